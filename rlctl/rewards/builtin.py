"""The built-in rule-based rewards (`BUILTINS`), each with TRL's signature `fn(prompts, completions, **columns)`."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

from rlctl.errors import UserError
from rlctl.rewards.answers import _truths, completion_text, gsm8k_answer, last_boxed, math_equal

RewardFn = Callable[..., list[float]]


def exact_match(prompts: list, completions: list, answer: list, **_: Any) -> list[float]:
    """1.0 when the completion, stripped, equals the ground-truth answer (any of them, for a list); else 0.0."""
    return [
        float(completion_text(c).strip() in [t.strip() for t in _truths(a)])
        for c, a in zip(completions, answer, strict=True)
    ]


def gsm8k(prompts: list, completions: list, answer: list, strict: bool = True, **_: Any) -> list[float]:
    """GSM8K-style final answer: 1.0 when the number after `####` in the completion equals the ground truth
    (itself a number, or a solution ending in `#### N`) as math-verify compares them; `strict=False` also
    accepts the last number."""
    scores = []
    for c, a in zip(completions, answer, strict=True):
        got = gsm8k_answer(completion_text(c), strict)
        wants = [gsm8k_answer(t, strict=False) if "####" in t else t.strip() for t in _truths(a)]
        scores.append(float(got is not None and any(w and math_equal(got, w) for w in wants)))
    return scores


def boxed(prompts: list, completions: list, answer: list, **_: Any) -> list[float]:
    """Math answer in `\\boxed{}`: 1.0 when the last boxed expression of the completion equals the ground
    truth (plain or boxed) by math-verify: as numbers, expressions, intervals, sets, tuples or text, units and
    `x =` dropped; else 0.0. The answer is parsed, never evaluated."""
    scores = []
    for c, a in zip(completions, answer, strict=True):
        got = last_boxed(completion_text(c))
        ok = got is not None and any(math_equal(got, last_boxed(t) or t) for t in _truths(a))
        scores.append(float(ok))
    return scores


_GSM8K_SOURCES = ("gsm8k",)
_MATH_SOURCES = ("math", "aime", "amc", "numina", "deepscaler", "dapo", "olympiad", "minerva")


def verl(prompts: list, completions: list, answer: list, data_source: list | None = None, **_: Any) -> list[float]:
    """verl's default scoring by `data_source`: gsm8k data by the `####` answer, math data (MATH, AIME, AMC,
    Numina, DAPO, ...) by `\\boxed{}`, anything else by exact match."""
    sources = data_source or [""] * len(completions)
    scores = []
    for p, c, a, src in zip(prompts, completions, answer, sources, strict=True):
        s = str(src or "").lower()
        if any(k in s for k in _GSM8K_SOURCES):
            fn: RewardFn = gsm8k
        elif any(k in s for k in _MATH_SOURCES):
            fn = boxed
        else:
            fn = exact_match
        scores += fn([p], [c], answer=[a])
    return scores


THINK_FORMAT = r"^\s*<think>.*?</think>\s*\S.*$"


def format_reward(prompts: list, completions: list, pattern: str = THINK_FORMAT, **_: Any) -> list[float]:
    """1.0 when the whole completion matches the regex `pattern` (default: reasoning in <think>...</think>
    followed by an answer), else 0.0. Matching is across lines (re.DOTALL)."""
    regex = re.compile(pattern, re.DOTALL)
    return [float(regex.fullmatch(completion_text(c)) is not None) for c in completions]


def length_penalty(
    prompts: list,
    completions: list,
    max_length: int = 1024,
    buffer: int | None = None,
    unit: str = "chars",
    completion_ids: list | None = None,
    **_: Any,
) -> list[float]:
    """DAPO's soft overlong penalty: 0 up to `max_length - buffer`, then falling linearly to -1 at
    `max_length`, and -1 beyond. `unit`: chars, words, or tokens (the token ids the trainer passes)."""
    if unit not in ("chars", "words", "tokens"):
        raise UserError(f"length_penalty: unit must be chars, words or tokens, not {unit!r}.")
    if unit == "tokens" and completion_ids is None:
        raise UserError("length_penalty(unit='tokens') needs the completion token ids, which only training passes.")
    buffer = max(1, max_length // 4) if buffer is None else buffer
    free = max_length - buffer
    scores = []
    for i, c in enumerate(completions):
        text = completion_text(c)
        n = len(completion_ids[i]) if unit == "tokens" else len(text.split()) if unit == "words" else len(text)
        if n <= free:
            scores.append(0.0)
        elif n <= max_length:
            scores.append((free - n) / buffer)
        else:
            scores.append(-1.0)
    return scores


_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def code_tests(
    prompts: list, completions: list, tests: list[str], timeout_s: float = 5.0, memory_mb: int = 512, **_: Any
) -> list[float]:
    """1.0 when the model's code (the last ```python block, else the whole completion) passes the row's `tests`
    (plain asserts), run in rlctl's kernel sandbox (bubblewrap: no network, no view of the host's files, processes
    or environment; wall-time, CPU, memory and output limits), the tests in a separate sandboxed process that
    decides the verdict; anything else (failure, timeout, early exit, escape attempt) scores 0.0."""
    from concurrent.futures import ThreadPoolExecutor

    from rlctl import sandbox

    limits = sandbox.Limits(wall_s=timeout_s, cpu_s=max(1, int(timeout_s)), memory_mb=memory_mb)

    def score(pair: tuple[Any, str]) -> float:
        text = completion_text(pair[0])
        blocks = _CODE_BLOCK.findall(text)
        return float(sandbox.run(blocks[-1] if blocks else text, str(pair[1]), limits).passed)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(score, zip(completions, tests, strict=True)))


def code_tests_problem(tests: Any) -> str | None:
    """Why a row's `tests` cannot judge code (read, not run): not text, not Python, or without a single assertion
    (no `assert`, no `assert...()` call), so that every completion, even an empty one, would pass; None when fine."""
    import ast

    if not isinstance(tests, str) or not tests.strip():
        return f"are {type(tests).__name__ if not isinstance(tests, str) else 'empty'}, not test code"
    try:
        tree = ast.parse(tests)
    except (SyntaxError, ValueError) as e:
        return f"are not Python ({getattr(e, 'msg', e)}, line {getattr(e, 'lineno', '?')}): every completion would fail"
    for node in ast.walk(tree):
        func = node.func if isinstance(node, ast.Call) else None
        name = getattr(func, "attr", None) or getattr(func, "id", None) or ""
        if isinstance(node, ast.Assert) or name.lower().startswith("assert"):
            return None
    return "assert nothing (no `assert` statement or assert...() call): every completion, even an empty one, would pass"


format_reward.__name__ = "format"
BUILTINS: dict[str, RewardFn] = {
    "code_tests": code_tests,
    "exact_match": exact_match,
    "gsm8k": gsm8k,
    "boxed": boxed,
    "verl": verl,
    "format": format_reward,
    "length_penalty": length_penalty,
}
# Rewards that say whether an answer is right (eval accuracy and pass@k use one of them).
# What the trainer passes to reward functions besides the dataset's columns.
TRAINER_KWARGS = ("completion_ids", "trainer_state")
# Parameters of built-ins that the trainer or the dataset fills in, not the user.
COLUMN_PARAMS = ("answer", "completion_ids", "data_source", "tests")
CORRECTNESS = ("exact_match", "gsm8k", "boxed", "verl", "code_tests")
NEEDS_ANSWER = ("exact_match", "gsm8k", "boxed", "verl")


def describe_builtins() -> list[tuple[str, str, str]]:
    """(name, arguments, first paragraph of the docstring) for each built-in: `rlctl rewards list`, the docs."""
    out = []
    for name, fn in BUILTINS.items():
        params = [
            f"{p.name}={p.default!r}"
            for p in list(inspect.signature(fn).parameters.values())[2:]
            if p.default is not inspect.Parameter.empty and p.name not in COLUMN_PARAMS
        ]
        doc = " ".join((fn.__doc__ or "").split("\n\n")[0].split())
        out.append((name, ", ".join(params), doc))
    out.append(("reward_model", "", "The reward model trained in the rm stage (needs the rm stage in the run)."))
    return out

"""Reward functions: built-in rule-based rewards, user plugins and installed entry points.

Every reward has TRL's signature: `fn(prompts, completions, **columns) -> list[float]`, where `columns`
holds the dataset's other columns (the ground truth among them, as `answer`). A reward is named in
`rl.rewards` by:

- a built-in: `exact_match`, `gsm8k`, `boxed`, `verl`, `format`, `length_penalty`, `code_tests` (see BUILTINS);
- `reward_model`: the reward model trained in the rm stage, wired in by the RL stage (it needs the weights);
- a plugin file: `path/to/file.py:function`;
- an installed entry point of group `rlctl.rewards` (`[project.entry-points."rlctl.rewards"]` in a package's
  pyproject.toml): its name.

Arguments are given in call form, with Python literals: `length_penalty(max_length=512, buffer=128)`,
`format(pattern=r"^<think>.+</think>.+$")`, `my_rewards.py:score(strict=False)`. Several rewards are summed
with their weights.

Package `rlctl.rewards`: the reward functions (this module) and the sandbox that runs model-written code
(`sandbox`).
May import: base, config.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import inspect
import math
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from rlctl.errors import RewardError, UserError, did_you_mean, is_out_of_memory

RewardFn = Callable[..., list[float]]
ENTRY_POINT_GROUP = "rlctl.rewards"
MODEL_REWARDS = ("reward_model",)


def completion_text(completion: Any) -> str:
    """The text of a completion, plain or conversational (a list of messages)."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def _truths(answer: Any) -> list[str]:
    """A ground truth as the list of acceptable answers (verl data may hold a list)."""
    if isinstance(answer, list | tuple):
        return [str(a) for a in answer]
    return [str(answer)]


# ------------------------------------------------------------------------------------------- answers
_NUMBER = re.compile(r"-?[\d,]*\.?\d+(?:[eE][-+]?\d+)?")


def _to_number(text: str) -> Fraction | float | None:
    """`text` as a number when it is one: 1,234  -3.5  1e-3  3/4  50%  $12 (else None)."""
    t = text.strip().rstrip(".").replace(",", "").replace("$", "").replace(" ", "")
    percent = t.endswith("%")
    t = t.rstrip("%")
    try:
        if re.fullmatch(r"-?\d+/\d+", t):
            value: Fraction | float = Fraction(t)
        elif re.fullmatch(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", t):
            value = Fraction(t) if "e" not in t.lower() else float(t)
        else:
            return None
    except (ValueError, ZeroDivisionError):
        return None
    return value / 100 if percent else value


def numbers_equal(a: Fraction | float, b: Fraction | float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)


def gsm8k_answer(text: str, strict: bool = True) -> str | None:
    """The final answer of a GSM8K-style solution: the number after `####` (strict), or else the last number
    in the text (flexible)."""
    match = re.findall(r"####\s*\$?\s*(-?[\d,]*\.?\d+)", text)
    if match:
        return match[-1].replace(",", "")
    if strict:
        return None
    numbers = [n for n in _NUMBER.findall(text) if re.search(r"\d", n)]
    return numbers[-1].replace(",", "") if numbers else None


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced; None if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        rest = text[start + len("\\boxed") :].strip()  # \boxed 5
        return rest.split("$")[0].strip() or None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def _strip_braces(s: str) -> str:
    while s.startswith("{") and s.endswith("}") and last_boxed("\\boxed" + s) == s[1:-1]:
        s = s[1:-1]
    return s


def _frac_to_text(s: str) -> str:
    """`\\frac{a}{b}` (also \\dfrac, \\tfrac, and \\frac12) as `(a)/(b)`, nested ones included."""
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    while "\\frac{" in s:
        i = s.find("\\frac{")
        num = last_boxed("\\boxed" + s[i + 5 :])
        if num is None:
            break
        j = i + 5 + len(num) + 2
        if j >= len(s) or s[j] != "{":
            break
        den = last_boxed("\\boxed" + s[j:])
        if den is None:
            break
        s = s[:i] + f"({num})/({den})" + s[j + len(den) + 2 :]
    return s


def normalize_math(text: str) -> str:
    """A LaTeX or plain math answer in a canonical text form for comparison."""
    s = text.strip().strip("$").strip()
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(mathrm|textbf|mathbf)\{([^{}]*)\}", r"\2", s)
    for unit in ("degrees", "degree", "cm", "units", "unit", "inches", "meters", "dollars"):
        s = re.sub(rf"\s*{unit}$", "", s)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "^\\circ", "^{\\circ}", "\\%", "\\$"):
        s = s.replace(token, "")
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/").replace("\\pi", "pi")
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)
    s = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", s)
    s = _frac_to_text(s)
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # x = 5 -> 5
    s = s.replace(" ", "").rstrip(".")
    s = _strip_braces(s)
    s = re.sub(r"(?<![A-Za-z])\(([\d.]+)\)", r"\1", s)  # (3)/(4) -> 3/4; sqrt(2) stays
    return s


_SAFE_EXPR = re.compile(r"[A-Za-z0-9\s+\-*/^().]+")


def _sympy_equal(a: str, b: str) -> bool:
    """Symbolic equality of two normalised expressions when both are small, safe arithmetic (letters, digits,
    operators, parentheses) that sympy parses; False otherwise. Model outputs are untrusted: no underscores,
    attribute access or huge powers reach the parser."""
    both = a + b
    if not (_SAFE_EXPR.fullmatch(a) and _SAFE_EXPR.fullmatch(b)) or len(a) > 80 or len(b) > 80:
        return False
    if re.search(r"\.(?!\d)", both) or "**" in both or re.search(r"\^\s*\(?\s*\d{3,}", both) or a.count("^") > 1:
        return False
    try:
        from sympy import simplify
        from sympy.parsing.sympy_parser import implicit_multiplication, parse_expr, standard_transformations

        rules = (*standard_transformations, implicit_multiplication)
        ea, eb = (parse_expr(x.replace("^", "**"), transformations=rules) for x in (a, b))
        return bool(simplify(ea - eb) == 0)
    except Exception:
        return False


def math_equal(prediction: str, truth: str) -> bool:
    """Whether two math answers are equal: as numbers (1/2 = 0.5 = \\frac{1}{2} = 50%), as normalised text, or
    symbolically (2\\sqrt{2} = \\sqrt{8})."""
    if prediction.strip() == truth.strip():
        return True
    a, b = normalize_math(prediction), normalize_math(truth)
    if a == b:
        return True
    na, nb = _to_number(a), _to_number(b)
    if na is not None and nb is not None:
        return numbers_equal(na, nb)
    if "," in a and "," in b:  # tuples and lists of answers, element-wise
        pa, pb = a.strip("()[]{}").split(","), b.strip("()[]{}").split(",")
        return len(pa) == len(pb) and all(math_equal(x, y) for x, y in zip(pa, pb, strict=True))
    return _sympy_equal(a, b)


# ------------------------------------------------------------------------------------------ built-ins
def exact_match(prompts: list, completions: list, answer: list, **_: Any) -> list[float]:
    """1.0 when the completion, stripped, equals the ground-truth answer (any of them, for a list); else 0.0."""
    return [
        float(completion_text(c).strip() in [t.strip() for t in _truths(a)])
        for c, a in zip(completions, answer, strict=True)
    ]


def gsm8k(prompts: list, completions: list, answer: list, strict: bool = True, **_: Any) -> list[float]:
    """GSM8K-style final answer: 1.0 when the number after `####` in the completion equals the ground truth
    (itself a number, or a solution ending in `#### N`); `strict=False` also accepts the last number."""
    scores = []
    for c, a in zip(completions, answer, strict=True):
        got = gsm8k_answer(completion_text(c), strict)
        ok = False
        if got is not None:
            for truth in _truths(a):
                want = gsm8k_answer(truth, strict=False) if "####" in truth else truth.strip()
                n_got, n_want = _to_number(got), _to_number(want or "")
                ok = ok or (n_got is not None and n_want is not None and numbers_equal(n_got, n_want))
        scores.append(float(ok))
    return scores


def boxed(prompts: list, completions: list, answer: list, **_: Any) -> list[float]:
    """Math answer in `\\boxed{}`: 1.0 when the last boxed expression of the completion equals the ground
    truth (plain or boxed) numerically, as normalised LaTeX, or symbolically; else 0.0."""
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
    (plain asserts), run in rlctl's sandbox: separate process, wall-time/CPU/memory limits, temporary working
    directory, no network, no writes outside it; anything else (failure, timeout, escape attempt) scores 0.0."""
    from concurrent.futures import ThreadPoolExecutor

    from rlctl.rewards import sandbox

    limits = sandbox.Limits(wall_s=timeout_s, cpu_s=max(1, int(timeout_s)), memory_mb=memory_mb)

    def score(pair: tuple[Any, str]) -> float:
        text = completion_text(pair[0])
        blocks = _CODE_BLOCK.findall(text)
        return float(sandbox.run(blocks[-1] if blocks else text, str(pair[1]), limits).passed)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(score, zip(completions, tests, strict=True)))


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
TRAINER_KWARGS = ("completion_ids", "trainer_state", "log_extra", "log_metric")
# Parameters of built-ins that the trainer or the dataset fills in, not the user.
COLUMN_PARAMS = ("answer", "completion_ids", "data_source", "tests")
CORRECTNESS = ("exact_match", "gsm8k", "boxed", "verl", "code_tests")
NEEDS_ANSWER = ("exact_match", "gsm8k", "boxed", "verl")


# ------------------------------------------------------------------------------------------ resolving
def _answer_as(fn: RewardFn, answer_field: str) -> RewardFn:
    """`fn` reading the ground truth from column `answer_field` under the name `answer`."""
    if answer_field == "answer":
        return fn

    @functools.wraps(fn)
    def wrapped(prompts: list, completions: list, **columns: Any) -> list[float]:
        columns = dict(columns)
        if answer_field in columns:
            columns["answer"] = columns.pop(answer_field)
        return fn(prompts, completions, **columns)

    return wrapped


_PLUGIN_CALL = re.compile(r"^(?P<path>.*?\.py):(?P<call>[A-Za-z_]\w*\(.*\))$", re.DOTALL)


def split_call(name: str) -> tuple[str, dict[str, Any]]:
    """`base(key=literal, ...)` as (base, kwargs); a name without arguments as (name, {})."""
    name = name.strip()
    if not name.endswith(")") or "(" not in name:
        return name, {}
    plugin = _PLUGIN_CALL.match(name)
    prefix, call = (plugin["path"] + ":", plugin["call"]) if plugin else ("", name)
    try:
        node = ast.parse(call, mode="eval").body
    except SyntaxError as e:
        raise UserError(f"Reward '{name}': cannot read its arguments ({e.msg}); write name(key=value, ...).") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        raise UserError(f"Reward '{name}': arguments must be keywords with literal values: name(key=value, ...).")
    kwargs = {}
    for kw in node.keywords:
        try:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            raise UserError(f"Reward '{name}': the value of {kw.arg} must be a literal (number, text, ...).") from None
    return prefix + node.func.id, kwargs


def load_plugin(spec: str) -> RewardFn:
    """The function named by `path/to/file.py:function`."""
    path_str, _, name = spec.rpartition(":")
    path = Path(path_str)
    if not path.is_file():
        raise UserError(f"Reward plugin file not found: {path} (from rl.rewards name '{spec}').")
    module_spec = importlib.util.spec_from_file_location(f"rlctl_plugin_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        raise UserError(f"Reward plugin {path} failed to import: {type(e).__name__}: {e}.") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        funcs = [n for n, v in vars(module).items() if inspect.isfunction(v)]
        raise UserError(f"Reward plugin {path} has no function '{name}'.{did_you_mean(name, funcs)}")
    return fn


def entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Rewards installed by packages under the entry point group `rlctl.rewards`, by name."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load_entry_point(ep: importlib.metadata.EntryPoint) -> RewardFn:
    try:
        fn = ep.load()
    except Exception as e:
        raise UserError(
            f"Reward '{ep.name}' (entry point {ep.value} of group {ENTRY_POINT_GROUP}) failed to load: "
            f"{type(e).__name__}: {e}."
        ) from None
    if not callable(fn):
        raise UserError(f"Reward entry point '{ep.name}' ({ep.value}) is not a function.")
    return fn


def _bind(fn: RewardFn, kwargs: dict[str, Any], label: str) -> RewardFn:
    """`fn` with `kwargs` fixed (they win over dataset columns of the same name), checked against its signature."""
    if not kwargs:
        return fn
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD][2:]
    named = [n for n in named if n not in COLUMN_PARAMS]
    for key in kwargs:
        if key not in params and (not takes_any or fn in BUILTINS.values()):
            raise UserError(
                f"Reward '{label}' has no argument '{key}'.{did_you_mean(key, named)} Its arguments: "
                f"{', '.join(named) or 'none'}."
            )

    @functools.wraps(fn)
    def bound(prompts: list, completions: list, **columns: Any) -> list[float]:
        return fn(prompts, completions, **{**columns, **kwargs})

    return bound


def known_names() -> list[str]:
    return [*BUILTINS, *MODEL_REWARDS, *entry_points()]


def resolve(name: str, answer_field: str = "answer") -> RewardFn:
    """The rule-based, plugin or entry-point reward called `name` (arguments in call form allowed)."""
    base, kwargs = split_call(name)
    if ".py:" in base:
        fn = load_plugin(base)
        fn = _bind(fn, kwargs, name)
        fn.__name__ = getattr(fn, "__name__", base)
        return _answer_as(fn, answer_field)
    if base in BUILTINS:
        return _answer_as(_bind(BUILTINS[base], kwargs, name), answer_field)
    eps = entry_points()
    if base in eps:
        return _answer_as(_bind(_load_entry_point(eps[base]), kwargs, name), answer_field)
    known = known_names()
    raise UserError(
        f"Unknown reward '{base}'.{did_you_mean(base, known)} Built-ins: {', '.join(known)}; "
        f"or give a plugin as path/to/file.py:function, or install a package with a '{ENTRY_POINT_GROUP}' entry point."
    )


def _sample_kwargs(kwargs: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    """The per-sample slice of a batch call's keyword arguments (columns are lists of n; the rest as is)."""
    return {k: [v[i]] if isinstance(v, list) and len(v) == n else v for k, v in kwargs.items()}


def guarded(fn: RewardFn, label: str, on_error: str, errors: dict[str, int]) -> RewardFn:
    """`fn` as the trainers call it during RL, with its failures handled per `on_error` (rl.rewards[].on_error).

    When the batch call raises, each completion is scored alone to find the culprits: with `raise` the first one
    stops training with a RewardError naming the reward, the sample and the error; with `zero` each failing
    completion scores 0.0 and is counted in `errors[label]`. Out-of-memory errors always propagate."""

    @functools.wraps(fn)
    def call_guarded(prompts: list, completions: list, **kwargs: Any) -> list[float]:
        try:
            return fn(prompts=prompts, completions=completions, **kwargs)
        except Exception as e:
            if is_out_of_memory(e):
                raise
            first = e
        n, values = len(completions), []
        for i in range(n):
            try:
                one = fn(prompts=[prompts[i]], completions=[completions[i]], **_sample_kwargs(kwargs, i, n))
                values.append(one[0])
            except Exception as e:
                if is_out_of_memory(e):
                    raise
                if on_error == "raise":
                    raise RewardError(
                        f"Reward '{label}' raised {type(e).__name__}: {e} on the completion "
                        f"{completion_text(completions[i])[:200]!r} of the prompt {str(prompts[i])[:200]!r}. "
                        "Fix the reward, or give it `on_error: zero` in rl.rewards to score such completions 0 "
                        "and count them as reward_errors."
                    ) from e
                values.append(0.0)
                errors[label] = errors.get(label, 0) + 1
        if on_error == "raise":  # no completion fails alone: the batch call itself does
            raise RewardError(
                f"Reward '{label}' raised {type(first).__name__}: {first} on a batch of {n} completions, though "
                "each one alone scores; fix the reward's batch handling."
            ) from first
        return values

    return call_guarded


def call(fn: RewardFn, label: str, prompts: Sequence, completions: Sequence, columns: dict[str, list]) -> list[float]:
    """Run one reward as the trainer does, turning the usual plugin mistakes into one-paragraph errors."""
    try:
        values = fn(prompts=list(prompts), completions=list(completions), **columns)
    except UserError:
        raise
    except TypeError as e:
        if "required" in str(e) or "missing" in str(e):
            raise UserError(
                f"Reward '{label}' cannot be called with the dataset's columns "
                f"({', '.join(sorted(set(columns) - set(TRAINER_KWARGS))) or 'none'}): {e}. "
                "Add the column it needs (or map it with data.columns)."
            ) from None
        raise UserError(f"Reward '{label}' raised TypeError: {e}.") from None
    except Exception as e:
        raise UserError(f"Reward '{label}' raised {type(e).__name__}: {e}.") from None
    if not isinstance(values, list | tuple) or len(values) != len(completions):
        got = f"{len(values)} values" if isinstance(values, list | tuple) else type(values).__name__
        raise UserError(f"Reward '{label}' must return one float per completion ({len(completions)}), got {got}.")
    return [float("nan") if v is None else float(v) for v in values]


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


def columns_of(rows: list[dict[str, Any]], skip: Sequence[str] = ("prompt", "completion")) -> dict[str, list]:
    """The dataset columns a trainer passes to reward functions: every column but the prompt and completion."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(k for k in row if k not in skip))
    return {k: [row.get(k) for row in rows] for k in keys}


def score(
    specs: Sequence[tuple[str, float]],
    prompts: Sequence,
    completions: Sequence,
    columns: dict[str, list],
    answer_field: str = "answer",
    model_scores: dict[str, list[float]] | None = None,
) -> tuple[dict[str, list[float] | None], list[float]]:
    """Each reward's values ({name: values}, None for a model reward without a model) and the weighted sum
    per completion, as the RL stage adds them up."""
    per: dict[str, list[float] | None] = {}
    total = [0.0] * len(completions)
    for i, (name, weight) in enumerate(specs):
        if name in MODEL_REWARDS:
            values = (model_scores or {}).get(name)
        else:
            values = call(resolve(name, answer_field), name, prompts, completions, columns)
        per[name if name not in per else f"{name}#{i + 1}"] = values
        if values is not None:
            total = [t + weight * (0.0 if math.isnan(v) else v) for t, v in zip(total, values, strict=True)]
    return per, total


def dry_run(names: Sequence[str], rows: list[dict[str, Any]], answer_field: str = "answer", n: int = 4) -> None:
    """Resolve every reward and call it as the trainer would, on the first rows with their ground truth as the
    completion: a plugin that fails to import, raises, needs a missing column or returns the wrong number of
    scores stops here with a UserError naming it."""
    fns = [(name, resolve(name, answer_field)) for name in names]
    rows = rows[:n]
    if not fns or not rows:
        return
    prompts = [r["prompt"] for r in rows]
    texts = [str(r.get(answer_field, "")) for r in rows]
    completions = [
        [{"role": "assistant", "content": t}] if isinstance(p, list) else t for p, t in zip(prompts, texts, strict=True)
    ]
    columns = {**columns_of(rows), "completion_ids": [list(range(len(t))) for t in texts]}
    for name, fn in fns:
        call(fn, name, prompts, completions, columns)

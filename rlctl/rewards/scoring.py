"""Which reward says whether an answer is right: held-out `eval_accuracy` (summary.json, keep-best), `rlctl eval`
and `rlctl rewards test` all take it from `rl.rewards`, with its arguments, so evaluation follows the training
signal. A reward counts when it is marked `correctness: true`, or, unmarked, when it is a correctness built-in
(rewards.CORRECTNESS: exact_match, gsm8k, boxed, verl, code_tests); exact match only when there is none."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlctl import rewards

THRESHOLD = 0.5  # a score above it is a correct answer


def is_correctness(name: str, marked: bool | None = None) -> bool:
    """Whether the reward `name` (arguments allowed) decides correctness, given its `correctness` setting."""
    return marked if marked is not None else rewards.split_call(name)[0] in rewards.CORRECTNESS


def accuracy_name(specs: Sequence[Any], data_format: str | None = None) -> str:
    """The reward (name with its arguments) that decides correctness among `specs` (RewardSpec-like, or
    (name, weight) pairs): the first correctness reward, else `verl` for verl data, else exact_match."""
    at = correctness_index(specs)
    if at is not None:
        return specs[at][0] if isinstance(specs[at], tuple) else specs[at].name
    return "verl" if data_format == "verl" else "exact_match"


def correctness_index(specs: Sequence[Any]) -> int | None:
    """The position in `specs` of the first correctness reward (the one training's positive examples and held-out
    accuracy read), None when there is none."""
    for i, spec in enumerate(specs):
        name, marked = (spec[0], None) if isinstance(spec, tuple) else (spec.name, spec.correctness)
        if name not in rewards.MODEL_REWARDS and is_correctness(name, marked):
            return i
    return None


def correct(
    name: str,
    answer_field: str,
    prompts: Sequence,
    completions: Sequence,
    columns: dict[str, list],
    timeout_s: float = rewards.DEADLINE_S,
) -> list[bool]:
    """Per completion, whether the correctness reward `name` scores it above THRESHOLD (`rewards.judged`: in a
    worker process stopped at `timeout_s`)."""
    values = rewards.judged(name, answer_field, prompts, completions, columns, timeout_s)
    return [v > THRESHOLD for v in values]


def first_truth(value: Any) -> str:
    """A ground truth as one answer to score: the first of a list of accepted answers (each counts)."""
    if isinstance(value, list | tuple):
        return str(value[0]) if value else ""
    return "" if value is None else str(value)

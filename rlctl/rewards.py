"""Reward functions: built-in rule-based rewards and user plugins (`path/to/file.py:function`).

Every reward has TRL's signature: `fn(prompts, completions, **columns) -> list[float]`, where `columns`
holds the dataset's other columns (the ground truth among them). The trained reward model is the
built-in `reward_model`, wired in by the RL stage because it needs the model weights.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.errors import UserError, did_you_mean

RewardFn = Callable[..., list[float]]


def completion_text(completion: Any) -> str:
    """The text of a completion, plain or conversational (a list of messages)."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def exact_match(prompts: list, completions: list, answer: list[str], **_: Any) -> list[float]:
    """1.0 when the completion, stripped, equals the ground-truth answer; else 0.0."""
    return [float(completion_text(c).strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)]


BUILTINS: dict[str, RewardFn] = {"exact_match": exact_match}
MODEL_REWARDS = ("reward_model",)


def _answer_as(fn: RewardFn, answer_field: str) -> RewardFn:
    """`fn` reading the ground truth from column `answer_field` under the name `answer`."""
    if answer_field == "answer":
        return fn

    @functools.wraps(fn)
    def wrapped(prompts: list, completions: list, **columns: Any) -> list[float]:
        columns = dict(columns)
        columns["answer"] = columns.pop(answer_field)
        return fn(prompts, completions, **columns)

    return wrapped


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


def resolve(name: str, answer_field: str = "answer") -> RewardFn:
    """The rule-based or plugin reward called `name`."""
    if ".py:" in name:
        fn = load_plugin(name)
        fn.__name__ = getattr(fn, "__name__", name)
        return fn
    if name not in BUILTINS:
        known = [*BUILTINS, *MODEL_REWARDS]
        raise UserError(
            f"Unknown reward '{name}'.{did_you_mean(name, known)} Built-ins: {', '.join(known)}; "
            "or give a plugin as path/to/file.py:function."
        )
    return _answer_as(BUILTINS[name], answer_field)

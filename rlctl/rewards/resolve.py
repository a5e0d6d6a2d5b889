"""Resolving a reward name of `rl.rewards` (a built-in, a plugin `path/to/file.py:function`, an installed entry
point; arguments in call form) to its function."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.errors import UserError, did_you_mean
from rlctl.rewards.builtin import BUILTINS, COLUMN_PARAMS, RewardFn

ENTRY_POINT_GROUP = "rlctl.rewards"
MODEL_REWARDS = ("reward_model",)


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


def load_plugin(spec: str, what: str = "Reward plugin", key: str = "rl.rewards name") -> Callable[..., Any]:
    """The function named by `path/to/file.py:function`; `what` and `key` name it in the errors (reward plugins
    here, `rl.tools` files in rlctl.rollout.tools)."""
    path_str, _, name = spec.rpartition(":")
    path = Path(path_str).expanduser()
    if not path.is_file():
        raise UserError(f"{what} file not found: {path} (from {key} '{spec}').")
    module_spec = importlib.util.spec_from_file_location(f"rlctl_plugin_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        raise UserError(f"{what} {path} failed to import: {type(e).__name__}: {e}.") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        funcs = [n for n, v in vars(module).items() if inspect.isfunction(v)]
        raise UserError(f"{what} {path} has no function '{name}'.{did_you_mean(name, funcs)}")
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

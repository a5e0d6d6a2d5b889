"""Calling rewards so that nothing fails silently: every output is checked (one finite number or None per
completion), failures, NaN/inf values and overrun deadlines follow the reward's `on_error`, a batch where every
reward is NaN stops the stage, and the pre-launch dry run refuses a reward before any training."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from rlctl.errors import RewardError, UserError, is_out_of_memory
from rlctl.rewards import worker
from rlctl.rewards.answers import completion_text
from rlctl.rewards.builtin import TRAINER_KWARGS, RewardFn
from rlctl.rewards.resolve import MODEL_REWARDS, resolve

Notify = Callable[..., None]  # notify(event, **fields): an event record for metrics.jsonl and the console
DEADLINE_S = 120.0  # a reward's deadline where rl.rewards sets none (its timeout_s default): the dry run, judges
JUDGE_BATCH = 256  # completions per judge call outside training (eval's thousands): a batch its deadline fits


class BadOutput(ValueError):
    """A reward returned something other than one number or None per completion."""


def as_scores(values: Any, n: int) -> list[float | None]:
    """A reward's output as one float or None per completion: a list or tuple, or a 1-D tensor/array of n
    numbers; a BadOutput naming the offending value otherwise."""
    if not isinstance(values, list | tuple) and hasattr(values, "tolist"):
        shape = tuple(getattr(values, "shape", ()))
        if shape != (n,):
            raise BadOutput(f"a {type(values).__name__} of shape {shape}, not ({n},)")
        values = values.tolist()
    if not isinstance(values, list | tuple):
        raise BadOutput(f"a {type(values).__name__}: {str(values)[:60]!r}")
    if len(values) != n:
        raise BadOutput(f"{len(values)} values")
    out: list[float | None] = []
    for i, v in enumerate(values):
        if v is not None and not isinstance(v, numbers.Real) and getattr(v, "shape", None) == ():
            v = v.item()  # a 0-d tensor or array
        if v is not None and not isinstance(v, numbers.Real):
            raise BadOutput(f"{str(v)[:60]!r} (a {type(v).__name__}) for completion {i + 1}")
        out.append(None if v is None else float(v))
    return out


class NanSteps:
    """The rewards of one stage, by slot, whose latest batch was NaN/inf throughout: once every slot's is, the
    stage stops (a reward model never reports, so a run with one never stops this way)."""

    def __init__(self, slots: int):
        self.slots, self.latest = slots, {}

    def report(self, slot: int, label: str, values: list[float | None]) -> None:
        self.latest[slot] = bool(values) and all(v is not None and not math.isfinite(v) for v in values)
        if slot == self.slots - 1 and all(self.latest.get(s) for s in range(self.slots)):
            raise RewardError(
                f"Every reward returned NaN/inf for all {len(values)} completions of a batch (the last: '{label}'), "
                "so nothing can be learned from it and the stage stopped. Fix the rewards (`rlctl rewards test` "
                "shows their values on sample completions)."
            )


def _sample_kwargs(kwargs: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    """The per-sample slice of a batch call's keyword arguments (columns are lists of n; the rest as is)."""
    return {k: [v[i]] if isinstance(v, list) and len(v) == n else v for k, v in kwargs.items()}


FIX_HINT = (
    "Fix the reward, or give it `on_error: zero` in rl.rewards to score such completions 0 and count them as "
    "reward_errors."
)


def _timed_out(label: str, e: worker.RewardTimeout, timeout_s: float | None) -> RewardError:
    return RewardError(
        f"Reward '{label}' did not return within its timeout_s={timeout_s:g} s on a batch of {e.completions} "
        f"completions and was stopped after {e.seconds:.1f} s. Make it faster, raise its timeout_s in rl.rewards, or "
        "give it `on_error: zero` to score such batches 0 and count them as reward_errors."
    )


def guarded(
    fn: RewardFn,
    label: str,
    on_error: str,
    errors: dict[str, int],
    nan_steps: NanSteps | None = None,
    slot: int = 0,
    timeout_s: float | None = None,
) -> RewardFn:
    """`fn` as the trainers call it during RL, its output checked and its failures handled per `on_error`.

    When the batch call raises or returns something malformed, each completion is scored alone to find the
    culprits: with `raise` the first one stops training with a RewardError naming the reward, the sample and the
    error; with `zero` each failing completion scores 0.0 and is counted in `errors[label]`. NaN/inf values are
    failures of their completions; a batch that overran its deadline (RewardTimeout from a worker) fails whole.
    Out-of-memory errors always propagate."""

    def count(k: int) -> None:
        errors[label] = errors.get(label, 0) + k

    def alone(prompts: list, completions: list, kwargs: dict, first: Exception) -> list[float | None]:
        n, values = len(completions), []
        for i in range(n):
            try:
                one = fn(prompts=[prompts[i]], completions=[completions[i]], **_sample_kwargs(kwargs, i, n))
                values.append(as_scores(one, 1)[0])
            except worker.RewardTimeout as e:
                if on_error == "raise":
                    raise _timed_out(label, e, timeout_s) from None
                values.append(0.0)
                count(1)
            except Exception as e:
                if is_out_of_memory(e):
                    raise
                if on_error == "raise":
                    what = f"returned {e}" if isinstance(e, BadOutput) else f"raised {type(e).__name__}: {e}"
                    raise RewardError(
                        f"Reward '{label}' {what} on the completion {completion_text(completions[i])[:200]!r} of the "
                        f"prompt {str(prompts[i])[:200]!r}. {FIX_HINT}",
                        index=i,
                    ) from e
                values.append(0.0)
                count(1)
        if on_error == "raise":  # no completion fails alone: the batch call itself does
            raise RewardError(
                f"Reward '{label}' raised {type(first).__name__}: {first} on a batch of {n} completions, though "
                "each one alone scores; fix the reward's batch handling."
            ) from first
        return values

    @functools.wraps(fn)
    def call_guarded(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        n = len(completions)
        try:
            values = as_scores(fn(prompts=prompts, completions=completions, **kwargs), n)
        except worker.RewardTimeout as e:
            if on_error == "raise":
                raise _timed_out(label, e, timeout_s) from None
            count(n)
            return [0.0] * n
        except Exception as e:
            if is_out_of_memory(e):
                raise
            values = alone(prompts, completions, kwargs, e)
        if nan_steps is not None:
            nan_steps.report(slot, label, values)
        for i, v in enumerate(values):
            if v is not None and not math.isfinite(v):
                if on_error == "raise":
                    raise RewardError(
                        f"Reward '{label}' returned {v} for the completion {completion_text(completions[i])[:200]!r} "
                        f"of the prompt {str(prompts[i])[:200]!r}; rewards must be finite numbers or None. "
                        f"{FIX_HINT}",
                        index=i,
                    )
                values[i] = 0.0
                count(1)
        return values

    return call_guarded


def stage_rewards(
    specs: Sequence, answer_field: str, errors: dict[str, int], workers: worker.Workers, notify: Notify | None = None
) -> list:
    """The rl.rewards entries as the stages call them, in order (None for a model reward): each in its worker
    process among `workers` with its deadline (in-process when timeout_s is 0), guarded per its on_error, sharing
    one NanSteps."""
    nan_steps = NanSteps(len(specs))
    out: list[RewardFn | None] = []
    for slot, spec in enumerate(specs):
        if spec.name in MODEL_REWARDS:
            out.append(None)
            continue

        def slow(seconds: float, name: str = spec.name, limit: float = spec.timeout_s) -> None:
            if notify is not None:
                notify("reward_slow", reward=name, seconds=round(seconds, 1), timeout_s=limit)

        if spec.timeout_s:
            fn = workers.remote(spec.name, answer_field, spec.timeout_s, slow)
        else:
            fn = resolve(spec.name, answer_field)
        out.append(guarded(fn, spec.name, spec.on_error, errors, nan_steps, slot, spec.timeout_s or None))
    return out


def checked(
    fn: RewardFn, label: str, prompts: Sequence, completions: Sequence, columns: dict[str, list]
) -> list[float | None]:
    """Run one reward as the trainer does, turning the usual plugin mistakes (a missing column, an exception, a
    hang past its deadline, an output that is not one number or None per completion) into one-paragraph errors."""
    try:
        values = fn(prompts=list(prompts), completions=list(completions), **columns)
    except UserError:
        raise
    except worker.RewardTimeout as e:
        raise UserError(
            f"Reward '{label}' did not return within its timeout_s on {e.completions} completions of your data "
            f"(stopped after {e.seconds:.1f} s). Make it faster or raise its timeout_s in rl.rewards."
        ) from None
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
    try:
        return as_scores(values, len(completions))
    except BadOutput as e:
        raise UserError(
            f"Reward '{label}' must return one finite number or None per completion ({len(completions)}); it "
            f"returned {e}."
        ) from None


def call(fn: RewardFn, label: str, prompts: Sequence, completions: Sequence, columns: dict[str, list]) -> list[float]:
    """`checked` values with None read as NaN (`rlctl rewards test`, `rlctl eval`)."""
    return [float("nan") if v is None else v for v in checked(fn, label, prompts, completions, columns)]


def judged(
    name: str,
    answer_field: str,
    prompts: Sequence,
    completions: Sequence,
    columns: dict[str, list],
    timeout_s: float = DEADLINE_S,
) -> list[float]:
    """`call` of the reward `name` as training runs it: in a worker process of its own, each call of at most
    JUDGE_BATCH completions stopped at `timeout_s` (a UserError saying so), so that no completion can stall a judge
    in `rlctl eval`, `rlctl rewards test` or held-out scoring."""
    resolve(name, answer_field)  # an unknown or broken reward is named here, before a worker starts
    workers = worker.Workers()
    fn, n, values = workers.remote(name, answer_field, timeout_s), len(completions), []
    try:
        for start in range(0, n, JUDGE_BATCH):
            part = slice(start, start + JUDGE_BATCH)
            cols = {k: v[part] if isinstance(v, list) and len(v) == n else v for k, v in columns.items()}
            values += call(fn, name, list(prompts)[part], list(completions)[part], cols)
        return values
    finally:
        workers.stop_all()


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
    """Each reward's values ({name: values}, None for a model reward without a model; each reward `judged`, within
    DEADLINE_S) and the weighted sum per completion, as the RL stage adds them up."""
    per: dict[str, list[float] | None] = {}
    total = [0.0] * len(completions)
    for i, (name, weight) in enumerate(specs):
        if name in MODEL_REWARDS:
            values = (model_scores or {}).get(name)
        else:
            values = judged(name, answer_field, prompts, completions, columns)
        per[name if name not in per else f"{name}#{i + 1}"] = values
        if values is not None:
            total = [t + weight * (0.0 if math.isnan(v) else v) for t, v in zip(total, values, strict=True)]
    return per, total


def dry_run(
    names: Sequence[str],
    rows: list[dict[str, Any]],
    answer_field: str = "answer",
    n: int = 4,
    timeouts: Sequence[float] | None = None,
) -> None:
    """Resolve every reward and call it as the trainer would (in its worker, with its deadline: `timeouts`, by
    default DEADLINE_S each; 0 = in this process), on the first rows with their ground truth as the completion: a plugin
    that fails to import, raises, hangs, needs a missing column, or returns anything but one finite number or None
    per completion stops here with a UserError naming it and the value."""
    timeouts = list(timeouts) if timeouts is not None else [DEADLINE_S] * len(names)
    fns = [(name, resolve(name, answer_field), t) for name, t in zip(names, timeouts, strict=True)]
    rows = rows[:n]
    if not fns or not rows:
        return
    prompts = [r["prompt"] for r in rows]
    truths = [r.get(answer_field, "") for r in rows]  # a list of accepted answers: its first stands for them
    texts = [str(t[0] if isinstance(t, list) and t else t) for t in truths]
    completions = [
        [{"role": "assistant", "content": t}] if isinstance(p, list) else t for p, t in zip(prompts, texts, strict=True)
    ]
    columns = {**columns_of(rows), "completion_ids": [list(range(len(t))) for t in texts]}
    workers = worker.Workers()
    try:
        for name, fn, timeout_s in fns:
            runner = workers.remote(name, answer_field, timeout_s) if timeout_s else fn
            values = checked(runner, name, prompts, completions, columns)
            bad = next((i for i, v in enumerate(values) if v is not None and not math.isfinite(v)), None)
            if bad is not None:
                raise UserError(
                    f"Reward '{name}' returned {values[bad]} for the completion {texts[bad][:200]!r} (the ground "
                    f"truth of row {bad + 1}); rewards must be finite numbers or None."
                )
    finally:
        workers.stop_all()

"""Runtime faults a stage can hit, explained in one paragraph for the user: a checkpoint write that failed (a full
disk), out of memory (with the plan's numbers and the nearest safer settings), a reward function that raised.
The runner turns these into an `error` event (shown by `rlctl train`) and exit code 1."""

from __future__ import annotations

import errno
from pathlib import Path

from rlctl import checkpoint
from rlctl.config import RESUMABLE
from rlctl.errors import RewardError, is_out_of_memory
from rlctl.plan import hardware


def _chain(error: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while error is not None and error not in out:
        out.append(error)
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return out


def _last_good(folder: Path) -> str:
    last = checkpoint.last_complete(folder)
    return f"the last complete checkpoint, {last.name}, is intact" if last else "no earlier checkpoint exists"


def explain(error: BaseException, plan, stage: str, checkpoints: Path, is_main: bool) -> str | None:
    """The user-facing explanation of `error` raised in `stage`, or None when it is not a known fault."""
    run_dir = plan.run_dir
    if is_out_of_memory(error):
        return out_of_memory(error, plan, stage)
    if isinstance(error, RewardError):
        return f"{error} Then `rlctl resume {run_dir}` ({_last_good(checkpoints)})."
    written = checkpoint.being_written(checkpoints)
    if written:
        free = hardware.free_disk_gib(checkpoints)
        if is_main:
            checkpoint.drop_partial(checkpoints)
        return (
            f"Writing checkpoint {written[-1].name} of stage {stage} failed ({type(error).__name__}: {error}); "
            f"{free:.1f} GiB are free in {checkpoints}. The partial checkpoint was removed and "
            f"{_last_good(checkpoints)}. Free disk space (or lower checkpoint.keep_last), then "
            f"`rlctl resume {run_dir}`."
        )
    if any(getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) for e in _chain(error)):
        return (
            f"The disk is full: stage {stage} could not write ({error}). {_last_good(checkpoints)}. Free disk space "
            f"where {run_dir} lives, then `rlctl resume {run_dir}`."
        )
    return None


def out_of_memory(error: BaseException, plan, stage: str) -> str:
    """The OOM report: the plan's memory numbers for this stage and the nearest settings that need less."""
    from rlctl.plan import memory

    sp = next(s for s in plan.stages if s.name == stage)
    mem = plan.memory
    where = "GPU" if mem.get("device") == "gpu" else "process"
    numbers = (
        f"the plan expected a peak of {mem['peak_gib']} GiB per {where} ({mem['peak_phase']}) within a budget of "
        f"{mem['budget_gib']} GiB, {mem['headroom_gib']} GiB headroom"
        if mem.get("estimated")
        else "the plan had no memory estimate (model.arch is not set)"
    )
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    options = [
        f"rlctl resume {plan.run_dir} {o}" if o.split("=")[0].removeprefix("--set ") in RESUMABLE else f"a new run {o}"
        for o in memory.safer(plan, stage)
    ]
    hint = ("Nearest safer plans: " + "; ".join(options) + ".") if options else "Use a GPU with more memory."
    return (
        f"Out of memory in stage {stage} ({first_line}). Settings: {plan.strategy}, {plan.adapter}, micro-batch "
        f"{sp.micro_batch_size} x {sp.grad_accum} accumulation, gradient checkpointing "
        f"{'on' if plan.gradient_checkpointing else 'off'}; {numbers}. {hint} A resume continues from the last "
        "complete checkpoint."
    )

"""Runtime faults a stage can hit, explained in one paragraph for the user: a checkpoint write that failed (a full
disk), out of memory (with the plan's numbers and the nearest safer settings), a reward function that raised.
The runner turns these into an `error` event (shown by `rlctl train`) and exit code 1."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from rlctl import checkpoint
from rlctl.config import RESUMABLE
from rlctl.errors import ChildDied, DataRowError, GeneratorFailed, RewardError, is_out_of_memory
from rlctl.plan import hardware


def _chain(error: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while error is not None and error not in out:
        out.append(error)
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return out


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, a quota, a file-size limit


def no_space(error: BaseException) -> bool:
    """Whether `error` (or one it came from) is a write that ran out of room: by its errno, or by the OS message
    that libraries writing tensors (safetensors, torch) pass on as text."""
    texts = [os.strerror(n) for n in NO_SPACE] + [f"os error {n})" for n in NO_SPACE]
    return any(getattr(e, "errno", None) in NO_SPACE or any(t in str(e) for t in texts) for e in _chain(error))


NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)  # permissions taken away, a read-only filesystem


def not_writable(error: BaseException) -> OSError | None:
    """The error (of `error`'s chain) that refused a write for its permissions or a read-only filesystem, or None."""
    return next((e for e in _chain(error) if isinstance(e, OSError) and e.errno in NOT_WRITABLE), None)


def where(error: BaseException) -> str:
    """file:line (function) of the innermost frame where `error` was raised."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "an unknown place"
    last = frames[-1]
    return f"{Path(last.filename).name}:{last.lineno} ({last.name})"


def _last_good(folder: Path) -> str:
    last = checkpoint.last_complete(folder)
    return f"the last complete checkpoint, {last.name}, is intact" if last else "no earlier checkpoint exists"


def explain(error: BaseException, plan, stage: str, checkpoints: Path, is_main: bool, measured: str = "") -> str | None:
    """The user-facing explanation of `error` raised in `stage`, or None when it is not a known fault. `measured`:
    the memory peaks measured so far (`rlctl.monitors.memory_probe.so_far`), for an out-of-memory error."""
    run_dir = plan.run_dir
    if is_out_of_memory(error):
        return out_of_memory(error, plan, stage, measured)
    if isinstance(error, ChildDied):
        return (
            f"{error} Stage {stage} stopped; {_last_good(checkpoints)}. Continue from it with "
            f"`rlctl resume {run_dir}`. The full log is in {run_dir}/logs/train.log."
        )
    if isinstance(error, GeneratorFailed):
        return (
            f"{error}{_generator_memory(plan, error)} Stage {stage} stopped; {_last_good(checkpoints)}. After "
            f"fixing the cause, continue from it with `rlctl resume {run_dir}`. The engine's traceback is in "
            f"{run_dir}/logs/train.log."
        )
    if isinstance(error, RewardError):
        return f"{error} Then `rlctl resume {run_dir}{_zero_on_error(plan)}` ({_last_good(checkpoints)})."
    disk_full = no_space(error)
    refused = not_writable(error)
    if refused is not None:
        return read_only(refused, stage, checkpoints, run_dir, is_main)
    written = checkpoint.being_written(checkpoints)
    if written:
        free = hardware.free_disk_gib(checkpoints)
        if is_main:
            checkpoint.drop_partial(checkpoints)
        if isinstance(error, DataRowError):
            return (
                f"Stage {stage} failed at checkpoint {written[-1].name}: {error} The partial checkpoint was removed "
                f"and {_last_good(checkpoints)}. {_fix_row(run_dir)}"
            )
        if not disk_full:  # saving or scoring the checkpoint failed for a reason of its own: name it
            return (
                f"Stage {stage} failed at checkpoint {written[-1].name} ({type(error).__name__}: {error}, at "
                f"{where(error)}); not a full disk ({free:.1f} GiB free). The partial checkpoint was removed and "
                f"{_last_good(checkpoints)}. The traceback is in {run_dir}/logs/train.log."
            )
        return (
            f"Writing checkpoint {written[-1].name} of stage {stage} failed: no space ({error}); "
            f"{free:.1f} GiB are free in {checkpoints}. The partial checkpoint was removed and "
            f"{_last_good(checkpoints)}. Free disk space (or lower checkpoint.keep_last), then "
            f"`rlctl resume {run_dir}`."
        )
    if isinstance(error, DataRowError):
        return f"{error} Stage {stage} stopped; {_last_good(checkpoints)}. {_fix_row(run_dir)}"
    if disk_full:
        return (
            f"The disk is full: stage {stage} could not write ({error}). {_last_good(checkpoints)}. Free disk space "
            f"where {run_dir} lives, then `rlctl resume {run_dir}`."
        )
    return None


def read_only(error: OSError, stage: str, checkpoints: Path, run_dir: Path, is_main: bool) -> str:
    """The paragraph of a write the run directory refused (its folder made read-only, its permissions changed, a
    filesystem remounted read-only): what could not be written, the last complete checkpoint, and the resume. What
    was partly written is removed where it can be (the folder may refuse that too)."""
    if is_main:
        with contextlib.suppress(OSError):
            checkpoint.drop_partial(checkpoints)
    what = f" {error.filename}" if error.filename else ""
    cause = os.strerror(error.errno) if error.errno else str(error)
    return (
        f"Stage {stage} could not write{what} ({cause}): the run directory, or a folder in it, is no longer "
        f"writable (read-only, or its permissions changed). {_capital(_last_good(checkpoints))}. Make "
        f"{run_dir} writable again, then `rlctl resume {run_dir}`."
    )


def _generator_memory(plan, error: GeneratorFailed) -> str:
    """For an engine out of memory: what the plan gave the generator side, and the settings that need less."""
    if error.kind not in ("OutOfMemoryError", "MemoryError"):
        return ""
    split = plan.async_split
    size = (
        f" (the plan gave each engine {split.generator_gib_per_gpu} GiB per GPU)" if split.generator_gib_per_gpu else ""
    )
    return (
        f" The engine ran out of memory{size}: lower rl.max_new_tokens or rl.prompts_per_step x rl.group_size, or "
        "spread the rounds over more engines (rl.async_rollout.generators)."
    )


def unexpected(error: BaseException, run_dir: Path, stage: str, log: Path) -> str:
    """One paragraph for a fault rlctl has no explanation of: the stage, the exception and its message, where it
    was raised, and where the full traceback is."""
    text = " ".join(str(error).split())
    text = text if len(text) <= 400 else text[:400] + " ..."
    return (
        f"Stage {stage} failed: {type(error).__name__}{': ' + text if text else ''} (raised at {where(error)}). "
        f"The full traceback is in {log}. After fixing the cause: `rlctl resume {run_dir}`."
    )


def _fix_row(run_dir: Path) -> str:
    return f"Fix or remove that row, then `rlctl resume {run_dir}`."


def _zero_on_error(plan) -> str:
    """The `--set rl.rewards=...` that resume accepts to score failing completions 0 (on_error: zero)."""
    specs = [
        "{"
        + f"name: '{r.name}', weight: {r.weight:g}, on_error: zero"
        + ("" if r.correctness is None else f", correctness: {str(r.correctness).lower()}")
        + "}"
        for r in plan.config.rl.rewards
    ]
    return f' --set "rl.rewards=[{", ".join(specs)}]"'


def out_of_memory(error: BaseException, plan, stage: str, measured: str = "") -> str:
    """The OOM report: the plan's memory numbers for this stage, the peaks measured so far, and the nearest
    settings that need less."""
    from rlctl.plan import memory

    sp = next(s for s in plan.stages if s.name == stage)
    mem = plan.memory
    numbers = (
        f"the plan expected a peak of {mem.peak_gib} GiB per {'GPU' if mem.device == 'gpu' else 'process'} "
        f"({mem.peak_phase}) within a budget of {mem.budget_gib} GiB, {mem.headroom_gib} GiB headroom"
        if mem is not None
        else "the plan had no memory estimate (model.arch is not set)"
    )
    numbers += measured
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


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]

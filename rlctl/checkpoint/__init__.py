"""Checkpoints: trainers write into `checkpoints/.incoming`; a checkpoint is marked complete (with its held-out
metric and every file's size and checksum, see `integrity`) and renamed into `checkpoints/` only once fully
written, so a crash or a full disk mid-write never leaves a checkpoint that resume would trust, and a checkpoint
damaged later is recognised. Retention keeps the last `checkpoint.keep_last` plus the best one.

Package `rlctl.checkpoint`: the checkpoint protocol (this module), the checks that a checkpoint or model folder
is intact (`integrity`, applied to a run's checkpoints by `verify`), and the runtime faults explained to the
user (`faults`).
May import: base, vision, config, sandbox, rundir, data, rewards, plan, algorithms.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from rlctl.checkpoint import integrity
from rlctl.rundir import COMPLETE, CheckpointMark, checkpoint, checkpoint_step, incoming, read_record, write_record
from rlctl.rundir.paths import CHECKPOINT_PREFIX

METRIC = "eval_accuracy"  # the held-out metric a checkpoint is marked with, for keep-best


def _step(p: Path) -> int:
    return checkpoint_step(p)  # type: ignore[return-value]


def publish(folder: Path, step: int, value: float | None, keep_last: int, keep_best: bool) -> Path:
    """Mark `.incoming/checkpoint-STEP` complete (recording its held-out METRIC's `value`, when measured, and its
    files' manifest), rename it into `folder`, and remove complete checkpoints that are neither among the last
    `keep_last` nor (with `keep_best`) the best."""
    src = checkpoint(incoming(folder), step)
    files = integrity.manifest(src, skip=(COMPLETE,))
    metric = METRIC if value is not None else None
    write_record(src / COMPLETE, CheckpointMark(step, metric, value, integrity.SCHEME, files), indent=None)
    dst = folder / src.name
    if dst.exists():  # the same step saved again (a resume that re-reached it): the new one replaces it
        shutil.rmtree(dst)
    os.replace(src, dst)
    with contextlib.suppress(OSError):  # empty now, unless a trainer keeps other files there
        incoming(folder).rmdir()
    kept = set(complete_checkpoints(folder)[-keep_last:])
    if keep_best and (top := best(folder)):
        kept.add(top)
    for old in complete_checkpoints(folder):
        if old not in kept:
            shutil.rmtree(old, ignore_errors=True)
    return dst


def mark(ckpt: Path) -> CheckpointMark:
    """A complete checkpoint's marker: its step, its held-out metric and value when measured, its files' manifest.
    Raises DamagedFile when it cannot be read."""
    path = ckpt / COMPLETE
    works = "The other checkpoints still work; `rlctl verify` checks them all."
    return read_record(path, CheckpointMark.from_json, works)


def complete_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints in `folder`, oldest first."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and _step(p) is not None and (p / COMPLETE).exists()]
    return sorted(found, key=_step)


def last_complete(folder: Path) -> Path | None:
    ckpts = complete_checkpoints(folder)
    return ckpts[-1] if ckpts else None


def best(folder: Path) -> Path | None:
    """The complete checkpoint with the highest held-out value (the later one on a tie); None when none has one."""
    scored = [(m.value, _step(c), c) for c in complete_checkpoints(folder) if (m := mark(c)).value is not None]
    return max(scored)[2] if scored else None


def drop_partial(folder: Path) -> list[Path]:
    """Delete what a crash or a failed write left unfinished; returns what was removed."""
    if not folder.is_dir():
        return []
    partial = [p for p in folder.iterdir() if p.is_dir() and _step(p) is not None and not (p / COMPLETE).exists()]
    partial += being_written(folder)
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return partial


def being_written(folder: Path) -> list[Path]:
    """Checkpoints still in `.incoming`: non-empty only while a write is under way, or after it failed."""
    return sorted(incoming(folder).glob(f"{CHECKPOINT_PREFIX}*")) if incoming(folder).is_dir() else []

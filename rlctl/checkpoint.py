"""Checkpoints: a checkpoint counts only once it is complete (marked after the trainer finished writing it)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

COMPLETE = "rlctl_complete"
_STEP = re.compile(r"^checkpoint-(\d+)$")


def mark_complete(ckpt: Path) -> None:
    (ckpt / COMPLETE).write_text("ok\n")


def complete_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints in `folder`, oldest first."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and _STEP.match(p.name) and (p / COMPLETE).exists()]
    return sorted(found, key=lambda p: int(_STEP.match(p.name)[1]))


def last_complete(folder: Path) -> Path | None:
    ckpts = complete_checkpoints(folder)
    return ckpts[-1] if ckpts else None


def drop_partial(folder: Path) -> list[Path]:
    """Delete checkpoints a crash left half-written; returns what was removed."""
    if not folder.is_dir():
        return []
    partial = [p for p in folder.iterdir() if p.is_dir() and _STEP.match(p.name) and not (p / COMPLETE).exists()]
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return partial


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)

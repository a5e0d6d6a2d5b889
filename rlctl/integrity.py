"""Checkpoints and model folders that prove themselves, without torch and without loading them on a GPU.

A checkpoint's completion marker records every file's size and an xxh3-128 checksum (`manifest`): files up to
FULL_HASH_BYTES are hashed whole; larger ones (weights, optimizer states) by their size, their safetensors header
and SAMPLED_BLOCKS blocks spread over the file, because hashing a 7B checkpoint whole (~100 GB with the optimizer)
would cost far more than 5% of writing it (bench/checksum_cost.py). On top of the manifest, every file is checked
for what its format makes checkable: a safetensors header that parses and accounts for the file's size, a zip
(torch.save) archive that has its central directory, JSON that parses.

`rlctl resume` verifies the newest checkpoint of each unfinished stage and falls back to the newest intact one
(`resume_check`); `rlctl verify RUN` checks every checkpoint, final folder and export of a run (`verify_run`).
"""

from __future__ import annotations

import json
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl import checkpoint
from rlctl.errors import UserError

FULL_HASH_BYTES = 64 << 20  # files up to this size are hashed whole
SAMPLED_BLOCKS = 16  # larger files: this many 1 MiB blocks spread evenly, plus the first and the last one
BLOCK = 1 << 20
SCHEME = "xxh3-128; whole up to 64 MiB, else size + safetensors header + 18 sampled 1 MiB blocks"
DAMAGED = ".damaged"  # suffix of a checkpoint folder set aside by a resume


def _hasher():
    import xxhash  # installed with datasets

    return xxhash.xxh3_128()


def _safetensors_header(f, size: int) -> tuple[int, dict[str, Any]]:
    """(header length, header) of an open safetensors file; ValueError when it cannot be one."""
    if size < 8:
        raise ValueError(f"{size} bytes, too short for a safetensors header")
    (length,) = struct.unpack("<Q", f.read(8))
    if length > min(size - 8, 100 << 20):
        raise ValueError(f"its header claims {length} bytes, the file has {size}")
    try:
        return length, json.loads(f.read(length))
    except ValueError as e:
        raise ValueError(f"its header is not valid JSON ({e})") from None


def file_entry(path: Path) -> dict[str, Any]:
    """{size, xxh3} of one file (a sampled checksum for files over FULL_HASH_BYTES: `sampled: true`)."""
    size = path.stat().st_size
    h = _hasher()
    with path.open("rb") as f:
        if size <= FULL_HASH_BYTES:
            while chunk := f.read(BLOCK * 8):
                h.update(chunk)
            return {"size": size, "xxh3": h.hexdigest()}
        head = 0
        if path.suffix == ".safetensors":
            try:
                head = 8 + _safetensors_header(f, size)[0]
            except (ValueError, struct.error):
                head = 0
        f.seek(0)
        h.update(f.read(head))
        step = (size - BLOCK) // (SAMPLED_BLOCKS + 1)
        for offset in [head, *(step * i for i in range(1, SAMPLED_BLOCKS + 1)), size - BLOCK]:
            f.seek(offset)
            h.update(f.read(BLOCK))
        h.update(str(size).encode())
    return {"size": size, "xxh3": h.hexdigest(), "sampled": True}


def manifest(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """{relative path: file_entry} of every file under `folder` but `skip`."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in skip)
    return {p.relative_to(folder).as_posix(): file_entry(p) for p in files}


def format_problem(path: Path) -> str | None:
    """What is wrong with a file by its own format (None when nothing, or nothing checkable): a truncated
    safetensors file, a torch.save archive without its central directory, JSON that does not parse."""
    size = path.stat().st_size
    try:
        if path.suffix == ".safetensors":
            with path.open("rb") as f:
                length, header = _safetensors_header(f, size)
            ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
            expected = 8 + length + max(ends, default=0)
            if expected != size:
                return f"{path.name} is {size:,} bytes; its header describes {expected:,}"
        elif path.suffix in (".pt", ".pth", ".bin") and size > 0 and not zipfile.is_zipfile(path):
            return f"{path.name} is not a complete torch.save archive (no zip central directory)"
        elif path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, KeyError, TypeError, IndexError, struct.error, UnicodeDecodeError) as e:
        return f"{path.name}: {e}"
    return None


def folder_problems(folder: Path, recorded: dict[str, dict[str, Any]] | None) -> list[str]:
    """Every problem of a checkpoint or model folder: files missing, resized or changed against `recorded` (a
    manifest; None when the folder has none), and files broken by their own format."""
    problems: dict[str, str] = {}
    for rel, want in (recorded or {}).items():
        path = folder / rel
        if not path.is_file():
            problems[rel] = f"{rel} is missing"
            continue
        size = path.stat().st_size
        if size != want["size"]:
            problems[rel] = f"{rel} is {size:,} bytes, the marker recorded {want['size']:,}"
        elif file_entry(path)["xxh3"] != want["xxh3"]:
            problems[rel] = f"{rel} changed since it was written (checksum differs)"
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel not in problems and (why := format_problem(path)):
            problems[rel] = why if "/" not in rel else f"{path.parent.relative_to(folder)}/{why}"
    found = list(problems.values())
    index = folder / "model.safetensors.index.json"
    if index.is_file() and not format_problem(index):
        shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        found += [f"{s} is missing (named in {index.name})" for s in shards if not (folder / s).is_file()]
    return found


def checkpoint_problems(ckpt: Path) -> list[str]:
    """Problems of a complete checkpoint against the manifest in its completion marker."""
    try:
        marker = json.loads((ckpt / checkpoint.COMPLETE).read_text())
    except (OSError, ValueError) as e:
        return [f"its completion marker cannot be read ({e})"]
    return folder_problems(ckpt, marker.get("files"))


@dataclass
class ResumeChoice:
    """Where a stage resumes: `intact` (None: from its start) and the newer checkpoints found `damaged`."""

    stage: str
    intact: Path | None
    damaged: list[tuple[Path, list[str]]] = field(default_factory=list)


def choose(stage: str, folder: Path) -> ResumeChoice:
    """The newest intact complete checkpoint of `folder` and the damaged ones newer than it."""
    choice = ResumeChoice(stage, None)
    for ckpt in reversed(checkpoint.complete_checkpoints(folder)):
        problems = checkpoint_problems(ckpt)
        if not problems:
            choice.intact = ckpt
            break
        choice.damaged.append((ckpt, problems))
    return choice


def _listed(damaged: list[tuple[Path, list[str]]]) -> str:
    return "; ".join(f"{c.name}: {', '.join(p)}" for c, p in damaged)


def resume_check(run_dir: Path, stages: list[str]) -> list[str]:
    """Before a resume: verify each unfinished stage's checkpoints, newest first. Damaged ones newer than the
    newest intact checkpoint are set aside (renamed CHECKPOINT.damaged, so the trainer resumes from the intact
    one and retention never counts them); returns one line per stage saying which and why. A stage whose
    checkpoints are all damaged raises a UserError naming the files (nothing is renamed then). Stages that
    summary.json lists as completed are not looked at."""
    summary = run_dir / "summary.json"
    completed = json.loads(summary.read_text()).get("completed", []) if summary.is_file() else []
    notes = []
    for stage in (s for s in stages if s not in completed):
        choice = choose(stage, run_dir / stage / "checkpoints")
        if not choice.damaged:
            continue
        if choice.intact is None:
            raise UserError(
                f"Every checkpoint of stage {stage} in {run_dir / stage / 'checkpoints'} is damaged "
                f"({_listed(choice.damaged)}). Restore them from a copy, or delete that folder to restart the stage "
                f"from its start, then `rlctl resume {run_dir}`."
            )
        for ckpt, _ in choice.damaged:
            aside = ckpt.with_name(ckpt.name + DAMAGED)
            if aside.exists():
                import shutil

                shutil.rmtree(aside)
            ckpt.rename(aside)
        names = ", ".join(c.name for c, _ in choice.damaged)
        notes.append(
            f"stage {stage}: {names} is damaged ({_listed(choice.damaged)}); resuming from {choice.intact.name}, the "
            f"newest intact checkpoint. The damaged copy is kept as {names.split(', ')[0]}{DAMAGED} for inspection."
        )
    return notes


def verify_run(run_dir: Path) -> list[tuple[str, list[str]]]:
    """(folder relative to the run, its problems) for every complete checkpoint, final folder and export of a
    run, in run order; an empty problem list means intact."""
    out = []
    for stage_dir in sorted(p for p in run_dir.iterdir() if (p / "checkpoints").is_dir() or (p / "final").is_dir()):
        for ckpt in checkpoint.complete_checkpoints(stage_dir / "checkpoints"):
            out.append((str(ckpt.relative_to(run_dir)), checkpoint_problems(ckpt)))
        if (stage_dir / "final").is_dir():
            out.append((str((stage_dir / "final").relative_to(run_dir)), folder_problems(stage_dir / "final", None)))
    for export in sorted(p.parent for p in run_dir.glob("export*/config.json")):
        out.append((str(export.relative_to(run_dir)), folder_problems(export, None)))
    return out

"""Files that prove themselves, without torch and without loading them on a GPU.

A checkpoint's completion marker records every file's size and an xxh3-128 checksum (`manifest`): files up to
FULL_HASH_BYTES are hashed whole; larger ones (weights, optimizer states) by their size, their safetensors header
and SAMPLED_BLOCKS blocks spread over the file, because hashing a 7B checkpoint whole (~100 GB with the optimizer)
would cost far more than 5% of writing it (bench/checksum_cost.py). On top of the manifest, every file is checked
for what its format makes checkable: a safetensors header that parses and accounts for the file's size, a zip
(torch.save) archive that has its central directory, JSON that parses.

`verify` applies these checks to a run's checkpoints (the resume fallback, `rlctl verify`).
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path
from typing import Any

from rlctl import strictjson
from rlctl.rundir import FileEntry

FULL_HASH_BYTES = 64 << 20  # files up to this size are hashed whole
SAMPLED_BLOCKS = 16  # larger files: this many 1 MiB blocks spread evenly, plus the first and the last one
BLOCK = 1 << 20
JSON_BYTES = 1 << 30  # the largest JSON file of a model folder read to check it parses (tokenizer.json: tens of MB)
SCHEME = "xxh3-128; whole up to 64 MiB, else size + safetensors header + 18 sampled 1 MiB blocks"


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


def file_entry(path: Path) -> FileEntry:
    """The size and checksum of one file (a sampled checksum for files over FULL_HASH_BYTES)."""
    size = path.stat().st_size
    h = _hasher()
    with path.open("rb") as f:
        if size <= FULL_HASH_BYTES:
            while chunk := f.read(BLOCK * 8):
                h.update(chunk)
            return FileEntry(size, h.hexdigest())
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
    return FileEntry(size, h.hexdigest(), sampled=True)


def manifest(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, FileEntry]:
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
            json.loads(strictjson.bounded(path, JSON_BYTES).decode("utf-8"))
    except (ValueError, KeyError, TypeError, IndexError, struct.error, UnicodeDecodeError) as e:
        return f"{path.name}: {e}"
    return None


def folder_problems(folder: Path, recorded: dict[str, FileEntry] | None) -> list[str]:
    """Every problem of a checkpoint or model folder: files missing, resized or changed against `recorded` (a
    manifest; None when the folder has none), and files broken by their own format."""
    problems: dict[str, str] = {}
    for rel, want in (recorded or {}).items():
        path = folder / rel
        if not path.is_file():
            problems[rel] = f"{rel} is missing"
            continue
        size = path.stat().st_size
        if size != want.size:
            problems[rel] = f"{rel} is {size:,} bytes, the marker recorded {want.size:,}"
        elif file_entry(path).xxh3 != want.xxh3:
            problems[rel] = f"{rel} changed since it was written (checksum differs)"
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel not in problems and (why := format_problem(path)):
            problems[rel] = why if "/" not in rel else f"{path.parent.relative_to(folder)}/{why}"
    found = list(problems.values())
    index = folder / "model.safetensors.index.json"
    if index.is_file() and not format_problem(index):
        shards = sorted(set(json.loads(strictjson.bounded(index, JSON_BYTES)).get("weight_map", {}).values()))
        found += [f"{s} is missing (named in {index.name})" for s in shards if not (folder / s).is_file()]
    return found

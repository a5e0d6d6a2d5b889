"""What a checkpoint's checksums cost next to writing it: a GIB-sized dummy file (default 3 GiB) is written
(64 MiB chunks, fsync) and then hashed with xxh3-128 (whole file), blake2b (whole file) and rlctl's scheme
(rlctl.checkpoint.integrity: whole files up to FULL_HASH_BYTES, larger ones by size, the safetensors header and sampled
blocks). Prints seconds and GiB/s of each and the hash time as a share of the write time.

Usage: python bench/checksum_cost.py [--gib 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import tempfile
import time
from pathlib import Path

import xxhash

from rlctl.checkpoint import integrity

CHUNK = 64 << 20


def write(path: Path, gib: float) -> float:
    """Seconds to write `gib` GiB of (incompressible) bytes behind a safetensors-like header, fsync included."""
    header = json.dumps({"w": {"dtype": "BF16", "shape": [int(gib * (1 << 29))], "data_offsets": [0, 0]}}).encode()
    block = os.urandom(CHUNK)
    total = int(gib * (1 << 30))
    start = time.perf_counter()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        done = 0
        while done < total:
            f.write(block[: min(CHUNK, total - done)])
            done += CHUNK
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - start


def whole(path: Path, make) -> float:
    h, start = make(), time.perf_counter()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    h.hexdigest()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=3.0)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    path = Path(args.dir) / "rlctl-checksum-bench.safetensors"
    try:
        w = write(path, args.gib)
        size = path.stat().st_size / (1 << 30)
        rows = [("write + fsync", w)]
        rows.append(("xxh3-128, whole file", whole(path, xxhash.xxh3_128)))
        rows.append(("blake2b, whole file", whole(path, hashlib.blake2b)))
        start = time.perf_counter()
        integrity.file_entry(path)
        rows.append(("rlctl scheme (size, header, sampled blocks)", time.perf_counter() - start))
        print(f"file: {path} ({size:.2f} GiB)")
        for name, seconds in rows:
            share = "" if name.startswith("write") else f"  {100 * seconds / w:6.2f}% of the write"
            print(f"{name:45s} {seconds:8.3f} s  {size / seconds:8.2f} GiB/s{share}")
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()

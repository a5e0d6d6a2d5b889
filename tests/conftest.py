"""Fixtures: one tiny-demo run shared by several tests. Plain helpers are in tests/helpers.py.

The suite runs in two pytest-xdist workers (`make test`: `-n 2 --dist loadfile`, one file per worker at a time), so
every process, the tests' own and the `rlctl` runs they start, computes on one thread: two workers then keep the two
cores busy without contending for them, and a run killed and resumed computes on the same thread count as the run it
is compared with (a different count changes float sums, and bit-exact resume compares them bit for bit)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before any test module imports torch

from pathlib import Path

import pytest
from filelock import FileLock

from tests.helpers import rlctl, strict_records


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """The full tiny demo (SFT -> RM -> GRPO), run once for the whole test run: under xdist the first worker to
    need it trains it in the folder the workers share, the other waits on the lock and reads the same run."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    run_dir = shared / "demo" / "run"
    with FileLock(str(shared / "demo.lock")):
        if not (run_dir / "summary.json").exists():
            proc = rlctl("train", "--preset", "tiny-demo", "--run-dir", str(run_dir))
            assert proc.returncode == 0, proc.stdout + proc.stderr
    strict_records(run_dir)
    return run_dir

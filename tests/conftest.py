"""Fixtures: one tiny-demo run shared by several tests. Plain helpers are in tests/helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import rlctl, strict_records


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """The full tiny demo (SFT -> RM -> GRPO), run once for the session."""
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    proc = rlctl("train", "--preset", "tiny-demo", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    strict_records(run_dir)
    return run_dir

"""Shared helpers: run the real `rlctl` CLI in a subprocess, and one tiny-demo run shared by several tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RLCTL = shutil.which("rlctl", path=str(Path(sys.executable).parent)) or "rlctl"


def rlctl(*args: str, cwd: Path | None = None, timeout: float = 1800, env: dict | None = None):
    """`rlctl ARGS` as a user would type it; returns the CompletedProcess (text output)."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([RLCTL, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


def strict_records(run_dir: Path) -> list[dict]:
    """metrics.jsonl as a strict JSON reader sees it (NaN and Infinity refused); every line must parse."""
    from rlctl import strictjson

    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [strictjson.loads(line) for line in lines if line.strip()]


def summary(run_dir: Path) -> dict:
    """summary.json of a run; its metrics.jsonl and summary.json must be strict JSON too."""
    from rlctl import strictjson

    strict_records(run_dir)
    return strictjson.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """The full tiny demo (SFT -> RM -> GRPO), run once for the session."""
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    proc = rlctl("train", "--preset", "tiny-demo", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    strict_records(run_dir)
    return run_dir

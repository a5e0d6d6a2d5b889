"""Exact resume: a run killed with kill -9 in every stage and resumed each time ends with the same weights,
bit for bit, as an uninterrupted run with the same seed (no step trained twice or skipped)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import RLCTL, rlctl, summary

pytestmark = pytest.mark.slow

ARGS = [
    "--preset",
    "tiny-demo",
    "--set",
    "sft.max_steps=30",
    "--set",
    "sft.save_every=10",
    "--set",
    "rm.max_steps=12",
    "--set",
    "rm.save_every=4",
    "--set",
    "rl.max_steps=12",
    "--set",
    "rl.save_every=4",
    "--set",
    "rl.eval_samples=20",
    "--set",
    "rm.eval_samples=20",
]
STAGES = {"sft": 10, "rm": 4, "rl": 4}  # save_every of each stage


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _kill_after_checkpoint(run_dir: Path, cmd: list[str], stage: str, every: int) -> None:
    """Start `cmd`, wait until `stage` has a complete checkpoint and has trained past it, then kill -9 it all."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 400
        while time.time() < deadline:
            steps = [r["step"] for r in _records(run_dir) if r.get("stage") == stage and "step" in r]
            done = list((run_dir / stage / "checkpoints").glob("checkpoint-*/rlctl_complete"))
            if done and steps and steps[-1] % every != 0 and steps[-1] > every:
                break
            assert proc.poll() is None, f"the run ended before {stage} could be interrupted"
            time.sleep(0.05)
        else:
            raise AssertionError(f"{stage} never reached a checkpoint")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_kill_9_in_every_stage_resumes_bit_exact(tmp_path: Path):
    straight = tmp_path / "straight"
    proc = rlctl("train", *ARGS, "--run-dir", str(straight))
    assert proc.returncode == 0, proc.stdout + proc.stderr

    broken = tmp_path / "broken"
    _kill_after_checkpoint(broken, [RLCTL, "train", *ARGS, "--run-dir", str(broken)], "sft", STAGES["sft"])
    for stage in ("rm", "rl"):
        _kill_after_checkpoint(broken, [RLCTL, "resume", str(broken)], stage, STAGES[stage])
    proc = rlctl("resume", str(broken))
    assert proc.returncode == 0, proc.stdout + proc.stderr

    starts = [r["stage"] for r in _records(broken) if r.get("event") == "start"]
    assert starts == ["sft", "sft", "rm", "rm", "rl", "rl"], starts
    for stage in STAGES:
        a, b = _weights(straight / stage / "final"), _weights(broken / stage / "final")
        assert a.keys() == b.keys()
        diff = max(float((a[k] - b[k]).abs().max()) for k in a)
        assert diff == 0.0, f"{stage}: max abs weight difference {diff}"
    # the step counter continued: every step logged once after the last resume point, ending at max_steps
    for stage, last in (("sft", 30), ("rm", 12), ("rl", 12)):
        assert [r["step"] for r in _records(broken) if r.get("stage") == stage and "step" in r][-1] == last
    final = summary(broken)
    assert final["stages"].keys() == summary(straight)["stages"].keys()
    again = rlctl("resume", str(broken))
    assert again.returncode == 0 and summary(broken) == final, "a finished run has nothing left to do"

"""Exact resume: a run killed with kill -9 in every stage and resumed each time ends with the same weights,
bit for bit, as an uninterrupted run with the same seed (no step trained twice or skipped)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import RLCTL, kill_after_checkpoint, records, rlctl, summary

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


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_kill_9_in_every_stage_resumes_bit_exact(tmp_path: Path):
    straight = tmp_path / "straight"
    proc = rlctl("train", *ARGS, "--run-dir", str(straight))
    assert proc.returncode == 0, proc.stdout + proc.stderr

    broken = tmp_path / "broken"
    kill_after_checkpoint(broken, [RLCTL, "train", *ARGS, "--run-dir", str(broken)], "sft", STAGES["sft"])
    for stage in ("rm", "rl"):
        kill_after_checkpoint(broken, [RLCTL, "resume", str(broken)], stage, STAGES[stage])
    proc = rlctl("resume", str(broken))
    assert proc.returncode == 0, proc.stdout + proc.stderr

    starts = [r["stage"] for r in records(broken) if r.get("event") == "start"]
    assert starts == ["sft", "sft", "rm", "rm", "rl", "rl"], starts
    for stage in STAGES:
        a, b = _weights(straight / stage / "final"), _weights(broken / stage / "final")
        assert a.keys() == b.keys()
        diff = max(float((a[k] - b[k]).abs().max()) for k in a)
        assert diff == 0.0, f"{stage}: max abs weight difference {diff}"
    # the step counter continued: every step logged once after the last resume point, ending at max_steps
    for stage, last in (("sft", 30), ("rm", 12), ("rl", 12)):
        assert [r["step"] for r in records(broken) if r.get("stage") == stage and "step" in r][-1] == last
    final = summary(broken)
    assert final["stages"].keys() == summary(straight)["stages"].keys()
    again = rlctl("resume", str(broken))
    assert again.returncode == 0 and summary(broken) == final, "a finished run has nothing left to do"

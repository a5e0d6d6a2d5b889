"""Nothing fails silently, end to end on the tiny demo: a damaged newest checkpoint (resume falls back to the
previous one and ends bit-identical to the uninterrupted run), a reward that hangs (stopped at its deadline, or
scored 0 and counted), a reward that returns strings or NaN, and a constant reward (the identical-rewards alarm)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import rlctl, strict_records, summary

pytestmark = pytest.mark.slow

SFT_ONLY = [
    "--preset", "tiny-demo", "--set", "stages=[sft]", "--set", "sft.max_steps=6", "--set", "sft.save_every=2",
    "--set", "checkpoint.keep_best=false", "--set", "rl.eval_samples=8",
]  # fmt: skip
RL_ONLY = [
    "--preset", "tiny-demo", "--set", "stages=[rl]", "--set", "rl.max_steps=2", "--set", "rl.prompts_per_step=4",
    "--set", "rl.group_size=4", "--set", "rl.eval_samples=8", "--set", "checkpoint.keep_best=false",
]  # fmt: skip

PLUGIN = """
import math, time

# The plan's dry run scores the ground truth as the completion; the tiny random model practically never writes it.
def sleepy(prompts, completions, answer, **_):
    if any(c.strip() != a for c, a in zip(completions, answer)):
        time.sleep(30)
    return [0.0] * len(completions)

def constant(prompts, completions, **_):
    return [0.5] * len(completions)

def words(prompts, completions, **_):
    return ["good"] * len(completions)

def nan(prompts, completions, answer, **_):
    return [1.0 if c.strip() == a else math.nan for c, a in zip(completions, answer)]
"""


def _one_line(proc) -> str:
    return " ".join((proc.stdout + proc.stderr).split())


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    path = tmp_path / "plug.py"
    path.write_text(PLUGIN)
    return path


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_a_damaged_newest_checkpoint_resumes_from_the_previous_one_bit_exact(tmp_path: Path):
    run_dir = tmp_path / "run"
    proc = rlctl("train", *SFT_ONLY, "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    straight = _weights(run_dir / "sft" / "final")
    # as left by a run killed after checkpoint-6 was complete, before the stage's final save; then the newest
    # checkpoint breaks (a copy cut short)
    state = summary(run_dir)
    state["completed"], state["stages"] = [], {k: v for k, v in state["stages"].items() if k != "sft"}
    (run_dir / "summary.json").write_text(json.dumps(state))
    shutil.rmtree(run_dir / "sft" / "final")
    weights = run_dir / "sft" / "checkpoints" / "checkpoint-6" / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])

    check = rlctl("verify", str(run_dir))
    assert check.returncode == 1 and "checkpoint-6: damaged" in check.stdout, check.stdout
    proc = rlctl("resume", str(run_dir))
    text = _one_line(proc)
    assert proc.returncode == 0, text
    assert f"checkpoint-6 is damaged (checkpoint-6: model.safetensors is {size // 2:,} bytes, the marker" in text
    assert "resuming from checkpoint-4, the newest intact checkpoint" in text
    steps = [r["step"] for r in strict_records(run_dir) if r.get("stage") == "sft" and "loss" in r]
    assert steps[-2:] == [5, 6]
    resumed = _weights(run_dir / "sft" / "final")
    assert max(float((straight[k] - resumed[k]).abs().max()) for k in straight) == 0.0
    assert rlctl("verify", str(run_dir)).returncode == 0


def test_a_hanging_reward_stops_the_run_naming_it(tmp_path: Path, plugin: Path):
    run_dir = tmp_path / "run"
    reward = f"rl.rewards=[{{name: '{plugin}:sleepy', timeout_s: 2}}]"
    proc = rlctl("train", *RL_ONLY, "--set", reward, "--run-dir", str(run_dir))
    text = _one_line(proc)
    assert proc.returncode == 1, text
    assert f"Reward '{plugin}:sleepy' did not return within its timeout_s=2 s on a batch of 8 completions" in text
    assert "slow reward" in text and "Traceback" not in proc.stdout
    strict_records(run_dir)


def test_timed_out_rewards_scored_zero_and_a_constant_reward_raises_the_alarm(tmp_path: Path, plugin: Path):
    run_dir = tmp_path / "run"
    rewards = f"rl.rewards=[{{name: '{plugin}:sleepy', timeout_s: 1, on_error: zero}}, {{name: '{plugin}:constant'}}]"
    sets = ["--set", rewards, "--set", "logging.alarm_steps=2"]
    proc = rlctl("train", *RL_ONLY, *sets, "--run-dir", str(run_dir))
    text = _one_line(proc)
    assert proc.returncode == 0, text
    records = strict_records(run_dir)
    counts = [r["reward_errors"] for r in records if r.get("stage") == "rl" and "reward_errors" in r]
    assert counts and counts[-1] >= 16, counts  # two batches of 16 completions
    alarms = {r["alarm"] for r in records if r.get("event") == "alarm"}
    assert "identical_rewards" in alarms, alarms
    assert "alarm (rl, step 2): Every group of completions has had identical rewards" in text
    assert "Likely cause: a reward that is constant or broken" in text
    report = rlctl("report", str(run_dir))
    assert report.returncode == 0 and "identical_rewards" in (run_dir / "report" / "report.md").read_text()


def test_string_and_nan_rewards(tmp_path: Path, plugin: Path):
    words = f"rl.rewards=[{{name: '{plugin}:words'}}]"
    proc = rlctl("train", *RL_ONLY, "--set", words, "--run-dir", str(tmp_path / "a"))
    text = _one_line(proc)
    assert proc.returncode == 2, text
    assert f"Reward '{plugin}:words' must return one finite number or None per completion (4)" in text
    assert "it returned 'good' (a str) for completion 1" in text
    assert "Traceback" not in text and not (tmp_path / "a" / "config.yaml").exists()

    run_dir = tmp_path / "b"
    reward = f"rl.rewards=[{{name: '{plugin}:nan', on_error: zero}}]"
    proc = rlctl("train", *RL_ONLY, "--set", reward, "--run-dir", str(run_dir))
    text = _one_line(proc)
    assert proc.returncode == 1, text
    assert "Every reward returned NaN/inf for all 8 completions of a batch" in text and "Done" not in text
    strict_records(run_dir)

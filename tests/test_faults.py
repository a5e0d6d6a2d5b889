"""Runtime faults end to end through `rlctl train`: a disk that fills during a checkpoint write, a reward
plugin that raises (on_error raise / zero), out of memory, and over-long RL prompts (drop / refuse)."""

from __future__ import annotations

import json
from pathlib import Path

from rlctl import checkpoint
from tests.helpers import injected, rlctl, strict_records, summary

SFT_ONLY = ["--preset", "tiny-demo", "--set", "stages=[sft]", "--set", "sft.max_steps=6", "--set", "sft.save_every=2"]
RL_ONLY = [
    "--preset",
    "tiny-demo",
    "--set",
    "stages=[rl]",
    "--set",
    "rl.max_steps=2",
    "--set",
    "rl.prompts_per_step=4",
    "--set",
    "rl.group_size=4",
    "--set",
    "rl.eval_samples=20",
    "--set",
    "rl.rewards=[{name: exact_match}]",
]

# Loaded by every Python process of the run (PYTHONPATH): once the trainer creates the folder of checkpoint N
# or later, any file it writes beyond 1 MiB fails with EFBIG, as writes fail on a full disk (the tiny model's
# weights alone are 2.5 MB). Nothing in rlctl or its libraries is patched.
FULL_DISK = """
import os, resource, signal, sys

def _hook(event, args):
    if event != "os.mkdir" or "/.incoming/checkpoint-" not in str(args[0]):
        return
    step = str(args[0]).rstrip("/").rsplit("-", 1)[-1]
    if step.isdigit() and int(step) >= int(os.environ["RLCTL_TEST_DISK_FULL_AT"]):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))

sys.addaudithook(_hook)
"""


def _records(run_dir: Path) -> list[dict]:
    return strict_records(run_dir)


def _one_line(proc) -> str:
    return " ".join((proc.stdout + proc.stderr).split())


def test_full_disk_during_a_checkpoint_keeps_the_previous_one_and_resume_finishes(tmp_path: Path):
    injection = injected(tmp_path, FULL_DISK)
    run_dir = tmp_path / "run"
    env = {**injection, "RLCTL_TEST_DISK_FULL_AT": "4"}
    proc = rlctl("train", *SFT_ONLY, "--run-dir", str(run_dir), env=env)
    text = _one_line(proc)
    assert proc.returncode == 1, text
    assert "Writing checkpoint checkpoint-4 of stage sft failed" in text and "File too large" in text
    assert "the last complete checkpoint, checkpoint-2, is intact" in text and f"rlctl resume {run_dir}" in text
    ckpts = run_dir / "sft" / "checkpoints"
    assert [p.name for p in checkpoint.complete_checkpoints(ckpts)] == ["checkpoint-2"]
    assert checkpoint.being_written(ckpts) == [], "the partial checkpoint is removed"
    assert "Traceback" not in proc.stdout

    proc = rlctl("resume", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = [r["step"] for r in _records(run_dir) if r.get("stage") == "sft" and "loss" in r]
    assert steps[-4:] == [3, 4, 5, 6], "the resume continued after checkpoint-2"
    assert summary(run_dir)["completed"] == ["sft"]


PICKY = """
def score(prompts, completions, answer, **_):
    if not all(c.strip().isdigit() for c in completions):  # the ground truth (the plan's dry run) always parses
        raise ValueError("not a number")
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
"""

HUNGRY = """
import torch

def score(prompts, completions, **_):
    if not all(c.strip().isdigit() for c in completions):  # passes the plan's dry run on the ground truth
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return [0.0] * len(completions)
"""


def _plugin(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "plugin_reward.py"
    path.write_text(source)
    return path


# PICKY, writing down the training progress it is given as TRL's trainers give it (`trainer_state`)
PICKY_STEPS = (
    PICKY
    + """
def score_and_note(prompts, completions, answer, trainer_state=None, **_):
    if trainer_state is not None:
        with open(__file__ + ".steps", "a") as f:
            f.write(f"{trainer_state.global_step} {trainer_state.max_steps}\\n")
    return score(prompts, completions, answer)
"""
)


def test_reward_errors_scored_zero_and_counted_with_on_error_zero(tmp_path: Path):
    plugin = _plugin(tmp_path, PICKY_STEPS)
    run_dir = tmp_path / "run"
    rewards = f"rl.rewards=[{{name: '{plugin}:score_and_note', on_error: zero}}]"
    proc = rlctl("train", *RL_ONLY, "--set", rewards, "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = [r["reward_errors"] for r in _records(run_dir) if r.get("stage") == "rl" and "reward_errors" in r]
    assert counts and counts[-1] > 0 and counts == sorted(counts), counts
    # each training call got the policy's optimizer steps so far and the stage's total (2 steps of 1 update), in order
    steps = Path(f"{plugin}.steps").read_text().splitlines()
    assert sorted(set(steps)) == ["0 2", "1 2"] and steps == sorted(steps), steps


def test_reward_error_stops_the_rlctl_loop_naming_the_reward_and_the_sample(tmp_path: Path):
    plugin = _plugin(tmp_path, PICKY)
    run_dir = tmp_path / "run"
    rewards = f"rl.rewards=[{{name: '{plugin}:score'}}]"  # on_error: raise, the default
    proc = rlctl("train", *RL_ONLY, "--algorithm", "reinforce-pp", "--set", rewards, "--run-dir", str(run_dir))
    text = _one_line(proc)
    assert proc.returncode == 1, text
    assert f"Reward '{plugin}:score' raised ValueError: not a number on the completion" in text
    assert "on_error: zero" in text and f"rlctl resume {run_dir}" in text and "Traceback" not in proc.stdout


def test_out_of_memory_is_reported_with_the_plan_and_safer_settings(tmp_path: Path):
    plugin = _plugin(tmp_path, HUNGRY)
    run_dir = tmp_path / "run"
    rewards = f"rl.rewards=[{{name: '{plugin}:score', on_error: zero}}]"  # never swallows out of memory
    proc = rlctl("train", *RL_ONLY, "--set", rewards, "--run-dir", str(run_dir))
    text = _one_line(proc)
    assert proc.returncode == 1, text
    assert "Out of memory in stage rl (CUDA out of memory. Tried to allocate 2.00 GiB)" in text
    assert "the plan expected a peak of" in text and "GiB per process" in text
    assert f"Nearest safer plans: rlctl resume {run_dir} --set rl.micro_batch_size=" in text


def _long_prompts(tmp_path: Path) -> Path:
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in [(12, 3), (45, 6), (70, 8), (33, 9)] * 4]
    rows[5]["prompt"] = "12+3=" * 20
    rows[9]["prompt"] = "45+6=" * 20
    path = tmp_path / "rl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_over_long_rl_prompts_are_dropped_and_counted(tmp_path: Path):
    data = _long_prompts(tmp_path)
    run_dir = tmp_path / "run"
    # 2 of 16 rows (12.5%) are over the limit: allowed once data.max_drop_fraction admits it (default 0.05 refuses)
    sets = ["--set", "data.generate=null", "--set", f"data.rl={data}", "--set", "data.max_drop_fraction=0.2"]
    proc = rlctl("train", *RL_ONLY, *sets, "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(run_dir)["data"]["rl"] == {"dropped_too_long": 2, "kept": 14, "limit": 16}
    assert any(r.get("event") == "data" and r["dropped_too_long"] == 2 for r in _records(run_dir))


def test_over_long_rl_prompts_refused_before_any_training(tmp_path: Path):
    data = _long_prompts(tmp_path)
    run_dir = tmp_path / "run"
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"prompt": f"{a}+3=", "completion": str(a + 3)}) + "\n" for a in range(10, 40)))
    sets = ["--set", "data.generate=null", "--set", f"data.rl={data}", "--set", f"data.sft={sft}"]
    sets += ["--set", "data.over_length=refuse", "--set", "stages=[sft,rl]"]
    proc = rlctl("--quiet", "train", *RL_ONLY, *sets, "--run-dir", str(run_dir))
    text = _one_line(proc)
    assert proc.returncode == 2, text
    assert f"2 of 16 rl rows are longer than data.max_prompt_length=16 tokens (first: {data}:6," in text
    assert "data.over_length=drop" in text and "Traceback" not in proc.stdout
    assert not run_dir.exists(), "refused by the pre-flight (builtin:tiny's tokenizer), before anything is written"

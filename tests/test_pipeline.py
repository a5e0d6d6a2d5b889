"""End to end through the real CLI and `accelerate launch`: the tiny demo learns, exports, survives kill -9,
and runs as two DDP processes."""

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

# A shorter pipeline for the robustness tests (learning is proven by the full demo run).
SHORT = [
    "--set",
    "sft.max_steps=120",
    "--set",
    "rm.max_steps=20",
    "--set",
    "rl.max_steps=30",
    "--set",
    "rl.save_every=5",
    "--set",
    "rl.eval_samples=40",
]


def test_demo_proves_learning(demo_run: Path):
    s = summary(demo_run)
    assert s["completed"] == ["sft", "rm", "rl"]
    acc = {stage: s["stages"][stage]["eval_accuracy"] for stage in ("base", "sft", "rl")}
    assert acc["base"] < 0.05, acc
    assert acc["sft"] > acc["base"] + 0.3, acc
    assert acc["rl"] > acc["sft"] + 0.15, acc
    assert s["stages"]["rm"]["eval_accuracy"] > 0.6, "the reward model prefers correct sums on held-out pairs"
    for name in (
        "config.yaml",
        "accelerate.yaml",
        "plan.json",
        "metrics.jsonl",
        "logs/train.log",
        "sft/final/model.safetensors",
        "rm/final/model.safetensors",
        "rl/final/model.safetensors",
    ):
        assert (demo_run / name).exists(), name
    records = [json.loads(line) for line in (demo_run / "metrics.jsonl").read_text().splitlines()]
    rl_steps = [r for r in records if r.get("stage") == "rl" and "step" in r]
    assert rl_steps[-1]["step"] == 60 and "reward" in rl_steps[-1]


def test_export_loads_and_generates(demo_run: Path, tmp_path: Path):
    out = tmp_path / "model"
    proc = rlctl("export", str(demo_run), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md"):
        assert (out / name).is_file(), name
    card = (out / "README.md").read_text()
    for text in (
        "Base model:** builtin:tiny",
        "sft -> rm -> rl",
        "Algorithm:** grpo",
        "learning_rate",
        "| rl | eval_accuracy |",
    ):
        assert text in card, text

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    prompts = [json.loads(line)["prompt"] for line in (demo_run / "data" / "eval.jsonl").read_text().splitlines()]
    answers = [json.loads(line)["answer"] for line in (demo_run / "data" / "eval.jsonl").read_text().splitlines()]
    enc = tok(prompts[:50], return_tensors="pt", padding=True, padding_side="left")
    ids = model.generate(**enc, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    texts = tok.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    correct = sum(t.strip() == a for t, a in zip(texts, answers[:50], strict=True))
    assert correct >= 35, f"the exported RL policy answers held-out sums ({correct}/50)"


def test_train_refuses_existing_run_dir(demo_run: Path):
    proc = rlctl("train", "--preset", "tiny-demo", "--run-dir", str(demo_run))
    assert proc.returncode == 2 and "rlctl resume" in proc.stderr.replace("\n", " ")


def _wait_for(path: Path, predicate, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip() and predicate(json.loads(line)):
                    return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting on {path}")


def test_kill_9_during_rl_then_resume(tmp_path: Path):
    run_dir = tmp_path / "run"
    cmd = [RLCTL, "train", "--preset", "tiny-demo", "--run-dir", str(run_dir), *SHORT]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for(run_dir / "metrics.jsonl", lambda r: r.get("stage") == "rl" and r.get("step", 0) >= 12, 400)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    s = summary(run_dir)
    assert s["completed"] == ["sft", "rm"], "killed while RL was running"
    assert list((run_dir / "rl" / "checkpoints").glob("checkpoint-*/rlctl_complete"))

    resumed = rlctl("resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    s = summary(run_dir)
    assert s["completed"] == ["sft", "rm", "rl"]
    assert set(s["stages"]) == {"base", "sft", "rm", "rl"}
    assert {"eval_accuracy", "eval_reward"} <= set(s["stages"]["rl"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    starts = [r["stage"] for r in records if r.get("event") == "start"]
    assert starts.count("sft") == 1 and starts.count("rm") == 1, "finished stages are not redone"
    assert starts.count("rl") == 2
    resumed_steps = [r["step"] for r in records if r.get("stage") == "rl" and "step" in r]
    assert resumed_steps[-1] == 30
    # a resume of a finished run has nothing left to do
    again = rlctl("resume", str(run_dir))
    assert again.returncode == 0 and summary(run_dir) == s


def test_two_process_ddp(tmp_path: Path):
    run_dir = tmp_path / "ddp"
    proc = rlctl(
        "train",
        "--preset",
        "tiny-demo",
        "--run-dir",
        str(run_dir),
        "--set",
        "hardware.num_processes=2",
        "--set",
        "sft.max_steps=20",
        "--set",
        "rm.max_steps=5",
        "--set",
        "rl.max_steps=3",
        "--set",
        "rl.prompts_per_step=8",
        "--set",
        "rl.eval_samples=20",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + (run_dir / "logs" / "train.log").read_text()[-3000:]
    s = summary(run_dir)
    assert s["world_size"] == 2
    assert s["completed"] == ["sft", "rm", "rl"]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["strategy"] == "ddp" and plan["accelerate"]["num_processes"] == 2

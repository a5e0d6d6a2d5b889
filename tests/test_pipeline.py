"""End to end through the real CLI and `accelerate launch`: the tiny demo learns, exports, survives kill -9,
and runs as two DDP processes."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import RLCTL, injected, rlctl, summary

pytestmark = pytest.mark.slow

# A shorter pipeline for the robustness tests (learning is proven by the full demo run).


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
    rl_steps = [r for r in records if r.get("stage") == "rl" and "step" in r and "event" not in r]
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


PLANTED = "hf_PLANTEDsecretTOKEN0123456789"


def test_two_process_ddp_and_no_secret_leaks(tmp_path: Path):
    run_dir = tmp_path / "ddp"
    secrets = {"HF_TOKEN": PLANTED, "WANDB_API_KEY": PLANTED + "w"}
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
        env=secrets,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + (run_dir / "logs" / "train.log").read_text()[-3000:]
    s = summary(run_dir)
    assert s["world_size"] == 2
    assert s["completed"] == ["sft", "rm", "rl"]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["strategy"] == "ddp" and plan["accelerate"]["num_processes"] == 2
    for stage, record in s["layout"].items():  # both processes ran DDP, as planned
        live = record["observed"]
        assert record["mismatches"] == [] and record["processes_recorded"] == 2, stage
        assert live["strategy"] == "ddp" and live["world_size"] == 2, stage
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("stage") == "sft" and "loss" in r]
    assert sum(losses[-5:]) < sum(losses[:5]), losses

    export = rlctl("export", str(run_dir), "--out", str(tmp_path / "model"), env=secrets)
    assert export.returncode == 0, export.stderr
    for text in (proc.stdout, proc.stderr, export.stdout, export.stderr):
        assert PLANTED not in text
    for folder in (run_dir, tmp_path / "model"):
        for path in folder.rglob("*"):
            if path.is_file() and path.stat().st_size < 50_000_000:
                assert PLANTED.encode() not in path.read_bytes(), f"token leaked into {path}"


def _start(run_dir: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        RLCTL,
        "train",
        "--preset",
        "tiny-demo",
        "--run-dir",
        str(run_dir),
        "--stages",
        "sft,rl",
        "--set",
        "rl.rewards=[{name: exact_match}]",
        "--set",
        "sft.max_steps=20",
        "--set",
        "rl.max_steps=500",
        "--set",
        "rl.save_every=1000",
        "--set",
        "rl.eval_samples=20",
        *extra,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize(
    ("signum", "code", "procs", "extra"),
    [
        (signal.SIGINT, 130, 1, ()),
        pytest.param(signal.SIGTERM, 143, 2, (), marks=pytest.mark.long),
        # the generator process waits too
        pytest.param(signal.SIGTERM, 143, 1, ("--set", "rl.async_rollout.enabled=true"), marks=pytest.mark.long),
    ],
)
def test_signal_stops_with_a_checkpoint(tmp_path: Path, signum: int, code: int, procs: int, extra: tuple):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, "--set", f"hardware.num_processes={procs}", *extra)
    try:
        _wait_for(run_dir / "metrics.jsonl", lambda r: r.get("stage") == "rl" and r.get("step", 0) >= 3, 300)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, out
    assert f"rlctl resume {run_dir}" in out.replace("\n", "")
    ckpts = list((run_dir / "rl" / "checkpoints").glob("checkpoint-*/rlctl_complete"))
    assert len(ckpts) == 1, "the stop saved exactly one checkpoint (periodic saves are every 1000 steps)"
    step = int(ckpts[0].parent.name.split("-")[1])
    assert 3 <= step < 500
    assert summary(run_dir)["completed"] == ["sft"]
    assert not (run_dir / "rl" / "final").exists()
    assert not (run_dir / "run.lock").exists()
    leftover = subprocess.run(["pgrep", "-f", f"rlctl.launch.runner {run_dir}"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "no trainer outlives the stop"


# Loaded by every process of the run (PYTHONPATH); in the runner, its last exit hook sends SIGTERM to the `rlctl
# train` above it: a stop that comes as the last stage has ended (a Stop clicked a moment too late).
LATE_STOP = """
import sys
if sys.orig_argv[1:3] == ["-m", "rlctl.launch.runner"]:
    import atexit, os, signal, psutil
    def stop_the_cli():
        for parent in psutil.Process().parents():
            if parent.cmdline()[1:3] and parent.cmdline()[1].endswith("rlctl") and parent.cmdline()[2] == "train":
                os.kill(parent.pid, signal.SIGTERM)
    atexit.register(stop_the_cli)
"""


def test_a_stop_that_comes_as_the_run_ends_reports_the_run_complete(tmp_path: Path):
    """Nothing is left to resume: exit 0 and the summary, not "Interrupted" and exit 143."""
    run_dir = tmp_path / "run"
    sets = ["stages=[rl]", "rl.rewards=[{name: exact_match}]", "rl.max_steps=2", "rl.eval_samples=8"]
    args = ["--preset", "tiny-demo", *(a for s in sets for a in ("--set", s)), "--run-dir", str(run_dir)]
    proc = rlctl("train", *args, env=injected(tmp_path, LATE_STOP))
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, out
    assert "The stop came after the last stage had ended: the run is complete." in out and "Done." in out, out
    assert "Interrupted" not in out and summary(run_dir)["completed"] == ["rl"]


def test_non_finite_reward_stops_and_keeps_the_last_good_checkpoint(tmp_path: Path):
    run_dir = tmp_path / "run"
    plugin = tmp_path / "bad_reward.py"
    marker = run_dir / "rl" / "checkpoints" / "checkpoint-2" / "rlctl_complete"
    plugin.write_text(  # the reward explodes once the first rl checkpoint is complete
        "from pathlib import Path\n\n\ndef explodes(prompts, completions, answer, **kw):\n"
        f"    if Path({str(marker)!r}).exists():\n        return [float('inf')] * len(completions)\n"
        "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n"
    )
    proc = rlctl(
        "train",
        "--preset",
        "tiny-demo",
        "--run-dir",
        str(run_dir),
        "--stages",
        "sft,rl",
        "--set",
        "sft.max_steps=10",
        "--set",
        "rl.max_steps=20",
        "--set",
        "rl.save_every=2",
        "--set",
        "rl.eval_samples=20",
        "--set",
        f"rl.rewards=[{{name: '{plugin}:explodes'}}]",
    )
    out = (proc.stdout + proc.stderr).replace("\n", " ")
    assert proc.returncode == 1, out
    assert "returned NaN/inf" in out and "rlctl resume" in out, out
    assert summary(run_dir)["completed"] == ["sft"]
    assert not (run_dir / "rl" / "final").exists()
    ckpts = sorted((run_dir / "rl" / "checkpoints").glob("checkpoint-*/rlctl_complete"))
    assert ckpts, "the last good checkpoint is kept"

    from safetensors.torch import load_file

    weights = load_file(ckpts[-1].parent / "model.safetensors")
    assert all(bool(w.isfinite().all()) for w in weights.values()), "no non-finite state was checkpointed"

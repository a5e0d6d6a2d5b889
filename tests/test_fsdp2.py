"""FSDP2 on two CPU processes (gloo), applied by rlctl itself in its RL loop: the plan says which stages shard,
two sharded processes train as one process does (per-update losses and final weights), checkpoints are DCP shards
(one file per process) that resume bit for bit after kill -9 and reshard onto another process count, and the final
model gathered from the shards exports as a loadable Hugging Face folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import RLCTL, free_port, kill_after_checkpoint, records, rlctl, summary

HERE = Path(__file__).resolve().parent
SHARDED = ("--set", "hardware.num_processes=2", "--set", "hardware.strategy=fsdp2")
LOOP_RUN = (
    "--preset",
    "tiny-demo",
    "--stages",
    "rl",
    *SHARDED,
    "--set",
    "rl.rewards=[{name: exact_match}]",
    "--set",
    "rl.max_steps=4",
    "--set",
    "rl.save_every=2",
    "--set",
    "rl.eval_samples=8",
)


def _plan(*args: str) -> tuple[int, str, dict | None]:
    proc = rlctl("plan", "--preset", "tiny-demo", *SHARDED, "--json", *args)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split()), json.loads(proc.stdout or "null")


def test_plan_shards_the_rlctl_loop_on_cpu_and_says_which_stages_run_ddp():
    code, text, _ = _plan("--stages", "sft,rm")  # TRL and accelerate train both: nothing would shard
    assert code == 2 and "no stage of this run can shard there: sft, rm" in text and "Traceback" not in text
    code, text, plan = _plan()  # the demo's GRPO in rlctl's loop, which shards itself
    assert code == 0, text
    assert plan["strategy"] == "fsdp2"
    assert {s["name"]: s["strategy"] for s in plan["stages"]} == {"sft": "ddp", "rm": "ddp", "rl": "fsdp2"}
    assert any("stage(s) sft, rm run DDP" in w for w in plan["warnings"])
    # accelerate runs no FSDP on CPU: its config must not claim it (its RAM-efficient loading would zero ranks > 0)
    assert plan["accelerate"]["distributed_type"] == "MULTI_GPU" and "fsdp_config" not in plan["accelerate"]


@pytest.fixture(scope="module")
def parity(tmp_path_factory) -> tuple[Path, Path]:
    """tests/fsdp2_worker.py on 2 FSDP2 processes, then on 1 process (which also resumes the 2-process checkpoint)."""
    two, one = tmp_path_factory.mktemp("fsdp2-two"), tmp_path_factory.mktemp("fsdp2-one")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    worker = str(HERE / "fsdp2_worker.py")
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    for cmd in ([*run, worker, str(two)], [sys.executable, worker, str(one), str(two)]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        aborted = "terminate called without an active exception" in proc.stderr
        if proc.returncode != 0 and aborted and 'fsdp2_worker.py", line' not in proc.stderr:
            # once in about 10 CI runs a rank died in C++ with no Python error (likely gloo at exit; not reproduced in 9
            # local runs): that run is repeated once; a Python failure in the worker is not
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return two, one


def _close(a: dict, b: dict) -> float:
    """The largest absolute difference between the weights both state dicts hold (a tied LM head is held once)."""
    return max(float((a[k] - b[k]).abs().max()) for k in a.keys() & b.keys())


@pytest.mark.slow
def test_two_sharded_processes_train_as_one(parity):
    import torch

    two, one = parity
    sharded, single = json.loads((two / "losses.json").read_text()), json.loads((one / "losses.json").read_text())
    assert len(sharded) == 20
    worst = max(abs(a - b) / abs(b) for a, b in zip(sharded, single["single"], strict=True))
    assert worst < 1e-5, f"per-update losses differ by {worst:.2e} (relative)"
    gathered, plain = torch.load(two / "weights.pt"), torch.load(one / "weights.pt")["single"]
    assert gathered.keys() == plain.keys() - {"lm_head.weight"}  # tied to the embedding: pushed and saved once
    assert _close(gathered, plain) < 2e-5  # fp32 rounding, compounded over 20 AdamW updates
    shares = [json.loads((two / f"share{r}.json").read_text()) for r in (0, 1)]
    assert shares[0] == shares[1] and sum(shares) == sum(t.numel() for t in gathered.values())
    assert sorted(p.name for p in (two / "ckpt" / "sharded").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]


@pytest.mark.slow
def test_one_process_resumes_the_two_process_checkpoint_resharded(parity):
    import torch

    two, one = parity
    sharded, resumed = json.loads((two / "losses.json").read_text()), json.loads((one / "losses.json").read_text())
    worst = max(abs(a - b) / abs(b) for a, b in zip(sharded[10:], resumed["resumed"], strict=True))
    assert len(resumed["resumed"]) == 10 and worst < 1e-5, worst
    assert _close(torch.load(two / "weights.pt"), torch.load(one / "weights.pt")["resumed"]) < 2e-5


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory) -> Path:
    """The demo's GRPO in rlctl's RL loop sharded over 2 processes, 4 steps, a checkpoint every 2."""
    run_dir = tmp_path_factory.mktemp("fsdp2-loop") / "run"
    proc = rlctl("train", *LOOP_RUN, "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir


def _safetensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


@pytest.mark.slow
def test_the_sharded_loop_checkpoints_one_shard_per_process_and_exports(loop_run: Path, tmp_path: Path):
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    record = summary(loop_run)["layout"]["rl"]
    assert record["mismatches"] == [] and record["processes_recorded"] == 2
    assert record["observed"]["strategy"] == record["planned"]["strategy"] == "fsdp2"
    ranks = [json.loads((loop_run / "rl" / "layout" / f"rank{r}.json").read_text())["observed"] for r in (0, 1)]
    moments = record["observed"]["total_parameters"] * 4 * 2  # AdamW's two fp32 moments of the whole model
    held = [live["optimizer_state"]["bytes"] for live in ranks]
    assert sum(held) == moments and max(held) < 0.6 * moments, held  # each process holds its shard's
    ckpts = sorted((loop_run / "rl" / "checkpoints").glob("checkpoint-*"))
    assert [c.name for c in ckpts] == ["checkpoint-2", "checkpoint-4"]
    for ckpt in ckpts:
        shards = sorted(p.name for p in (ckpt / "sharded").iterdir())
        assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"], ckpt
        assert not list(ckpt.glob("*.safetensors")) and not list(ckpt.glob("optimizer*"))
    dcp_to_torch_save(ckpts[-1] / "sharded", tmp_path / "last.pt")
    last = torch.load(tmp_path / "last.pt")["policy"]
    out = tmp_path / "export"
    proc = rlctl("export", str(loop_run), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exported = _safetensors(out)
    assert exported.keys() <= last.keys() and _close(exported, last) == 0.0  # the shards, gathered
    assert _safetensors(loop_run / "rl" / "final").keys() == exported.keys()
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False).shape == (1, 6)


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_ends_bit_identical(loop_run: Path, tmp_path: Path):
    broken = tmp_path / "run"
    kill_after_checkpoint(broken, [RLCTL, "train", *LOOP_RUN, "--run-dir", str(broken)], "rl", 2)
    proc = rlctl("resume", str(broken))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["stage"] for r in records(broken) if r.get("event") == "start"] == ["rl", "rl"]
    a, b = _safetensors(loop_run / "rl" / "final"), _safetensors(broken / "rl" / "final")
    assert a.keys() == b.keys() and _close(a, b) == 0.0

"""The plan is a contract: each stage records the layout it runs, read from the live objects, beside the plan's
values in summary.json, and a stage whose layout contradicts its plan stops at its first step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.monitors.layout import NO_OP, mismatches, offload_record
from tests.helpers import assert_cpu_precision, injected, rlctl, summary

SFT_ONLY = ("--preset", "tiny-demo", "--stages", "sft", "--set", "sft.max_steps=3", "--set", "sft.save_every=3")

# A stage that ignores the adapter the plan chose: LoRA planned, the trainer gets no PEFT config.
IGNORES_ADAPTER = """
import sys
if "rlctl.launch.runner" in " ".join(sys.orig_argv):
    import rlctl.runtime.models as models
    models.lora_config = lambda source, task_type="CAUSAL_LM": None
"""


def test_mismatches_name_both_values():
    plan = {"strategy": "fsdp2", "adapter": "lora", "world_size": 2, "frozen_dtype": "bfloat16"}
    live = {"strategy": "ddp", "adapter": "lora", "world_size": 2, "frozen_dtype": "bfloat16"}
    assert mismatches(plan, live) == ["strategy: planned fsdp2, observed ddp"]
    qlora = {"adapter": "qlora", "frozen_dtype": "float32"}
    assert mismatches({"adapter": "qlora", "frozen_dtype": "float32"}, qlora) == []


def test_optimizer_offload_is_recorded_as_it_ran():
    """On CPU the offload calls have nothing to move: the record says so instead of "offloaded". Where the state
    does move (to the meta device here, standing in for a GPU's round trip to host RAM), the record holds the bytes
    and seconds per switch."""
    import torch

    from rlctl.trainer import offload

    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters())
    assert offload_record(None, []) == {"phase_offload": "off"}
    model(torch.ones(2, 8)).sum().backward()
    offloaded = offload.Offloaded()
    offload.reload_optimizer_state(opt, offloaded)
    opt.step()
    assert offload.offload_optimizer_state(opt, offloaded) == 0, "CPU to CPU: nothing moves"
    live = offload_record(offloaded.switches, ["cpu"])
    assert live == {"phase_offload": NO_OP, "optimizer_switches": {"calls": 2, "bytes_moved": 0}}
    moments = 2 * (8 * 4 + 4) * 4  # exp_avg and exp_avg_sq of weight and bias, fp32
    assert offload.offload_optimizer_state(opt, offloaded, device="meta") == moments
    live = offload_record(offloaded.switches, ["meta"])
    assert live["phase_offload"] == "between phases"
    offload = live["optimizer_switches"]["offload"]
    assert offload["switches"] == 1 and offload["bytes_per_switch"] == moments and offload["seconds_per_switch"] > 0
    assert live["optimizer_switches"]["reload"]["switches"] == 0


@pytest.mark.slow
def test_every_stage_records_planned_and_observed_layout(demo_run: Path):
    layout = summary(demo_run)["layout"]
    assert set(layout) == {"sft", "rm", "rl"}
    for record in layout.values():
        live = record["observed"]
        assert live["strategy"] == record["planned"]["strategy"] == "single"
        assert live["adapter"] == "full" and live["trainable_parameters"] == live["total_parameters"] > 0
        assert live["optimizer_state"]["devices"] == ["cpu"] and not live["gradient_checkpointing"]
    assert_cpu_precision(layout)
    rl = layout["rl"]["observed"]
    assert rl["generation_engine"] == "transformers" and rl["phase_offload"] == "off" and not rl["critic"]
    assert rl["reference"] == "cpu", "GRPO's KL term (beta 0.04) against a frozen fp32 copy in the process"
    assert rl["reward_model_dtype"] == "float32"


@pytest.mark.slow
def test_lora_checkpointing_offload_and_critic_run_and_learn(tmp_path: Path):
    """LoRA in every stage of the tiny pipeline with gradient checkpointing and the optimizer offload between phases,
    and PPO (rlctl's loop) with a LoRA critic and the adapters-disabled reference: SFT loss falls, every stage
    records what it ran, in fp32, and the offload is a recorded no-op on CPU."""
    run = tmp_path / "run"
    proc = rlctl(
        "train", "--preset", "tiny-demo", "--algorithm", "ppo", "--run-dir", str(run),
        "--set", "model.adapter=lora", "--set", "model.gradient_checkpointing=true",
        "--set", "hardware.optimizer_offload=true", "--set", "sft.max_steps=30", "--set", "rm.max_steps=6",
        "--set", "rl.max_steps=2", "--set", "rl.prompts_per_step=8", "--set", "rl.eval_samples=20",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    losses = [r["loss"] for r in records if r.get("stage") == "sft" and "loss" in r]
    assert sum(losses[-5:]) < sum(losses[:5]), losses
    layout = summary(run)["layout"]
    assert_cpu_precision(layout)
    for stage in ("sft", "rm", "rl"):
        live = layout[stage]["observed"]
        assert live["adapter"] == "lora" and live["lora_modules"] > 0 and live["gradient_checkpointing"], stage
        assert 0 < live["trainable_parameters"] < live["total_parameters"], stage
    rl = layout["rl"]["observed"]
    assert rl["critic"] and rl["reference"] == "adapters-disabled" and rl["phase_offload"] == NO_OP
    assert rl["optimizer_switches"] == {"calls": 5, "bytes_moved": 0}, "offload before step 1, then reload+offload"


@pytest.mark.slow
def test_a_stage_that_ignores_its_plan_stops_at_its_first_step(tmp_path: Path):
    injection = injected(tmp_path, IGNORES_ADAPTER)
    run_dir = tmp_path / "run"
    proc = rlctl("train", *SFT_ONLY, "--set", "model.adapter=lora", "--run-dir", str(run_dir), env=injection)
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert "Stage sft does not run the layout its plan chose (adapter: planned lora, observed full" in text
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (run_dir / "sft" / "checkpoints" / "checkpoint-3").exists()

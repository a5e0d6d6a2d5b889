"""The plan is a contract: each stage records the layout it runs, read from the live objects, beside the plan's
values in summary.json, and a stage whose layout contradicts its plan stops at its first step."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlctl.stages.layout import mismatches
from tests.conftest import rlctl, summary

SFT_ONLY = ("--preset", "tiny-demo", "--stages", "sft", "--set", "sft.max_steps=3", "--set", "sft.save_every=3")

# A stage that ignores the adapter the plan chose: LoRA planned, the trainer gets no PEFT config.
IGNORES_ADAPTER = """
import sys
if "rlctl.launch.runner" in " ".join(sys.orig_argv):
    import rlctl.stages.common as common
    common.lora_config = lambda ctx, task_type="CAUSAL_LM": None
"""


def test_mismatches_name_both_values():
    plan = {"strategy": "fsdp2", "adapter": "lora", "world_size": 2, "frozen_dtype": "bfloat16"}
    live = {"strategy": "ddp", "adapter": "lora", "world_size": 2, "frozen_dtype": "bfloat16"}
    assert mismatches(plan, live) == ["strategy: planned fsdp2, observed ddp"]
    qlora = {"adapter": "qlora", "frozen_dtype": "float32"}
    assert mismatches({"adapter": "qlora", "frozen_dtype": "float32"}, qlora) == []


@pytest.mark.slow
def test_every_stage_records_planned_and_observed_layout(demo_run: Path):
    layout = summary(demo_run)["layout"]
    assert set(layout) == {"sft", "rm", "rl"}
    for stage, record in layout.items():
        assert record["mismatches"] == [], stage
        live = record["observed"]
        assert live["strategy"] == record["planned"]["strategy"] == "single"
        assert live["adapter"] == "full" and live["trainable_parameters"] == live["total_parameters"] > 0
        assert live["trainable_dtype"] == "float32" and live["optimizer_state"]["devices"] == ["cpu"]
    assert layout["rl"]["observed"]["generation_engine"] == "transformers"


@pytest.mark.slow
def test_a_stage_that_ignores_its_plan_stops_at_its_first_step(tmp_path: Path):
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(IGNORES_ADAPTER)
    path = os.pathsep.join(p for p in (str(inject), os.environ.get("PYTHONPATH")) if p)
    run_dir = tmp_path / "run"
    proc = rlctl("train", *SFT_ONLY, "--set", "model.adapter=lora", "--run-dir", str(run_dir), env={"PYTHONPATH": path})
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert "Stage sft does not run the layout its plan chose (adapter: planned lora, observed full" in text
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (run_dir / "sft" / "checkpoints" / "checkpoint-3").exists()


def test_fsdp2_on_cpu_with_no_stage_that_can_shard_is_refused_not_run_as_ddp():
    sets = ("--set", "hardware.num_processes=2", "--set", "hardware.strategy=fsdp2")
    proc = rlctl("plan", "--preset", "tiny-demo", *sets)
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and "plain DDP under an FSDP2 label" in text and "Traceback" not in text

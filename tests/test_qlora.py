"""QLoRA (4-bit NF4 base + LoRA) on CPU with bitsandbytes: refused at plan time without the package, and the tiny
demo's stages running through it, their final models saved as plain (unquantized) weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl import config
from rlctl.errors import UserError
from rlctl.plan import packages
from rlctl.plan import planner as plan
from tests.helpers import assert_cpu_precision, rlctl, summary


def _plan(preset: str, spec: str, *sets: str) -> plan.Plan:
    return plan.build(config.resolve(preset, None, None, spec, list(sets)), "/tmp/rlctl-qlora-plan")


@pytest.mark.parametrize("version", [None, "0.45.5"])
def test_qlora_without_a_usable_bitsandbytes_is_refused_here_and_flagged_elsewhere(monkeypatch, version):
    real = packages.installed_version
    monkeypatch.setattr(packages, "installed_version", lambda n, m=None: version if n == "bitsandbytes" else real(n, m))
    with pytest.raises(UserError, match=r"pip install 'rlctl\[qlora\]' \(bitsandbytes>=0\.50\)"):  # CPU kernels
        _plan("tiny-demo", "cpu", "model.adapter=qlora")
    monkeypatch.setattr(plan.hw, "has_local_gpu", lambda: False)  # a GPU plan made here for another machine
    p = _plan("qwen7b-grpo", "1xH100-80GB", "model.adapter=qlora")
    assert p.adapter == "qlora" and any("QLoRA" in w and "(bitsandbytes>=0.46.1)" in w for w in p.warnings)


def test_qlora_plans_here_when_bitsandbytes_is_installed():
    pytest.importorskip("bitsandbytes")
    assert packages.qlora_problem(cpu=True) is None
    assert _plan("tiny-demo", "cpu", "model.adapter=qlora").adapter == "qlora"


@pytest.mark.slow
def test_qlora_tiny_pipeline_on_cpu(tmp_path: Path):
    pytest.importorskip("bitsandbytes")
    import torch
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    # the checkpoint at SFT step 15 is scored in eval mode and SFT trains on (bitsandbytes' CPU inference repack)
    proc = rlctl(
        "train", "--preset", "tiny-demo", "--run-dir", str(run), "--set", "model.adapter=qlora",
        "--set", "sft.max_steps=30", "--set", "sft.save_every=15", "--set", "rm.max_steps=6", "--set", "rl.max_steps=2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    losses = [r["loss"] for r in records if r.get("stage") == "sft" and "loss" in r]
    assert sum(losses[-5:]) < sum(losses[:5])  # the adapters on the 4-bit base learn
    layout = summary(run)["layout"]
    assert_cpu_precision(layout)  # the 4-bit layers compute in fp32, the reward model in RL is fp32 too
    for stage in ("sft", "rm", "rl"):
        live = layout[stage]["observed"]
        assert live["adapter"] == "qlora" and live["linear4bit_compute_dtype"] == "float32", stage
        assert live["linear4bit_modules"] > 0 and live["lora_modules"] > 0
        assert 0 < live["trainable_parameters"] < live["total_parameters"]
        cfg = json.loads((run / stage / "final" / "config.json").read_text())
        assert "quantization_config" not in cfg, stage  # adapters merged into the unquantized base
    model = AutoModelForCausalLM.from_pretrained(run / "rl" / "final")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    rl = layout["rl"]["observed"]
    assert rl["reference"] == "adapters-disabled" and rl["reward_model_dtype"] == "float32"


@pytest.mark.slow
@pytest.mark.parametrize("adapter", [pytest.param("lora", marks=pytest.mark.long), "qlora"])
def test_adapters_learn_rl_on_top_of_the_demo_sft_model(demo_run: Path, tmp_path: Path, adapter: str):
    """LoRA and QLoRA adapters on the demo's (fully fine-tuned) SFT model: GRPO lifts held-out accuracy. The LoRA
    run also offloads the optimizer between phases (TRL's path: a recorded no-op on CPU)."""
    if adapter == "qlora":
        pytest.importorskip("bitsandbytes")
    sft = summary(demo_run)["stages"]["sft"]["eval_accuracy"]
    run = tmp_path / "run"
    offload = "true" if adapter == "lora" else "auto"
    proc = rlctl(
        "train", "--preset", "tiny-demo", "--stages", "rl", "--run-dir", str(run),
        "--set", f"model.name_or_path={demo_run / 'sft' / 'final'}", "--set", f"model.adapter={adapter}",
        "--set", "rl.rewards=[{name: exact_match}]", "--set", "rl.learning_rate=2e-3",
        "--set", f"hardware.optimizer_offload={offload}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = summary(run)
    assert_cpu_precision(result["layout"])
    live = result["layout"]["rl"]["observed"]
    assert live["adapter"] == adapter and live["reference"] == "adapters-disabled"
    assert live["phase_offload"] == ("no-op on CPU" if adapter == "lora" else "off")
    assert result["stages"]["rl"]["eval_accuracy"] >= sft + 0.1, (sft, result["stages"])

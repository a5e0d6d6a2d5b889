"""The planner plans the model being trained: architecture numbers from its config.json (a folder, the Hugging
Face cache), the preset's numbers only as the offline fallback, MoE and unknown types refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl import config
from rlctl.errors import UserError
from rlctl.plan import arch as model_arch
from rlctl.plan import planner as plan
from rlctl.plan.memory.arch import Arch
from tests.helpers import rlctl

QWEN25_3B = {
    "model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
    "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}  # fmt: skip
# (config.json numbers, published parameter count in billions)
PUBLISHED = {
    "llama-3.1-8b": ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                      "tie_word_embeddings": False}, 8.03),
    "mistral-7b": ({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                    "tie_word_embeddings": False}, 7.24),
    "gemma-2b": ({"model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 18,
                  "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 256000}, 2.51),
    "qwen3-0.6b": ({"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                    "tie_word_embeddings": True}, 0.60),
    "phi-3-mini": ({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
                    "tie_word_embeddings": False}, 3.82),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_counts_of_real_configs(name: str):
    numbers, billions = PUBLISHED[name]
    arch = model_arch.arch_from_config(numbers, name)
    assert Arch.of(arch).params() / 1e9 == pytest.approx(billions, rel=0.01)


def test_a_model_folder_is_planned_from_its_config_json(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_3B))
    proc = rlctl("plan", "--preset", "qwen0.5b-grpo", "--set", f"model.name_or_path={tmp_path}", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    facts = json.loads(proc.stdout)["model"]
    assert facts["params_billions"] == pytest.approx(3.09, abs=0.01)
    assert facts["arch_source"] == str(tmp_path / "config.json") and facts["arch"]["layers"] == 36
    assert any("differs from the preset's (layers 24 -> 36" in w for w in json.loads(proc.stdout)["warnings"])
    text = rlctl("plan", "--preset", "qwen0.5b-grpo", "--set", f"model.name_or_path={tmp_path}")
    assert "Parameters 3.09B (architecture from" in " ".join(text.stdout.split())


def test_a_hub_id_is_read_from_the_local_cache(tmp_path: Path, monkeypatch):
    repo = tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text(json.dumps(QWEN25_3B))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = config.resolve("qwen0.5b-grpo", None, None, "1xH100-80GB", [])
    p = plan.build(cfg, tmp_path / "run")
    assert p.model.arch_source.startswith("Hugging Face cache") and p.model.params_billions == 3.09


def test_offline_and_uncached_falls_back_to_the_preset(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    p = plan.build(config.resolve("qwen7b-grpo", None, None, "8xH100-80GB", []), tmp_path / "run")
    assert p.model.params_billions == 7.62
    assert "preset's model.arch" in p.model.arch_source and "HF_HUB_OFFLINE is set" in p.model.arch_source


def test_moe_and_unknown_architectures_are_refused_before_anything_runs(tmp_path: Path):
    moe = {**QWEN25_3B, "model_type": "qwen2_moe", "num_experts": 60, "moe_intermediate_size": 1408}
    with pytest.raises(UserError, match="mixture-of-experts"):
        model_arch.arch_from_config(moe, "x")
    (tmp_path / "config.json").write_text(json.dumps({**QWEN25_3B, "model_type": "mamba"}))
    proc = rlctl("plan", "--preset", "qwen0.5b-grpo", "--set", f"model.name_or_path={tmp_path}")
    assert proc.returncode == 2 and "model_type 'mamba'" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr

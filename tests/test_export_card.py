"""`rlctl export` writes a model card users can publish (huggingface_hub's metadata, model-index, the real load
path), copies full weights without reloading them, and `rlctl verify` checks an export folder anywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rlctl.after.card import model_card
from rlctl.config import RunConfig
from rlctl.rundir import Summary
from tests.helpers import rlctl, summary

EXPORT_AND_LIST_MODEL_CLASSES = """
import sys
from pathlib import Path
from rlctl.after import export
export.export(Path(sys.argv[1]), Path(sys.argv[2]))
print([m for m in sys.modules if m.startswith("transformers.models.") and ".modeling_" in m])
"""


def test_export_card_copied_weights_and_verify(demo_run: Path, tmp_path: Path):
    from huggingface_hub import ModelCard

    out = tmp_path / "model"
    proc = subprocess.run(
        [sys.executable, "-c", EXPORT_AND_LIST_MODEL_CLASSES, str(demo_run), str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"full weights are copied, no model class is loaded: {proc.stdout}"
    final = demo_run / "rl" / "final"
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (out / name).read_bytes() == (final / name).read_bytes(), name

    card = ModelCard.load(out / "README.md")
    assert card.data.pipeline_tag == "text-generation"
    assert card.data.base_model is None, "the built-in model is not on the Hub"
    assert "builtin:tiny (rlctl's built-in" in card.text, "it is named in the text"
    assert {"rlctl", "trl", "sft", "rm", "rl", "grpo"} <= set(card.data.tags)
    assert card.data.license is None, "no license is invented for the built-in model"
    held_out = summary(demo_run)["stages"]["rl"]
    results = {r.metric_name: r.metric_value for r in card.data.eval_results}
    assert results == {k: held_out[k] for k in ("eval_accuracy", "eval_reward")}
    assert card.data.eval_results[0].task_type == "text-generation"
    assert f'AutoModelForCausalLM.from_pretrained("{out.resolve()}")' in card.text
    assert '"PATH"' not in card.text

    assert rlctl("verify", str(out)).returncode == 0
    weights = out / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    proc = rlctl("verify", str(out), "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["checked"][0]["problems"] == [
        "model.safetensors changed since it was written (checksum differs)"
    ]
    proc = rlctl("verify", str(tmp_path))
    assert proc.returncode == 2 and "neither a run directory" in proc.stderr + proc.stdout


def test_card_metadata_for_hub_base_and_data(tmp_path: Path):
    from huggingface_hub import ModelCard

    hub_cfg = RunConfig(
        model={"name_or_path": "Qwen/Qwen2.5-0.5B-Instruct"},
        data={"rl": "hf://openai/gsm8k:main@train", "eval": "openai/gsm8k:main@test"},
        stages=["rl"],
    )
    stats = Summary.from_json(
        {"stages": {"base": {"eval_accuracy": 0.25}, "rl": {"eval_accuracy": 0.5, "eval_reward": 0.75}}}
    )
    card = ModelCard(model_card(hub_cfg, stats, "rl", repo_id="alice/m"))
    assert card.data.base_model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert card.data.datasets == ["openai/gsm8k"]
    assert card.data.model_name == "alice/m"
    assert [(r.dataset_type, r.metric_name, r.metric_value) for r in card.data.eval_results] == [
        ("openai/gsm8k", "eval_accuracy", 0.5),
        ("openai/gsm8k", "eval_reward", 0.75),
    ]
    assert 'from_pretrained("alice/m")' in card.text

    base = tmp_path / "my-base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: apache-2.0\n---\n# my base\n")
    rows = tmp_path / "prompts.jsonl"
    rows.write_text('{"prompt": "1+1", "answer": "2"}\n')
    local_cfg = RunConfig(model={"name_or_path": str(base)}, data={"rl": str(rows)}, stages=["rl"])
    card = ModelCard(model_card(local_cfg, Summary(), "rl", where="/models/x"))
    assert card.data.license == "apache-2.0", "the license is read from the local base model's card"
    assert card.data.base_model is None and card.data.datasets is None, "local paths stay out of the metadata"
    assert "`prompts.jsonl` (local file, `data.rl`)" in card.text and "`my-base`" in card.text
    assert card.data.eval_results is None

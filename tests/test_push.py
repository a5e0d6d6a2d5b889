"""`rlctl export --push` against a local stand-in for the Hub (HF_ENDPOINT): the repo is created (private when
asked), every exported file and the model card arrive intact, the token authenticates every call and is
never printed; LoRA runs can push the adapter alone."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import yaml

from rlctl.errors import UserError
from tests.helpers import rlctl
from tests.hub_stub import HubStub

pytestmark = pytest.mark.slow


def hub_env(hub: HubStub, token: str, tmp_path: Path) -> dict[str, str]:
    return {
        "HF_ENDPOINT": hub.url,
        "HF_TOKEN": token,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


def local_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_push_creates_the_repo_and_uploads_folder_and_card(demo_run: Path, tmp_path: Path):
    token = "hf_rlctlTest" + secrets.token_hex(12)
    out = tmp_path / "model"
    with HubStub(token) as hub:
        proc = rlctl(
            "export", str(demo_run), "--out", str(out), "--push", "alice/tiny-demo", "--private",
            env=hub_env(hub, token, tmp_path),
        )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert token not in output and token[:12] not in output, "the token is never printed"
    assert f"Pushed {hub.url}/alice/tiny-demo" in proc.stdout
    assert hub.unhandled == [], hub.unhandled
    repo = hub.repos["alice/tiny-demo"]
    assert repo.private is True
    assert repo.files == local_files(out), "every exported file arrives byte for byte"
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= set(repo.files)
    card = repo.files["README.md"].decode()
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert 'AutoModelForCausalLM.from_pretrained("alice/tiny-demo")' in card
    assert "| rl | eval_accuracy |" in card
    assert hub.validated == [card], "the card's metadata was validated by the Hub"
    assert len(repo.commits) == 1 and repo.commits[0]["summary"] == "Upload model exported by rlctl"
    api_calls = [r for r in hub.requests if r.path.startswith(("/api/repos", "/api/models", "/api/validate"))]
    assert {r.path.split("/")[-2] for r in api_calls if "/api/models/" in r.path} == {"preupload", "commit"}
    assert all(r.authorization == f"Bearer {token}" for r in api_calls)


def test_push_with_a_rejected_token_fails_clearly(tmp_path: Path, monkeypatch):
    from huggingface_hub import constants

    from rlctl.after import export

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "README.md").write_text("---\nlibrary_name: transformers\n---\n# m\n")
    wrong = "hf_wrong" + secrets.token_hex(12)
    with HubStub("hf_the_right_one") as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", wrong)
        with pytest.raises(UserError) as err:
            export.push(folder, "alice/x", quiet=True)
    message = str(err.value)
    assert "refused the token" in message and "hf auth login" in message
    assert wrong not in message
    assert hub.repos == {}


def _lora_run(demo_run: Path, root: Path, base: Path | None = None) -> Path:
    """A finished one-stage LoRA run whose adapter checkpoint is a real PEFT adapter on the demo's base model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    run = root / "lora-run"
    (run / "sft").mkdir(parents=True)
    cfg = yaml.safe_load((demo_run / "config.yaml").read_text())
    cfg["model"]["adapter"], cfg["stages"] = "lora", ["sft"]
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run / "summary.json").write_text(json.dumps({"stages": {"sft": {"eval_accuracy": 0.5}}, "completed": ["sft"]}))
    (run / "sft" / "final").symlink_to(demo_run / "sft" / "final")
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base or demo_run / "base"), LoraConfig(r=4, target_modules="all-linear")
    )
    from rlctl import checkpoint

    model.save_pretrained(checkpoint.incoming(run / "sft" / "checkpoints") / "checkpoint-5")
    checkpoint.publish(run / "sft" / "checkpoints", 5, None, keep_last=2, keep_best=False)  # complete and intact
    return run


def test_push_lora_adapter_alone(demo_run: Path, tmp_path: Path):
    run = _lora_run(demo_run, tmp_path)
    token = "hf_rlctlTest" + secrets.token_hex(12)
    out = tmp_path / "adapter"
    with HubStub(token) as hub:
        proc = rlctl(
            "export",
            str(run),
            "--adapter",
            "--out",
            str(out),
            "--push",
            "alice/tiny-lora",
            env=hub_env(hub, token, tmp_path),
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = hub.repos["alice/tiny-lora"].files
    assert files == local_files(out)
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "README.md"} <= set(files)
    assert "model.safetensors" not in files, "the adapter, not merged weights"
    card = files["README.md"].decode()
    assert (
        card.startswith("---\nlibrary_name: peft\n")
        and 'AutoPeftModelForCausalLM.from_pretrained("alice/tiny-lora")' in card
    )

    from peft import AutoPeftModelForCausalLM

    loaded = AutoPeftModelForCausalLM.from_pretrained(out)
    assert loaded.peft_config["default"].r == 4


def test_adapter_export_refusals(demo_run: Path, tmp_path: Path):
    from rlctl.after import export

    proc = rlctl("export", str(demo_run), "--adapter", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "trained no LoRA adapter" in proc.stderr.replace("\n", " ")
    run = tmp_path / "stacked"
    from rlctl import checkpoint

    ckpt = checkpoint.incoming(run / "rl" / "checkpoints") / "checkpoint-3"
    ckpt.mkdir(parents=True)
    (ckpt / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(run / "sft" / "final")}))
    checkpoint.publish(run / "rl" / "checkpoints", 3, None, keep_last=2, keep_best=False)  # complete and intact
    from rlctl.config import RunConfig

    with pytest.raises(UserError, match="trained on top of an earlier stage"):
        export.adapter_source(run, RunConfig(model={"adapter": "lora"}), "rl")

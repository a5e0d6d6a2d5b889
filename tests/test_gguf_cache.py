"""The GGUF import cache ($RLCTL_CACHE/gguf): a damaged or unwritable cache is named (exit 2) or rebuilt, an entry is
trusted only when its content checks out, and `rlctl plan` and `rlctl train` judge a GGUF file alike. The files
are tiny GGUFs written here with the `gguf` package; the conversion itself (transformers, torch) is stood in for by
a function that writes a small checkpoint, so these tests take seconds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from rlctl.config import ModelConfig
from rlctl.plan import gguf
from rlctl.stages import gguf_import
from tests.helpers import rlctl


def write_gguf(path: Path, architecture: str = "llama", vocab: int = 16) -> Path:
    """A GGUF file with a decoder's header numbers and one small tensor."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), architecture)
    for add, value in [
        (writer.add_block_count, 1),
        (writer.add_embedding_length, 8),
        (writer.add_head_count, 2),
        (writer.add_head_count_kv, 2),
        (writer.add_feed_forward_length, 16),
        (writer.add_context_length, 64),
    ]:
        add(value)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    writer.add_eos_token_id(1)
    writer.add_tensor("token_embd.weight", np.zeros((vocab, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RLCTL_CACHE", str(root))
    return root


def _fake_convert(path: Path, header, dtype: str, tmp: Path) -> list[str]:
    """What `_convert` leaves in its folder, in small: weights (a safetensors file), a config, a tokenizer."""
    from safetensors.numpy import save_file

    tmp.mkdir(parents=True)
    save_file({"w": np.full((64, 64), path.stat().st_size, dtype=np.float32)}, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps({"source": path.name}))
    (tmp / "tokenizer.json").write_text("{}")
    return ["eos t0 -> t1"]


def _plan(*args: str, env: dict[str, str]) -> tuple[int, str]:
    proc = rlctl("plan", "--preset", "tiny-demo", *args, env=env, timeout=300)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def test_damaged_hash_and_header_records_are_computed_again(tmp_path: Path, cache: Path):
    """An emptied hash record named the import folder without a hash (so a second GGUF would be 'converted
    already'); a header record cut short was a JSONDecodeError on every later plan."""
    first, second = write_gguf(tmp_path / "a.gguf"), write_gguf(tmp_path / "b.gguf", vocab=24)
    header, folder = gguf.header(first), gguf.converted_folder(first, "float32")
    (hashes,) = (cache / "gguf" / "hashes").iterdir()
    (headers,) = (cache / "gguf" / "headers").iterdir()
    headers.write_text(headers.read_text()[:30])
    hashes.write_text("")
    assert gguf.header(first) == header
    assert json.loads(headers.read_text()) == header.to_json(), "rebuilt"
    want = hashlib.sha256(first.read_bytes()).hexdigest()
    assert folder.name.startswith(want) and gguf.converted_folder(first, "float32") == folder
    assert hashes.read_text() == want, "rebuilt"
    assert gguf.converted_folder(second, "float32") != gguf.converted_folder(first, "float32")


def test_a_cached_import_is_trusted_only_when_its_content_checks_out(tmp_path: Path, cache: Path, monkeypatch):
    monkeypatch.setattr(gguf_import, "_convert", _fake_convert)
    model = ModelConfig(name_or_path=str(write_gguf(tmp_path / "m.gguf")))
    spec, _ = gguf.plan_import(model, bf16=False)
    assert not spec.cached and gguf_import.ensure(spec, lambda line: None).converted_now
    folder = Path(spec.folder)
    weights = folder / "model.safetensors"
    intact = weights.read_bytes()
    record = json.loads((folder / gguf.RECORD).read_text())
    assert set(record["files"]) == {"model.safetensors", "config.json", "tokenizer.json"}
    assert gguf.plan_import(model, bf16=False)[0].cached

    damages = {
        "weights cut short": lambda: weights.write_bytes(intact[:-100]),
        "weights changed, same size": lambda: weights.write_bytes(intact[:-4] + b"\x01\x02\x03\x04"),
        "record emptied": lambda: (folder / gguf.RECORD).write_text(""),
        "record of another file": lambda: (folder / gguf.RECORD).write_text(json.dumps({**record, "sha256": "0" * 64})),
        "a file gone": lambda: (folder / "config.json").unlink(),
    }
    for what, damage in damages.items():
        damage()
        lines: list[str] = []
        again = gguf_import.ensure(gguf.plan_import(model, bf16=False)[0], lines.append)
        assert again.converted_now and lines[0].startswith(f"The cached import {folder} cannot be used"), (what, lines)
        assert weights.read_bytes() == intact, what
        assert gguf_import.problem(folder) is None, what
    left = [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]
    assert left == [], "nothing set aside or half-written is left"


def test_the_cut_short_weights_are_not_planned_as_converted(tmp_path: Path, cache: Path, monkeypatch):
    monkeypatch.setattr(gguf_import, "_convert", _fake_convert)
    model = ModelConfig(name_or_path=str(write_gguf(tmp_path / "m.gguf")))
    gguf_import.ensure(gguf.plan_import(model, bf16=False)[0], lambda line: None)
    weights = Path(gguf.plan_import(model, bf16=False)[0].folder) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert not gguf.plan_import(model, bf16=False)[0].cached


def test_an_unwritable_cache_is_named_by_plan_and_train(tmp_path: Path):
    """A cache under a file (or read-only): exit 2 naming it and RLCTL_CACHE, no traceback, nothing written."""
    model = write_gguf(tmp_path / "m.gguf")
    (tmp_path / "afile").write_text("")
    env = {"RLCTL_CACHE": str(tmp_path / "afile" / "cache")}
    for command in ("plan", "train"):
        run_dir = tmp_path / "run"
        argv = [command, "--preset", "tiny-demo", "--set", f"model.name_or_path={model}", "--run-dir", str(run_dir)]
        proc = rlctl(*argv, env=env, timeout=300)
        out = " ".join((proc.stdout + proc.stderr).split())
        assert proc.returncode == 2 and "Traceback" not in out, out
        assert f"The GGUF import cache {tmp_path / 'afile' / 'cache'} cannot be written" in out, out
        assert "Set RLCTL_CACHE to a folder you can write" in out and not run_dir.exists()


def test_a_damaged_header_record_does_not_stop_the_next_plan(tmp_path: Path):
    model = write_gguf(tmp_path / "m.gguf")
    env = {"RLCTL_CACHE": str(tmp_path / "cache")}
    assert _plan("--set", f"model.name_or_path={model}", env=env)[0] == 0
    for record in (tmp_path / "cache" / "gguf" / "headers").iterdir():
        record.write_text(record.read_text()[:40])
    code, out = _plan("--set", f"model.name_or_path={model}", env=env)
    assert code == 0 and "converted once before launch" in out, out


def test_plan_and_train_refuse_an_unknown_architecture_alike(tmp_path: Path):
    """plan exited 0 promising a conversion that train then refused."""
    model = write_gguf(tmp_path / "odd.gguf", architecture="mysterious")
    env = {"RLCTL_CACHE": str(tmp_path / "cache")}
    said = []
    for command in ("plan", "train"):
        run_dir = tmp_path / "run"
        argv = [command, "--preset", "tiny-demo", "--set", f"model.name_or_path={model}", "--run-dir", str(run_dir)]
        proc = rlctl(*argv, env=env, timeout=300)
        out = " ".join((proc.stdout + proc.stderr).split())
        assert proc.returncode == 2 and "Traceback" not in out and not run_dir.exists(), out
        assert f"{model} is a GGUF file of architecture 'mysterious'" in out, out
        said.append(out[out.index("error:") :])
    assert said[0] == said[1], "one check, one message"

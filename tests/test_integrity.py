"""Checkpoints that prove themselves, checked directly: the completion marker's manifest (sizes and checksums),
what each file format makes checkable, the resume fallback to the newest intact checkpoint, `rlctl verify`, and
strict JSON. The end-to-end resume is in test_silent_failures.py."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pytest

from rlctl import checkpoint, strictjson
from rlctl.checkpoint import integrity, verify
from rlctl.errors import UserError
from tests.helpers import records, rlctl


def _safetensors(path: Path, n: int) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x01" * (4 * n))


def _publish(folder: Path, step: int, n: int = 1000, config: bool = False) -> Path:
    ckpt = checkpoint.incoming(folder) / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    _safetensors(ckpt / "model.safetensors", n)
    if config:  # a model folder, as TRL's trainers save it
        (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (ckpt / "nested").mkdir()
    (ckpt / "nested" / "rng.pkl").write_bytes(b"rng" * 10)
    return checkpoint.publish(folder, step, None, keep_last=5, keep_best=False)


def _halve(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_the_marker_records_every_file_and_catches_truncation_changes_and_loss(tmp_path: Path):
    ckpt = _publish(tmp_path, 2)
    marker = json.loads((ckpt / checkpoint.COMPLETE).read_text())
    assert set(marker["files"]) == {"model.safetensors", "trainer_state.json", "nested/rng.pkl"}
    assert marker["files"]["nested/rng.pkl"]["size"] == 30 and marker["checksums"] == integrity.SCHEME
    mark = checkpoint.mark(ckpt)  # the marker as a record: unscored, every file's entry as written
    assert (mark.step, mark.metric, mark.value) == (2, None, None) and mark.to_json() == marker
    assert mark.files["nested/rng.pkl"] == integrity.file_entry(ckpt / "nested" / "rng.pkl")
    assert verify.checkpoint_problems(ckpt) == []
    size = (ckpt / "model.safetensors").stat().st_size
    _halve(ckpt / "model.safetensors")
    assert verify.checkpoint_problems(ckpt) == [
        f"model.safetensors is {size // 2:,} bytes, the marker recorded {size:,}"
    ]
    (ckpt / "nested" / "rng.pkl").write_bytes(b"RNG" * 10)  # same size, other bytes
    (ckpt / "trainer_state.json").unlink()
    problems = verify.checkpoint_problems(ckpt)
    assert "nested/rng.pkl changed since it was written (checksum differs)" in problems
    assert "trainer_state.json is missing" in problems


def test_a_marker_without_a_manifest_reads_and_one_with_a_broken_entry_is_damaged(tmp_path: Path):
    """A marker from before rlctl recorded the files reads with none (the folder is then checked by its formats);
    a file entry that is not one rlctl wrote makes the marker damaged, never a traceback."""
    ckpt = _publish(tmp_path, 3)
    (ckpt / checkpoint.COMPLETE).write_text('{"step": 3, "metric": "eval_accuracy", "value": 0.5}\n')
    mark = checkpoint.mark(ckpt)
    assert (mark.step, mark.value, mark.files) == (3, 0.5, None) and verify.checkpoint_problems(ckpt) == []
    assert mark.to_json() == {"step": 3, "metric": "eval_accuracy", "value": 0.5}
    (ckpt / checkpoint.COMPLETE).write_text('{"step": 3, "files": {"model.safetensors": {"size": 10}}}\n')
    assert verify.checkpoint_problems(ckpt) == [
        f"its completion marker {checkpoint.COMPLETE} is damaged (it lacks its `files.model.safetensors.xxh3`)"
    ]


def test_large_files_get_a_sampled_checksum_that_still_sees_their_blocks(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(integrity, "FULL_HASH_BYTES", 1 << 20)
    path = tmp_path / "big.safetensors"
    _safetensors(path, 3 << 20)  # 12 MiB
    entry = integrity.file_entry(path)
    assert entry.sampled and entry.size == path.stat().st_size
    assert entry.to_json() == {"size": entry.size, "xxh3": entry.xxh3, "sampled": True}
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # inside the last sampled block
    path.write_bytes(bytes(data))
    assert integrity.file_entry(path).xxh3 != entry.xxh3


def test_formats_are_checked_without_a_manifest(tmp_path: Path):
    _safetensors(tmp_path / "model.safetensors", 100)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "optimizer.pt").write_bytes(b"not a zip archive")
    assert integrity.folder_problems(tmp_path, None) == [
        "optimizer.pt is not a complete torch.save archive (no zip central directory)"
    ]
    (tmp_path / "optimizer.pt").unlink()
    _halve(tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text("{")
    problems = integrity.folder_problems(tmp_path, None)
    assert any(p.startswith("config.json: ") for p in problems)
    assert any(p.startswith("model.safetensors is ") and "its header describes" in p for p in problems)


def test_resume_sets_damaged_checkpoints_aside_and_refuses_when_none_is_intact(tmp_path: Path):
    folder = tmp_path / "rl" / "checkpoints"
    for step in (2, 4, 6):
        _publish(folder, step)
    _halve(folder / "checkpoint-6" / "model.safetensors")
    (notes,) = verify.resume_check(tmp_path, ["sft", "rl"])
    assert notes.startswith("stage rl: checkpoint-6 is damaged (checkpoint-6: model.safetensors is ")
    assert "resuming from checkpoint-4, the newest intact checkpoint" in notes
    assert [p.name for p in checkpoint.complete_checkpoints(folder)] == ["checkpoint-2", "checkpoint-4"]
    assert (folder / "checkpoint-6.damaged" / "model.safetensors").is_file()
    assert checkpoint.drop_partial(folder) == [], "a damaged checkpoint is kept for inspection"
    assert verify.resume_check(tmp_path, ["rl"]) == []
    for step in (2, 4):
        _halve(folder / f"checkpoint-{step}" / "model.safetensors")
    with pytest.raises(UserError) as info:
        verify.resume_check(tmp_path, ["rl"])
    assert "Every checkpoint of stage rl" in str(info.value) and "checkpoint-2: model.safetensors is" in str(info.value)
    assert (folder / "checkpoint-4").is_dir(), "nothing is renamed when no checkpoint is intact"
    (tmp_path / "summary.json").write_text(json.dumps({"completed": ["rl"]}))
    assert verify.resume_check(tmp_path, ["rl"]) == [], "finished stages are not looked at"


def test_rlctl_verify_lists_checkpoints_finals_and_exports(tmp_path: Path):
    _publish(tmp_path / "sft" / "checkpoints", 2)
    (tmp_path / "sft" / "final").mkdir()
    _safetensors(tmp_path / "sft" / "final" / "model.safetensors", 10)
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}")
    _safetensors(tmp_path / "export" / "model.safetensors", 10)
    from rlctl.config import dump, presets, validate

    (tmp_path / "config.yaml").write_text(dump(validate(presets.load("tiny-demo"))))
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": NaN}\n{"step": 2}\n{"step": 3, "lo')  # a run going on
    ok = rlctl("verify", str(tmp_path))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "sft/checkpoints/checkpoint-2: intact" in ok.stdout and "export: intact" in ok.stdout
    assert "config.yaml: intact" in ok.stdout and "metrics.jsonl: intact" in ok.stdout
    (tmp_path / "summary.json").write_text('{"completed": ["sf')
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    run_files = dict(verify.run_file_problems(tmp_path))
    (summary_problem,) = run_files["summary.json"]
    assert summary_problem.startswith("it is not valid JSON") and "rebuilds it" in summary_problem
    assert run_files["metrics.jsonl"] == ["line(s) 2 are not JSON records; `rlctl report` leaves them out"]
    (tmp_path / "summary.json").unlink()
    (tmp_path / "metrics.jsonl").unlink()
    _halve(tmp_path / "export" / "model.safetensors")
    bad = rlctl("verify", str(tmp_path), "--json")
    assert bad.returncode == 1
    checked = {c["path"]: c for c in json.loads(bad.stdout)["checked"]}
    assert checked["sft/final"]["intact"] and not checked["export"]["intact"]
    assert rlctl("verify", str(tmp_path / "nothing")).returncode == 2


def test_strict_json_writes_null_with_the_reason():
    text = strictjson.dumps({"loss": math.nan, "kl": -math.inf, "ok": 1.0, "inner": [{"x": math.inf}]})
    assert strictjson.loads(text) == {
        "loss": None,
        "kl": None,
        "ok": 1.0,
        "inner": [{"x": None, "null_reasons": {"x": "inf"}}],
        "null_reasons": {"loss": "nan", "kl": "-inf"},
    }
    with pytest.raises(ValueError, match="not strict JSON: NaN"):
        strictjson.loads('{"loss": NaN}')


def test_export_never_copies_damaged_final_weights(tmp_path: Path):
    from rlctl.after import export

    final = tmp_path / "rl" / "final"
    final.mkdir(parents=True)
    _safetensors(final / "model.safetensors", 1000)
    assert export.intact_source(tmp_path, "rl", final) == (final, "")
    _halve(final / "model.safetensors")
    with pytest.raises(strictjson.DamagedFile, match=r"rl/final is damaged: model\.safetensors .*No intact rl check"):
        export.intact_source(tmp_path, "rl", final)
    folder = tmp_path / "rl" / "checkpoints"
    _publish(folder, 2, config=True)  # a model folder (TRL's stages save them)
    _publish(folder, 4, config=True)
    _publish(folder, 6)  # training state without a model config (rlctl's RL loop)
    _halve(folder / "checkpoint-4" / "model.safetensors")
    src, note = export.intact_source(tmp_path, "rl", final)
    assert src == folder / "checkpoint-2", "the newest intact model folder, never the damaged final or checkpoint-4"
    assert note.startswith(f"{final} is damaged (model.safetensors ") and "checkpoint-2" in note
    shutil.rmtree(folder / "checkpoint-2")
    with pytest.raises(strictjson.DamagedFile, match=r"checkpoint-6, holds training state.*`rlctl resume "):
        export.intact_source(tmp_path, "rl", final)


def test_a_finished_run_whose_final_folder_is_gone_is_named_and_resume_re_creates_it(tmp_path: Path):
    run_dir = tmp_path / "run"
    sets = ["stages=[rl]", "rl.rewards=[{name: exact_match}]", "rl.max_steps=4", "rl.save_every=2"]
    proc = rlctl("train", "--preset", "tiny-demo", *[a for s in sets for a in ("--set", s)], "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    final = run_dir / "rl" / "final"
    weights = (final / "model.safetensors").read_bytes()
    shutil.rmtree(final)
    checked = rlctl("verify", str(run_dir))
    said = " ".join(checked.stdout.split())
    assert checked.returncode == 1 and "rl/final: damaged: gone" in said and f"rlctl resume {run_dir}" in said, said
    for command in ("export", "eval"):
        refused = rlctl(command, str(run_dir))
        said = " ".join((refused.stdout + refused.stderr).split())
        assert refused.returncode == 2 and "its final folder" in said, said
        assert f"`rlctl resume {run_dir}` re-creates it" in said, said
    steps = [r for r in records(run_dir) if "step" in r and "loss" in r]
    resumed = rlctl("resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # rlctl's loop keeps its state in checkpoints: the stage reopens at its last one and trains nothing more
    assert "the stage trains again from checkpoint-4" in " ".join(resumed.stdout.split()), resumed.stdout
    assert (final / "model.safetensors").read_bytes() == weights
    assert [r for r in records(run_dir) if "step" in r and "loss" in r] == steps, "nothing was trained again"
    assert rlctl("verify", str(run_dir)).returncode == 0
    assert rlctl("export", str(run_dir)).returncode == 0


def test_verify_of_an_export_names_files_its_manifest_does_not_know_and_fails_on_those_that_load(tmp_path: Path):
    from rlctl.checkpoint import safewrite

    out = tmp_path / "export"
    staged = safewrite.staging(out)
    (staged / "config.json").write_text("{}")
    _safetensors(staged / "model.safetensors", 10)
    safewrite.publish(staged, out, "export", force=False)
    (out / "NOTES.md").write_text("my notes")
    (out / "notes.txt").write_text("more notes")
    named = rlctl("verify", str(out))
    assert named.returncode == 0, named.stdout + named.stderr
    assert "also holds NOTES.md, notes.txt, not written by rlctl" in named.stdout, named.stdout
    (out / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}')
    _safetensors(out / "adapter_model.safetensors", 10)
    planted = rlctl("verify", str(out))
    said = " ".join(planted.stdout.split())
    assert planted.returncode == 1, said
    assert said.split("would load: ")[1].split(";")[0] == "adapter_config.json, adapter_model.safetensors", said

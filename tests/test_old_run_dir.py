"""A run directory written by an older rlctl still reports, exports and resumes, and its summary.json reads into
the typed record and back unchanged. tests/data/run_df505fd is tiny-demo's sft -> rl (4 + 2 steps, exact match)
as commit df505fd wrote it (the last landed main; its config.yaml still holds the retired `rl.trainer`), its
checkpoints, base model and TensorBoard files left out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers import rlctl, summary

from rlctl import rundir

OLD = Path(__file__).parent / "data" / "run_df505fd"


def _copy(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(OLD, run)
    return run


def test_old_summary_reads_into_the_record_and_back_unchanged():
    raw = json.loads((OLD / rundir.SUMMARY_FILE).read_text())
    record = rundir.read_summary(OLD)
    assert record.completed == ["sft", "rl"] and record.world_size == 1
    assert record.stages["rl"].eval_accuracy == raw["stages"]["rl"]["eval_accuracy"]
    assert record.to_json() == raw


def test_summary_keeps_unknown_keys_and_defaults_missing_ones():
    record = rundir.Summary.from_json({"stages": {"sft": {"eval_accuracy": 0.5}}, "future": [1]})
    assert record.completed == [] and record.world_size is None and record.stages["sft"].eval_accuracy == 0.5
    assert record.to_json() == {
        "run": "",
        "model": "",
        "stages": {"sft": {"eval_accuracy": 0.5}},
        "completed": [],
        "future": [1],
    }


def test_old_run_reports_and_exports(tmp_path: Path):
    run = _copy(tmp_path)
    proc = rlctl("report", str(run))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sft, rl" in (run / "report" / "report.md").read_text()
    out = tmp_path / "export"
    proc = rlctl("export", str(run), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "model.safetensors").is_file() and "eval_accuracy" in (out / "README.md").read_text()


def test_old_run_resumes(tmp_path: Path):
    """Finished: nothing to resume. Its rl final folder gone (no checkpoint left): the stage trains again."""
    run = _copy(tmp_path)
    proc = rlctl("resume", str(run))
    assert proc.returncode == 0 and "finished" in proc.stdout, proc.stdout + proc.stderr
    shutil.rmtree(run / "rl" / "final")
    proc = rlctl("resume", str(run))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (run / "rl" / "final" / "model.safetensors").is_file()
    assert summary(run)["completed"] == ["sft", "rl"]

"""A run directory written by an older rlctl still reports, exports and resumes, and its summary.json reads into
the typed record and back unchanged, as do its layout and memory records and its checkpoints' completion markers.
tests/data/run_df505fd is tiny-demo's sft -> rl (4 + 2 steps, exact match) as commit df505fd wrote it (the last
landed main; its config.yaml still holds the retired `rl.trainer`), its checkpoints, base model and TensorBoard
files left out; tests/data/run_df505fd_marks holds those checkpoints' markers (beside the run: a checkpoint of
nothing but its marker would be damaged, and the resume below would refuse it). That run's RL stage ran on TRL, so
it has no loop state: the older shape of one is written out below."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers import rlctl, summary

from rlctl import checkpoint, rundir, strictjson
from rlctl.checkpoint import integrity

OLD = Path(__file__).parent / "data" / "run_df505fd"
MARKS = Path(__file__).parent / "data" / "run_df505fd_marks"


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


def test_old_layout_and_memory_records_read_into_the_records_and_make_the_same_summary():
    """The per-process records read back, and what the runner makes of them is what df505fd put in summary.json."""
    from rlctl.monitors import layout, memory_probe
    from rlctl.plan import resolved

    raw = json.loads((OLD / rundir.SUMMARY_FILE).read_text())
    run, plan_memory = rundir.RunDir(OLD), resolved.read(OLD).memory
    for stage in ("sft", "rl"):
        for path, kind in ((run.layout(stage), rundir.LayoutRecord), (run.memory(stage), rundir.MemoryRecord)):
            assert kind.from_json(json.loads(path.read_text())).to_json() == json.loads(path.read_text())
        assert layout.read(OLD, stage).to_json() == raw["layout"][stage]
        assert memory_probe.summary(OLD, stage, plan_memory).to_json() == raw["memory"][stage]
    record = rundir.read_summary(OLD)
    assert record.layout["rl"].observed["trainable_parameters"] == 632960 and not record.layout["rl"].mismatched
    rl = record.memory["rl"]
    assert (rl.measured_peak_phase, rl.phases["generation"].planned_phase) == ("training", "rl/generation")
    assert rl.phases["checkpoint"].planned_peak_gib is None and rl.phases["training"].measured == {"rss_gib": 0.807}
    best = record.best_checkpoints["rl"]
    assert (best.step, best.metric, best.value) == (2, "eval_accuracy", 0.0)


def test_old_checkpoint_marks_read_into_the_record_and_back_byte_for_byte():
    for stage, step in (("sft", 4), ("rl", 2)):
        ckpt = MARKS / stage / "checkpoints" / f"checkpoint-{step}"
        text = (ckpt / checkpoint.COMPLETE).read_text()
        mark = checkpoint.mark(ckpt)
        assert (mark.step, mark.metric, mark.value, mark.checksums) == (step, "eval_accuracy", 0.0, integrity.SCHEME)
        assert mark.files["model.safetensors"].size == 2537072 and not mark.files["model.safetensors"].sampled
        assert strictjson.dumps(mark.to_json()) + "\n" == text
        # checked against its manifest: the files left out of the test data are named, each by its recorded entry
        assert "optimizer.pt is missing" in integrity.folder_problems(ckpt, mark.files)


def test_loop_state_of_older_checkpoints_reads_without_the_process_count():
    older = rundir.LoopState.from_json({"step": 8, "cursor": 16, "kl_coef": 0.05})
    assert (older.step, older.cursor, older.kl_coef, older.world) == (8, 16, 0.05, None)
    assert older.to_json() == {"step": 8, "cursor": 16, "kl_coef": 0.05}
    now = rundir.LoopState(8, 16, 0.05, 2)
    assert rundir.LoopState.from_json(now.to_json()) == now and now.to_json()["world"] == 2


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

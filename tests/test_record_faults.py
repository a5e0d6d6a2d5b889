"""Run records that are not what they claim (issue 49): a record whose key holds another kind of value than rlctl
writes is refused naming the file and the key (a finished run never trains again); every record and log rlctl
reads back is read with a size bound, so a link to /dev/zero or a huge file is refused instead of filling memory;
a run directory made read-only mid-run exits 1 naming the last complete checkpoint and `rlctl resume`; and
logs/train.log holds the lines a person reads, not the carriage-return frames of progress bars."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from rlctl import checkpoint, rundir, strictjson
from rlctl.launch import logfile
from rlctl.plan.data_lengths import DataLengths
from rlctl.plan.gguf import ImportRecord
from rlctl.rundir import RunDir
from tests.helpers import injected, rlctl, strict_records


def _out(proc) -> str:
    return " ".join((proc.stdout + proc.stderr).split())


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished tiny SFT run (2 steps, a checkpoint at each)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    sets = ["stages=[sft]", "sft.max_steps=2", "sft.save_every=1", "data.eval=null"]
    proc = rlctl("train", "--preset", "tiny-demo", *[a for s in sets for a in ("--set", s)], "--run-dir", str(run))
    assert proc.returncode == 0, _out(proc)
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out, symlinks=True)
    return out


@pytest.mark.parametrize("completed", ['"sft,rl"', '{"sft": true}', "[1, 2]", "7"])
def test_a_summary_whose_completed_is_of_another_kind_is_refused_naming_the_key(finished, tmp_path, completed):
    run = _copy(finished, tmp_path)
    path = RunDir(run).summary
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "completed": json.loads(completed)}))
    final = sorted(p.name for p in RunDir(run).final("sft").iterdir())
    stamp = (RunDir(run).final("sft") / "config.json").stat().st_mtime_ns
    proc = rlctl("resume", str(run))
    out = _out(proc)
    assert proc.returncode == 2, out
    assert f"{path} is damaged: its `completed" in out and "Nothing was resumed" in out and "Traceback" not in out
    assert sorted(p.name for p in RunDir(run).final("sft").iterdir()) == final
    assert (RunDir(run).final("sft") / "config.json").stat().st_mtime_ns == stamp
    assert json.loads(path.read_text())["completed"] == json.loads(completed), "summary.json is left as it was"
    for command in ("report", "verify"):  # they say what is damaged, and work from what is intact
        proc = rlctl(command, str(run))
        assert "Traceback" not in _out(proc) and "completed" in _out(proc), _out(proc)


def test_records_of_another_kind_are_refused_naming_file_and_key(tmp_path):
    """Every typed record: a key of another kind (a boolean is no number), nested ones named by their path."""
    cases = [
        (rundir.Summary.from_json, {"completed": "sft"}, "`completed` is a string, where rlctl writes a JSON array"),
        (rundir.Summary.from_json, {"completed": ["sft", 3]}, "`completed[1]` is the number 3"),
        (rundir.Summary.from_json, {"world_size": True}, "`world_size` is a boolean"),
        (rundir.Summary.from_json, {"best_checkpoints": {"rl": {"step": "9"}}}, "`best_checkpoints.rl.step`"),
        (rundir.Summary.from_json, {"memory": {"rl": []}}, "`memory.rl` is a JSON array"),
        (rundir.Summary.from_json, {"memory": {"rl": {"phases": {"train": 3}}}}, "`memory.rl.phases.train`"),
        (rundir.CheckpointMark.from_json, {"step": "2"}, "`step` is a string"),
        (rundir.LoopState.from_json, {"step": 2, "cursor": 1.5, "kl_coef": 0.1}, "`cursor` is the number 1.5"),
        (DataLengths.from_json, {"rl_longest_prompt": "5"}, "`rl_longest_prompt` is a string"),
        (DataLengths.from_json, {"images": {"rl": {"tokens_per_row": 5.5}}}, "`images.rl.tokens_per_row` is the"),
        (DataLengths.from_json, {"images": {"rl": {"tokens_per_row": 5}}}, "it lacks its `images.rl.tokens_per_image`"),
        (ImportRecord.from_json, {"source": "m.gguf", "sha256": "0", "files": {}, "fixes": [1]}, "`fixes[0]` is the"),
        (ImportRecord.from_json, {"source": "m.gguf", "sha256": "0", "files": {"a": {"size": "1"}}}, "`files.a.size`"),
        (ImportRecord.from_json, {"source": "m.gguf", "files": {}}, "it lacks its `sha256`"),
    ]
    for parse, data, said in cases:
        path = tmp_path / "record.json"
        path.write_text(json.dumps(data))
        with pytest.raises(rundir.WrongRecord, match="record.json is damaged: " + ".*" + _literal(said)):
            rundir.read_record(path, parse)
    path.write_text(json.dumps({"step": 2, "kl_coef": 0.1}))
    with pytest.raises(rundir.WrongRecord, match="it lacks its `cursor`"):
        rundir.read_record(path, rundir.LoopState.from_json)
    older = {"run": "r", "model": "m", "stages": {}, "completed": ["sft"], "world_size": None, "custom": 1}
    path.write_text(json.dumps(older))  # keys it lacks or null take their defaults; unknown keys are kept
    summary = rundir.read_record(path, rundir.Summary.from_json)
    assert summary.completed == ["sft"] and summary.world_size is None and summary.extra == {"custom": 1}


def _literal(text: str) -> str:
    import re

    return re.escape(text)


MARKER = "sft/checkpoints/checkpoint-2/rlctl_complete"


@pytest.mark.parametrize(
    ("where", "kind"),
    [
        ("summary.json", "dev-zero"),
        ("summary.json", "huge"),
        ("summary.json", "fifo"),
        (MARKER, "dev-zero"),
        (MARKER, "huge"),
    ],
)
def test_a_record_that_is_a_device_or_huge_is_refused_not_read_into_memory(finished, tmp_path, where, kind):
    """summary.json or a checkpoint's completion marker linked to /dev/zero, a named pipe, or a 100 GB sparse file:
    `report`, `verify` and `resume` name the file and why, and never die of MemoryError (or hang on the pipe)."""
    run = _copy(finished, tmp_path)
    path = run / where
    path.unlink()
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        with path.open("wb") as f:
            f.truncate(100 * 2**30)
    for command in ("report", "verify", "resume"):
        proc = rlctl(command, str(run), timeout=300)
        out = _out(proc)
        assert "MemoryError" not in out and "Traceback" not in out, (command, out)
        if command == "verify" or where == "summary.json":
            assert str(path) in out or path.name in out, (command, out)
        if command == "resume":
            assert proc.returncode in (0, 2), out
    if where == "summary.json":
        assert (run / "sft" / "final").is_dir()


def test_bounded_reads_refuse_devices_pipes_and_oversized_files(tmp_path):
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "pipe")
    with (tmp_path / "big").open("wb") as f:
        f.truncate(strictjson.RECORD_BYTES + 1)
    for name, said in (("zero", "a link to /dev/zero"), ("pipe", "not a regular file"), ("big", "more than")):
        with pytest.raises(strictjson.DamagedFile, match=said):
            strictjson.read(tmp_path / name)
    (tmp_path / "metrics.jsonl").symlink_to("/dev/zero")
    with pytest.raises(strictjson.DamagedFile, match="not a regular file"):
        strictjson.lines(tmp_path / "metrics.jsonl")


# Loaded by every Python process of the run (PYTHONPATH): once checkpoint-2 of the stage is complete, every write
# into its checkpoints folder is refused with EACCES, as a folder made read-only refuses a user (the tests run as
# root, whom chmod does not stop). Nothing in rlctl or its libraries is patched.
READ_ONLY = """
import errno, os, sys

def _hook(event, args):
    if event not in ("os.mkdir", "open", "os.rename"):
        return
    path = str(args[0])
    if "/checkpoints/" not in path:
        return
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT
    if event == "open" and not (any(c in args[1] for c in "wax+") if args[1] else args[2] & writes):
        return
    folder = path.split("/checkpoints/")[0] + "/checkpoints"
    if os.path.exists(folder + "/checkpoint-2/rlctl_complete"):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

sys.addaudithook(_hook)
"""


def test_a_checkpoints_folder_made_read_only_mid_run_exits_1_naming_the_last_checkpoint(tmp_path):
    injection = injected(tmp_path, READ_ONLY)
    run = tmp_path / "run"
    sets = ["stages=[sft]", "sft.max_steps=6", "sft.save_every=2", "data.eval=null"]
    args = [a for s in sets for a in ("--set", s)]
    proc = rlctl("train", "--preset", "tiny-demo", *args, "--run-dir", str(run), env=injection)
    out = _out(proc)
    assert proc.returncode == 1, out
    assert "Stage sft could not write" in out and "Permission denied" in out, out
    assert "The last complete checkpoint, checkpoint-2, is intact" in out and f"rlctl resume {run}" in out
    assert "Traceback" not in proc.stdout
    assert [p.name for p in checkpoint.complete_checkpoints(run / "sft" / "checkpoints")] == ["checkpoint-2"]
    errors = [r for r in strict_records(run) if r.get("event") == "error"]
    assert errors and errors[-1]["exit_code"] == 1
    proc = rlctl("resume", str(run))  # writable again: it continues from checkpoint-2
    assert proc.returncode == 0, _out(proc)


def test_a_read_only_fault_is_explained_with_the_last_checkpoint(tmp_path):
    """The explanation itself, for each way a write is refused (EACCES, EPERM, EROFS), wrapped or not."""
    from rlctl.checkpoint import faults

    class Plan:
        run_dir = str(tmp_path)

    ckpts = tmp_path / "sft" / "checkpoints"
    (ckpts / "checkpoint-4").mkdir(parents=True)
    (ckpts / "checkpoint-4" / rundir.COMPLETE).write_text('{"step": 4}')
    for code in (errno.EACCES, errno.EPERM, errno.EROFS):
        error = OSError(code, os.strerror(code), str(ckpts / ".incoming"))
        wrapped = RuntimeError("saving failed")
        wrapped.__cause__ = error
        for raised in (error, wrapped):
            text = faults.explain(raised, Plan(), "sft", ckpts, True)
            assert text is not None and f"could not write {ckpts / '.incoming'} ({os.strerror(code)})" in text
            assert "The last complete checkpoint, checkpoint-4, is intact" in text
            assert f"rlctl resume {tmp_path}" in text


def test_an_image_that_fails_at_runtime_is_explained_with_the_last_checkpoint(tmp_path):
    from rlctl.checkpoint import faults
    from rlctl.data import images

    class Plan:
        run_dir = str(tmp_path)

    with pytest.raises(images.UnreadableImage) as raised:
        images.open_image(str(tmp_path / "gone.png"))
    text = faults.explain(raised.value, Plan(), "rl", tmp_path / "rl" / "checkpoints", True)
    assert text is not None and f"An image of the data, {tmp_path / 'gone.png'}, cannot be opened" in text
    assert "no earlier checkpoint exists" in text and f"rlctl resume {tmp_path}" in text


def test_progress_bar_frames_become_readable_lines():
    """tqdm's carriage-return redraws: one line per bar when it ends (its last frame), a frame at most every
    `every_s` while it runs; plain lines pass as written, a last line without a newline too."""
    now = [0.0]
    out = io.BytesIO()
    lines = logfile.LogLines(out, every_s=30, clock=lambda: now[0])
    lines.feed(b"Loading weights\n")
    for i in range(1, 101):
        now[0] += 1.0
        lines.feed(f"\rTokenizing:  {i:3d}%|{'#' * (i // 10):10s}| {i}/100".encode())
    lines.feed(b"\n")
    lines.feed(b"step 1 loss 2.0\r\nno newline at the end")
    lines.close()
    text = out.getvalue().decode()
    assert "\r" not in text
    shown = text.splitlines()
    assert shown[0] == "Loading weights" and shown[-2:] == ["step 1 loss 2.0", "no newline at the end"]
    bars = [line for line in shown if line.startswith("Tokenizing")]
    assert bars[-1].endswith("100/100") and 2 <= len(bars) <= 5, bars  # 100 s of frames: every 30 s, and the end


def test_train_log_holds_no_progress_bar_frames(finished):
    text = (RunDir(finished).logs / "train.log").read_bytes()
    assert b"\r" not in text and len(text.splitlines()) < 400, text[-2000:]

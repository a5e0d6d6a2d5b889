"""Nothing of the user's is lost: exports, reports, eval results, init and run directories never overwrite a file
rlctl did not write; damaged run files are named (never a traceback); a crash after launch is one paragraph."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from pathlib import Path

import pytest

from rlctl import atomic
from rlctl.checkpoint import safewrite
from rlctl.errors import UserError
from rlctl.rundir import RunDir
from tests.helpers import rlctl


def _folder(path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return path


def _staged(target: Path, files: dict[str, str]) -> Path:
    return _folder(safewrite.staging(target), files)


def test_publish_keeps_the_users_files(tmp_path: Path):
    target = _folder(tmp_path / "mine", {"notes.txt": "mine"})
    staged = _staged(target, {"config.json": "{}", "sub/w.bin": "1"})
    with pytest.raises(UserError, match=r"notes\.txt.*--force"):
        safewrite.publish(staged, target, "export", force=False)
    assert sorted(os.listdir(target)) == ["notes.txt"], "a refusal changes nothing"
    safewrite.publish(_staged(target, {"config.json": "{}", "old.bin": "1"}), target, "export", force=True)
    safewrite.publish(_staged(target, {"config.json": "{2}"}), target, "export", force=True)
    assert (target / "notes.txt").read_text() == "mine"
    assert (target / "config.json").read_text() == "{2}"
    assert not (target / "old.bin").exists(), "rlctl's own file of the earlier export is replaced"
    assert safewrite.recorded(target) == ("export", {"config.json"})
    with pytest.raises(UserError, match=r"notes\.txt"):  # a file of the user's would be replaced: never
        safewrite.publish(_staged(target, {"notes.txt": "x"}), target, "export", force=True)
    assert (target / "notes.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary folder or lock left"


def test_a_folder_of_the_users_where_a_file_goes_is_never_replaced(tmp_path: Path):
    target = _folder(tmp_path / "out", {"config.json/keep": "mine"})
    (target / "empty").mkdir()
    for force, said in ((False, r"did not write as its export \(config\.json/keep\)"), (True, r"\(config\.json\)")):
        with pytest.raises(UserError, match=said):
            safewrite.publish(_staged(target, {"config.json": "{}", "w.bin": "1"}), target, "export", force=force)
    assert sorted(os.listdir(target)) == ["config.json", "empty"] and (target / "config.json" / "keep").is_file()
    other = _folder(tmp_path / "other", {"notes": "mine"})
    with pytest.raises(UserError, match=r"\(notes/a\.bin\)"):
        safewrite.publish(_staged(other, {"notes/a.bin": "1"}), other, "export", force=True)
    safewrite.publish(_staged(target / "empty", {"a/b/c.bin": "1"}), target / "empty", "export", force=False)
    safewrite.publish(_staged(target, {"w.bin": "2"}), tmp_path / "fresh", "export", force=False)
    mine = _folder(tmp_path / "mine", {})
    (mine / "kept").mkdir(parents=True)
    safewrite.publish(_staged(mine, {"w.bin": "1"}), mine, "export", force=False)
    assert (mine / "kept").is_dir(), "an empty folder of the user's is kept too"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary folder or lock left"


def test_an_earlier_export_is_replaced_but_not_one_of_another_kind(tmp_path: Path):
    target = tmp_path / "out"
    safewrite.publish(_staged(target, {"a": "1", "b": "1"}), target, "export", force=False)
    safewrite.publish(_staged(target, {"a": "2"}), target, "export", force=False)
    assert sorted(os.listdir(target)) == ["a", safewrite.MANIFEST]
    with pytest.raises(UserError, match="did not write as its adapter export"):
        safewrite.check_target(target, "adapter export", force=False)


def _publish_after(barrier, target: Path, value: str, results) -> None:
    staged = _staged(target, {"config.json": value, "model.safetensors": value})
    barrier.wait()
    try:
        with safewrite.lock(target, "export"):
            barrier.wait()  # both hold or tried the lock at once: the forced interleaving
            safewrite.publish(staged, target, "export", force=False)
        results.put(("ok", value))
    except UserError as e:
        results.put(("refused", str(e)))
        shutil.rmtree(staged, ignore_errors=True)
        barrier.wait()


def test_concurrent_exports_to_one_folder(tmp_path: Path):
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    target = tmp_path / "out"
    procs = [ctx.Process(target=_publish_after, args=(barrier, target, v, results)) for v in ("A", "B")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcomes = sorted(results.get(timeout=5) for _ in procs)
    (refused, why), (ok, value) = outcomes[1], outcomes[0]
    assert (ok, refused) == ("ok", "refused"), outcomes
    pids = {str(p.pid) for p in procs}
    assert "being written by another rlctl export (pid " in why and any(f"pid {pid})" in why for pid in pids)
    assert (target / "config.json").read_text() == value == (target / "model.safetensors").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.fixture
def run_copy(demo_run: Path, tmp_path: Path) -> Path:
    """A copy of the demo run to damage (without its exports and report)."""
    run = tmp_path / "run"
    shutil.copytree(demo_run, run, ignore=shutil.ignore_patterns("export*", "report", "eval"))
    return run


def _finished_run(run_dir: Path) -> None:
    """A run directory as far as `rlctl export` reads it: config, summary, and an rl/final folder of full weights
    (copied, so no model is loaded)."""
    import struct

    from rlctl.config import dump, presets, validate

    final = run_dir / "rl" / "final"
    final.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump(validate(presets.load("tiny-demo"))))
    (run_dir / "summary.json").write_text(json.dumps({"stages": {}, "completed": ["sft", "rm", "rl"]}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [10], "data_offsets": [0, 40]}}).encode()
    (final / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\x01" * 40)
    (final / "config.json").write_text("{}")
    (final / "generation_config.json").write_text("{}")


def test_an_export_removes_what_a_killed_export_of_its_target_left_half_written(tmp_path: Path):
    run_dir = tmp_path / "run"
    _finished_run(run_dir)
    stale = run_dir / ".export.k9q2x7ab.rlctl-tmp"  # as `staging` names it; the export was killed with kill -9
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    other = run_dir / ".export.v2.k9q2x7ab.rlctl-tmp"  # another target's (export.v2): not this export's to remove
    other.mkdir()
    proc = rlctl("export", str(run_dir))
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, said
    assert not stale.exists() and other.is_dir()
    assert f"Removed {stale.name} next to {run_dir / 'export'}" in said, said
    assert sorted(p.name for p in run_dir.iterdir() if p.name.endswith(".rlctl-tmp")) == [other.name]


def test_drop_stale_removes_a_killed_write_file_of_its_target_only(tmp_path: Path):
    target = tmp_path / "eval.json"
    (tmp_path / ".eval.json.k9q2x7ab.rlctl-tmp").write_text('{"half": ')  # write_file's temporary file
    (tmp_path / ".eval.json.rlctl-lock").write_text("123\n")
    assert safewrite.drop_stale(target).startswith(f"Removed .eval.json.k9q2x7ab.rlctl-tmp next to {target}")
    assert [p.name for p in tmp_path.iterdir()] == [".eval.json.rlctl-lock"]
    assert safewrite.drop_stale(target) == ""


def test_drop_stale_removes_a_killed_atomic_write_of_its_target_only(tmp_path: Path):
    target = tmp_path / "a.json"
    left = atomic.temp_path(target)  # atomic.write_text's temporary file (.a.json.PID.HEX8.rlctl-tmp), killed
    left.write_text('{"half": ')
    neighbour = atomic.temp_path(tmp_path / "a.json.bak")  # another target's, whose name starts with this one's
    neighbour.write_text('{"half": ')
    staged = tmp_path / ".a.json.2.0badcafe.rlctl-tmp"  # a folder: the staging of target a.json.2, not a.json's
    staged.mkdir()
    assert safewrite.drop_stale(target).startswith(f"Removed {left.name} next to {target}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([neighbour.name, staged.name])
    assert safewrite.drop_stale(target) == ""
    assert safewrite.drop_stale(tmp_path / "a.json.bak").startswith(f"Removed {neighbour.name} ")


def test_export_into_the_users_folder(run_copy: Path, tmp_path: Path):
    mine = _folder(tmp_path / "mine", {"notes.txt": "keep me"})
    proc = rlctl("export", str(run_copy), "--out", str(mine))
    assert proc.returncode == 2 and "notes.txt" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert os.listdir(mine) == ["notes.txt"]
    with safewrite.lock(mine, "export"):  # another export holds the folder
        proc = rlctl("export", str(run_copy), "--out", str(mine), "--force")
        assert proc.returncode == 2 and f"(pid {os.getpid()})" in " ".join(proc.stderr.split()), proc.stderr
    proc = rlctl("export", str(run_copy), "--out", str(mine), "--force")
    assert proc.returncode == 0, proc.stderr
    assert (mine / "notes.txt").read_text() == "keep me"
    assert {"config.json", "model.safetensors", "README.md"} <= set(os.listdir(mine))
    # damaged summary.json: export goes on from the intact final folders, report from metrics.jsonl alone
    (run_copy / "summary.json").write_text((run_copy / "summary.json").read_text()[:150])
    proc = rlctl("export", str(run_copy), "--out", str(tmp_path / "fresh"))
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0 and "summary.json is damaged (it ends early" in said, said
    assert (tmp_path / "fresh" / "model.safetensors").is_file()
    proc = rlctl("report", str(run_copy))
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0 and "built from metrics.jsonl alone" in said, said
    assert (run_copy / "report" / "rl.png").is_file()


def test_damaged_run_files_for_resume(run_copy: Path):
    summary = json.loads((run_copy / "summary.json").read_text())
    (run_copy / "summary.json").write_text(json.dumps(summary)[:120])
    proc = rlctl("resume", str(run_copy))
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0 and "rebuilt from metrics.jsonl (completed: sft, rm, rl)" in said, said
    assert json.loads((run_copy / "summary.json").read_text())["completed"] == summary["completed"]
    assert (run_copy / "summary.json.damaged").is_file()
    text = (run_copy / "config.yaml").read_text()
    for cut in (text[:100], text[: len(text) // 2]):  # parses, with sections missing; does not parse
        (run_copy / "config.yaml").write_text(cut)
        for command in (["resume"], ["export"], ["report"]):
            proc = rlctl(*command, str(run_copy))
            said = " ".join(proc.stderr.split())
            assert proc.returncode == 2 and "config.yaml is damaged" in said and "plan.json" in said, said
            assert "Traceback" not in proc.stderr


def test_a_crash_after_launch_is_one_paragraph(run_copy: Path):
    summary = json.loads((run_copy / "summary.json").read_text())
    summary["completed"].remove("rl")
    (run_copy / "summary.json").write_text(json.dumps(summary))
    shutil.rmtree(run_copy / "rl")
    weights = run_copy / "rm" / "final" / "model.safetensors"  # the reward model the RL stage loads
    weights.write_bytes(weights.read_bytes()[:1000])
    proc = rlctl("resume", str(run_copy))
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, said
    assert "Stage rl failed: SafetensorError" in said and f"{run_copy}/logs/train.log" in said, said
    assert "Traceback" not in said and 'File "' not in said


def test_the_cause_of_a_launch_failure_is_read_from_its_log():
    from rlctl.launch.start import failure

    log = (
        'Traceback (most recent call last):\n  File "x.py", line 3, in f\n    g()\n'
        "pyarrow.lib.ArrowTypeError: Expected bytes, got a 'list' object\n"
        'Traceback (most recent call last):\n  File "launch.py", line 9\n'
        "subprocess.CalledProcessError: Command '['python', '-m', 'rlctl.launch.runner']' returned 1.\n"
    )
    assert (
        failure(log) == "The training process raised pyarrow.lib.ArrowTypeError: Expected bytes, got a 'list' object."
    )
    assert failure("rlctl: Stage sft failed: boom.\n" + log) == "Stage sft failed: boom."
    assert "without saying why" in failure("Killed\n")


def test_a_stopped_run_names_its_stage_and_log(tmp_path: Path):
    from rlctl.launch.start import _stopped_where

    log = tmp_path / "logs" / "train.log"
    said = _stopped_where({"stage": "rl", "message": "Reward 'r.py:f' raised KeyError: 'x' [red]."}, log)
    assert said == f" in stage rl:[/] Reward 'r.py:f' raised KeyError: 'x' \\[red]. Full log: {log}."
    named = f"Stage rl failed: OSError (raised at x.py:3). The full traceback is in {log}."
    assert _stopped_where({"stage": "rl", "message": named}, log) == f":[/] {named}", "said once, not twice"


def test_a_launch_killed_without_a_word_names_its_stage(tmp_path: Path):
    from rlctl.launch.start import _failed

    log = tmp_path / "logs" / "train.log"
    said = _failed("sft", -9, "The training process ended without saying why.", log, tmp_path)
    assert said.startswith("[red]Training failed in stage sft (exit -9).[/] The training process ended without")
    assert f"Full log: {log}." in said
    named = "Stage rl failed: OSError (raised at x.py:3)."
    assert _failed("rl", 1, named, log, tmp_path).startswith(f"[red]Training failed (exit 1).[/] {named}")
    (tmp_path / "rl" / "checkpoints" / "checkpoint-4").mkdir(parents=True)
    (tmp_path / "rl" / "checkpoints" / "checkpoint-4" / "rlctl_complete").write_text("{}")
    said = _failed("rl", 1, named, log, tmp_path)
    assert said.endswith(
        f"rlctl resume {tmp_path} (it continues from rl/checkpoints/checkpoint-4, the last complete checkpoint)"
    )


def test_a_training_process_killed_by_a_signal_is_named():
    from rlctl.launch.start import failure

    one = "subprocess.CalledProcessError: Command '['python', 'r']' died with <Signals.SIGKILL: 9>."
    several = "[0]:\n  time      : 2026-01-01\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 4242)"
    for log in (f'Traceback (most recent call last):\n  File "launch.py", line 9\n{one}\n', several):
        said = failure(log)
        assert (
            said
            == "A training process was killed by signal 9 (SIGKILL: a kill -9, or the system's out-of-memory killer)."
        ), said


def test_init_and_train_never_write_over_the_users_files(tmp_path: Path):
    proj = _folder(tmp_path / "proj", {"data/rl.jsonl": "mine\n"})
    proc = rlctl("init", str(proj))
    assert proc.returncode == 2 and "data/rl.jsonl already exists" in " ".join(proc.stderr.split())
    assert sorted(os.listdir(proj)) == ["data"] and (proj / "data" / "rl.jsonl").read_text() == "mine\n"
    proc = rlctl("init", str(proj), "--force")  # --force replaces only what rlctl init wrote
    assert proc.returncode == 2 and "data/rl.jsonl in" in " ".join(proc.stderr.split()) and "yours" in proc.stderr
    assert sorted(os.listdir(proj)) == ["data"] and (proj / "data" / "rl.jsonl").read_text() == "mine\n"
    run_dir = _folder(tmp_path / "run", {"notes.txt": "mine"})
    proc = rlctl("train", "--preset", "tiny-demo", "--run-dir", str(run_dir))
    assert proc.returncode == 2 and "notes.txt" in proc.stderr, proc.stderr
    assert os.listdir(run_dir) == ["notes.txt"]


def test_init_force_replaces_its_own_files_and_never_an_edited_one(tmp_path: Path):
    proj = tmp_path / "proj"
    assert rlctl("init", str(proj), "--preset", "tiny-demo").returncode == 0
    (proj / "notes.txt").write_text("mine")
    assert rlctl("init", str(proj), "--preset", "tiny-agent-demo").returncode == 2  # without --force: nothing
    proc = rlctl("init", str(proj), "--preset", "tiny-agent-demo", "--force")
    assert proc.returncode == 0, proc.stderr
    assert "tiny-agent-demo" in (proj / "rlctl.yaml").read_text() and (proj / "notes.txt").read_text() == "mine"
    edited = (proj / "rlctl.yaml").read_text() + "# my change\n"
    (proj / "rlctl.yaml").write_text(edited)
    proc = rlctl("init", str(proj), "--force")
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "error: rlctl.yaml in" in text and "changed since" in text, text
    assert (proj / "rlctl.yaml").read_text() == edited


def test_init_refuses_a_file_where_its_folder_goes_and_a_folder_where_its_file_goes(tmp_path: Path):
    proj = _folder(tmp_path / "proj", {"data": "mine"})
    (tmp_path / "proj2" / "data" / "rl.jsonl").mkdir(parents=True)
    for folder, said in ((proj, "data in"), (tmp_path / "proj2", "data/rl.jsonl in")):
        for force in ([], ["--force"]):
            proc = rlctl("init", str(folder), *force)
            text = " ".join(proc.stderr.split())
            assert proc.returncode == 2 and said in text and "Traceback" not in text, text
    assert os.listdir(proj) == ["data"] and (proj / "data").read_text() == "mine"
    assert os.listdir(tmp_path / "proj2") == ["data"]


def test_eval_never_replaces_a_file_it_did_not_write(run_copy: Path, tmp_path: Path):
    mine = tmp_path / "results.json"
    mine.write_text('{"mine": 1}')
    proc = rlctl("eval", str(run_copy), "--data", str(run_copy / "data" / "eval.jsonl"), "--out", str(mine))
    assert proc.returncode == 2 and "not an earlier rlctl eval result" in " ".join(proc.stderr.split())
    assert mine.read_text() == '{"mine": 1}' and not mine.with_suffix(".samples.jsonl").exists()


def test_a_config_yaml_that_is_not_text_is_named_damaged(tmp_path: Path):
    from rlctl import strictjson
    from rlctl.checkpoint import verify

    (tmp_path / "config.yaml").write_bytes(b"\x93\xb7 random bytes \xff")
    with pytest.raises(strictjson.DamagedFile, match=r"config\.yaml is damaged.*not a text YAML file.*plan\.json"):
        verify.run_config(tmp_path)


def test_a_place_that_cannot_be_written_is_refused_before_anything_starts(tmp_path: Path):
    blocker = _folder(tmp_path, {"afile": "mine"}) / "afile"
    for target in (blocker / "out", Path("/proc/rlctl-no-such-place/out")):
        with pytest.raises(UserError, match=r"^Cannot write .*; nothing was written"):
            safewrite.check_target(target, "export", force=False)
        with pytest.raises(UserError, match=r"^Cannot write "):
            safewrite.check_file(target / "r.json", lambda _: True, what="eval result")
        with pytest.raises(UserError, match=r"^Cannot write "), safewrite.lock(target, "export"):
            pass
    safewrite.check_target(tmp_path / "new" / "deeper", "export", force=False)  # missing folders are fine
    for argv in (["init", str(blocker / "proj")], ["train", "--preset", "tiny-demo", "--run-dir", str(blocker / "r")]):
        proc = rlctl(*argv)
        said = " ".join(proc.stderr.split())
        assert proc.returncode == 2 and f"Cannot write {blocker}/" in said and "Traceback" not in said, said
    assert sorted(os.listdir(tmp_path)) == ["afile"] and blocker.read_text() == "mine", "nothing left behind"


def test_a_damaged_data_lengths_record_is_named(tmp_path: Path):
    from rlctl import strictjson
    from rlctl.plan import data_lengths

    assert data_lengths.prompt_tokens_of(tmp_path, None) is None
    record = RunDir(tmp_path).data_lengths
    record.write_text('{"rl_longest_prompt": 5}')
    assert data_lengths.prompt_tokens_of(tmp_path, None) == 5 and data_lengths.prompt_tokens_of(tmp_path, 9) == 9
    for damaged in ('{"rl_long', '{"rl_longest_prompt": "x"}', "[5]"):
        record.write_text(damaged)
        with pytest.raises(strictjson.DamagedFile, match=r"data_lengths\.json is damaged.*data\.max_prompt_length"):
            data_lengths.prompt_tokens_of(tmp_path, None)

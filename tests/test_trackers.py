"""logging.report_to: one short SFT -> RM -> RL run (rlctl's own RL loop) reports to W&B (offline), MLflow (its
default SQLite store in the run directory) and trackio (a local store) at once; each is read back from its own
files and must hold exactly the scalars of metrics.jsonl, at the same steps, alarms included. A tracker that fails
is dropped with one warning; TensorBoard needs no package."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl.launch import trackers
from rlctl.launch.tbevents import Scalars
from tests.helpers import free_port, rlctl, strict_records, without

wandb = pytest.importorskip("wandb")
mlflow = pytest.importorskip("mlflow")
trackio = pytest.importorskip("trackio")

SETS = [
    "sft.max_steps=4",
    "rm.max_steps=4",
    "rl.max_steps=2",
    "rl.eval_samples=16",
    "logging.alarm_steps=1",  # alarms fire at once on so short a run
    "logging.report_to=[wandb,mlflow,trackio,tensorboard]",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("trackers")
    run_dir, store = tmp / "run", tmp / "trackio"
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "TRACKIO_DIR": str(store), "MLFLOW_TRACKING_URI": ""}
    sets = [a for s in SETS for a in ("--set", s)]
    proc = rlctl("train", "--preset", "tiny-demo", "--algorithm", "reinforce-pp", *sets, "--run-dir", str(run_dir),
                 env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr + (run_dir / "logs" / "train.log").read_text()
    assert "tracker failed" not in (run_dir / "logs" / "train.log").read_text()
    return run_dir, store


def _expected(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] as rlctl sends them, from metrics.jsonl."""
    scalars, out = Scalars(), {}
    for rec in strict_records(run_dir):
        point = scalars.of(rec)
        for key, value in (point[0] if point else {}).items():
            out.setdefault(key, []).append((point[1], value))
    return out


def _alarms(run_dir: Path) -> set[tuple[str, str]]:
    return {(r["stage"], r["alarm"]) for r in strict_records(run_dir) if r.get("event") == "alarm"}


def _same(got: dict[str, list[tuple[int, float]]], want: dict[str, list[tuple[int, float]]]) -> None:
    assert sorted(got) == sorted(want)
    for key, points in want.items():
        assert [s for s, _ in got[key]] == [s for s, _ in points], key
        assert [v for _, v in got[key]] == pytest.approx([v for _, v in points], rel=1e-6), key


@pytest.mark.slow
def test_the_run_covers_every_kind_of_record(run):
    run_dir, _ = run
    keys = set(_expected(run_dir))
    for stage in ("sft", "rm", "rl"):
        assert any(k.startswith(f"{stage}/") and "/eval/" not in k and "/memory/" not in k for k in keys), stage
        assert any(k.startswith(f"{stage}/memory/") for k in keys), stage
    assert {"sft/eval/accuracy", "rl/eval/accuracy", "rl/time_generate"} <= keys  # held-out, rlctl's RL loop
    assert _alarms(run_dir), "an alarm to carry"


def _wandb_records(path: Path):
    """The protobuf records of a .wandb file (wandb 0.2x+ has no Python reader: W&B's LevelDB-style log, a 7-byte
    header then 32 KiB blocks of chunks `crc32 uint32 | length uint16 | type uint8 (1 full, 2 first, 3 middle,
    4 last) | data`)."""
    from wandb.proto import wandb_internal_pb2

    raw, pos, chunk, block = path.read_bytes(), 7, b"", 32768
    while pos + 7 <= len(raw):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if kind == 0:
            break
        chunk, pos = chunk + raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


@pytest.mark.slow
def test_wandb_offline_run_holds_metrics_jsonl(run):
    run_dir, _ = run
    (log,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    got: dict[str, list[tuple[int, float]]] = {}
    summary: dict = {}
    for record in _wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {_key(item): json.loads(item.value_json) for item in record.history.item}
            stage = next(k.split("/")[0] for k in row if not k.startswith("_"))
            for key, value in row.items():
                if not key.startswith("_") and key != f"{stage}/step":
                    got.setdefault(key, []).append((row[f"{stage}/step"], value))
        if kind == "summary":
            summary.update({_key(item): json.loads(item.value_json) for item in record.summary.update})
    _same(got, _expected(run_dir))
    assert {tuple(k.split("/")[1:]) for k in summary if k.startswith("alarms/")} == _alarms(run_dir)


@pytest.mark.slow
def test_mlflow_default_store_holds_metrics_jsonl(run):
    run_dir, _ = run
    client = mlflow.MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("rlctl").experiment_id])
    want = _expected(run_dir)
    got = {k: [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, k)] for k in want}
    assert set(found.data.metrics) == set(want)
    _same(got, want)
    alarms = {tuple(k.split(".")[1:]) for k in found.data.tags if k.startswith("alarm.")}
    assert alarms == _alarms(run_dir) and found.info.status == "FINISHED"


# trackio reads TRACKIO_DIR when imported: the store is read in a process started with it
READ_TRACKIO = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
name = sys.argv[1]
print(json.dumps([SQLiteStorage.get_logs("rlctl", name), SQLiteStorage.get_alerts("rlctl", run_name=name)]))
"""


@pytest.mark.slow
def test_trackio_local_store_holds_metrics_jsonl(run):
    run_dir, store = run
    name = json.loads((run_dir / "summary.json").read_text())["run"]
    env = {**os.environ, "TRACKIO_DIR": str(store)}
    proc = subprocess.run([sys.executable, "-c", READ_TRACKIO, name], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    logs, alerts = json.loads(proc.stdout)
    got: dict[str, list[tuple[int, float]]] = {}
    for row in logs:
        for key, value in row.items():
            if key not in ("step", "timestamp"):
                got.setdefault(key, []).append((row["step"], value))
    _same(got, _expected(run_dir))
    assert {tuple(a["title"].split()[-2:]) for a in alerts} == _alarms(run_dir)


def test_a_failing_tracker_is_dropped_with_one_warning(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")
    fan = trackers.Fanout(["mlflow", "tensorboard"], tmp_path, "r", {})
    for step in (1, 2):
        fan.add({"stage": "sft", "step": step, "loss": 1.0})
    err = capsys.readouterr().err
    assert err.count("the mlflow tracker failed") == 1 and "dropped" in err
    assert fan.pending == [] and fan.open == {}


def test_a_tracker_failing_in_a_run_shows_on_the_console_once_and_leaks_no_password(tmp_path: Path):
    run_dir, secret = tmp_path / "run", "s3cretPASS"
    uri = f"http://alice:{secret}@127.0.0.1:{free_port()}/"  # nothing listens there
    env = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    sets = ["stages=[sft]", "sft.max_steps=2", "logging.report_to=[mlflow]"]
    args = [a for s in sets for a in ("--set", s)]
    proc = rlctl("train", "--preset", "tiny-demo", *args, "--run-dir", str(run_dir), env=env)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console
    assert console.count("the mlflow tracker failed") == 1, console
    assert "alice:***@127.0.0.1" in console and secret not in console, console
    report = rlctl("report", str(run_dir))
    assert report.returncode == 0 and secret not in report.stdout + report.stderr
    leaked = [p for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert leaked == []


def test_tensorboard_needs_no_package(tmp_path: Path):
    env = without(tmp_path, ["tensorboard", "tensorboardX"])
    proc = rlctl("plan", "--preset", "tiny-demo", "--set", "logging.report_to=[tensorboard]", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr

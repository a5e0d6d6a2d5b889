"""The experiment trackers of `logging.report_to`: every metrics.jsonl record, fanned out as it is written.

rlctl writes one record stream (rlctl.runtime.context.MetricsLog, main process only) and sends the same scalars
to each tracker: every stage's steps (TRL's trainers and rlctl's own RL loop alike), the held-out evaluations,
memory records and alarms, named as in TensorBoard (`stage/metric`, `stage/eval/metric`, `stage/memory/phase/x`,
`stage/alarm/name`; rlctl.launch.tbevents.Scalars) at the stage's step. TRL's own callbacks are off
(`report_to="none"`), so nothing is logged twice.

- tensorboard: rlctl's own event files in RUN_DIR/tensorboard, always written by `rlctl train` (no package).
- wandb: `wandb.init` in RUN_DIR/wandb (WANDB_DIR, WANDB_MODE=offline, WANDB_PROJECT... as wandb reads them).
- mlflow: MLFLOW_TRACKING_URI when set, else `sqlite:///RUN_DIR/mlflow.db` (MLflow 3 refuses its old ./mlruns
  file store); experiment MLFLOW_EXPERIMENT_NAME or "rlctl".
- trackio: trackio's local store (TRACKIO_DIR, default ~/.cache/huggingface/trackio), project "rlctl".

A tracker that fails (not logged in, no server, a bug) is reported once, credentials scrubbed (rlctl.scrub), on
stderr (the run's log) and as a `tracker_failed` record (the console), and dropped; the run, metrics.jsonl and the
other trackers go on.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rlctl.launch.tbevents import Scalars
from rlctl.scrub import scrub

PROJECT = "rlctl"


class Tracker(Protocol):
    def log(self, values: dict[str, float], stage: str, step: int) -> None: ...

    def alarm(self, stage: str, step: int, name: str, message: str) -> None: ...

    def close(self) -> None: ...


class WandbTracker:
    def __init__(self, run_dir: Path, name: str, config: dict[str, Any]):
        import wandb

        directory = os.environ.get("WANDB_DIR") or str(run_dir)
        Path(directory).mkdir(parents=True, exist_ok=True)
        project = os.environ.get("WANDB_PROJECT") or PROJECT
        self.run = wandb.init(project=project, name=name, dir=directory, config=config)
        self.stages: set[str] = set()

    def log(self, values: dict[str, float], stage: str, step: int) -> None:
        if stage not in self.stages:  # each stage counts its own steps: its charts use `stage/step` as x axis
            self.run.define_metric(f"{stage}/step")
            self.run.define_metric(f"{stage}/*", step_metric=f"{stage}/step")
            self.stages.add(stage)
        self.run.log({f"{stage}/step": step, **values})

    def alarm(self, stage: str, step: int, name: str, message: str) -> None:
        self.run.summary[f"alarms/{stage}/{name}"] = f"step {step}: {message}"

    def close(self) -> None:
        self.run.finish()


def mlflow_uri(run_dir: Path) -> str:
    """MLFLOW_TRACKING_URI, or a SQLite store in the run directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"


class MlflowTracker:
    def __init__(self, run_dir: Path, name: str, config: dict[str, Any]):
        from mlflow import MlflowClient

        self.client = MlflowClient(mlflow_uri(run_dir))
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
        self.run_id = self.client.create_run(
            experiment_id, run_name=name, tags={"rlctl.run_dir": str(run_dir)}
        ).info.run_id

    def log(self, values: dict[str, float], stage: str, step: int) -> None:
        from mlflow.entities import Metric

        at = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, at, step) for k, v in values.items()])

    def alarm(self, stage: str, step: int, name: str, message: str) -> None:
        self.client.set_tag(self.run_id, f"alarm.{stage}.{name}", f"step {step}: {message}")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class TrackioTracker:
    def __init__(self, run_dir: Path, name: str, config: dict[str, Any]):
        import trackio

        self.run = trackio.init(project=PROJECT, name=name, config=config, auto_log_cpu=False, auto_log_gpu=False)

    def log(self, values: dict[str, float], stage: str, step: int) -> None:
        self.run.log(values, step=step)

    def alarm(self, stage: str, step: int, name: str, message: str) -> None:
        self.run.alert(f"rlctl alarm: {stage} {name}", message, step=step)

    def close(self) -> None:
        self.run.finish()


ADAPTERS: dict[str, type] = {"wandb": WandbTracker, "mlflow": MlflowTracker, "trackio": TrackioTracker}


class Fanout:
    """metrics.jsonl records -> the configured trackers (those of `names` with an adapter; tensorboard's files are
    written by `rlctl train` itself). Opened on the first record, closed when the process exits (before the
    trackers' own exit hooks, registered earlier, tear their clients down); a tracker that raises is warned about
    once (on stderr and through `note`, which writes a metrics.jsonl record) and dropped."""

    def __init__(
        self,
        names: list[str],
        run_dir: Path,
        run_name: str,
        config: dict[str, Any],
        note: Callable[..., None] | None = None,
    ):
        self.pending = [n for n in names if n in ADAPTERS]
        self.run_dir, self.run_name, self.config = run_dir, run_name, config
        self.open: dict[str, Tracker] = {}
        self.scalars = Scalars()
        self.note = note
        self.stage = "run"  # the stage of the record being sent

    def _call(self, name: str, action: str, *args: Any) -> None:
        try:
            if name not in self.open:
                self.open[name] = ADAPTERS[name](self.run_dir, self.run_name, self.config)
                atexit.register(self.close_one, name)
            getattr(self.open[name], action)(*args)
        except Exception as e:  # any failure of a tracker: warn, drop it, train on
            self.pending.remove(name)
            self.open.pop(name, None)
            self._warn(name, e)

    def _warn(self, name: str, error: Exception) -> None:
        """The one warning of tracker `name` failing, its error scrubbed of credentials."""
        what = scrub(f"{type(error).__name__}: {error}".strip().splitlines()[0][:300])
        message = (
            f"the {name} tracker failed ({what}); it is dropped for the rest of the run (metrics.jsonl and the "
            "other trackers go on; logging.report_to)."
        )
        print(f"rlctl: warning: {message}", file=sys.stderr)
        if self.note is not None:
            self.note(stage=self.stage, event="tracker_failed", tracker=name, message=message)

    def add(self, rec: dict[str, Any]) -> None:
        point = self.scalars.of(rec)
        if point is None:
            return
        values, step = point
        stage = self.stage = rec.get("stage", "run")
        for name in list(self.pending):
            if values:
                self._call(name, "log", values, stage, step)
            if rec.get("event") == "alarm" and name in self.pending:
                self._call(name, "alarm", stage, step, str(rec.get("alarm")), str(rec.get("message", "")))

    def close_one(self, name: str) -> None:
        """Finish tracker `name`'s run (if it is still open)."""
        if name in self.open:
            self._call(name, "close")
            self.open.pop(name, None)

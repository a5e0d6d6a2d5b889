"""Where each file of a run directory lies: `RunDir`, the names of its files and folders (and of the checkpoint
folders in a stage's `checkpoints/`), and `NAMES`, every one of them as a pattern: no module outside
`rlctl.rundir` builds a path from one of those names (tests/test_rundir_only.py holds the code to it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CONFIG_FILE = "config.yaml"  # the resolved config the run was started with (and changed by `rlctl resume --set`)
SUMMARY_FILE = "summary.json"  # per-stage held-out metrics and the stages that finished
METRICS_FILE = "metrics.jsonl"  # every event and training record, one JSON object a line
PLAN_FILE = "plan.json"  # the plan the run was launched with, read by every rank
DATA_LENGTHS_FILE = "data_lengths.json"  # the data's counted lengths and image budgets, as the plan used them
ACCELERATE_FILE = "accelerate.yaml"  # accelerate's config file, as the plan made it
MODEL_IMPORT_FILE = "model_import.json"  # what the import of a GGUF model fixed (a copy of its cache record)
LOCK_FILE = "run.lock"  # the pid of the process that runs the run
LOGS = "logs"  # the launch logs and the UI's logs of the commands it started
DATA = "data"  # the generated datasets, one `ROLE.jsonl` each
BASE = "base"  # the random-init tiny model of a `builtin:tiny` run
TENSORBOARD = "tensorboard"
REPORT = "report"
EVAL = "eval"
CHECKPOINTS = "checkpoints"  # in a stage's folder: its complete checkpoints, `checkpoint-STEP` each
FINAL = "final"  # in a stage's folder: its final model
FINAL_STAGING = "final.tmp"  # beside `final`: the final model while it is written, renamed into place when whole
INCOMING = ".incoming"  # in `checkpoints/`: the checkpoints being written, renamed out once complete
CHECKPOINT_PREFIX = "checkpoint-"  # a checkpoint folder is `checkpoint-STEP` (as transformers' Trainer names it)
DAMAGED = ".damaged"  # the suffix of a file or checkpoint that a resume set aside as damaged
COMPLETE = "rlctl_complete"  # in a checkpoint folder, written last: its CheckpointMark
LOOP_STATE = "rlctl_loop.json"  # in a checkpoint of rlctl's RL loop: its LoopState
REPAIR = "`rlctl resume {run_dir}` rebuilds it from metrics.jsonl; `rlctl report` and `rlctl export` work without it."

# every name above, and the names made from them (`*` where a step, a rank, a role or a command goes)
NAMES = (
    CONFIG_FILE,
    SUMMARY_FILE,
    METRICS_FILE,
    PLAN_FILE,
    DATA_LENGTHS_FILE,
    ACCELERATE_FILE,
    MODEL_IMPORT_FILE,
    LOCK_FILE,
    LOGS,
    "train.log",
    "train.node*.log",
    "ui-*.log",
    DATA,
    "*.jsonl",
    BASE,
    TENSORBOARD,
    REPORT,
    EVAL,
    "export",
    "export-gguf",
    CHECKPOINTS,
    FINAL,
    FINAL_STAGING,
    "layout",
    "memory",
    "rank*.json",
    INCOMING,
    f"{CHECKPOINT_PREFIX}*",
    f"*{DAMAGED}",
    COMPLETE,
    LOOP_STATE,
)

_STEP = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


@dataclass(frozen=True)
class RunDir:
    """A run directory and the paths of its files."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY_FILE

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def plan(self) -> Path:
        """The plan the run was launched with (`rlctl.plan.resolved.Plan`)."""
        return self.root / PLAN_FILE

    @property
    def data_lengths(self) -> Path:
        """The data's counted lengths (`rlctl.plan.data_lengths.DataLengths`)."""
        return self.root / DATA_LENGTHS_FILE

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    def log(self, node_rank: int = 0) -> Path:
        """A node's launch log: node 0 `logs/train.log`, node R `logs/train.nodeR.log`."""
        return self.logs / ("train.log" if node_rank == 0 else f"train.node{node_rank}.log")

    def ui_log(self, command: str) -> Path:
        """The output of an rlctl `command` (train, resume, eval, export ...) the web UI started on the run."""
        return self.logs / f"ui-{command}.log"

    @property
    def lock(self) -> Path:
        """Held by the process that runs the run (its pid)."""
        return self.root / LOCK_FILE

    @property
    def accelerate(self) -> Path:
        return self.root / ACCELERATE_FILE

    @property
    def data(self) -> Path:
        """The generated datasets of a run that generates its data."""
        return self.root / DATA

    def data_file(self, role: str) -> Path:
        """The generated dataset of `role` (sft, preference, rl, eval)."""
        return data_file(self.data, role)

    @property
    def base(self) -> Path:
        """The random-init tiny model a `builtin:tiny` run starts from."""
        return self.root / BASE

    @property
    def model_import(self) -> Path:
        """What the import of a GGUF model fixed (`rlctl.plan.gguf.ImportRecord`)."""
        return self.root / MODEL_IMPORT_FILE

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD

    @property
    def report(self) -> Path:
        return self.root / REPORT

    def export(self, fmt: str = "hf") -> Path:
        return self.root / ("export-gguf" if fmt == "gguf" else "export")

    def eval(self, stem: str) -> Path:
        """An `rlctl eval` result of the run (its samples beside it: `eval_samples`)."""
        return self.root / EVAL / f"{stem}.json"

    def stage(self, name: str) -> Path:
        """The folder of stage `name` (its checkpoints, final model, layout and memory records)."""
        return self.root / name

    def checkpoints(self, stage: str) -> Path:
        return self.stage(stage) / CHECKPOINTS

    def final(self, stage: str) -> Path:
        return self.stage(stage) / FINAL

    def layout(self, stage: str, rank: int = 0) -> Path:
        """Process `rank`'s LayoutRecord of `stage`."""
        return self.stage(stage) / "layout" / f"rank{rank}.json"

    def memory(self, stage: str, rank: int = 0) -> Path:
        """Process `rank`'s MemoryRecord of `stage`."""
        return self.stage(stage) / "memory" / f"rank{rank}.json"

    def is_run(self) -> bool:
        """Whether the folder is a run directory (it holds a config.yaml)."""
        return self.config.is_file()


def every_rank(record: Path) -> list[Path]:
    """The records of every process beside `record` (one of `RunDir.layout` or `RunDir.memory`)."""
    return sorted(record.parent.glob("rank*.json")) if record.parent.is_dir() else []


def data_file(folder: Path, role: str) -> Path:
    """The generated dataset of `role` in `folder`: a run's `data/`, or where a generator writes before it is one."""
    return folder / f"{role}.jsonl"


def incoming(checkpoints: Path) -> Path:
    """Where trainers write checkpoints into `checkpoints` (a stage's `RunDir.checkpoints`) before they are
    complete."""
    return checkpoints / INCOMING


def checkpoint(folder: Path, step: int) -> Path:
    """The checkpoint of `step` in `folder` (a stage's checkpoints, or their `incoming`): `checkpoint-STEP`."""
    return folder / f"{CHECKPOINT_PREFIX}{step}"


def checkpoint_step(path: Path) -> int | None:
    """The step of the checkpoint folder `path` (`checkpoint-STEP`); None when it is not named as one."""
    found = _STEP.match(path.name)
    return int(found[1]) if found else None


def set_aside(path: Path) -> Path:
    """Where a resume keeps the damaged file or checkpoint `path`: beside it, as `NAME.damaged`."""
    return path.with_name(path.name + DAMAGED)


def eval_samples(result: Path) -> Path:
    """The samples of the `rlctl eval` result `result` (`RunDir.eval`, or a file `--out` names), beside it as
    `STEM.samples.jsonl`."""
    return result.with_suffix(".samples.jsonl")


def final_staging(final: Path) -> Path:
    """Where the final model `final` (a stage's `RunDir.final`) is written before it is renamed into place."""
    return final.with_name(FINAL_STAGING)

"""Where each file of a run directory lies: `RunDir`, and the names of the files rlctl reads back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG_FILE = "config.yaml"  # the resolved config the run was started with (and changed by `rlctl resume --set`)
SUMMARY_FILE = "summary.json"  # per-stage held-out metrics and the stages that finished
METRICS_FILE = "metrics.jsonl"  # every event and training record, one JSON object a line
COMPLETE = "rlctl_complete"  # in a checkpoint folder, written last: its CheckpointMark
LOOP_STATE = "rlctl_loop.json"  # in a checkpoint of rlctl's RL loop: its LoopState
REPAIR = "`rlctl resume {run_dir}` rebuilds it from metrics.jsonl; `rlctl report` and `rlctl export` work without it."


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
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, node_rank: int = 0) -> Path:
        """A node's launch log: node 0 `logs/train.log`, node R `logs/train.nodeR.log`."""
        return self.logs / ("train.log" if node_rank == 0 else f"train.node{node_rank}.log")

    @property
    def lock(self) -> Path:
        """Held by the process that runs the run (its pid)."""
        return self.root / "run.lock"

    @property
    def accelerate(self) -> Path:
        return self.root / "accelerate.yaml"

    @property
    def data(self) -> Path:
        """The generated datasets of a run that generates its data."""
        return self.root / "data"

    @property
    def base(self) -> Path:
        """The random-init tiny model a `builtin:tiny` run starts from."""
        return self.root / "base"

    @property
    def model_import(self) -> Path:
        """What the import of a GGUF model fixed."""
        return self.root / "model_import.json"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def report(self) -> Path:
        return self.root / "report"

    def export(self, fmt: str = "hf") -> Path:
        return self.root / ("export-gguf" if fmt == "gguf" else "export")

    def eval(self, stem: str) -> Path:
        """An `rlctl eval` result of the run."""
        return self.root / "eval" / f"{stem}.json"

    def stage(self, name: str) -> Path:
        """The folder of stage `name` (its checkpoints, final model, layout and memory records)."""
        return self.root / name

    def checkpoints(self, stage: str) -> Path:
        return self.stage(stage) / "checkpoints"

    def final(self, stage: str) -> Path:
        return self.stage(stage) / "final"

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

"""The run directory: where each of its files lies (`RunDir`) and the typed record of its summary.json (`Summary`,
with `to_json`/`from_json` as `Plan` has). Every read and write of summary.json and every path to config.yaml goes
through here. `from_json` reads what older rlctl wrote: keys it does not know are kept and written back, keys it
lacks take their defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl import atomic, strictjson

CONFIG_FILE = "config.yaml"  # the resolved config the run was started with (and changed by `rlctl resume --set`)
SUMMARY_FILE = "summary.json"  # per-stage held-out metrics and the stages that finished
METRICS_FILE = "metrics.jsonl"  # every event and training record, one JSON object a line
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

    def stage(self, name: str) -> Path:
        """The folder of stage `name` (its checkpoints, final model, layout and memory records)."""
        return self.root / name

    def checkpoints(self, stage: str) -> Path:
        return self.stage(stage) / "checkpoints"

    def final(self, stage: str) -> Path:
        return self.stage(stage) / "final"

    def is_run(self) -> bool:
        """Whether the folder is a run directory (it holds a config.yaml)."""
        return self.config.is_file()


@dataclass
class StageSummary:
    """A stage's held-out metrics in summary.json: `eval_accuracy` and `eval_reward` for a policy (the reward model's
    are pairwise), `eval_rows`, tool metrics, and `null_reasons` where a value was not finite; kept as written."""

    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def eval_accuracy(self) -> Any:
        return self.metrics.get("eval_accuracy")

    @property
    def eval_reward(self) -> Any:
        return self.metrics.get("eval_reward")

    def to_json(self) -> dict[str, Any]:
        return self.metrics

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageSummary:
        return cls(dict(data))


@dataclass
class Summary:
    """summary.json: the held-out metrics of each stage (`stages`, {stage: {metric: value}}; `base` is the starting
    policy), the stages that finished in order (`completed`), and the per-stage records of the data dropped, the
    memory measured, the best checkpoint and the layout each stage ran with."""

    run: str = ""
    model: str = ""
    stages: dict[str, StageSummary] = field(default_factory=dict)
    completed: list[str] = field(default_factory=list)
    world_size: int | None = None
    data: dict[str, dict[str, Any]] = field(default_factory=dict)
    memory: dict[str, dict[str, Any]] = field(default_factory=dict)
    best_checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    layout: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this rlctl does not know, written back as they were

    def to_json(self) -> dict[str, Any]:
        """The mapping summary.json holds; the per-stage sections only once a stage recorded one."""
        stages = {name: stage.to_json() for name, stage in self.stages.items()}
        out: dict[str, Any] = {"run": self.run, "model": self.model, "stages": stages, "completed": self.completed}
        if self.world_size is not None:
            out["world_size"] = self.world_size
        for key in ("data", "memory", "best_checkpoints", "layout"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary:
        """The record of a summary.json mapping, as any rlctl wrote it; values of the wrong kind read as absent."""
        known = {"run": str, "model": str, "stages": dict, "completed": list, "world_size": int}
        known |= {k: dict for k in ("data", "memory", "best_checkpoints", "layout")}
        values = {k: data[k] for k, kind in known.items() if isinstance(data.get(k), kind)}
        values["completed"] = [s for s in values.get("completed", []) if isinstance(s, str)]
        stages = values.get("stages", {}).items()
        values["stages"] = {s: StageSummary.from_json(m) for s, m in stages if isinstance(m, dict)}
        return cls(**values, extra={k: v for k, v in data.items() if k not in known})

    def finished(self, stages: list[str]) -> bool:
        """Whether every one of `stages` is recorded as completed."""
        return all(stage in self.completed for stage in stages)


def read_summary(run_dir: Path, works: str = "", missing: Summary | None = None) -> Summary:
    """The run's summary.json; `missing` (an empty Summary unless given) when there is none. Raises DamagedFile
    when it cannot be read, `works` saying what still works without it."""
    raw = strictjson.read(RunDir(run_dir).summary, works, missing=None)
    if raw is None:
        return missing if missing is not None else Summary()
    return Summary.from_json(raw)


def write_summary(run_dir: Path, summary: Summary) -> None:
    """Write summary.json whole or not at all (strict JSON: NaN and infinities as null)."""
    atomic.write_text(RunDir(run_dir).summary, strictjson.dumps(summary.to_json(), indent=2) + "\n")

"""summary.json as a typed record: `Summary`, its stages' held-out metrics (`StageSummary`) and data notes
(`DataNote`) beside the records of `rlctl.rundir.records`; read and written whole (`read_summary`, `write_summary`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rlctl.rundir.paths import RunDir
from rlctl.rundir.records import (
    BestCheckpoint,
    LayoutRecord,
    StageMemory,
    WrongKind,
    nested,
    pick,
    read_record,
    unknown,
    write_record,
)


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
class DataNote:
    """summary.json's record of a stage's training rows: how many were dropped as longer than `limit` tokens and
    how many were kept."""

    dropped_too_long: int = 0
    kept: int = 0
    limit: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    KINDS: ClassVar[dict[str, Any]] = dict.fromkeys(("dropped_too_long", "kept", "limit"), int)

    def to_json(self) -> dict[str, Any]:
        return {"dropped_too_long": self.dropped_too_long, "kept": self.kept, "limit": self.limit} | self.extra

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DataNote:
        return cls(**pick(data, cls.KINDS), extra=unknown(data, cls.KINDS))


@dataclass
class Restart:
    """summary.json's record of one elastic restart (torchrun's agent restarted the training processes): the
    agents' restart count (`restart`), the nodes whose agent was started anew (`lost_nodes`: their node ranks, a
    node lost and replaced), the stage it happened in, the last step that stage had logged (`reached_step`) and the
    complete checkpoint every process resumed from (`resumed_from`, None: the stage's start)."""

    restart: int = 0
    lost_nodes: list[int] = field(default_factory=list)
    stage: str = ""
    reached_step: int = 0
    resumed_from: str | None = None
    time: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    KINDS: ClassVar[dict[str, Any]] = {
        "restart": int,
        "lost_nodes": list,
        "stage": str,
        "reached_step": int,
        "resumed_from": str,
        "time": (int, float),
    }

    def to_json(self) -> dict[str, Any]:
        out = {"restart": self.restart, "lost_nodes": self.lost_nodes, "stage": self.stage}
        out |= {"reached_step": self.reached_step, "resumed_from": self.resumed_from, "time": self.time}
        return out | self.extra

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Restart:
        values = pick(data, cls.KINDS)
        for i, node in enumerate(values.get("lost_nodes", [])):
            if not isinstance(node, int) or isinstance(node, bool):
                raise WrongKind(f"lost_nodes[{i}]", node, int)
        return cls(**values, extra=unknown(data, cls.KINDS))


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
    data: dict[str, DataNote] = field(default_factory=dict)
    memory: dict[str, StageMemory] = field(default_factory=dict)
    best_checkpoints: dict[str, BestCheckpoint] = field(default_factory=dict)
    layout: dict[str, LayoutRecord] = field(default_factory=dict)
    restarts: list[Restart] = field(default_factory=list)  # elastic restarts, in order
    extra: dict[str, Any] = field(default_factory=dict)  # keys this rlctl does not know, written back as they were

    KINDS: ClassVar[dict[str, Any]] = {
        "run": str,
        "model": str,
        "stages": dict,
        "completed": list,
        "world_size": int,
        "restarts": list,
    }
    RECORDS: ClassVar[dict[str, Any]] = {
        "stages": StageSummary,
        "data": DataNote,
        "memory": StageMemory,
        "best_checkpoints": BestCheckpoint,
        "layout": LayoutRecord,
    }

    def to_json(self) -> dict[str, Any]:
        """The mapping summary.json holds; the per-stage sections only once a stage recorded one."""
        out: dict[str, Any] = {"run": self.run, "model": self.model, "stages": {}, "completed": self.completed}
        if self.world_size is not None:
            out["world_size"] = self.world_size
        for key in self.RECORDS:
            out[key] = {stage: record.to_json() for stage, record in getattr(self, key).items()}
        out["restarts"] = [restart.to_json() for restart in self.restarts]
        return {k: v for k, v in out.items() if v or k in ("run", "model", "stages", "completed")} | self.extra

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary:
        """The record of a summary.json mapping, as any rlctl wrote it (keys it lacks, or null, take their
        defaults); a value of another kind than rlctl writes is a WrongKind naming its key (a `completed` that is
        a string, not a list of stage names, would make a finished run train again)."""
        kinds = cls.KINDS | dict.fromkeys(cls.RECORDS, dict)
        values = pick(data, kinds)
        for i, stage in enumerate(values.get("completed", [])):
            if not isinstance(stage, str):
                raise WrongKind(f"completed[{i}]", stage, str)
        restarts = enumerate(values.get("restarts", []))
        values["restarts"] = [nested(Restart.from_json, r, f"restarts[{i}]") for i, r in restarts]
        for key, record in cls.RECORDS.items():
            found = values.get(key, {}).items()
            values[key] = {stage: nested(record.from_json, m, f"{key}.{stage}") for stage, m in found}
        return cls(**values, extra=unknown(data, kinds))

    def finished(self, stages: Sequence[str]) -> bool:
        """Whether every one of `stages` is recorded as completed."""
        return all(stage in self.completed for stage in stages)


def read_summary(run_dir: Path, works: str = "", missing: Summary | None = None) -> Summary:
    """The run's summary.json; `missing` (an empty Summary unless given) when there is none. Raises DamagedFile
    when it cannot be read, `works` saying what still works without it."""
    path = RunDir(run_dir).summary
    if not path.exists() and not path.is_symlink():
        return missing if missing is not None else Summary()
    return read_record(path, Summary.from_json, works)


def write_summary(run_dir: Path, summary: Summary) -> None:
    """Write summary.json whole or not at all (strict JSON: NaN and infinities as null)."""
    write_record(RunDir(run_dir).summary, summary)

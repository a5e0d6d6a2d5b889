"""The typed parts of a plan (`rlctl.plan.resolved.Plan`): the process layout, the model's facts, the RL rollouts'
engine settings (vLLM or transformers `generate`) and the memory table, each with its plan.json form (`to_json`,
`from_json`). Their defaults live here and nowhere else: a consumer reads attributes, it never supplies a value
of its own for a missing key."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rlctl.config.sections import ModelArch


@dataclass(frozen=True)
class Layout:
    """Where the processes run: nodes x processes per node, this node's rank and the rank-0 node's address."""

    nodes: int
    gpus_per_node: int
    processes_per_node: int
    world_size: int  # processes over all nodes
    node_rank: int
    main: str | None  # HOST:PORT of the rank-0 node on several nodes, else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layout:
        return cls(**data)


@dataclass(frozen=True)
class ModelFacts:
    """The model the plan is for: its name, where its architecture numbers came from, and (when it has them) the
    architecture and its parameter count."""

    name_or_path: str
    arch_source: str
    arch: ModelArch | None = None  # None: model.arch is not set (no parameter count either)
    params: int | None = None
    params_billions: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name_or_path": self.name_or_path, "arch_source": self.arch_source}
        if self.arch is not None:
            out |= {"params": self.params, "params_billions": self.params_billions, "arch": self.arch.model_dump()}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelFacts:
        arch = data.get("arch")
        return cls(
            data["name_or_path"],
            data["arch_source"],
            ModelArch.model_validate(arch) if arch is not None else None,
            data.get("params"),
            data.get("params_billions"),
        )

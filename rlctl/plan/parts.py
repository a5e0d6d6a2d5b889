"""The typed parts of a plan (`rlctl.plan.resolved.Plan`): the process layout, the model's facts, the RL rollouts'
engine settings (vLLM or transformers `generate`) and the memory table, each with its plan.json form (`to_json`,
`from_json`, strict: a value of another kind than the field's is a WrongKind naming its key, see
`rlctl.rundir.typed`). Their defaults live here and nowhere else: a consumer reads attributes, it never supplies a
value of its own for a missing key."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Generic, TypeVar

from rlctl.config.sections import ModelArch
from rlctl.rundir.records import NUMBER, pick, typed

T = TypeVar("T")
Decision = dict[str, str]  # one line of plan.json's decisions: {"setting", "value", "why"}


@dataclass(frozen=True)
class Noted(Generic[T]):
    """A planning step's result: its value, and the warnings and decisions the plan shows for it."""

    value: T
    warnings: tuple[str, ...] = ()
    decisions: tuple[Decision, ...] = ()


NOT_ESTIMATED = "model.arch is not set: memory not estimated"  # plan.json's memory reason when `Plan.memory` is None


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
        return typed(cls, data)


@dataclass(frozen=True)
class ModelFacts:
    """The model the plan is for: its name, where its architecture numbers came from, and (when it has them) the
    architecture and its parameter count."""

    name_or_path: str
    arch_source: str
    arch: ModelArch | None = None  # None: model.arch is not set (no parameter count either)
    params: int | None = None  # the vision tower's included
    params_billions: float | None = None
    vision_params: int | None = None  # a vision-language model's vision tower (None: a text model)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name_or_path": self.name_or_path, "arch_source": self.arch_source}
        if self.arch is not None:
            out |= {"params": self.params, "params_billions": self.params_billions, "arch": self.arch.model_dump()}
        if self.vision_params is not None:
            out["vision_params"] = self.vision_params
        return out

    KINDS: ClassVar[dict[str, Any]] = {"name_or_path": str, "arch_source": str, "arch": dict, "params": int}
    KINDS |= {"params_billions": NUMBER, "vision_params": int}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelFacts:
        """KeyError naming a key it lacks, WrongKind one of another kind; pydantic's ValidationError (a ValueError)
        for an `arch` that is not one."""
        values = pick(data, cls.KINDS)
        for key in ("name_or_path", "arch_source"):
            if key not in values:
                raise KeyError(key)
        if "arch" in values:
            values["arch"] = ModelArch.model_validate(values["arch"])
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class VllmSettings:
    """The RL rollouts' vLLM engine (plan.json's `vllm`): colocated in each trainer process, asleep between
    rollouts on GPUs, or an async run's generator engines on GPUs of their own (`placement`). The defaults are an
    engine the memory planner did not size (no model.arch): see `Plan.vllm_settings`."""

    max_model_length: int  # the longest prompt plus the longest completion
    gpu_memory_utilization: float = 0.3  # vLLM's reservation, a share of each GPU
    tensor_parallel_size: int = 1
    max_num_seqs: int = 0  # sequences vLLM schedules at once (0: not sized)
    kv_cache_gib: float | None = 1.0  # per GPU; on CPU vLLM's KV cache space. None: an async generator not sized
    concurrent_sequences: int = 0  # rollouts the KV cache holds at once (0: not sized)
    rollouts_per_instance: int = 0  # rollouts one engine (its tensor-parallel group) generates per step
    sleep_level: int = 2  # 2: weights and KV cache released between rollouts; 0: no sleep mode (CPU, async)
    placement: str | None = None  # where an async run's engines run; None: colocated with the trainers

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": "vllm"}
        if self.placement is not None:
            out["placement"] = self.placement
        return out | {
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_length": self.max_model_length,
            "max_num_seqs": self.max_num_seqs,
            "kv_cache_gib": self.kv_cache_gib,
            "concurrent_sequences": self.concurrent_sequences,
            "rollouts_per_instance": self.rollouts_per_instance,
            "sleep_level": self.sleep_level,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VllmSettings:
        return typed(cls, data)


@dataclass(frozen=True)
class GenerationSettings:
    """The RL rollouts' transformers `generate` (plan.json's `generation`): rollouts per process (or per async
    generator) and per `generate` call."""

    rollouts_per_process: int
    rollouts_per_generate: int  # 0: not sized (no model.arch); `Plan.rollouts_per_generate` then takes them all

    def to_json(self) -> dict[str, Any]:
        return {"engine": "transformers", **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GenerationSettings:
        return typed(cls, data)


@dataclass(frozen=True)
class PhaseMemory:
    """One phase of one stage: GiB per GPU (per process on CPU) by component, its peak against the budget."""

    stage: str
    phase: str  # generation, training, optimizer step
    components_gib: dict[str, float]
    peak_gib: float
    budget_gib: float
    headroom_gib: float
    fits: bool

    @property
    def label(self) -> str:
        return f"{self.stage}/{self.phase}"


@dataclass(frozen=True)
class HostMemory:
    """Host RAM per node: what CPU offload keeps there (GiB by component; none without offload) against its budget."""

    components_gib: dict[str, float]
    peak_gib: float
    budget_gib: float
    ram_assumed: bool  # the spec's RAM is a guess (a named spec, not this machine)


@dataclass(frozen=True)
class DiskSpace:
    """What the run writes at most (checkpoints and final models) and what is free where the run directory lives."""

    need_gib: float
    free_gib: float


@dataclass(frozen=True)
class MemoryTable:
    """The memory plan (plan.json's `memory`): one row per phase of each stage, GiB per GPU (per process on CPU),
    the highest of them against the budget, host RAM and disk."""

    device: str  # gpu | cpu
    total_gib: float
    budget_gib: float
    peak_gib: float
    peak_phase: str  # STAGE/PHASE of the peak
    headroom_gib: float
    fits: bool
    phases: tuple[PhaseMemory, ...]
    host: HostMemory
    disk: DiskSpace

    def stage_phases(self, stage: str) -> list[PhaseMemory]:
        """The rows of one stage, in the plan's order."""
        return [p for p in self.phases if p.stage == stage]

    def to_json(self) -> dict[str, Any]:
        out = {"estimated": True, **asdict(self)}
        out["phases"] = [asdict(p) for p in self.phases]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryTable | None:
        """The table plan.json holds; None where it says the memory was not estimated."""
        if not pick(data, {"estimated": bool}).get("estimated"):
            return None
        return typed(cls, data)

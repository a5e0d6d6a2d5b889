"""The resolved plan (`Plan`, one `StagePlan` per stage): what `rlctl.plan.planner.build` decides, written to the
run directory's plan.json (`to_json`) and read back by every rank (`from_json`)."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.config import RunConfig
from rlctl.data.images import ImageBudget
from rlctl.plan import engine, gguf, memory
from rlctl.plan import hardware as hw
from rlctl.plan.parts import NOT_ESTIMATED, GenerationSettings, Layout, MemoryTable, ModelFacts, VllmSettings

if TYPE_CHECKING:
    from rlctl.plan.async_split import AsyncSplit

PLAN_FILE = "plan.json"  # in the run directory: the plan the run was launched with, read by every rank


@dataclass
class StagePlan:
    """One stage: where its weights start, where they land, and its batch arithmetic per process."""

    name: str
    init_from: str
    output: str
    max_steps: int
    batch_size: int
    micro_batch_size: int
    grad_accum: int
    notes: list[str] = field(default_factory=list)
    strategy: str = ""  # how this stage distributes (the plan's strategy, but where the hardware cannot run it)
    epochs: float | None = None  # the stage's length as set, when in epochs (max_steps is then counted from them)


@dataclass
class Plan:
    """The whole plan of a run. Its parts are typed (`rlctl.plan.parts`: layout, model, vllm, generation, memory),
    with their defaults there; `accelerate` alone stays a dict: accelerate's own config file, passed through
    verbatim as the run directory's accelerate.yaml."""

    config: RunConfig
    run_dir: str
    hardware: hw.Hardware
    num_processes: int
    strategy: str
    mixed_precision: str
    adapter: str
    gradient_checkpointing: bool
    generation_engine: str
    stages: list[StagePlan]
    accelerate: dict[str, Any]  # accelerate's config file (accelerate.yaml), written as is
    launch: list[str]
    layout: Layout
    model: ModelFacts
    warnings: list[str] = field(default_factory=list)
    cpu_offload: bool = False  # FSDP2 keeps parameters, gradients and optimizer states in host RAM
    phase_offload: bool = False  # RL: optimizer states live in host RAM outside the optimizer step
    reference: str = "none"  # none | adapters-disabled | gpu | gpu-sharded | cpu-offload | cpu | cpu-sharded
    vllm: VllmSettings | None = None  # the vLLM engine as the planner sized it (None: not sized, or no vLLM)
    decisions: list[dict[str, str]] = field(default_factory=list)  # {setting, value, why}, one line each
    memory: MemoryTable | None = None  # per phase x component GiB, peak, budget, headroom; None: not estimated
    generation: GenerationSettings | None = None  # transformers generation: rollouts per process, per generate call
    model_import: gguf.GgufImport | None = None  # a GGUF file converted to a folder before launch
    async_split: AsyncSplit | None = None  # rl.async_rollout: the generator process beside the trainers
    images: dict[str, ImageBudget] = field(default_factory=dict)  # a vision-language run's image tokens, by stage

    @property
    def command(self) -> str:
        return shlex.join(self.launch)

    @property
    def memory_engine(self) -> str:
        """The engine the memory model plans beside the trainer processes: `separate` when an async run's generator
        has GPUs of its own, else the generation engine."""
        return memory.SEPARATE if self.async_split is not None and self.async_split.on_gpus else self.generation_engine

    @property
    def vllm_settings(self) -> VllmSettings:
        """The vLLM engine's settings: the planner's, else (no model.arch: not sized) `VllmSettings`' defaults."""
        return self.vllm or VllmSettings(max_model_length=engine.max_model_length(self.config))

    @property
    def rollouts_per_generate(self) -> int:
        """Rollouts per transformers `generate` call: the planner's choice, else all of a process's rollouts."""
        planned = self.generation.rollouts_per_generate if self.generation else 0
        rl = next((s for s in self.stages if s.name == "rl"), None)
        return planned or (rl.micro_batch_size * rl.grad_accum if rl else 1)

    def to_json(self) -> dict[str, Any]:
        out = self._json()
        if self.images:  # vision-language runs only: a text plan's JSON is unchanged
            out["images"] = {stage: b.to_json() for stage, b in self.images.items()}
        return out

    def _json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "hardware": self.hardware.to_dict(),
            "layout": self.layout.to_json(),
            "model": self.model.to_json(),
            "model_import": asdict(self.model_import) if self.model_import else None,
            "async_split": self.async_split.to_dict() if self.async_split else None,
            "num_processes": self.num_processes,
            "strategy": self.strategy,
            "mixed_precision": self.mixed_precision,
            "adapter": self.adapter,
            "gradient_checkpointing": self.gradient_checkpointing,
            "generation_engine": self.generation_engine,
            "stages": [asdict(s) for s in self.stages],
            "accelerate": self.accelerate,
            "launch": self.command,
            "cpu_offload": self.cpu_offload,
            "phase_offload": self.phase_offload,
            "reference": self.reference,
            "vllm": self.vllm.to_json() if self.vllm else None,
            "generation": self.generation.to_json() if self.generation else None,
            "decisions": self.decisions,
            "memory": self.memory.to_json() if self.memory else {"estimated": False, "reason": NOT_ESTIMATED},
            "warnings": self.warnings,
            "config": self.config.model_dump(mode="json"),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        """The plan `to_json` wrote (plan.json): what every rank of a run reads instead of planning again."""
        from rlctl import config as config_mod

        split = data.get("async_split")
        if split is not None:
            from rlctl.plan.async_split import AsyncSplit

            ids = ("generator_gpu_ids", "trainer_gpu_ids")
            split = AsyncSplit(
                **{k: tuple(v) if k in ids else v for k, v in split.items() if k in AsyncSplit.__dataclass_fields__}
            )
        imported = data.get("model_import")
        return cls(
            config=config_mod.validate(config_mod.saved(data["config"], "plan.json"), source="plan.json"),
            run_dir=data["run_dir"],
            hardware=hw.Hardware(**data["hardware"]),
            num_processes=data["num_processes"],
            strategy=data["strategy"],
            mixed_precision=data["mixed_precision"],
            adapter=data["adapter"],
            gradient_checkpointing=data["gradient_checkpointing"],
            generation_engine=data["generation_engine"],
            stages=[StagePlan(**s) for s in data["stages"]],
            accelerate=data["accelerate"],
            launch=shlex.split(data["launch"]),
            layout=Layout.from_json(data["layout"]),
            model=ModelFacts.from_json(data["model"]),
            warnings=data.get("warnings", []),
            cpu_offload=data.get("cpu_offload", False),
            phase_offload=data.get("phase_offload", False),
            reference=data.get("reference", "none"),
            vllm=VllmSettings.from_json(data["vllm"]) if data.get("vllm") else None,
            decisions=data.get("decisions", []),
            memory=MemoryTable.from_json(data.get("memory", {})),
            generation=GenerationSettings.from_json(data["generation"]) if data.get("generation") else None,
            model_import=gguf.GgufImport(**imported) if imported else None,
            async_split=split,
            images={stage: ImageBudget.from_json(b) for stage, b in (data.get("images") or {}).items()},
        )


def read(run_dir: Path) -> Plan:
    """The plan a run was launched with (plan.json): every rank reads it rather than planning again (no hardware
    or disk probes per rank, no second opinion); a DamagedFile naming the file when it cannot be read."""
    from rlctl import strictjson

    path = Path(run_dir) / PLAN_FILE
    works = f"`rlctl resume {run_dir}` plans the run again from config.yaml and writes a new {PLAN_FILE}."
    data = strictjson.read(path, works)
    try:
        return Plan.from_json(data)
    except (KeyError, TypeError, ValueError) as e:
        raise strictjson.DamagedFile(path, f"it does not hold a plan ({type(e).__name__}: {e})", works) from None

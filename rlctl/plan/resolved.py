"""The resolved plan (`Plan`, one `StagePlan` per stage): what `rlctl.plan.planner.build` decides, written to the
run directory's plan.json (`to_json`) and read back by every rank (`from_json`, strict as every run record is: a
key of another kind, or one missing, is named)."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rlctl.config import RunConfig
from rlctl.data.images import ImageBudget
from rlctl.plan import engine, gguf, memory
from rlctl.plan import hardware as hw
from rlctl.plan.parts import NOT_ESTIMATED, GenerationSettings, Layout, MemoryTable, ModelFacts, VllmSettings
from rlctl.rundir import PLAN_FILE, RunDir, read_record
from rlctl.rundir.records import nested, pick, typed, typed_value

if TYPE_CHECKING:
    from rlctl.plan.async_split import AsyncSplit


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

    KINDS: ClassVar[dict[str, Any]] = {
        "run_dir": str,
        "num_processes": int,
        "strategy": str,
        "mixed_precision": str,
        "adapter": str,
        "gradient_checkpointing": bool,
        "generation_engine": str,
        "launch": str,
        "cpu_offload": bool,
        "phase_offload": bool,
        "reference": str,
    }
    KINDS |= dict.fromkeys(("config", "hardware", "layout", "model", "accelerate", "vllm", "generation"), dict)
    KINDS |= dict.fromkeys(("memory", "model_import", "async_split", "images"), dict)
    KINDS |= dict.fromkeys(("stages", "decisions", "warnings"), list)
    REQUIRED: ClassVar[tuple[str, ...]] = ("config", "run_dir", "hardware", "num_processes", "strategy")
    REQUIRED += ("mixed_precision", "adapter", "gradient_checkpointing", "generation_engine", "stages", "accelerate")
    REQUIRED += ("launch", "layout", "model")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        """The plan `to_json` wrote (plan.json): what every rank of a run reads instead of planning again. A KeyError
        names a key it lacks, a WrongKind one of another kind (`stages[0].max_steps`)."""
        from rlctl import config as config_mod
        from rlctl.plan.async_split import AsyncSplit

        v = pick(data, cls.KINDS)
        for key in cls.REQUIRED:
            if key not in v:
                raise KeyError(key)

        def part(kind: Any, key: str) -> Any:
            return typed(kind, v[key], key) if key in v else None

        return cls(
            config=config_mod.validate(config_mod.saved(v["config"], PLAN_FILE), source=PLAN_FILE),
            run_dir=v["run_dir"],
            hardware=part(hw.Hardware, "hardware"),
            num_processes=v["num_processes"],
            strategy=v["strategy"],
            mixed_precision=v["mixed_precision"],
            adapter=v["adapter"],
            gradient_checkpointing=v["gradient_checkpointing"],
            generation_engine=v["generation_engine"],
            stages=typed_value(list[StagePlan], v["stages"], "stages"),
            accelerate=v["accelerate"],
            launch=shlex.split(v["launch"]),
            layout=part(Layout, "layout"),
            model=nested(ModelFacts.from_json, v["model"], "model"),
            warnings=typed_value(list[str], v.get("warnings", []), "warnings"),
            cpu_offload=v.get("cpu_offload", False),
            phase_offload=v.get("phase_offload", False),
            reference=v.get("reference", "none"),
            vllm=part(VllmSettings, "vllm"),
            decisions=typed_value(list[dict[str, str]], v.get("decisions", []), "decisions"),
            memory=nested(MemoryTable.from_json, v.get("memory", {}), "memory"),
            generation=part(GenerationSettings, "generation"),
            model_import=part(gguf.GgufImport, "model_import"),
            async_split=part(AsyncSplit, "async_split"),
            images={s: nested(ImageBudget.from_json, b, f"images.{s}") for s, b in v.get("images", {}).items()},
        )


def read(run_dir: Path, works: str = "") -> Plan:
    """The plan a run was launched with (plan.json): every rank reads it rather than planning again (no hardware
    or disk probes per rank, no second opinion); a DamagedFile naming the file when it cannot be read, followed by
    `works` (by default: that a resume writes a new one)."""
    works = works or f"`rlctl resume {run_dir}` plans the run again from config.yaml and writes a new {PLAN_FILE}."
    return read_record(RunDir(Path(run_dir)).plan, Plan.from_json, works)

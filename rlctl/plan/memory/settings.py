"""The planning step of memory: the memory planner's decision (`rlctl.plan.memory.decide`) for the trainer processes
turned into the plan's settings (strategy, adapter, checkpointing, offload, micro-batches, the generation engine's
settings, the memory table with the disk the run needs), or without architecture numbers the defaults, unchecked."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rlctl.errors import UserError
from rlctl.plan import engine as engine_mod
from rlctl.plan import hardware as hw
from rlctl.plan import memory
from rlctl.plan.parts import Decision, DiskSpace, GenerationSettings, MemoryTable, Noted, VllmSettings

if TYPE_CHECKING:
    from rlctl.config import RunConfig
    from rlctl.plan.async_split import AsyncSplit


@dataclass(frozen=True)
class Memory:
    """The memory planner's decisions (or the defaults, unchecked, without architecture numbers)."""

    strategy: str
    adapter: str
    checkpointing: bool
    cpu_offload: bool = False
    phase_offload: bool = False
    reference: str = "unknown"
    micro: dict[str, int] = field(default_factory=dict)  # stage -> the micro-batch that fits
    vllm: VllmSettings | None = None
    generation: GenerationSettings | None = None
    table: MemoryTable | None = None
    warnings: tuple[str, ...] = ()
    decisions: tuple[Decision, ...] = ()


@dataclass(frozen=True)
class Trainers:
    """What the memory of the trainer processes is planned for: the run's config, the config the memory model sizes
    (sequences as long as the data's), the hardware, processes per node, engine, precision and run directory, and a
    vision-language run's image tokens per row by stage."""

    cfg: RunConfig
    sized: RunConfig
    hardware: hw.Hardware
    procs: int
    engine: str
    precision: str
    run_dir: str | Path
    image_tokens: dict[str, int] = field(default_factory=dict)


def plan(t: Trainers, split: AsyncSplit | None) -> Memory:
    """The memory settings of the trainer processes, or without architecture numbers the defaults."""
    mem = _decide(t.sized, t.hardware, t.procs, t.engine, t.precision, split, t.image_tokens)
    return _defaults(t) if mem is None else _checked(t, mem)


def _defaults(t: Trainers) -> Memory:
    """No architecture numbers: the configured settings, auto ones at their defaults, unchecked."""
    cfg, hardware = t.cfg, t.hardware
    strategy = cfg.hardware.strategy
    if strategy == "auto":
        strategy = "single" if t.procs * hardware.nodes == 1 else "ddp"
    checkpointing = cfg.model.gradient_checkpointing
    unchecked = "model.arch is not set: the memory planner cannot check this plan (add the model's arch)"
    return Memory(
        strategy,
        "full" if cfg.model.adapter == "auto" else cfg.model.adapter,
        bool(not hardware.is_cpu if checkpointing == "auto" else checkpointing),
        phase_offload=cfg.hardware.optimizer_offload is True and "rl" in cfg.stages,
        warnings=() if hardware.is_cpu else (unchecked,),
    )


def _checked(t: Trainers, mem: memory.MemoryPlan) -> Memory:
    """What the memory planner settled on, with the generation engine's settings and the disk the run needs."""
    cfg, hardware, setup = t.cfg, t.hardware, mem.setup
    decisions = list(mem.decisions)
    phase_offload = setup.phase_offload and "rl" in cfg.stages
    if hardware.is_cpu and cfg.hardware.optimizer_offload is True and "rl" in cfg.stages:
        phase_offload = True  # asked for: the RL step runs its offload calls, which have nothing to move
        why = "no-op on CPU: the optimizer state already lives in host RAM (set by you)"
        decisions.append({"setting": "optimizer offload", "value": "between phases", "why": why})
    settings = _generation_settings(mem.generation, hardware)
    need, free = memory.disk_need(cfg, setup, t.precision), hw.free_disk_gib(t.run_dir)
    here = hardware.is_cpu or hw.has_local_gpu()  # a GPU plan made on a GPU-less machine runs elsewhere
    disk: tuple[str, ...] = ()
    if here and need > free * memory.GiB:
        disk = (
            f"checkpoints and final models need about {memory.gib(need):g} GiB but {free:.0f} GiB are free "
            "where the run directory lives (lower checkpoint.keep_last or free disk)",
        )
    vllm, generation = settings.value
    return Memory(
        setup.strategy,
        setup.adapter,
        bool(setup.checkpointing),
        setup.cpu_offload,
        phase_offload,
        mem.reference,
        mem.micro,
        vllm,
        generation,
        mem.table(DiskSpace(memory.gib(need), round(free, 1))),
        (*mem.warnings, *disk),
        (*decisions, *settings.decisions),
    )


def _generation_settings(
    gen: memory.Generation | None, hardware: hw.Hardware
) -> Noted[tuple[VllmSettings | None, GenerationSettings | None]]:
    """The plan's vllm or generation section for the generation phase the memory planner sized."""
    if gen is not None and gen.engine == "vllm":
        if engine_mod.sleep_mode_for(hardware):
            return Noted((gen.vllm_settings(), None))
        why = "vLLM's CPU build has no sleep mode"
        off = {"setting": "vLLM sleep mode", "value": "off", "why": why}
        return Noted((replace(gen.vllm_settings(), sleep_level=0), None), decisions=(off,))
    if gen is not None and gen.engine == "transformers":
        if gen.concurrent >= gen.rollouts:
            return Noted((None, gen.transformers_settings()))
        chunk = {
            "setting": "generation chunk",
            "value": f"{gen.concurrent} of {gen.rollouts} rollouts per generate call",
            "why": "the KV cache of every rollout at once does not fit next to the training state",
        }
        return Noted((None, gen.transformers_settings()), decisions=(chunk,))
    return Noted((None, None))


def _decide(
    cfg: RunConfig,
    hardware: hw.Hardware,
    procs: int,
    engine: str,
    precision: str,
    split: AsyncSplit | None,
    image_tokens: dict[str, int],
) -> memory.MemoryPlan | None:
    """memory.decide for the trainer processes: an async run's on its trainer GPUs with no engine beside them, its
    refusal saying that only the trainer side was planned there."""
    if split is None or not split.on_gpus:
        return memory.decide(cfg, hardware, procs, engine, precision, image_tokens)
    try:
        return memory.decide(cfg, hardware, procs, memory.SEPARATE, precision, image_tokens)
    except UserError as e:
        raise UserError(
            f"rl.async_rollout: the trainer side ({procs} of {hardware.gpus_per_node} GPUs per node; the generator has "
            f"the other {hardware.gpus_per_node - procs}) does not fit. {e}"
        ) from None

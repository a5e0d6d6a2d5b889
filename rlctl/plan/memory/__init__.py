"""The memory planner: the automatic settings of a run, chosen on the memory model (`rlctl.plan.memory.model`).

`decide()` walks the candidate settings in a fixed order (full replicated, FSDP2, optimizer offload between
phases, FSDP2 + CPU offload, LoRA, QLoRA; `rlctl.plan.memory.search`), picks the first that fits with the largest
micro-batches, and explains every choice in one line (`rlctl.plan.memory.explain`). Nothing fits: `decide()` raises a
UserError naming the nearest plan that does (`rlctl.plan.memory.advice`). Also here: the disk a run needs. Pure Python
(no torch), documented in docs/memory-planner.md.

The modules of this package: `arch` (architecture counts), `model` (per-GPU terms of the training state and the
training phase), `generation` (the RL generation phase), `search` (workloads, candidates, micro-batch fit), `advice`
(nearest fitting plans, safer settings after an OOM), `explain` (reasons and the table), `settings` (the decision as
the plan's settings: the planner's memory step).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rlctl.errors import UserError
from rlctl.plan.memory import explain, search
from rlctl.plan.memory.advice import nearest, refusal, safer
from rlctl.plan.memory.arch import Arch
from rlctl.plan.memory.explain import render
from rlctl.plan.memory.model import SEPARATE, Attempt, Env, Generation, GiB, Setup, gib
from rlctl.plan.memory.search import environment, explicit_settings
from rlctl.plan.parts import DiskSpace, HostMemory, MemoryTable

if TYPE_CHECKING:
    from rlctl.config import RunConfig
    from rlctl.plan.hardware import Hardware

# the API rlctl.plan, the display and the out-of-memory report use
__all__ = ["SEPARATE", "GiB", "MemoryPlan", "decide", "disk_need", "gib", "render", "safer"]


# --- The result ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryPlan:
    """What `decide()` settled on, with its per-phase memory table, its warnings and one-line explanations."""

    attempt: Attempt
    env: Env
    warnings: tuple[str, ...] = ()
    decisions: tuple[dict[str, str], ...] = ()

    @property
    def setup(self) -> Setup:
        return self.attempt.setup

    @property
    def micro(self) -> dict[str, int]:
        return {s.workload.stage: s.micro for s in self.attempt.stages}

    @property
    def generation(self) -> Generation | None:
        return next((s.generation for s in self.attempt.stages if s.generation is not None), None)

    @property
    def reference(self) -> str:
        wls = [s.workload for s in self.attempt.stages if s.workload.reference]
        if not wls:
            return "none"
        if self.setup.adapter != "full":
            return "adapters-disabled"
        loop = any(w.loop_reference for w in wls)  # rlctl's RL loop: sharded with the policy, never offloaded
        if self.env.is_cpu:
            return "cpu-sharded" if loop and self.setup.strategy == "fsdp2" else "cpu"
        if loop:
            return "gpu-sharded" if self.setup.strategy == "fsdp2" else "gpu"
        if self.setup.cpu_offload:
            return "cpu-offload"
        return "gpu-sharded" if self.setup.strategy == "fsdp2" else "gpu"

    def table(self, disk: DiskSpace) -> MemoryTable:
        """The plan's memory table (GiB), with the run's `disk` space."""
        a = self.attempt
        worst = a.worst
        host = HostMemory(
            {k: gib(v) for k, v in a.host.items()}, gib(a.host_peak), gib(a.host_budget), self.env.host_assumed
        )
        return MemoryTable(
            device="cpu" if self.env.is_cpu else "gpu",
            total_gib=gib(self.env.total),
            budget_gib=gib(self.env.budget),
            peak_gib=gib(worst.peak),
            peak_phase=worst.label,
            headroom_gib=gib(worst.headroom),
            fits=a.fits,
            phases=tuple(p.row() for p in a.phases),
            host=host,
            disk=disk,
        )


def decide(
    cfg: RunConfig,
    hardware: Hardware,
    procs: int,
    engine: str,
    precision: str,
    image_tokens: dict[str, int] | None = None,
) -> MemoryPlan | None:
    """The automatic settings for `cfg` on `hardware`, or None when the model has no architecture numbers;
    `image_tokens`: a vision-language run's image tokens per row, by stage (they lengthen its sequences).

    Raises UserError (exit 2) with the nearest fitting plan when nothing fits and the user fixed nothing;
    settings the user fixed always win, with a warning when they will not fit. On CPU it never refuses."""
    if cfg.model.arch is None:
        return None
    arch = Arch.of(cfg.model.arch)
    env = environment(cfg, hardware, procs, engine, precision)
    found, closest = search.search(cfg, env, arch, image_tokens)
    warnings: list[str] = []
    fixed = explicit_settings(cfg)
    if found is None:
        if env.is_cpu:
            warnings.append(f"the memory model expects {closest.why_not()} (of RAM); the run may swap or fail")
        elif fixed:
            near = nearest(cfg, hardware, procs, engine, precision, relax_user=True, image_tokens=image_tokens)
            warnings.append(
                f"{', '.join(fixed)} will not fit: {closest.why_not()}."
                + (f" Nearest plan that fits: {near[0]}." if near else "")
            )
        else:
            raise UserError(refusal(cfg, hardware, procs, engine, precision, closest, image_tokens))
        found = closest
    plan = MemoryPlan(found, env)
    if env.host_assumed and (found.setup.cpu_offload or found.setup.phase_offload):
        warnings.append(
            f"host RAM not known for {hardware.spec}: assumed {hardware.ram_gib:g} GiB per node for the CPU offload"
        )
    return replace(plan, warnings=tuple(warnings), decisions=tuple(explain.explain(cfg, plan, hardware)))


# --- Checkpoints on disk --------------------------------------------------------------------------------------------


def disk_need(cfg: RunConfig, setup: Setup, precision: str) -> float:
    """Bytes the run writes at most: per stage, the kept checkpoints (weights + optimizer; the last keep_last, the
    best one besides, and the next one while it is written) and the final model."""
    arch = Arch.of(cfg.model.arch)  # type: ignore[arg-type]
    wb = 2.0 if precision == "bf16" else 4.0
    total = 0.0
    for name in cfg.stages:
        p = arch.params("score" if name == "rm" else "lm")
        adapters = arch.adapter_params(cfg.model.lora_r, cfg.model.train_embeddings is True, cfg.model.lora_vision)
        frozen_tower = arch.vision_params if cfg.model.freeze_vision else 0
        trained = p - frozen_tower if setup.adapter == "full" else adapters
        ckpt = (trained + frozen_tower) * 4.0 + trained * 8.0  # fp32 weights + AdamW m and v of what trains
        final = p * (4.0 if setup.adapter == "full" else wb)  # saved in the dtype it trained in; LoRA merged
        total += (cfg.checkpoint.keep_last + cfg.checkpoint.keep_best + 1) * ckpt + final
    return total

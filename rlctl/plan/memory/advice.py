"""What to change when a plan does not fit (the nearest plans that do: halved lengths or batches, vLLM, bigger
hardware) and, after an out-of-memory error, the nearest safer settings with their planned peaks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlctl.plan.memory.model import Attempt, gib_str
from rlctl.plan.memory.search import explicit_settings, fitting_attempt

if TYPE_CHECKING:
    from rlctl.config import RunConfig
    from rlctl.plan.hardware import Hardware

HARDWARE_LADDER = ("1xA100-80GB", "1xH100-80GB", "8xH100-80GB", "2x8xH100-80GB")


def _halvings(cfg: RunConfig) -> list[tuple[str, int, int]]:
    """(key, current value, floor) of the workload knobs the nearest-plan search may halve."""
    knobs = []
    if "rl" in cfg.stages:
        knobs += [("rl.max_new_tokens", cfg.rl.max_new_tokens, 16), ("rl.prompts_per_step", cfg.rl.prompts_per_step, 1)]
        knobs.append(("data.max_prompt_length", cfg.data.max_prompt_length, 32))
    for name in ("sft", "dpo", "rm"):
        if name in cfg.stages:
            knobs.append((f"{name}.max_length", getattr(cfg, name).max_length, 64))
    return knobs


def _with(cfg: RunConfig, key: str, value: Any) -> RunConfig:
    new = cfg.model_copy(deep=True)
    section, attr = key.split(".")
    setattr(getattr(new, section), attr, value)
    return new


def _describe(a: Attempt) -> str:
    text = f"{a.setup.label}, {gib_str(a.headroom)} GiB headroom"
    gen = next((s.generation for s in a.stages if s.generation is not None), None)
    if gen is not None and gen.engine == "vllm" and gen.concurrent < gen.rollouts * gen.tp:
        text += f", vLLM holds {gen.concurrent} of {gen.rollouts * gen.tp} rollouts at once"
    return text


def nearest(
    cfg: RunConfig,
    hardware: Hardware,
    procs: int,
    engine: str,
    precision: str,
    relax_user: bool = False,
    image_tokens: dict[str, int] | None = None,
) -> list[str]:
    """Up to three nearby plans that fit, as `--set`/`--hardware` suggestions with their layout and headroom
    (`image_tokens`: a vision-language run's image tokens per row, by stage)."""
    from rlctl.plan import hardware as hw

    out: list[str] = []
    base = cfg
    if relax_user:
        base = cfg.model_copy(deep=True)
        base.model.adapter = "auto"
        base.model.gradient_checkpointing = "auto"
        base.hardware.strategy = "auto"
        base.hardware.optimizer_offload = "auto"
        for name in cfg.stages:
            getattr(base, name).micro_batch_size = "auto"
        a = fitting_attempt(base, hardware, procs, engine, precision, image_tokens)
        if a is not None:
            changes = []
            if cfg.model.adapter != "auto" and cfg.model.adapter != a.setup.adapter:
                changes.append(f"model.adapter={a.setup.adapter}")
            if cfg.hardware.strategy != "auto" and cfg.hardware.strategy != a.setup.strategy:
                changes.append(f"hardware.strategy={a.setup.strategy}")
            if cfg.hardware.optimizer_offload not in ("auto", a.setup.phase_offload):
                changes.append(f"hardware.optimizer_offload={str(a.setup.phase_offload).lower()}")
            if cfg.model.gradient_checkpointing not in ("auto", a.setup.checkpointing):
                changes.append(f"model.gradient_checkpointing={str(a.setup.checkpointing).lower()}")
            for s in a.stages:
                name = s.workload.stage
                if getattr(cfg, name).micro_batch_size not in ("auto", s.micro):
                    changes.append(f"{name}.micro_batch_size={s.micro}")
            flags = " ".join(f"--set {c}" for c in changes) or "the automatic settings"
            return [f"{flags} ({_describe(a)})"]
    best: tuple[int, str] | None = None
    for key, value, floor in _halvings(base):
        v, steps = value, 0
        while v // 2 >= floor and steps < 6:
            v, steps = v // 2, steps + 1
            a = fitting_attempt(_with(base, key, v), hardware, procs, engine, precision, image_tokens)
            if a is not None:
                if best is None or steps < best[0]:
                    best = (steps, f"--set {key}={v} ({_describe(a)})")
                break
    if best:
        out.append(best[1])
    if engine == "transformers" and not hardware.is_cpu:
        a = fitting_attempt(base, hardware, procs, "vllm", precision, image_tokens)
        if a is not None:
            out.append(f"pip install 'rlctl[vllm]' for colocated vLLM generation ({_describe(a)})")
    have = hardware.world_size * hardware.gpu_usable_gib
    for spec in HARDWARE_LADDER:
        other = hw.parse_spec(spec)
        if other.world_size * other.gpu_usable_gib <= have:
            continue
        other_precision = "bf16" if other.bf16 and cfg.model.dtype != "float32" else "no"
        a = fitting_attempt(base, other, other.gpus_per_node, engine, other_precision, image_tokens)
        if a is not None:
            out.append(f"--hardware {spec} ({_describe(a)})")
            break
    if relax_user:  # the user's settings alone do not fit anywhere near: these need them back on auto
        out = [f"{s}, with {', '.join(explicit_settings(cfg))} back on auto" for s in out]
    return out


def refusal(
    cfg: RunConfig,
    hardware: Hardware,
    procs: int,
    engine: str,
    precision: str,
    closest: Attempt,
    image_tokens: dict[str, int] | None = None,
) -> str:
    near = nearest(cfg, hardware, procs, engine, precision, image_tokens=image_tokens)
    hint = (
        "Nearest plans that fit: " + "; ".join(near) + "."
        if near
        else "No nearby plan fits: pick a smaller model or more GPUs."
    )
    return (
        f"The plan does not fit {hardware.spec} ({hardware.world_size} GPU(s) of "
        f"{hardware.gpu_usable_gib:g} GiB): every layout up to QLoRA runs out of memory; the closest "
        f"({closest.setup.label}) fails because {closest.why_not()}. {hint}"
    )


def safer(plan: Any, stage: str) -> list[str]:
    """After an out-of-memory error in `stage`: settings that lower its memory, nearest first (halve the
    micro-batch, gradient checkpointing, then a lighter adapter), each with the stage's planned phase peaks before
    and after when the planner has the model's architecture. The plan's own choices are pinned, so each option
    changes one thing."""
    cfg: RunConfig = plan.config
    stage_plan = next(s for s in plan.stages if s.name == stage)
    pinned = cfg.model_copy(deep=True)
    pinned.model.adapter, pinned.model.gradient_checkpointing = plan.adapter, plan.gradient_checkpointing
    pinned.hardware.strategy = plan.strategy
    for s in plan.stages:
        getattr(pinned, s.name).micro_batch_size = s.micro_batch_size
    options: list[tuple[str, Any]] = []
    if stage_plan.micro_batch_size > 1:
        options.append((f"{stage}.micro_batch_size", stage_plan.micro_batch_size // 2))
    if not plan.gradient_checkpointing:
        options.append(("model.gradient_checkpointing", True))
    if plan.adapter in ("full", "lora"):
        options.append(("model.adapter", {"full": "lora", "lora": "qlora"}[plan.adapter]))
    images = {name: b.tokens_per_row for name, b in plan.images.items()}
    args = (plan.hardware, plan.num_processes, plan.memory_engine, plan.mixed_precision, images)

    def peaks(a: Attempt | None) -> dict[str, float]:
        return {p.label: p.peak for p in a.phases if p.stage == stage} if a else {}

    now = peaks(fitting_attempt(pinned, *args))
    out = []
    for key, value in options:
        flag = f"--set {key}={str(value).lower()}"
        new = peaks(fitting_attempt(_with(pinned, key, value), *args))
        if not now or not new:
            out.append(flag)
            continue
        lower = [k for k in now if new.get(k, 0) < now[k]]
        if lower and all(new.get(k, 0) <= now[k] for k in now):
            changes = ", ".join(f"{k} peak {gib_str(now[k])} -> {gib_str(new[k])} GiB" for k in lower)
            out.append(f"{flag} (planned {changes})")
    return out

"""The memory planner: the automatic settings of a run, chosen on the memory model (`rlctl.plan.memory_model`).

`decide()` walks the candidate settings in a fixed order (full replicated, FSDP2, optimizer offload between
phases, FSDP2 + CPU offload, LoRA, QLoRA), picks the first that fits with the largest micro-batches, and
explains every choice in one line. Nothing fits: `decide()` raises a UserError naming the nearest plan that does.
Also here: the disk a run needs and the `rlctl plan` memory table. Pure Python (no torch), documented in
docs/memory-planner.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlctl.errors import UserError
from rlctl.plan.memory_model import (
    CRITIC_ALGORITHMS,
    GPU_RESERVE,
    HOST_RESERVE,
    Arch,
    Attempt,
    Env,
    Generation,
    GiB,
    Setup,
    Workload,
    attempt,
    frozen_copy,
    gib,
    gib_str,
    master_weights,
    micro_options,
    model_state,
    stage_fit,
)

if TYPE_CHECKING:
    from rich.table import Table

    from rlctl.config import RunConfig
    from rlctl.plan.hardware import Hardware

__all__ = ["GiB", "MemoryPlan", "decide", "disk_need", "gib", "render"]  # the API rlctl.plan and the display use


def _count(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


# --- From the config ----------------------------------------------------------------------------------------------


def workloads(cfg: RunConfig, world: int) -> list[Workload]:
    """The shape of each selected stage (per process), from the config."""
    out = []
    for name in cfg.stages:
        sc = getattr(cfg, name)
        micro = None if sc.micro_batch_size == "auto" else int(sc.micro_batch_size)
        if name == "rl":
            rl = cfg.rl
            critic = getattr(rl, "critic_init", None) is not None or rl.algorithm in CRITIC_ALGORITHMS
            out.append(
                Workload(
                    "rl",
                    rl.prompts_per_step * rl.group_size // world,
                    1,
                    cfg.data.max_prompt_length + rl.max_new_tokens,
                    rl.max_new_tokens,
                    prompt_tokens=cfg.data.max_prompt_length,
                    group_size=rl.group_size,
                    reference=rl.beta > 0,
                    reward_model=any(r.name == "reward_model" for r in rl.rewards),
                    critic=critic,
                    micro_fixed=micro,
                    loop_reference=getattr(rl, "path", None) == "rlctl",
                    chunkable=getattr(rl, "path", None) == "rlctl" or rl.ppo_epochs * rl.ppo_mini_batches == 1,
                )
            )
        elif name == "rm":  # a sequence classifier on chosen + rejected: no vocabulary logits
            out.append(Workload("rm", sc.batch_size // world, 2, sc.max_length, 0, head="score", micro_fixed=micro))
        elif name == "sft":
            out.append(Workload("sft", sc.batch_size // world, 1, sc.max_length, sc.max_length, micro_fixed=micro))
        else:  # dpo: chosen + rejected in one forward; kto: completion + mismatched KL completion; both a reference
            length = sc.max_length
            out.append(Workload(name, sc.batch_size // world, 2, length, length, reference=True, micro_fixed=micro))
    return out


def environment(cfg: RunConfig, hardware: Hardware, procs: int, engine: str, precision: str) -> Env:
    if hardware.is_cpu:
        total = hardware.ram_gib * GiB / max(procs, 1)
        budget = total * (1 - HOST_RESERVE)
    else:
        total = hardware.gpu_usable_gib * GiB
        budget = total * (1 - GPU_RESERVE)
    return Env(
        is_cpu=hardware.is_cpu,
        procs=procs,
        nodes=hardware.nodes,
        total=total,
        budget=budget,
        host_budget=hardware.ram_gib * GiB * (1 - HOST_RESERVE),
        host_assumed=hardware.ram_assumed,
        precision=precision,
        engine=engine,
        lora_r=cfg.model.lora_r,
        lora_dropout=cfg.model.lora_dropout,
    )


def candidates(cfg: RunConfig, env: Env) -> list[Setup]:
    """Setups in the planner's order of preference, restricted by what the user fixed: full replicated, full
    FSDP2 (several GPUs), full with the optimizer offloaded between phases, FSDP2 with CPU offload, LoRA, QLoRA
    (each adapter also with the offload between phases)."""
    rep = "single" if env.world == 1 else "ddp"
    rl = "rl" in cfg.stages
    order = [Setup(rep, "full")]
    if env.world > 1:
        order.append(Setup("fsdp2", "full"))
    if rl:
        order.append(Setup(rep if env.world == 1 else "fsdp2", "full", phase_offload=True))
    order.append(Setup("fsdp2", "full", cpu_offload=True))
    for adapter in ("lora", "qlora"):
        order.append(Setup(rep, adapter))
        if rl:
            order.append(Setup(rep, adapter, phase_offload=True))
    if env.is_cpu:
        order = [Setup(rep, "full"), Setup(rep, "lora"), Setup(rep, "qlora")]
    adapter, strategy = cfg.model.adapter, cfg.hardware.strategy
    if adapter == "full" and strategy in ("single", "ddp"):
        order = [Setup(strategy, "full")] + ([Setup(strategy, "full", phase_offload=True)] if rl else [])
    if adapter != "auto":
        order = [s for s in order if s.adapter == adapter]
    if strategy != "auto":
        picked = [s for s in order if s.strategy == strategy or (strategy != "fsdp2" and s.strategy == rep)]
        picked = [s._replace(strategy=strategy) for s in picked]
        order = picked or [Setup(strategy, adapter if adapter != "auto" else "full")]
    seen: list[Setup] = []
    for s in order:
        if s not in seen:
            seen.append(s)
    if env.is_cpu:
        return seen[:1]  # on CPU the planner reports, it does not search
    return seen


def explicit_settings(cfg: RunConfig) -> list[str]:
    """The planner-relevant settings the user fixed (anything but auto)."""
    fixed = []
    if cfg.model.adapter != "auto":
        fixed.append(f"model.adapter={cfg.model.adapter}")
    if cfg.model.gradient_checkpointing != "auto":
        fixed.append(f"model.gradient_checkpointing={str(cfg.model.gradient_checkpointing).lower()}")
    if cfg.hardware.strategy != "auto":
        fixed.append(f"hardware.strategy={cfg.hardware.strategy}")
    for name in cfg.stages:
        micro = getattr(cfg, name).micro_batch_size
        if micro != "auto":
            fixed.append(f"{name}.micro_batch_size={micro}")
    return fixed


def search(cfg: RunConfig, env: Env, arch: Arch) -> tuple[Attempt | None, Attempt]:
    """(first fitting attempt or None, the closest attempt) over the candidates."""
    wls = workloads(cfg, env.world)
    ckpt = None if cfg.model.gradient_checkpointing == "auto" else bool(cfg.model.gradient_checkpointing)
    if env.is_cpu and ckpt is None:
        ckpt = False
    closest = None
    for setup in candidates(cfg, env):
        a = attempt(arch, env, setup, wls, ckpt)
        if a.fits:
            return a, a
        if closest is None or a.headroom > closest.headroom:
            closest = a
    assert closest is not None
    return None, closest


# --- The result ---------------------------------------------------------------------------------------------------


class MemoryPlan:
    """What `decide()` settled on, with its per-phase memory table and one-line explanations."""

    def __init__(self, attempt: Attempt, env: Env, warnings: list[str]):
        self.attempt, self.env, self.warnings = attempt, env, warnings
        self.decisions: list[dict[str, str]] = []
        self.disk: dict[str, float] = {}

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
        if self.env.is_cpu:
            return "cpu"
        if any(w.loop_reference for w in wls):  # rlctl's RL loop moves its reference whole to each GPU
            return "gpu"
        if self.setup.cpu_offload:
            return "cpu-offload"
        return "gpu-sharded" if self.setup.strategy == "fsdp2" else "gpu"

    def to_json(self) -> dict[str, Any]:
        a = self.attempt
        worst = a.worst
        return {
            "estimated": True,
            "device": "cpu" if self.env.is_cpu else "gpu",
            "total_gib": gib(self.env.total),
            "budget_gib": gib(self.env.budget),
            "peak_gib": gib(worst.peak),
            "peak_phase": worst.label,
            "headroom_gib": gib(worst.headroom),
            "fits": a.fits,
            "phases": [p.to_json() for p in a.phases],
            "host": {
                "components_gib": {k: gib(v) for k, v in a.host.items()},
                "peak_gib": gib(a.host_peak),
                "budget_gib": gib(a.host_budget),
                "ram_assumed": self.env.host_assumed,
            },
            "disk": self.disk,
        }


def decide(cfg: RunConfig, hardware: Hardware, procs: int, engine: str, precision: str) -> MemoryPlan | None:
    """The automatic settings for `cfg` on `hardware`, or None when the model has no architecture numbers.

    Raises UserError (exit 2) with the nearest fitting plan when nothing fits and the user fixed nothing;
    settings the user fixed always win, with a warning when they will not fit. On CPU it never refuses."""
    if cfg.model.arch is None:
        return None
    arch = Arch.of(cfg.model.arch)
    env = environment(cfg, hardware, procs, engine, precision)
    found, closest = search(cfg, env, arch)
    warnings: list[str] = []
    fixed = explicit_settings(cfg)
    if found is None:
        if env.is_cpu:
            warnings.append(f"the memory model expects {closest.why_not()} (of RAM); the run may swap or fail")
        elif fixed:
            near = nearest(cfg, hardware, procs, engine, precision, relax_user=True)
            warnings.append(
                f"{', '.join(fixed)} will not fit: {closest.why_not()}."
                + (f" Nearest plan that fits: {near[0]}." if near else "")
            )
        else:
            raise UserError(refusal(cfg, hardware, procs, engine, precision, closest))
        found = closest
    plan = MemoryPlan(found, env, warnings)
    plan.decisions = explain(cfg, plan, hardware)
    if env.host_assumed and (found.setup.cpu_offload or found.setup.phase_offload):
        warnings.append(
            f"host RAM not known for {hardware.spec}: assumed {hardware.ram_gib:g} GiB per node for the CPU offload"
        )
    return plan


# --- Nearest fitting plan -------------------------------------------------------------------------------------------

HARDWARE_LADDER = ("1xA100-80GB", "1xH100-80GB", "8xH100-80GB", "2x8xH100-80GB")


def _try(cfg: RunConfig, hardware: Hardware, procs: int, engine: str, precision: str) -> Attempt | None:
    if cfg.model.arch is None:
        return None
    env = environment(cfg, hardware, procs, engine, precision)
    world = env.world
    for name in cfg.stages:
        batch = cfg.rl.prompts_per_step * cfg.rl.group_size if name == "rl" else getattr(cfg, name).batch_size
        if batch % world:
            return None
    return search(cfg, env, Arch.of(cfg.model.arch))[0]


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
    cfg: RunConfig, hardware: Hardware, procs: int, engine: str, precision: str, relax_user: bool = False
) -> list[str]:
    """Up to three nearby plans that fit, as `--set`/`--hardware` suggestions with their layout and headroom."""
    from rlctl.plan import hardware as hw

    out: list[str] = []
    base = cfg
    if relax_user:
        base = cfg.model_copy(deep=True)
        base.model.adapter = "auto"
        base.model.gradient_checkpointing = "auto"
        base.hardware.strategy = "auto"
        for name in cfg.stages:
            getattr(base, name).micro_batch_size = "auto"
        a = _try(base, hardware, procs, engine, precision)
        if a is not None:
            changes = []
            if cfg.model.adapter != "auto" and cfg.model.adapter != a.setup.adapter:
                changes.append(f"model.adapter={a.setup.adapter}")
            if cfg.hardware.strategy != "auto" and cfg.hardware.strategy != a.setup.strategy:
                changes.append(f"hardware.strategy={a.setup.strategy}")
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
            a = _try(_with(base, key, v), hardware, procs, engine, precision)
            if a is not None:
                if best is None or steps < best[0]:
                    best = (steps, f"--set {key}={v} ({_describe(a)})")
                break
    if best:
        out.append(best[1])
    if engine == "transformers" and not hardware.is_cpu:
        a = _try(base, hardware, procs, "vllm", precision)
        if a is not None:
            out.append(f"pip install 'rlctl[vllm]' for colocated vLLM generation ({_describe(a)})")
    have = hardware.world_size * hardware.gpu_usable_gib
    for spec in HARDWARE_LADDER:
        other = hw.parse_spec(spec)
        if other.world_size * other.gpu_usable_gib <= have:
            continue
        other_precision = "bf16" if other.bf16 and cfg.model.dtype != "float32" else "no"
        a = _try(base, other, other.gpus_per_node, engine, other_precision)
        if a is not None:
            out.append(f"--hardware {spec} ({_describe(a)})")
            break
    if relax_user:  # the user's settings alone do not fit anywhere near: these need them back on auto
        out = [f"{s}, with {', '.join(explicit_settings(cfg))} back on auto" for s in out]
    return out


def refusal(cfg: RunConfig, hardware: Hardware, procs: int, engine: str, precision: str, closest: Attempt) -> str:
    near = nearest(cfg, hardware, procs, engine, precision)
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
    args = (plan.hardware, plan.num_processes, plan.generation_engine, plan.mixed_precision)

    def peaks(a: Attempt | None) -> dict[str, float]:
        return {p.label: p.peak for p in a.phases if p.stage == stage} if a else {}

    now = peaks(_try(pinned, *args))
    out = []
    for key, value in options:
        flag = f"--set {key}={str(value).lower()}"
        new = peaks(_try(_with(pinned, key, value), *args))
        if not now or not new:
            out.append(flag)
            continue
        lower = [k for k in now if new.get(k, 0) < now[k]]
        if lower and all(new.get(k, 0) <= now[k] for k in now):
            changes = ", ".join(f"{k} peak {gib_str(now[k])} -> {gib_str(new[k])} GiB" for k in lower)
            out.append(f"{flag} (planned {changes})")
    return out


# --- Explanations ---------------------------------------------------------------------------------------------------


def explain(cfg: RunConfig, plan: MemoryPlan, hardware: Hardware) -> list[dict[str, str]]:
    """One line per automatic (or user-fixed) setting: what was chosen and why."""
    a, env, s = plan.attempt, plan.env, plan.setup
    arch = Arch.of(cfg.model.arch)  # type: ignore[arg-type]
    out: list[dict[str, str]] = []

    def add(setting: str, value: Any, why: str, user: bool = False) -> None:
        out.append({"setting": setting, "value": str(value), "why": why + (" (set by you)" if user else "")})

    st = model_state(arch, env, s)
    per_gpu = gib_str(st["weights"] + st["grads"] + st["optim"])
    p = arch.params()
    if env.is_cpu:
        add("strategy", s.strategy, f"CPU: {env.world} process(es); the planner reports memory but does not search")
    elif s.strategy == "fsdp2":
        rep = model_state(arch, env, Setup("ddp" if env.world > 1 else "single", s.adapter))
        why = (
            f"{s.adapter} state sharded over {env.world} GPUs: {per_gpu} GiB per GPU instead of "
            f"{gib_str(rep['weights'] + rep['grads'] + rep['optim'] + rep['buckets'])} GiB replicated"
        )
        if env.world == 1:
            why = f"{s.adapter} state through FSDP2 on one GPU: {per_gpu} GiB on the GPU"
        if s.cpu_offload:
            why = f"sharded fp32 state ({gib_str(st['host'])} GiB per GPU) lives in host RAM; GPUs hold gathered layers"
        add("strategy", "fsdp2" + (" + CPU offload" if s.cpu_offload else ""), why, cfg.hardware.strategy != "auto")
    else:
        where = "one GPU" if env.world == 1 else f"each of {env.world} GPUs (DDP replicas)"
        add("strategy", s.strategy, f"{s.adapter} training state ({per_gpu} GiB) fits {where}")
    fixed_adapter = cfg.model.adapter != "auto"
    if s.adapter == "full":
        sharded = ", sharded" if s.strategy == "fsdp2" and env.world > 1 else ""
        kind = "in float32" if env.precision != "bf16" else "with fp32 master weights (bf16 compute)"
        why = f"all {_count(p)} parameters train {kind}: weights 4 + grads 4 + AdamW 8 B/param{sharded}"
        if master_weights(env, s):
            why += ", and autocast's bf16 copy (2 B/param) during each forward"
    else:
        pl = arch.lora_params(env.lora_r)
        base = "bf16" if s.adapter == "lora" else "4-bit NF4"
        why = f"{_count(pl)} LoRA parameters (r={env.lora_r}, fp32) on a frozen {base} base"
        if not fixed_adapter:
            why = "full fine-tuning does not fit; " + why
    add("adapter", s.adapter, why, fixed_adapter)
    ck_user = cfg.model.gradient_checkpointing != "auto"
    if s.checkpointing:
        why = "recompute each layer in the backward pass: saved activations drop to the layer inputs"
    else:
        why = "activations of the chosen micro-batches fit without recomputation"
    add("gradient_checkpointing", str(s.checkpointing).lower(), why, ck_user)
    for f in a.stages:
        wl = f.workload
        tokens = f.micro * wl.seqs * wl.tokens
        why = (
            f"{wl.per_proc} {'pairs' if wl.seqs == 2 else 'sequences'} per process per step = {f.micro} x "
            f"{f.grad_accum} accumulation; {tokens} tokens per forward"
        )
        why += (
            " (largest divisor that fits)"
            if wl.micro_fixed is None and f.micro < micro_options(wl)[0]
            else " (the largest allowed)"
            if wl.micro_fixed is None
            else ""
        )
        if env.is_cpu:
            why = f"{wl.per_proc} per process per step = {f.micro} x {f.grad_accum} accumulation"
        add(f"{wl.stage}.micro_batch_size", f.micro, why, wl.micro_fixed is not None)
    if "rl" in cfg.stages and not env.is_cpu:
        rl_fit = next(f for f in a.stages if f.workload.stage == "rl")
        optim = st["optim"]
        if s.phase_offload:
            kept = stage_fit(arch, env, s._replace(phase_offload=False), rl_fit.workload, rl_fit.micro)
            w = kept.worst
            why = f"{w.label} would peak at {gib_str(w.peak)} GiB > {gib_str(w.budget)} GiB"
            if w.fits and kept.generation is not None and not kept.generation.fits:
                why = "generation would have no room for the rollouts' KV cache"
            add(
                "optimizer offload",
                "between phases",
                f"{gib_str(optim)} GiB of AdamW states move to host RAM after each step and back for the next "
                f"(with them on the GPU {why})",
            )
        elif not s.cpu_offload:
            add("optimizer offload", "none", "the optimizer states fit on the GPU next to generation")
        gen = rl_fit.generation
        if gen is not None and gen.engine == "vllm":
            add(
                "vllm.gpu_memory_utilization",
                f"{gen.util:.2f}",
                f"{gib_str(gen.util * env.total)} GiB reserved: weights + runtime + {gib_str(gen.kv_cache)} GiB KV "
                f"cache for {gen.concurrent} of {gen.rollouts * gen.tp} rollouts at once (sleeps at level 2 in "
                "training)",
            )
            add(
                "vllm.tensor_parallel_size",
                gen.tp,
                "vLLM's weights fit one GPU"
                if gen.tp == 1
                else f"vLLM's weights split over {gen.tp} GPUs to leave room for the KV cache",
            )
        elif gen is not None:
            add(
                "generation",
                "transformers",
                f"plain transformers generate: all {gen.rollouts} rollouts per process at once (KV cache "
                f"{gib_str(rl_fit.phases[0].components.get('KV cache (generate)', 0))} GiB)",
            )
    ref = plan.reference
    if ref != "none" or "rl" in cfg.stages:
        wl = next((f.workload for f in a.stages if f.workload.reference), a.stages[0].workload)
        copy = gib_str(frozen_copy(arch, env, s, wl))
        kind = "fp32 copy (TRL builds it in the policy's dtype)"
        if wl.loop_reference or env.precision != "bf16":
            kind = "bf16 copy (rlctl's RL loop loads it frozen)" if env.precision == "bf16" else "float32 copy"
        why = {
            "none": "rl.beta=0: no reference model is loaded",
            "adapters-disabled": "LoRA: the reference is the base model with adapters disabled (no extra copy)",
            "gpu": f"a frozen {kind} on each GPU ({copy} GiB)",
            "gpu-sharded": f"a frozen {kind} sharded by FSDP2 ({copy} GiB per GPU)",
            "cpu-offload": f"a frozen {kind} in host RAM, offloaded with the FSDP2 state",
            "cpu": f"a frozen copy in each process ({copy} GiB)",
        }[ref]
        add("reference", ref, why)
    return out


# --- Checkpoints on disk --------------------------------------------------------------------------------------------


def disk_need(cfg: RunConfig, setup: Setup, precision: str) -> float:
    """Bytes the run writes at most: per stage, the kept checkpoints (weights + optimizer; the last keep_last, the
    best one besides, and the next one while it is written) and the final model."""
    arch = Arch.of(cfg.model.arch)  # type: ignore[arg-type]
    wb = 2.0 if precision == "bf16" else 4.0
    total = 0.0
    for name in cfg.stages:
        p = arch.params("score" if name == "rm" else "lm")
        trained = p if setup.adapter == "full" else arch.lora_params(cfg.model.lora_r)
        ckpt = trained * 4.0 * 3  # fp32 weights + AdamW m and v
        final = p * (4.0 if setup.adapter == "full" else wb)  # saved in the dtype it trained in; LoRA merged
        total += (cfg.checkpoint.keep_last + cfg.checkpoint.keep_best + 1) * ckpt + final
    return total


# --- Display --------------------------------------------------------------------------------------------------------


def render(plan: Any) -> Table:
    """The plan's memory for `rlctl plan`: a table with one column per phase and one row per component (GiB per
    GPU, or per process on CPU), then peak, budget and headroom, followed by every setting with its reason."""
    from rich.table import Table

    mem = plan.memory
    outer = Table.grid(padding=(1, 0))
    outer.add_column()
    if not mem.get("estimated"):
        outer.add_row(f"[yellow]memory not estimated:[/] {mem.get('reason', 'unknown')}")
        return outer
    phases = mem["phases"]
    unit = "GPU" if mem.get("device") == "gpu" else "process"
    table = Table(title=f"Memory per {unit} (GiB)", title_justify="left")
    table.add_column("component")
    for p in phases:
        table.add_column(f"{p['stage']}: {p['phase']}", justify="right")
    names: list[str] = []
    for p in phases:
        names += [k for k in p["components_gib"] if k not in names]
    for name in names:
        table.add_row(name, *[_cell(p["components_gib"].get(name)) for p in phases])
    table.add_section()
    table.add_row("peak", *[f"{p['peak_gib']:.2f}" for p in phases], style="bold")
    table.add_row("budget", *[f"{p['budget_gib']:.2f}" for p in phases])
    table.add_row("headroom", *[f"[{'green' if p['fits'] else 'red'}]{p['headroom_gib']:.2f}[/]" for p in phases])
    host = mem.get("host", {})
    if host.get("components_gib"):
        assumed = " (RAM assumed for this spec)" if host.get("ram_assumed") else ""
        table.caption = f"host RAM per node: {host['peak_gib']:.2f} of {host['budget_gib']:.2f} GiB{assumed}"
        table.caption_justify = "left"
    outer.add_row(table)
    why = Table(title="Settings", title_justify="left", show_edge=False)
    why.add_column("setting")
    why.add_column("value")
    why.add_column("why", overflow="fold")
    for d in plan.decisions:
        why.add_row(d["setting"], d["value"], d["why"])
    outer.add_row(why)
    return outer


def _cell(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"

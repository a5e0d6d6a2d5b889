"""The planner's search: each selected stage's shape from the config, the candidate layouts in order of preference,
and for one layout the largest micro-batches whose phases fit (with gradient checkpointing when it is needed).
Pure Python, no torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlctl import vision
from rlctl.errors import UserError
from rlctl.plan.memory.arch import Arch
from rlctl.plan.memory.generation import generation_chunks, transformers_generation, vllm_generation
from rlctl.plan.memory.model import (
    CRITIC_ALGORITHMS,
    GPU_RESERVE,
    HOST_PROCESS_GIB,
    HOST_RESERVE,
    MAX_MICRO,
    SEPARATE,
    TOKENS_PER_MICRO,
    Attempt,
    Env,
    GiB,
    Phase,
    Setup,
    StageFit,
    Workload,
    generation_resident,
    model_state,
    reference_bytes,
    training_phases,
)

if TYPE_CHECKING:
    from rlctl.config import RunConfig
    from rlctl.plan.hardware import Hardware

# --- One layout: the largest micro-batches whose phases fit ---------------------------------------------------


def stage_fit(arch: Arch, env: Env, setup: Setup, wl: Workload, micro: int) -> StageFit:
    """Every phase of one stage at one micro-batch (an async trainer's RL stage: training only, the generator has
    GPUs of its own)."""
    phases = training_phases(arch, env, setup, wl, micro)
    if wl.stage != "rl" or env.engine == SEPARATE:
        return StageFit(wl, micro, phases)
    if env.engine == "vllm":
        resident = generation_resident(arch, env, setup, wl)
        gen, vcomps = vllm_generation(arch, env, setup, wl, resident)
        phases.insert(0, Phase(wl.stage, "generation", {**resident, **vcomps}, env.budget))
    else:  # the largest chunk of rollouts whose generation fits (on CPU: all at once)
        chunks = [wl.per_proc] if env.is_cpu else generation_chunks(wl, micro, env.world)
        for chunk in chunks:
            gen, phase = transformers_generation(arch, env, setup, wl, chunk)
            if gen.fits:
                break
        phases.insert(0, phase)
    return StageFit(wl, micro, phases, gen)


def micro_options(wl: Workload) -> list[int]:
    """Micro-batches that divide the per-process batch, largest first (at most MAX_MICRO)."""
    if wl.micro_fixed is not None:
        return [wl.micro_fixed]
    return [d for d in range(min(wl.per_proc, MAX_MICRO), 0, -1) if wl.per_proc % d == 0]


def best_micro(arch: Arch, env: Env, setup: Setup, wl: Workload) -> StageFit:
    """The largest micro-batch whose phases all fit (or the smallest tried, to report how far off it is).
    On CPU the planner does not search: the largest allowed micro-batch, as before the memory model."""
    if env.is_cpu:
        return stage_fit(arch, env, setup, wl, micro_options(wl)[0])
    fit = None
    for micro in micro_options(wl):
        fit = stage_fit(arch, env, setup, wl, micro)
        if fit.fits:
            return fit
    assert fit is not None
    return fit


def _enough_tokens(fit: StageFit) -> bool:
    wl = fit.workload
    return fit.micro * wl.seqs * wl.tokens >= TOKENS_PER_MICRO or fit.micro == micro_options(wl)[0]


def host_usage(arch: Arch, env: Env, setup: Setup, wls: list[Workload]) -> dict[str, float]:
    """Host RAM per node: each process, optimizer states parked between phases, FSDP2's CPU-offloaded shards."""
    if env.is_cpu:
        return {}
    out = {"training processes": HOST_PROCESS_GIB * GiB * env.procs}
    st = model_state(arch, env, setup)
    if setup.phase_offload and any(w.stage == "rl" for w in wls):
        out["optimizer states (between phases)"] = st["optim"] * env.procs
    if setup.cpu_offload:
        out["FSDP2 CPU offload (params, grads, optimizer)"] = st["host"] * env.procs
        ref = next((w for w in wls if w.reference and not w.loop_reference), None)
        if ref is not None and setup.adapter == "full":
            out["reference model (CPU offload)"] = reference_bytes(arch, env, setup, ref) / env.world * env.procs
        if any(w.critic for w in wls):
            out["critic (CPU offload)"] = model_state(arch, env, setup, "score")["host"] * env.procs
    return out


def attempt(arch: Arch, env: Env, setup: Setup, wls: list[Workload], checkpointing: bool | None) -> Attempt:
    """One setup with its micro-batches; checkpointing=None lets the planner choose it."""

    def run(ckpt: bool) -> Attempt:
        s = setup._replace(checkpointing=ckpt)
        fits = [best_micro(arch, env, s, wl) for wl in wls]
        return Attempt(s, fits, host_usage(arch, env, s, wls), env.host_budget)

    if checkpointing is not None:
        return run(checkpointing)
    off = run(False)
    if off.fits and all(_enough_tokens(f) for f in off.stages):
        return off
    on = run(True)
    if on.fits and (not off.fits or any(a.micro > b.micro for a, b in zip(on.stages, off.stages, strict=True))):
        return on
    return off if off.fits else on


# --- From the config ----------------------------------------------------------------------------------------------


def workloads(cfg: RunConfig, world: int, image_tokens: dict[str, int] | None = None) -> list[Workload]:
    """The shape of each selected stage (per process), from the config; a vision-language stage's `image_tokens`
    per row lengthen its sequences (prompts) beyond the text lengths the config and the data set."""
    out = []
    for name in cfg.stages:
        sc = getattr(cfg, name)
        micro = None if sc.micro_batch_size == "auto" else int(sc.micro_batch_size)
        image = (image_tokens or {}).get(name, 0)
        if name == "rl":
            rl = cfg.rl
            critic = rl.critic.init is not None or rl.algorithm in CRITIC_ALGORITHMS
            out.append(
                Workload(
                    "rl",
                    rl.prompts_per_step * rl.group_size // world,
                    1,
                    cfg.data.max_prompt_length + image + rl.max_new_tokens,
                    rl.max_new_tokens,
                    prompt_tokens=cfg.data.max_prompt_length + image,
                    group_size=rl.group_size,
                    reference=rl.beta > 0,
                    reward_model=any(r.name == "reward_model" for r in rl.rewards),
                    critic=critic,
                    micro_fixed=micro,
                    loop_reference=True,
                    chunkable=True,
                    image_tokens=image,
                    value_pretraining=critic and rl.critic.pretrain_steps > 0,
                )
            )
        elif name == "rm":  # a sequence classifier on chosen + rejected: no vocabulary logits
            length = sc.max_length + image
            wl = Workload("rm", sc.batch_size // world, 2, length, 0, head="score", micro_fixed=micro)
            out.append(wl._replace(image_tokens=image))
        elif name == "sft":
            length = sc.max_length + image
            wl = Workload("sft", sc.batch_size // world, 1, length, length, micro_fixed=micro)
            out.append(wl._replace(image_tokens=image))
        else:  # dpo: chosen + rejected in one forward; kto: completion + mismatched KL completion; both a reference
            length = sc.max_length + image
            wl = Workload(name, sc.batch_size // world, 2, length, length, reference=True, micro_fixed=micro)
            out.append(wl._replace(image_tokens=image))
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
        lora_embeddings=cfg.model.train_embeddings is True,
        lora_vision=cfg.model.lora_vision,
        freeze_vision=cfg.model.freeze_vision,
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
    family = vision.of_arch(cfg.model.arch)
    if family is not None and not family.fsdp2 and env.world > 1:  # no blank-tower pass: collectives would diverge
        if strategy == "fsdp2":
            raise UserError(
                f"hardware.strategy=fsdp2: {cfg.model.name_or_path} has a {family.tower_name} vision tower "
                f"({family.name}), which rlctl cannot shard with FSDP2 over several processes yet (a process whose "
                "batch holds no image leaves the processes' collectives out of step). Use hardware.strategy=ddp (with "
                "model.adapter=lora when full weights do not fit) or one process. See docs/vlm.md."
            )
        order = [s for s in order if s.strategy != "fsdp2"]
    offload = cfg.hardware.optimizer_offload
    if rl and offload != "auto" and not env.is_cpu:  # on CPU a no-op: the memory model keeps the state in RAM
        kept = [s for s in order if s.phase_offload == offload]
        order = kept or [s._replace(phase_offload=offload) for s in order if not s.cpu_offload]
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
    if cfg.hardware.optimizer_offload != "auto":
        fixed.append(f"hardware.optimizer_offload={str(cfg.hardware.optimizer_offload).lower()}")
    for name in cfg.stages:
        micro = getattr(cfg, name).micro_batch_size
        if micro != "auto":
            fixed.append(f"{name}.micro_batch_size={micro}")
    return fixed


def search(
    cfg: RunConfig, env: Env, arch: Arch, image_tokens: dict[str, int] | None = None
) -> tuple[Attempt | None, Attempt]:
    """(first fitting attempt or None, the closest attempt) over the candidates (`image_tokens`: per row, by
    stage, see `workloads`)."""
    wls = workloads(cfg, env.world, image_tokens)
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


def fitting_attempt(
    cfg: RunConfig,
    hardware: Hardware,
    procs: int,
    engine: str,
    precision: str,
    image_tokens: dict[str, int] | None = None,
) -> Attempt | None:
    if cfg.model.arch is None:
        return None
    env = environment(cfg, hardware, procs, engine, precision)
    world = env.world
    for name in cfg.stages:
        batch = cfg.rl.prompts_per_step * cfg.rl.group_size if name == "rl" else getattr(cfg, name).batch_size
        if batch % world:
            return None
    return search(cfg, env, Arch.of(cfg.model.arch), image_tokens)[0]

"""The memory plan for people: one line per automatic setting with its reason (`decisions`), and the per-phase
memory table of `rlctl plan`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlctl.plan.memory.arch import Arch
from rlctl.plan.memory.model import SEPARATE, Setup, frozen_copy, gib_str, master_weights, model_state
from rlctl.plan.memory.search import micro_options, stage_fit
from rlctl.plan.parts import NOT_ESTIMATED

if TYPE_CHECKING:
    from rich.table import Table

    from rlctl.config import RunConfig
    from rlctl.plan.hardware import Hardware


def _count(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


# --- Explanations ---------------------------------------------------------------------------------------------------


def explain(cfg: RunConfig, plan: Any, hardware: Hardware) -> list[dict[str, str]]:
    """One line per automatic (or user-fixed) setting of `plan` (a `rlctl.plan.memory.MemoryPlan`): what was
    chosen and why."""
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
        which = f"all {_count(p)} parameters"
        if env.freeze_vision and arch.vision is not None:
            which = f"the {_count(p - arch.vision_params)} parameters outside the frozen vision tower"
        why = f"{which} train {kind}: weights 4 + grads 4 + AdamW 8 B/param{sharded}"
        if master_weights(env, s):
            why += ", and autocast's bf16 copy (2 B/param) during each forward"
    else:
        pl = arch.adapter_params(env.lora_r, env.lora_embeddings, env.lora_vision)
        base = "bf16" if s.adapter == "lora" else "4-bit NF4"
        trained = "LoRA parameters and the token embeddings" if env.lora_embeddings else "LoRA parameters"
        why = f"{_count(pl)} {trained} (r={env.lora_r}, fp32) on a frozen {base} base"
        if not fixed_adapter:
            why = "full fine-tuning does not fit; " + why
    add("adapter", s.adapter, why, fixed_adapter)
    if arch.vision is not None:
        v = arch.vision
        state = "frozen: LoRA targets the language model (model.lora_vision=true adds adapters to it)"
        if s.adapter == "full" and env.freeze_vision:
            state = "frozen (model.freeze_vision): no gradients or optimizer states for it"
        elif s.adapter == "full":
            state = "trains with the language model (full fine-tuning)"
        elif env.lora_vision:
            state = "LoRA adapters on it too (model.lora_vision)"
        shape = v.family.tower_shape(v)
        add("vision tower", _count(v.params), f"{shape}; {state}; its weights are in every phase")
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
            elif w.fits:
                why = "everything would fit too"
            add(
                "optimizer offload",
                "between phases",
                f"{gib_str(optim)} GiB of AdamW states move to host RAM after each step and back for the next "
                f"(with them on the GPU {why})",
                cfg.hardware.optimizer_offload is True,
            )
        elif not s.cpu_offload:
            why = "the optimizer states fit on the GPU next to generation"
            if env.engine == SEPARATE:
                why = "the optimizer states fit on the trainer GPUs (the generator has GPUs of its own)"
            add("optimizer offload", "none", why, cfg.hardware.optimizer_offload is False)
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
            "cpu-sharded": f"a frozen copy sharded by FSDP2 over the processes ({copy} GiB each)",
        }[ref]
        add("reference", ref, why)
    return out


# --- Display --------------------------------------------------------------------------------------------------------


def render(plan: Any) -> Table:
    """The plan's memory for `rlctl plan`: a table with one column per phase and one row per component (GiB per
    GPU, or per process on CPU), then peak, budget and headroom, followed by every setting with its reason."""
    from rich.table import Table

    mem = plan.memory
    outer = Table.grid(padding=(1, 0))
    outer.add_column()
    if mem is None:
        outer.add_row(f"[yellow]memory not estimated:[/] {NOT_ESTIMATED}")
        return outer
    phases = mem.phases
    table = Table(title=f"Memory per {'GPU' if mem.device == 'gpu' else 'process'} (GiB)", title_justify="left")
    table.add_column("component")
    for p in phases:
        table.add_column(f"{p.stage}: {p.phase}", justify="right")
    names: list[str] = []
    for p in phases:
        names += [k for k in p.components_gib if k not in names]
    for name in names:
        table.add_row(name, *[_cell(p.components_gib.get(name)) for p in phases])
    table.add_section()
    table.add_row("peak", *[f"{p.peak_gib:.2f}" for p in phases], style="bold")
    table.add_row("budget", *[f"{p.budget_gib:.2f}" for p in phases])
    table.add_row("headroom", *[f"[{'green' if p.fits else 'red'}]{p.headroom_gib:.2f}[/]" for p in phases])
    host = mem.host
    if host.components_gib:
        assumed = " (RAM assumed for this spec)" if host.ram_assumed else ""
        table.caption = f"host RAM per node: {host.peak_gib:.2f} of {host.budget_gib:.2f} GiB{assumed}"
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

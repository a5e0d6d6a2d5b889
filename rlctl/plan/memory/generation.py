"""The generation phase of the RL stage in the memory model: colocated vLLM (its reservation, tensor parallelism,
KV cache) or transformers `generate` in chunks of rollouts; and an async run's generator on GPUs of its own
(`dedicated`). Pure arithmetic, no torch."""

from __future__ import annotations

import math
from collections import namedtuple
from typing import TYPE_CHECKING

from rlctl.plan.memory.model import (
    CUDA_CONTEXT_GIB,
    SAMPLING_LOGIT_BYTES,
    VLLM_DEDICATED_UTIL,
    VLLM_MIN_CONCURRENT,
    VLLM_RUNTIME_GIB,
    Env,
    Generation,
    GiB,
    Phase,
    Setup,
    Workload,
    autocast_copies,
    generation_resident,
    master_weights,
    nonzero,
    quantized_bytes,
    vision_activations,
)

if TYPE_CHECKING:
    from rlctl.plan.memory.arch import Arch


def vllm_weights(arch: Arch, env: Env, setup: Setup) -> float:
    """vLLM's own copy of the policy (bf16; NF4 via bitsandbytes when the policy is QLoRA)."""
    return quantized_bytes(arch, env) if setup.adapter == "qlora" else arch.params() * 2.0


def tp_choices(arch: Arch, env: Env) -> list[int]:
    """vLLM tensor-parallel sizes that divide the processes per node, the heads and the KV heads."""
    return [
        t
        for t in (1, 2, 4, 8)
        if t <= env.procs and env.procs % t == 0 and arch.heads % t == 0 and arch.kv_heads % t == 0
    ]


def vllm_generation(
    arch: Arch, env: Env, setup: Setup, wl: Workload, resident: dict[str, float]
) -> tuple[Generation, dict[str, float]]:
    """vLLM colocated: it reserves util x total; weights/TP + runtime + KV cache fill that reservation (a
    vision-language model's runtime includes its vision encoder's profiling run over one row's images).

    util is the smallest that holds every rollout of the step at once, else all the room left (rounded down
    to 0.01); the phase fits when the KV cache holds at least min(rollouts, VLLM_MIN_CONCURRENT) sequences."""
    seq = wl.prompt_tokens + wl.logit_tokens
    encoder = vision_activations(arch, env, setup, wl, 1, grad=False)  # one row's images through the tower
    free = env.budget - sum(resident.values())
    best: tuple[Generation, dict[str, float]] | None = None
    for tp in tp_choices(arch, env) or [1]:
        rollouts = wl.per_proc * tp  # one vLLM instance serves its TP group
        max_num_seqs = wl.per_proc * tp
        weights = vllm_weights(arch, env, setup) / tp
        runtime = VLLM_RUNTIME_GIB * GiB + max_num_seqs * arch.vocab * 4.0 + encoder
        kv_seq = seq * arch.kv_bytes_per_token(2.0) / tp  # per GPU: its share of the heads
        need = weights + runtime + rollouts * kv_seq
        if need <= free:
            util = math.ceil(need / env.total * 100) / 100
            if util * env.total > free:
                util = math.floor(free / env.total * 100) / 100
        else:
            util = max(0.0, math.floor(free / env.total * 100) / 100)
        kv = util * env.total - weights - runtime
        concurrent = max(0, int(kv // kv_seq)) if kv > 0 else 0
        fits = kv > 0 and concurrent >= min(rollouts, VLLM_MIN_CONCURRENT)
        gen = Generation(
            "vllm",
            wl.per_proc,
            util=util,
            tp=tp,
            max_model_length=seq,
            max_num_seqs=max_num_seqs,
            kv_cache=max(kv, 0.0),
            concurrent=min(concurrent, rollouts),
            fits=fits,
        )
        comps = {"vLLM weights": weights, "vLLM runtime (activations, graphs)": runtime, "vLLM KV cache": max(kv, 0)}
        if best is None or (fits and not best[0].fits):
            best = (gen, comps)
        if fits:
            break
    assert best is not None
    return best


def generation_chunks(wl: Workload, micro: int, world: int) -> list[int]:
    """Rollouts per transformers `generate` call the stage can run, largest first: divisors of the per-process
    rollouts that are whole micro-batches and, over all processes, whole groups (TRL forms its generation batch
    from complete groups); only the whole batch when the stage cannot chunk."""
    if not wl.chunkable:
        return [wl.per_proc]
    ok = [d for d in range(wl.per_proc, 0, -1) if wl.per_proc % d == 0 and d % micro == 0]
    return [d for d in ok if (d * world) % max(wl.group_size, 1) == 0] or [wl.per_proc]


def transformers_generation(
    arch: Arch, env: Env, setup: Setup, wl: Workload, chunk: int | None = None
) -> tuple[Generation, Phase]:
    """transformers `generate` over `chunk` rollouts at a time (default: the whole per-process batch): the KV
    cache of those rollouts, the prefill's MLP working set (3I + 2h per prompt token) and the sampling logits.

    Under master weights every forward re-casts the weights to bf16 (`autocast_copies`), and the fp32 embedding
    makes RoPE's cos/sin fp32, so the cached keys are fp32 and the values follow them: a 4-byte KV cache; the
    residual and the norm output of the prefill are fp32 too."""
    n = chunk or wl.per_proc
    seq = wl.prompt_tokens + wl.logit_tokens
    master = master_weights(env, setup)
    comps = generation_resident(arch, env, setup, wl)
    comps["bf16 weight copies (autocast)"] = autocast_copies(arch, env, setup)
    comps["KV cache (generate)"] = n * seq * arch.kv_bytes_per_token(4.0 if master else env.wb)
    mlp, resid = (2.0, 4.0) if master else (env.wb, env.wb)
    comps["prefill activations"] = n * wl.prompt_tokens * (3 * arch.intermediate * mlp + 2 * arch.hidden * resid)
    comps["sampling logits"] = n * arch.vocab * SAMPLING_LOGIT_BYTES
    comps["vision tower activations"] = vision_activations(arch, env, setup, wl, n, grad=False)
    comps = nonzero(comps, env)
    phase = Phase(wl.stage, "generation", comps, env.budget)
    return Generation("transformers", wl.per_proc, concurrent=n, fits=phase.fits), phase


class EngineSize(namedtuple("EngineSize", "per_gpu components concurrent fits")):
    """An async run's generator engine, per GPU: per_gpu (bytes it reserves or peaks at), components (bytes by
    name), concurrent (sequences it holds at once), fits."""

    __slots__ = ()


def dedicated(
    arch: Arch, engine: str, total: float, budget: float, rollouts: int, prompt: int, seq: int, tp: int
) -> EngineSize:
    """An async run's generator engine on GPUs the trainer does not use, serving `rollouts` per step. It always
    holds bf16 weights (the trainer pushes them whole).

    vLLM (`tp` GPUs per engine) reserves VLLM_DEDICATED_UTIL x total: its CUDA context, its share of the weights and
    its runtime; the KV cache takes the rest. transformers (one GPU): the weights, then the KV cache, prefill and
    sampling logits of as many of the engine's `rollouts` at once as fit the budget. Either fits when it holds
    min(rollouts, VLLM_MIN_CONCURRENT) sequences at once."""
    context, weights = CUDA_CONTEXT_GIB * GiB, arch.params() * 2.0 / tp
    kv_seq = seq * arch.kv_bytes_per_token(2.0) / tp
    if engine == "vllm":
        runtime = VLLM_RUNTIME_GIB * GiB + rollouts * arch.vocab * 4.0
        reserved = VLLM_DEDICATED_UTIL * total
        kv = max(reserved - context - weights - runtime, 0.0)
        comps = {"CUDA context + framework": context, "vLLM weights": weights, "vLLM runtime": runtime}
        comps["vLLM KV cache"] = kv
        held = min(int(kv // kv_seq), rollouts)
        return EngineSize(reserved, comps, held, held >= min(rollouts, VLLM_MIN_CONCURRENT))
    per_seq = kv_seq + prompt * (3 * arch.intermediate + 2 * arch.hidden) * 2.0 + arch.vocab * SAMPLING_LOGIT_BYTES
    held = min(max(int((budget - context - weights) // per_seq), 0), rollouts)
    comps = {"CUDA context + framework": context, "policy weights (bf16)": weights}
    comps["KV cache, prefill, sampling"] = held * per_seq
    return EngineSize(sum(comps.values()), comps, held, held >= min(rollouts, VLLM_MIN_CONCURRENT))

"""The memory planner: a per-GPU memory model of each stage's phases, and the automatic settings built on it.

Pure Python (no torch): `rlctl plan` stays fast and works on any machine. Every formula and constant below
is documented in docs/memory-planner.md; numbers are bytes unless a name says GiB.

The model, per GPU and per phase (generation and training for RL; training for SFT/DPO/RM):

* policy weights / gradients / optimizer states, from the adapter (full, LoRA, QLoRA), the precision and
  the strategy (replicated single/DDP, FSDP2 full shard, FSDP2 with CPU offload);
* activations (Korthikanti et al. 2022 counting, adapted to GQA + SwiGLU + RMSNorm + flash attention) with or
  without gradient checkpointing, and the LM-head logits;
* reference model, reward model, critic;
* generation: vLLM colocated in sleep mode (its reservation `gpu_memory_utilization x total`: weights, runtime,
  KV cache) or transformers `generate` (KV cache, prefill activations, sampling logits);
* a fixed CUDA context / framework overhead.

`decide()` walks the candidate settings in a fixed order (full replicated, FSDP2, optimizer offload between
phases, FSDP2 + CPU offload, LoRA, QLoRA), picks the first that fits with the largest micro-batches, and
explains every choice in one line. Nothing fits: `decide()` raises a UserError naming the nearest plan that does.
"""

from __future__ import annotations

import math
from collections import namedtuple
from typing import TYPE_CHECKING, Any

from rlctl.errors import UserError

if TYPE_CHECKING:
    from rich.table import Table

    from rlctl.config import ModelArch, RunConfig
    from rlctl.hardware import Hardware

GiB = float(2**30)

# --- Assumptions (each one is a row of docs/memory-planner.md) ------------------------------------------------
CUDA_CONTEXT_GIB = 1.5  # CUDA context, cuBLAS/NCCL workspaces, torch/TRL buffers, per GPU process
CPU_FRAMEWORK_GIB = 1.0  # Python + torch + datasets per process when training on CPU
GPU_RESERVE = 0.05  # fraction of each GPU kept free for allocator fragmentation
HOST_RESERVE = 0.10  # fraction of host RAM kept for the OS and page cache
HOST_PROCESS_GIB = 2.0  # host RAM per training process (Python, torch, tokenizer, dataloader)
VLLM_RUNTIME_GIB = 1.0  # vLLM's profiled activations (max_num_batched_tokens=4096) + CUDA graphs
VLLM_SLEEP_RESIDUE_GIB = 1.0  # what a sleeping vLLM (level 2) keeps on the GPU: graphs, non-tagged buffers
VLLM_MIN_CONCURRENT = 16  # fewest rollouts vLLM must hold at once (or all of them, when fewer)
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit NF4 + 8-bit absmax per 64 + fp32 per 256 blocks (double quant)
MAX_MICRO = 64  # largest micro-batch the planner considers
TOKENS_PER_MICRO = 4096  # checkpointing stays off when a micro-batch of this many tokens fits without it
LOGIT_BYTES = {"sft": 12.0, "dpo": 8.0, "rl": 8.0, "rm": 0.0}  # per token per vocab entry at bf16, see docs
SAMPLING_LOGIT_BYTES = 12.0  # transformers generate: fp32 last-token logits, processed copy, probabilities
CRITIC_ALGORITHMS = frozenset({"ppo", "vapo"})  # algorithms that train a value model next to the policy


def gib(x: float) -> float:
    return round(x / GiB, 3)


def _gb(x: float) -> str:
    return f"{x / GiB:.1f}"


def _count(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


# --- Architecture arithmetic ------------------------------------------------------------------------------------


# Immutable records are plain namedtuples: `typing.NamedTuple` and dataclasses compile code per field at import,
# which costs tens of milliseconds that `rlctl plan` does not have.


class Arch(namedtuple("Arch", "layers hidden heads kv_heads vocab intermediate tie_embeddings", defaults=(False,))):
    """The architecture numbers the model needs (a decoder-only, GQA, SwiGLU, RMSNorm transformer):
    layers, hidden, heads, kv_heads, vocab, intermediate (MLP size), tie_embeddings."""

    __slots__ = ()

    @classmethod
    def of(cls, a: ModelArch) -> Arch:
        return cls(a.layers, a.hidden, a.heads, a.kv_heads, a.vocab, a.intermediate, a.tie_embeddings)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_linear(self) -> int:
        """q, o (h x h), k, v (h x kv_dim), gate, up, down (h x I): the layer's matmul weights."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_dim + 3 * h * self.intermediate

    @property
    def layer_params(self) -> int:
        return self.layer_linear + 2 * self.hidden  # + two RMSNorm weights

    @property
    def embedding(self) -> int:
        return self.vocab * self.hidden

    def params(self, head: str = "lm") -> int:
        """All parameters (biases ignored, < 0.1%); `head="score"` is the reward model's 1-output head."""
        out = self.embedding if head == "lm" and not self.tie_embeddings else 0
        if head == "score":
            out = self.hidden
        return self.layers * self.layer_params + self.embedding + out + self.hidden  # + final norm

    @property
    def linear_params(self) -> int:
        """Weights bitsandbytes quantizes for QLoRA (embeddings, LM head and norms stay in bf16)."""
        return self.layers * self.layer_linear

    def lora_params(self, r: int) -> int:
        """LoRA on all linear layers (PEFT `all-linear`, LM head excluded): r x (in + out) per adapted matrix."""
        h, kv, i = self.hidden, self.kv_dim, self.intermediate
        # q: 2h, k: h+kv, v: h+kv, o: 2h, gate: h+I, up: h+I, down: I+h
        return self.layers * r * (9 * h + 2 * kv + 3 * i)

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.layers * self.kv_dim * dtype_bytes

    def act_bytes_per_token_layer(self, ab: float) -> float:
        """Tensors one decoder layer saves for backward, per token, in elements of ab bytes (flash attention,
        no dropout): each RMSNorm its input upcast to fp32 (2), its normalised and its output tensor (1 + 1)
        -> 4h per norm, 8h for two; Q and the attention output h each; K and V kv_dim each; the MLP's gate, up,
        act(gate) and act*up I each. Total 10h + 2 kv_dim + 4I (docs/memory-planner.md itemises it)."""
        return ab * (10 * self.hidden + 2 * self.kv_dim + 4 * self.intermediate)

    def act_bytes_per_token_layer_master(self) -> float:
        """Bytes one decoder layer saves per token when the weights are fp32 and autocast computes in bf16 (full
        training on single/DDP): the embedding is fp32, so the residual stream and both RMSNorms stay fp32 (input
        4h + normalised 4h bytes each), and every linear casts its input to bf16 on its own (q, k, v: 3 copies,
        gate, up: 2; 2h bytes each); Q, the attention output, K, V and the MLP tensors are bf16 as above.
        Total 2 x 8h + 5 x 2h + 2 x (2h + 2 kv_dim + 4I) = 30h + 4 kv_dim + 8I."""
        return 30 * self.hidden + 4 * self.kv_dim + 8 * self.intermediate

    def matmul_params(self, head: str = "lm") -> int:
        """Weights autocast casts to bf16 for a forward: the linear layers and the LM head (vocab x h, tied or
        not) or the reward model's h x 1 score head; embeddings and norms are not matmuls."""
        return self.linear_params + (self.embedding if head == "lm" else self.hidden)

    def lora_dropout_bytes_per_token_layer(self, ab: float) -> float:
        """LoRA dropout keeps a copy of each adapted matrix's input: q, k, v, o, gate, up (h) and down (I)."""
        return ab * (6 * self.hidden + self.intermediate)

    @property
    def largest_fsdp_unit(self) -> int:
        """FSDP2 wraps each decoder layer and the embedding (with the tied head) as units."""
        return max(self.layer_params, self.embedding)


# --- What runs where ----------------------------------------------------------------------------------------------


class Env(
    namedtuple(
        "Env",
        "is_cpu procs nodes total budget host_budget host_assumed precision engine lora_r lora_dropout",
        defaults=(16, 0.05),
    )
):
    """The hardware side of the model: one GPU's budget (or one CPU process's share of RAM).

    procs: processes per node; total: bytes of one device as the framework sees it; budget: bytes the plan may
    use per device; host_budget: host RAM per node the plan may use; precision: "bf16" or "no" (float32);
    engine: "vllm", "transformers" or "none"."""

    __slots__ = ()

    @property
    def world(self) -> int:
        return self.procs * self.nodes

    @property
    def wb(self) -> float:
        """Bytes of a frozen weight as loaded (and of activations): bf16 2, float32 4. Weights that train in full
        are fp32 either way (`master_weights`)."""
        return 2.0 if self.precision == "bf16" else 4.0

    @property
    def context(self) -> float:
        return (CPU_FRAMEWORK_GIB if self.is_cpu else CUDA_CONTEXT_GIB) * GiB


class Workload(
    namedtuple(
        "Workload",
        "stage per_proc seqs tokens logit_tokens head prompt_tokens group_size reference reward_model critic "
        "micro_fixed",
        defaults=("lm", 0, 1, False, False, False, None),
    )
):
    """One stage's shape. per_proc: items (sequences, pairs or rollouts) per process per optimizer step;
    seqs: sequences per item (2 for preference pairs: chosen + rejected in one forward); tokens: tokens per
    sequence; logit_tokens: tokens per sequence whose LM-head logits are materialised; head: "lm" or "score"
    (reward model); micro_fixed: the user's micro-batch, or None."""

    __slots__ = ()


class Setup(
    namedtuple("Setup", "strategy adapter cpu_offload phase_offload checkpointing", defaults=(False, False, False))
):
    """One candidate layout of the training state. strategy: single, ddp, fsdp2; adapter: full, lora, qlora;
    cpu_offload: FSDP2 CPUOffloadPolicy (params, grads and optimizer in host RAM); phase_offload: RL optimizer
    states leave the GPU outside the optimizer step; checkpointing: gradient checkpointing."""

    __slots__ = ()

    @property
    def label(self) -> str:
        parts = [self.adapter, self.strategy]
        if self.cpu_offload:
            parts.append("CPU offload")
        if self.phase_offload:
            parts.append("optimizer offload between phases")
        if self.checkpointing:
            parts.append("checkpointing")
        return ", ".join(parts)


class Phase:
    """One phase of one stage: its components (bytes per GPU) against the budget."""

    def __init__(self, stage: str, name: str, components: dict[str, float], budget: float):
        self.stage = stage
        self.name = name  # generation, training, optimizer step
        self.components = components
        self.budget = budget

    @property
    def peak(self) -> float:
        return sum(self.components.values())

    @property
    def headroom(self) -> float:
        return self.budget - self.peak

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget

    @property
    def label(self) -> str:
        return f"{self.stage}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "phase": self.name,
            "components_gib": {k: gib(v) for k, v in self.components.items()},
            "peak_gib": gib(self.peak),
            "budget_gib": gib(self.budget),
            "headroom_gib": gib(self.headroom),
            "fits": self.fits,
        }


class Generation:
    """How the RL stage generates: the vLLM settings, or transformers `generate` over every rollout at once."""

    def __init__(
        self,
        engine: str,
        rollouts: int,  # rollouts per process per step
        util: float = 0.0,
        tp: int = 1,
        max_model_length: int = 0,
        max_num_seqs: int = 0,
        kv_cache: float = 0.0,
        concurrent: int = 0,
        fits: bool = True,
    ):
        self.engine, self.rollouts, self.util, self.tp = engine, rollouts, util, tp
        self.max_model_length, self.max_num_seqs, self.kv_cache = max_model_length, max_num_seqs, kv_cache
        self.concurrent, self.fits = concurrent, fits

    def to_json(self) -> dict[str, Any]:
        if self.engine == "vllm":
            return {
                "engine": "vllm",
                "gpu_memory_utilization": self.util,
                "tensor_parallel_size": self.tp,
                "max_model_length": self.max_model_length,
                "max_num_seqs": self.max_num_seqs,
                "kv_cache_gib": gib(self.kv_cache),
                "concurrent_sequences": self.concurrent,
                "rollouts_per_instance": self.rollouts * self.tp,
                "sleep_level": 2,
            }
        return {"engine": self.engine, "rollouts_per_process": self.rollouts}


class StageFit:
    """One stage at one micro-batch: its phases and, for RL, how it generates."""

    def __init__(self, workload: Workload, micro: int, phases: list[Phase], generation: Generation | None = None):
        self.workload, self.micro, self.phases, self.generation = workload, micro, phases, generation

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.phases) and (self.generation is None or self.generation.fits)

    @property
    def grad_accum(self) -> int:
        return self.workload.per_proc // self.micro

    @property
    def worst(self) -> Phase:
        return min(self.phases, key=lambda p: p.headroom)


class Attempt:
    """One candidate setup with every stage fitted, and the host RAM it needs per node."""

    def __init__(self, setup: Setup, stages: list[StageFit], host: dict[str, float], host_budget: float):
        self.setup, self.stages, self.host, self.host_budget = setup, stages, host, host_budget

    @property
    def host_peak(self) -> float:
        return sum(self.host.values())

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages) and self.host_peak <= self.host_budget

    @property
    def phases(self) -> list[Phase]:
        return [p for s in self.stages for p in s.phases]

    @property
    def worst(self) -> Phase:
        return min(self.phases, key=lambda p: p.headroom)

    @property
    def headroom(self) -> float:
        return self.worst.headroom

    def why_not(self) -> str:
        if self.host_peak > self.host_budget and all(s.fits for s in self.stages):
            return f"host RAM {_gb(self.host_peak)} GiB > {_gb(self.host_budget)} GiB"
        for s in self.stages:
            if s.generation is not None and not s.generation.fits and s.worst.fits:
                return f"{s.workload.stage}/generation: no room for the rollouts' KV cache"
        w = self.worst
        return f"{w.label} peaks at {_gb(w.peak)} GiB > {_gb(w.budget)} GiB"


# --- The model ------------------------------------------------------------------------------------------------------


def model_state(arch: Arch, env: Env, setup: Setup, head: str = "lm") -> dict[str, float]:
    """Training state of one model per GPU: weights, gradients, optimizer states, DDP buckets, host share.

    full: the stages load weights that train in full in fp32 (master weights; bf16 autocast runs the math):
        weights 4P, gradients 4P, AdamW m and v 8P; DDP adds gradient buckets 4P (autocast's bf16 copies of the
        weights are transient: `autocast_copies`).
    full, FSDP2: the same state sharded, 16P/N, plus the gathered bf16 units (3 x largest unit x 2 B).
    FSDP2 + CPU offload: the sharded state lives in host RAM; the GPU keeps the gathered units.
    LoRA: frozen base 2P (bf16) + adapters in fp32 (PEFT autocasts them): 4Pa weights, 4Pa grads, 8Pa Adam.
    QLoRA: the base's linear weights in NF4 (NF4_BYTES per param), embeddings/head/norms in bf16 + LoRA as above.
    """
    p = arch.params(head)
    world = env.world
    sharded = setup.strategy == "fsdp2"
    n = world if sharded else 1
    if setup.adapter == "full":
        trainable, frozen = p, 0.0
        tb = 4.0  # bytes per trainable weight: fp32 master weights
    else:
        trainable = arch.lora_params(env.lora_r)
        tb = 4.0
        frozen = p * env.wb if setup.adapter == "lora" else quantized_bytes(arch, env, head)
    weights = (frozen + trainable * tb) / n
    grads = trainable * tb / n
    optim = 2 * trainable * tb / n
    gathered = 3 * arch.largest_fsdp_unit * env.wb if sharded else 0.0
    buckets = trainable * tb if setup.strategy == "ddp" else 0.0
    host = 0.0
    if setup.cpu_offload:
        host = weights + grads + optim
        weights, grads, optim = 0.0, 0.0, 0.0
    return {"weights": weights + gathered, "grads": grads, "optim": optim, "buckets": buckets, "host": host}


def quantized_bytes(arch: Arch, env: Env, head: str = "lm") -> float:
    """A 4-bit (bitsandbytes NF4, double quant) copy: linear weights at NF4_BYTES, the rest in bf16."""
    p = arch.params(head)
    return arch.linear_params * NF4_BYTES + (p - arch.linear_params) * env.wb


def master_weights(env: Env, setup: Setup) -> bool:
    """Full training on single/DDP under bf16 mixed precision: the weights are fp32 on the GPU and autocast
    computes in bf16 (FSDP2 instead gathers bf16 units through its MixedPrecisionPolicy: bf16 activations)."""
    return setup.adapter == "full" and setup.strategy != "fsdp2" and env.precision == "bf16"


def autocast_copies(arch: Arch, env: Env, setup: Setup, head: str = "lm") -> float:
    """autocast's bf16 copies of the fp32 weights, 2 B per matmul weight: cached for the whole forward (the
    autocast weight cache, with or without checkpointing) and, without checkpointing, saved for backward."""
    return 2.0 * arch.matmul_params(head) if master_weights(env, setup) else 0.0


def reference_bytes(arch: Arch, env: Env, setup: Setup, head: str = "lm") -> float:
    """The whole frozen reference: TRL 1.16 builds it in the policy's dtype (GRPO/RLOO/DPO/KTO:
    `model_init_kwargs.setdefault("dtype", self.model.dtype)`) and rlctl's RL loop deep-copies the policy, so
    under full training it is fp32 like the policy's weights (4P); NF4 under QLoRA."""
    if setup.adapter == "qlora":
        return quantized_bytes(arch, env, head)
    return arch.params(head) * (4.0 if setup.adapter == "full" else env.wb)


def frozen_copy(arch: Arch, env: Env, setup: Setup, head: str = "lm") -> float:
    """The frozen reference model per GPU (`reference_bytes`), sharded by FSDP2 (TRL's prepare_fsdp), in host RAM
    with FSDP2 CPU offload."""
    if setup.cpu_offload:
        return 0.0
    full = reference_bytes(arch, env, setup, head)
    return full / env.world if setup.strategy == "fsdp2" else full


def reward_model_copy(arch: Arch, env: Env, setup: Setup) -> float:
    """The rm stage's classifier used as an RL reward: bf16 (NF4 under QLoRA) on every GPU. TRL prepares reward
    models for evaluation only, so they are counted whole on each GPU whatever the strategy."""
    return quantized_bytes(arch, env, "score") if setup.adapter == "qlora" else arch.params("score") * env.wb


def critic_state(arch: Arch, env: Env, setup: Setup, with_grads: bool) -> float:
    """A value model (critic) laid out like the policy: weights + optimizer (+ gradients while training)."""
    c = model_state(arch, env, setup, "score")
    return c["weights"] + c["optim"] + c["buckets"] + (c["grads"] if with_grads else 0.0)


def activations(arch: Arch, env: Env, setup: Setup, wl: Workload, micro: int) -> float:
    """Saved activations of one micro-batch: tokens x layers x per-layer bytes, or with checkpointing the layer
    inputs (h per token per layer; fp32 under master weights) plus one layer recomputed in the backward pass."""
    tokens = micro * wl.seqs * wl.tokens
    ab = env.wb
    per_layer = arch.act_bytes_per_token_layer(ab)
    if master_weights(env, setup):
        ab, per_layer = 4.0, arch.act_bytes_per_token_layer_master()
    if setup.adapter != "full" and env.lora_dropout > 0:
        per_layer += arch.lora_dropout_bytes_per_token_layer(ab)
    if setup.checkpointing:
        return tokens * (arch.layers * ab * arch.hidden + per_layer)
    return tokens * arch.layers * per_layer


def logits(arch: Arch, env: Env, wl: Workload, micro: int) -> float:
    """LM-head logits and their log-softmax/gradient working copies (LOGIT_BYTES per entry at bf16)."""
    return micro * wl.seqs * wl.logit_tokens * arch.vocab * LOGIT_BYTES.get(wl.stage, 8.0) * env.wb / 2


def training_phases(arch: Arch, env: Env, setup: Setup, wl: Workload, micro: int) -> list[Phase]:
    """The training phase (forward + backward + step), split in two when the optimizer leaves the GPU."""
    st = model_state(arch, env, setup, wl.head)
    comps: dict[str, float] = {_context_name(env): env.context}
    comps["policy weights"] = st["weights"]
    comps["policy gradients"] = st["grads"]
    if st["buckets"]:
        comps["DDP gradient buckets"] = st["buckets"]
    if wl.reference and setup.adapter == "full":
        comps["reference model"] = frozen_copy(arch, env, setup)
    if wl.reward_model:
        comps["reward model"] = reward_model_copy(arch, env, setup)
    if wl.critic:
        comps["critic (weights, grads, optimizer)"] = critic_state(arch, env, setup, with_grads=True)
    if env.engine == "vllm" and wl.stage == "rl":
        comps["vLLM sleeping residue"] = VLLM_SLEEP_RESIDUE_GIB * GiB
    act = activations(arch, env, setup, wl, micro) * (2 if wl.critic else 1)
    split = setup.phase_offload and wl.stage == "rl" and st["optim"] > 0
    train = dict(comps)
    copies = autocast_copies(arch, env, setup, wl.head)
    train["bf16 weight copies (autocast)"] = copies + (autocast_copies(arch, env, setup, "score") if wl.critic else 0)
    train["activations"] = act
    train["logits"] = logits(arch, env, wl, micro)
    if not split:
        train["optimizer states"] = st["optim"]
        return [Phase(wl.stage, "training", _nonzero(train, env), env.budget)]
    step = dict(comps)
    step["optimizer states"] = st["optim"]
    return [
        Phase(wl.stage, "training", _nonzero(train, env), env.budget),
        Phase(wl.stage, "optimizer step", _nonzero(step, env), env.budget),
    ]


def generation_resident(arch: Arch, env: Env, setup: Setup, wl: Workload) -> dict[str, float]:
    """What the training side keeps on the GPU while rollouts are generated. Gradients are not there: the
    trainer frees them after every optimizer step (zero_grad(set_to_none=True)) and generates before the next
    forward; DDP's gradient buckets are allocated for the whole run."""
    st = model_state(arch, env, setup, wl.head)
    comps: dict[str, float] = {_context_name(env): env.context}
    comps["policy weights"] = st["weights"]
    if st["buckets"]:
        comps["DDP gradient buckets"] = st["buckets"]
    if not setup.phase_offload:
        comps["optimizer states"] = st["optim"]
    if wl.reference and setup.adapter == "full":
        comps["reference model"] = frozen_copy(arch, env, setup)
    if wl.reward_model:
        comps["reward model"] = reward_model_copy(arch, env, setup)
    if wl.critic:
        comps["critic (weights, optimizer)"] = critic_state(arch, env, setup, with_grads=False)
    return _nonzero(comps, env)


def _context_name(env: Env) -> str:
    return "framework (Python, torch)" if env.is_cpu else "CUDA context + framework"


def _nonzero(comps: dict[str, float], env: Env) -> dict[str, float]:
    return {k: v for k, v in comps.items() if v > 0 or k == _context_name(env)}


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
    """vLLM colocated: it reserves util x total; weights/TP + runtime + KV cache fill that reservation.

    util is the smallest that holds every rollout of the step at once, else all the room left (rounded down
    to 0.01); the phase fits when the KV cache holds at least min(rollouts, VLLM_MIN_CONCURRENT) sequences."""
    seq = wl.prompt_tokens + wl.logit_tokens
    free = env.budget - sum(resident.values())
    best: tuple[Generation, dict[str, float]] | None = None
    for tp in tp_choices(arch, env) or [1]:
        rollouts = wl.per_proc * tp  # one vLLM instance serves its TP group
        max_num_seqs = wl.per_proc * tp
        weights = vllm_weights(arch, env, setup) / tp
        runtime = VLLM_RUNTIME_GIB * GiB + max_num_seqs * arch.vocab * 4.0
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


def transformers_generation(arch: Arch, env: Env, setup: Setup, wl: Workload) -> tuple[Generation, Phase]:
    """transformers `generate` over the whole per-process rollout batch at once (TRL's generation batch): the KV
    cache of every rollout, the prefill's MLP working set (3I + 2h per prompt token) and the sampling logits.

    Under master weights every forward re-casts the weights to bf16 (`autocast_copies`), and the fp32 embedding
    makes RoPE's cos/sin fp32, so the cached keys are fp32 and the values follow them: a 4-byte KV cache; the
    residual and the norm output of the prefill are fp32 too."""
    n = wl.per_proc
    seq = wl.prompt_tokens + wl.logit_tokens
    master = master_weights(env, setup)
    comps = generation_resident(arch, env, setup, wl)
    comps["bf16 weight copies (autocast)"] = autocast_copies(arch, env, setup)
    comps["KV cache (generate)"] = n * seq * arch.kv_bytes_per_token(4.0 if master else env.wb)
    mlp, resid = (2.0, 4.0) if master else (env.wb, env.wb)
    comps["prefill activations"] = n * wl.prompt_tokens * (3 * arch.intermediate * mlp + 2 * arch.hidden * resid)
    comps["sampling logits"] = n * arch.vocab * SAMPLING_LOGIT_BYTES
    comps = _nonzero(comps, env)
    phase = Phase(wl.stage, "generation", comps, env.budget)
    return Generation("transformers", n, concurrent=n, fits=phase.fits), phase


def stage_fit(arch: Arch, env: Env, setup: Setup, wl: Workload, micro: int) -> StageFit:
    """Every phase of one stage at one micro-batch."""
    phases = training_phases(arch, env, setup, wl, micro)
    gen = None
    if wl.stage == "rl" and env.engine == "vllm":
        resident = generation_resident(arch, env, setup, wl)
        gen, vcomps = vllm_generation(arch, env, setup, wl, resident)
        phases.insert(0, Phase(wl.stage, "generation", {**resident, **vcomps}, env.budget))
    elif wl.stage == "rl":
        gen, phase = transformers_generation(arch, env, setup, wl)
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
        if any(w.reference for w in wls) and setup.adapter == "full":
            out["reference model (CPU offload)"] = reference_bytes(arch, env, setup) / env.world * env.procs
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
    text = f"{a.setup.label}, {_gb(a.headroom)} GiB headroom"
    gen = next((s.generation for s in a.stages if s.generation is not None), None)
    if gen is not None and gen.engine == "vllm" and gen.concurrent < gen.rollouts * gen.tp:
        text += f", vLLM holds {gen.concurrent} of {gen.rollouts * gen.tp} rollouts at once"
    return text


def nearest(
    cfg: RunConfig, hardware: Hardware, procs: int, engine: str, precision: str, relax_user: bool = False
) -> list[str]:
    """Up to three nearby plans that fit, as `--set`/`--hardware` suggestions with their layout and headroom."""
    from rlctl import hardware as hw

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


# --- Explanations ---------------------------------------------------------------------------------------------------


def explain(cfg: RunConfig, plan: MemoryPlan, hardware: Hardware) -> list[dict[str, str]]:
    """One line per automatic (or user-fixed) setting: what was chosen and why."""
    a, env, s = plan.attempt, plan.env, plan.setup
    arch = Arch.of(cfg.model.arch)  # type: ignore[arg-type]
    out: list[dict[str, str]] = []

    def add(setting: str, value: Any, why: str, user: bool = False) -> None:
        out.append({"setting": setting, "value": str(value), "why": why + (" (set by you)" if user else "")})

    st = model_state(arch, env, s)
    per_gpu = _gb(st["weights"] + st["grads"] + st["optim"])
    p = arch.params()
    if env.is_cpu:
        add("strategy", s.strategy, f"CPU: {env.world} process(es); the planner reports memory but does not search")
    elif s.strategy == "fsdp2":
        rep = model_state(arch, env, Setup("ddp" if env.world > 1 else "single", s.adapter))
        why = (
            f"{s.adapter} state sharded over {env.world} GPUs: {per_gpu} GiB per GPU instead of "
            f"{_gb(rep['weights'] + rep['grads'] + rep['optim'] + rep['buckets'])} GiB replicated"
        )
        if env.world == 1:
            why = f"{s.adapter} state through FSDP2 on one GPU: {per_gpu} GiB on the GPU"
        if s.cpu_offload:
            why = f"sharded fp32 state ({_gb(st['host'])} GiB per GPU) lives in host RAM; GPUs hold gathered layers"
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
            why = f"{w.label} would peak at {_gb(w.peak)} GiB > {_gb(w.budget)} GiB"
            if w.fits and kept.generation is not None and not kept.generation.fits:
                why = "generation would have no room for the rollouts' KV cache"
            add(
                "optimizer offload",
                "between phases",
                f"{_gb(optim)} GiB of AdamW states move to host RAM after each step and back for the next "
                f"(with them on the GPU {why})",
            )
        elif not s.cpu_offload:
            add("optimizer offload", "none", "the optimizer states fit on the GPU next to generation")
        gen = rl_fit.generation
        if gen is not None and gen.engine == "vllm":
            add(
                "vllm.gpu_memory_utilization",
                f"{gen.util:.2f}",
                f"{_gb(gen.util * env.total)} GiB reserved: weights + runtime + {_gb(gen.kv_cache)} GiB KV cache "
                f"for {gen.concurrent} of {gen.rollouts * gen.tp} rollouts at once (sleeps at level 2 in training)",
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
                f"{_gb(rl_fit.phases[0].components.get('KV cache (generate)', 0))} GiB)",
            )
    ref = plan.reference
    copy = frozen_copy(arch, env, s)
    if ref != "none" or "rl" in cfg.stages:
        why = {
            "none": "rl.beta=0: TRL loads no reference model",
            "adapters-disabled": "LoRA: the reference is the base model with adapters disabled (no extra copy)",
            "gpu": f"a frozen fp32 copy (TRL builds it in the policy's dtype) on each GPU ({_gb(copy)} GiB)",
            "gpu-sharded": f"a frozen fp32 copy sharded by FSDP2 ({_gb(copy)} GiB per GPU)",
            "cpu-offload": "a frozen fp32 copy in host RAM, offloaded with the FSDP2 state",
            "cpu": f"a frozen copy in each process ({_gb(copy)} GiB)",
        }[ref]
        add("reference", ref, why)
    return out


# --- Checkpoints on disk --------------------------------------------------------------------------------------------


def disk_need(cfg: RunConfig, setup: Setup, precision: str) -> float:
    """Bytes the run writes: keep_last checkpoints (weights + optimizer) and the final model of every stage."""
    arch = Arch.of(cfg.model.arch)  # type: ignore[arg-type]
    wb = 2.0 if precision == "bf16" else 4.0
    total = 0.0
    for name in cfg.stages:
        p = arch.params("score" if name == "rm" else "lm")
        trained = p if setup.adapter == "full" else arch.lora_params(cfg.model.lora_r)
        ckpt = trained * 4.0 * 3  # fp32 weights + AdamW m and v
        final = p * (4.0 if setup.adapter == "full" else wb)  # saved in the dtype it trained in; LoRA merged
        total += cfg.checkpoint.keep_last * ckpt + final
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

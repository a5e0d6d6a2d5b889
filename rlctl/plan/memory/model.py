"""The memory model: what each stage of a run keeps in memory, per GPU and per phase (pure arithmetic).

Pure Python (no torch): `rlctl plan` stays fast and works on any machine. Every formula and constant below
is documented in docs/memory-planner.md; numbers are bytes unless a name says GiB.

The model, per GPU and per phase (generation and training for RL; training for SFT/DPO/RM):

* policy weights / gradients / optimizer states, from the adapter (full, LoRA, QLoRA), the precision and
  the strategy (replicated single/DDP, FSDP2 full shard, FSDP2 with CPU offload); full training keeps fp32
  master weights (the stages load trainable weights in fp32 under bf16 autocast), with autocast's bf16 copies;
* activations (Korthikanti et al. 2022 counting, adapted to GQA + SwiGLU + RMSNorm + flash attention) with or
  without gradient checkpointing, and the LM-head logits; a vision-language model's vision tower (its weights in
  every phase, its training state when it trains) and its activations for the images of a micro-batch, whose
  image tokens lengthen each sequence;
* reference model, reward model, critic;
* generation: vLLM colocated in sleep mode (its reservation `gpu_memory_utilization x total`: weights, runtime,
  KV cache) or transformers `generate` (KV cache, prefill activations, sampling logits); none on an async RL
  run's trainer GPUs (engine `separate`: the generator's own GPUs are sized in `rlctl.plan.async_split`);
* a fixed CUDA context / framework overhead.

The architecture counts live in `rlctl.plan.memory.arch`, the generation phase in `rlctl.plan.memory.generation`;
`rlctl.plan.memory.search` fits one candidate layout (`Setup`) to every stage with its largest micro-batches and
`rlctl.plan.memory` chooses among the candidates and explains the choice.
"""

from __future__ import annotations

from collections import namedtuple
from typing import TYPE_CHECKING

from rlctl.plan.parts import GenerationSettings, PhaseMemory, VllmSettings

if TYPE_CHECKING:
    from rlctl.plan.memory.arch import Arch

GiB = float(2**30)

# --- Assumptions (each one is a row of docs/memory-planner.md) ------------------------------------------------
CUDA_CONTEXT_GIB = 0.8  # CUDA context, cuBLAS workspaces, allocator blocks of small tensors, per GPU process
CPU_FRAMEWORK_GIB = 1.0  # Python + torch + datasets per process when training on CPU
GPU_RESERVE = 0.05  # fraction of each GPU kept free for allocator fragmentation
HOST_RESERVE = 0.10  # fraction of host RAM kept for the OS and page cache
HOST_PROCESS_GIB = 2.0  # host RAM per training process (Python, torch, tokenizer, dataloader)
VLLM_RUNTIME_GIB = 1.0  # vLLM's profiled activations (max_num_batched_tokens=4096) + CUDA graphs
VLLM_SLEEP_RESIDUE_GIB = 1.0  # what a sleeping vLLM (level 2) keeps on the GPU: graphs, non-tagged buffers
VLLM_MIN_CONCURRENT = 16  # fewest rollouts vLLM must hold at once (or all of them, when fewer)
VLLM_DEDICATED_UTIL = 0.90  # gpu_memory_utilization of a vLLM engine on GPUs of its own (vLLM's default; async RL)
SEPARATE = "separate"  # Env.engine of an async trainer: the generator runs on other GPUs, none generates here
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit NF4 + 8-bit absmax per 64 + fp32 per 256 blocks (double quant)
MAX_MICRO = 64  # largest micro-batch the planner considers
TOKENS_PER_MICRO = 4096  # checkpointing stays off when a micro-batch of this many tokens fits without it
LOGIT_BYTES = {"sft": 12.0, "dpo": 8.0, "rm": 0.0}  # per token per vocab entry at bf16 (x2 in float32), see docs
# rlctl's RL loop scores tokens through the LM head in chunks of this many logits (rlctl.rollout.samples), each
# recomputed in the backward pass: per entry the head's output, its fp32 copy, log-sum-exp's exp and the gradient
LOGPROB_CHUNK_ENTRIES = 2**26
LOOP_CHUNK_BYTES = 14.0
FUSED_TILE = (4096, 32768)  # TRL's chunked LM head (GRPO, RLOO, KTO): tokens x vocabulary entries per tile
SAMPLING_LOGIT_BYTES = 12.0  # transformers generate: fp32 last-token logits, processed copy, probabilities
CRITIC_ALGORITHMS = frozenset({"ppo", "vapo"})  # algorithms that train a value model next to the policy


def gib(x: float) -> float:
    return round(x / GiB, 3)


def gib_str(x: float) -> str:
    return f"{x / GiB:.1f}"


# --- What runs where ----------------------------------------------------------------------------------------------


class Env(
    namedtuple(
        "Env",
        "is_cpu procs nodes total budget host_budget host_assumed precision engine lora_r lora_dropout lora_embeddings "
        "lora_vision freeze_vision",
        defaults=(16, 0.05, False, False, False),
    )
):
    """The hardware side of the model: one GPU's budget (or one CPU process's share of RAM).

    procs: processes per node; total: bytes of one device as the framework sees it; budget: bytes the plan may
    use per device; host_budget: host RAM per node the plan may use; precision: "bf16" or "no" (float32);
    engine: "vllm", "transformers", "none" or "separate" (async RL: generation runs on other GPUs); lora_vision:
    adapters on the vision tower too (model.lora_vision); freeze_vision: full fine-tuning keeps the vision tower
    frozen (model.freeze_vision)."""

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
        "micro_fixed loop_reference chunkable image_tokens value_pretraining",
        defaults=("lm", 0, 1, False, False, False, None, False, True, 0, False),
    )
):
    """One stage's shape. per_proc: items (sequences, pairs or rollouts) per process per optimizer step;
    seqs: sequences per item (2 for preference pairs: chosen + rejected in one forward); tokens: tokens per
    sequence; logit_tokens: tokens per sequence whose LM-head logits are materialised; head: "lm" or "score"
    (reward model); micro_fixed: the user's micro-batch, or None; loop_reference: rlctl's own RL loop runs the
    stage and loads its reference itself (frozen, bf16, whole on each GPU) rather than TRL; chunkable: transformers
    generation may run the rollouts in several `generate` calls (TRL: only with one update per rollout batch);
    image_tokens: a vision-language stage's image tokens per sequence (already in `tokens` and `prompt_tokens`);
    value_pretraining: the RL stage fits its critic alone before the policy moves (VAPO's rl.critic.pretrain_steps),
    a phase of its own."""

    __slots__ = ()

    @property
    def fused_head(self) -> bool:
        """TRL 1.16's KTO trainer scores tokens through its chunked LM head (`add_fused_lm_head`): no [tokens x
        vocabulary] logits (rlctl's RL loop chunks its own: `logits`)."""
        return self.stage == "kto"


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

    def row(self) -> PhaseMemory:
        """The phase as a row of the plan's memory table (GiB)."""
        return PhaseMemory(
            self.stage,
            self.name,
            {k: gib(v) for k, v in self.components.items()},
            gib(self.peak),
            gib(self.budget),
            gib(self.headroom),
            self.fits,
        )


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

    def vllm_settings(self) -> VllmSettings:
        """The plan's `vllm` for this colocated engine (asleep between rollouts)."""
        return VllmSettings(
            max_model_length=self.max_model_length,
            gpu_memory_utilization=self.util,
            tensor_parallel_size=self.tp,
            max_num_seqs=self.max_num_seqs,
            kv_cache_gib=gib(self.kv_cache),
            concurrent_sequences=self.concurrent,
            rollouts_per_instance=self.rollouts * self.tp,
        )

    def transformers_settings(self) -> GenerationSettings:
        """The plan's `generation` for transformers `generate`: `concurrent` rollouts per call."""
        return GenerationSettings(self.rollouts, self.concurrent)


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
            return f"host RAM {gib_str(self.host_peak)} GiB > {gib_str(self.host_budget)} GiB"
        for s in self.stages:
            if s.generation is not None and not s.generation.fits and s.worst.fits:
                return f"{s.workload.stage}/generation: no room for the rollouts' KV cache"
        w = self.worst
        return f"{w.label} peaks at {gib_str(w.peak)} GiB > {gib_str(w.budget)} GiB"


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
    if setup.adapter == "full":  # model.freeze_vision: the tower's fp32 weights take no gradients or AdamW states
        tower = arch.vision_params if env.freeze_vision else 0
        trainable, frozen = p - tower, tower * 4.0
        tb = 4.0  # bytes per trainable weight: fp32 master weights
    else:
        trainable = arch.adapter_params(env.lora_r, env.lora_embeddings, env.lora_vision)
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


def reference_bytes(arch: Arch, env: Env, setup: Setup, wl: Workload) -> float:
    """The whole frozen reference of a full fine-tuning. TRL 1.16 builds it in the policy's dtype (GRPO, RLOO,
    DPO, KTO: `model_init_kwargs.setdefault("dtype", self.model.dtype)`), fp32 like the policy's weights (4P);
    rlctl's RL loop loads it frozen, in bf16 (2P)."""
    if setup.adapter == "qlora":
        return quantized_bytes(arch, env)
    full = setup.adapter == "full" and not wl.loop_reference
    return arch.params() * (4.0 if full else env.wb)


def frozen_copy(arch: Arch, env: Env, setup: Setup, wl: Workload) -> float:
    """The frozen reference model per GPU (`reference_bytes`): TRL's is sharded by FSDP2 (prepare_fsdp) and in
    host RAM with FSDP2 CPU offload; rlctl's RL loop shards it with the policy under fsdp2 (never offloaded)."""
    full = reference_bytes(arch, env, setup, wl)
    if setup.cpu_offload and not wl.loop_reference:
        return 0.0
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


def vision_trains(env: Env, setup: Setup) -> bool:
    """The vision tower trains in full fine-tuning (unless model.freeze_vision), and with adapters only when
    model.lora_vision puts some on it."""
    return not env.freeze_vision if setup.adapter == "full" else env.lora_vision


def vision_activations(arch: Arch, env: Env, setup: Setup, wl: Workload, sequences: int, grad: bool = True) -> float:
    """The vision tower's activations for the images of `sequences` rows: image tokens x the patches each stands for
    (`Vision.patches_per_token`, its family's). A
    tower that trains (`grad`, `vision_trains`) keeps every block's tensors for backward (with checkpointing, each
    block's input and one block recomputed); a frozen one, or one under no_grad (generation), one block's at a
    time."""
    v = arch.vision
    if v is None or not wl.image_tokens:
        return 0.0
    patches = sequences * wl.image_tokens * v.patches_per_token
    ab = 4.0 if master_weights(env, setup) else env.wb
    per_block = v.act_bytes_per_patch_layer(ab)
    if not grad or not vision_trains(env, setup):
        return patches * per_block
    if setup.checkpointing:
        return patches * (v.layers * ab * v.hidden + per_block)
    return patches * v.layers * per_block


def logits(arch: Arch, env: Env, setup: Setup, wl: Workload, micro: int) -> float:
    """The LM head's working memory for one micro-batch's scored tokens.

    TRL's chunked LM head (KTO): one [4,096 x 32,768] tile of logits in the compute dtype, the fp32 gradient of the
    hidden states, and the fp32 gradient of the head's weight when it trains. rlctl's RL loop: one chunk of
    LOGPROB_CHUNK_ENTRIES logits at LOOP_CHUNK_BYTES per entry, the fp32 gradient of the hidden states and of the
    head's weight when it trains. SFT and DPO: LOGIT_BYTES per entry at bf16, twice that in float32."""
    tokens = micro * wl.seqs * wl.logit_tokens
    head_grad = arch.embedding * 4.0 if setup.adapter == "full" else 0.0
    if wl.stage == "rl":
        chunk = min(tokens * arch.vocab, max(LOGPROB_CHUNK_ENTRIES, micro * arch.vocab))
        return chunk * LOOP_CHUNK_BYTES + tokens * arch.hidden * 4.0 + head_grad
    if wl.fused_head:
        tile = min(tokens, FUSED_TILE[0]) * min(arch.vocab, FUSED_TILE[1]) * env.wb
        return tile + tokens * arch.hidden * 4.0 + head_grad
    return tokens * arch.vocab * LOGIT_BYTES.get(wl.stage, 8.0) * env.wb / 2


def training_phases(arch: Arch, env: Env, setup: Setup, wl: Workload, micro: int) -> list[Phase]:
    """The training phase (forward + backward) and the optimizer step (the state with gradients, activations and
    logits freed). Without the optimizer offload the training phase also holds the optimizer states, so it is the
    stage's peak; the step is planned apart because it is measured apart (the memory probe's phase)."""
    st = model_state(arch, env, setup, wl.head)
    comps: dict[str, float] = {_context_name(env): env.context}
    comps["policy weights"] = st["weights"]
    comps["policy gradients"] = st["grads"]
    if st["buckets"]:
        comps["DDP gradient buckets"] = st["buckets"]
    comps |= _other_models(arch, env, setup, wl, with_grads=True)
    if env.engine == "vllm" and wl.stage == "rl":
        comps["vLLM sleeping residue"] = VLLM_SLEEP_RESIDUE_GIB * GiB
    act = activations(arch, env, setup, wl, micro) * (2 if wl.critic else 1)
    split = setup.phase_offload and wl.stage == "rl" and st["optim"] > 0
    train = dict(comps)
    copies = autocast_copies(arch, env, setup, wl.head)
    train["bf16 weight copies (autocast)"] = copies + (autocast_copies(arch, env, setup, "score") if wl.critic else 0)
    train["activations"] = act
    train["vision tower activations"] = vision_activations(arch, env, setup, wl, micro * wl.seqs)
    train["logits"] = logits(arch, env, setup, wl, micro)
    if not split:
        train["optimizer states"] = st["optim"]
    phases = [Phase(wl.stage, "training", nonzero(train, env), env.budget)]
    if st["optim"] > 0:
        step = dict(comps)
        step["optimizer states"] = st["optim"]
        phases.append(Phase(wl.stage, "optimizer step", nonzero(step, env), env.budget))
    if wl.stage == "rl" and wl.critic and wl.value_pretraining:
        phases.append(value_pretraining_phase(arch, env, setup, wl, micro))
    return phases


def value_pretraining_phase(arch: Arch, env: Env, setup: Setup, wl: Workload, micro: int) -> Phase:
    """VAPO's value pretraining (rl.critic.pretrain_steps): the critic trains alone (its weights, gradients,
    optimizer, its activations of one micro-batch and its bf16 weight copies) beside the policy's weights, which do
    not train: no policy gradients, no policy activations or logits, and no policy optimizer states yet (AdamW
    creates them at the policy's first step, after this phase). Smaller than the training phase that follows."""
    st = model_state(arch, env, setup, wl.head)
    comps: dict[str, float] = {_context_name(env): env.context, "policy weights": st["weights"]}
    if st["buckets"]:
        comps["DDP gradient buckets"] = st["buckets"]
    comps |= _other_models(arch, env, setup, wl, with_grads=True)
    if env.engine == "vllm":
        comps["vLLM sleeping residue"] = VLLM_SLEEP_RESIDUE_GIB * GiB
    comps["bf16 weight copies (autocast)"] = autocast_copies(arch, env, setup, "score")
    comps["critic activations"] = activations(arch, env, setup, wl, micro)
    comps["vision tower activations"] = vision_activations(arch, env, setup, wl, micro * wl.seqs)
    return Phase(wl.stage, "value pretraining", nonzero(comps, env), env.budget)


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
    return nonzero(comps | _other_models(arch, env, setup, wl, with_grads=False), env)


def _other_models(arch: Arch, env: Env, setup: Setup, wl: Workload, with_grads: bool) -> dict[str, float]:
    """The models the stage keeps beside the policy: the reference (a frozen copy unless adapters train), the reward
    model and the critic (its gradients `with_grads`, during the training phase)."""
    out: dict[str, float] = {}
    if wl.reference and setup.adapter == "full":
        out["reference model"] = frozen_copy(arch, env, setup, wl)
    if wl.reward_model:
        out["reward model"] = reward_model_copy(arch, env, setup)
    if wl.critic:
        label = "critic (weights, grads, optimizer)" if with_grads else "critic (weights, optimizer)"
        out[label] = critic_state(arch, env, setup, with_grads=with_grads)
    return out


def _context_name(env: Env) -> str:
    return "framework (Python, torch)" if env.is_cpu else "CUDA context + framework"


def nonzero(comps: dict[str, float], env: Env) -> dict[str, float]:
    return {k: v for k, v in comps.items() if v > 0 or k == _context_name(env)}

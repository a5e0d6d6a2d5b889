"""Where asynchronous RL runs (rl.async_rollout): the generator process beside the trainer processes.

On CPU the cores are split between the two processes (torch threads each). On GPUs the generator takes GPUs the
trainers do not use, the same ones on every node: the trainer processes run on GPUs 0..T-1 (accelerate's
gpu_ids), the generator's engines on the next ones. The split, sized per GPU on both sides:

* the engine's tensor-parallel size: the smallest of 1, 2, 4, 8 (dividing the heads and KV heads, at most half
  the node) at which it holds its bf16 weights and a KV cache for min(rollouts, 16) sequences
  (`rlctl.plan.memory.generation.dedicated`);
* the generator's GPUs per node: whole engines, from a quarter of the node (rounded up) up to half, then below a
  quarter, the first count that leaves a trainer count dividing every stage's batch; hardware.num_processes, when
  set, is the trainer count and the generator takes the rest;
* the trainer side: the memory planner on the trainer GPUs alone, with no engine beside it (no vLLM reservation,
  no sleep-mode residue, no generation phase).

A machine that cannot split (one GPU) is refused with the reason: overlapping there would need the engine and
the trainer to time-share the card (sleep mode), which is what the synchronous loop already does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from rlctl.errors import UserError
from rlctl.plan import hardware as hw
from rlctl.plan.parts import GenerationSettings, VllmSettings

if TYPE_CHECKING:
    from rlctl.config import RunConfig
    from rlctl.plan.memory.arch import Arch

TP_SIZES = (1, 2, 4, 8)  # tensor-parallel sizes tried for a generator engine, smallest first


@dataclass(frozen=True)
class AsyncSplit:
    """The split of an async RL run: the generator's devices and threads, the trainers' share, each side's memory.

    GPU ids count a node's GPUs as the launching shell sees them (before accelerate narrows CUDA_VISIBLE_DEVICES
    to the trainer GPUs); memory is GiB per GPU, None where model.arch is not set."""

    generator_engine: str  # transformers (a copy of the policy in the generator process) or vllm
    generator_gpus: int  # GPUs per node of the generator (0 on CPU)
    trainer_gpus: int  # GPUs per node of the trainer processes (0 on CPU)
    generator_threads: int  # torch CPU threads of the generator process
    trainer_threads: int  # torch CPU threads of each trainer process
    why: str  # one line for the plan's decisions
    generator_gpu_ids: tuple[int, ...] = ()  # on every node
    trainer_gpu_ids: tuple[int, ...] = ()  # on every node: accelerate's gpu_ids
    engines: int = 0  # generator engines over all nodes, tensor_parallel_size GPUs each
    tensor_parallel_size: int = 1
    rollouts_per_engine: int = 0  # rollouts each engine generates per step
    concurrent_per_engine: int = 0  # of them at once (what its KV cache holds)
    gpu_memory_utilization: float = 0.0  # vLLM's reservation on each generator GPU (0: transformers)
    max_model_length: int = 0  # longest prompt + longest completion
    generator_gib_per_gpu: float | None = None  # vLLM: its reservation; transformers: its peak
    generator_weights_gib: float | None = None  # the engine's share of the bf16 weights
    generator_kv_cache_gib: float | None = None  # vLLM: the KV cache in its reservation; transformers: KV + prefill
    trainer_gib_per_gpu: float | None = None  # the trainer side's planned peak (the memory plan)
    budget_gib_per_gpu: float | None = None  # what the plan may use of each GPU, on either side
    idle_gpus: int = 0  # GPUs per node neither side uses (hardware.num_processes leaving part of an engine)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["generator_gpu_ids"], out["trainer_gpu_ids"] = list(self.generator_gpu_ids), list(self.trainer_gpu_ids)
        return out

    @property
    def on_gpus(self) -> bool:
        return self.trainer_gpus > 0

    def vllm_settings(self) -> VllmSettings:
        """The plan's `vllm` for the generator's vLLM engines: no sleep mode, they never share their GPUs."""
        return VllmSettings(
            placement="generator GPUs (rl.async_rollout)",
            gpu_memory_utilization=self.gpu_memory_utilization,
            tensor_parallel_size=self.tensor_parallel_size,
            max_model_length=self.max_model_length,
            max_num_seqs=self.rollouts_per_engine,
            kv_cache_gib=self.generator_kv_cache_gib,
            concurrent_sequences=self.concurrent_per_engine,
            rollouts_per_instance=self.rollouts_per_engine,
            sleep_level=0,
        )

    def transformers_settings(self) -> GenerationSettings:
        """The plan's `generation` for the generator's transformers engines."""
        return GenerationSettings(self.rollouts_per_engine, self.concurrent_per_engine)

    def decision(self) -> dict[str, str]:
        """The split as one line of the plan's decisions."""
        if not self.on_gpus:
            value = f"generator {self.generator_threads} threads, trainers {self.trainer_threads} each"
        else:
            value = f"generator GPUs {ids(self.generator_gpu_ids)}, trainer GPUs {ids(self.trainer_gpu_ids)}"
        return {"setting": "rl.async_rollout split", "value": value, "why": self.why}


def ids(gpus: tuple[int, ...]) -> str:
    """GPU ids as a range where they run on (`4-7`), else listed (`0,2`)."""
    if len(gpus) > 1 and list(gpus) == list(range(gpus[0], gpus[-1] + 1)):
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(map(str, gpus))


def split(
    cfg: RunConfig, hardware: hw.Hardware, procs: int, engine: str, batches: list[int], image_tokens: int = 0
) -> AsyncSplit:
    """The split for an async RL run of `cfg` on `hardware`; `procs`: the trainer processes per node on CPU,
    `batches`: every stage's global batch (the trainer count must divide them); `image_tokens`: a vision-language
    run's image tokens per prompt. A UserError where it cannot split."""
    rl = cfg.rl
    rollouts = rl.prompts_per_step * rl.group_size
    if hardware.is_cpu:
        return _cpu(cfg, hardware, procs, engine, rollouts)
    from rlctl.plan.memory.arch import Arch
    from rlctl.plan.memory.model import VLLM_DEDICATED_UTIL

    gpus, nodes = hardware.gpus_per_node, hardware.nodes
    arch = Arch.of(cfg.model.arch) if cfg.model.arch is not None else None
    if gpus < 2:
        raise UserError(_one_gpu(hardware, arch))
    prompt = cfg.data.max_prompt_length + image_tokens
    seq = prompt + rl.max_new_tokens
    tp = _tensor_parallel(arch, hardware, engine, rollouts, prompt, seq)
    fixed, wanted = cfg.hardware.num_processes, rl.async_rollout.generators
    if wanted is not None:
        gen = _wanted_engines(gpus, tp, nodes, wanted, fixed)
        how = "rl.async_rollout.generators (set by you): the other GPUs" if fixed is None else _FIXED
    elif fixed is None:
        gen, how = _generator_gpus(gpus, tp, nodes, batches), _RULE
    else:
        gen, how = _fixed_trainers(gpus, tp, fixed), _FIXED
    trainers = gpus - gen if fixed is None else fixed
    idle = gpus - trainers - gen
    engines = nodes * gen // tp
    per_engine = _per_engine(rollouts, engines)
    kind = f"{engines} vLLM engine(s) of {tp} GPU(s)" if engine == "vllm" else f"{engines} transformers generator(s)"
    kind += f" over {nodes} nodes" if nodes > 1 else ""
    why = (
        f"{gpus} GPUs per node: {gen} for the generator ({kind}, {per_engine} rollouts each per step), "
        f"{trainers} for the trainer processes ({how})" + (f"; {idle} GPU(s) idle" if idle else "")
    )
    out = AsyncSplit(
        engine,
        gen,
        trainers,
        1,
        max(1, hardware.cpu_cores // gpus),
        why,
        generator_gpu_ids=tuple(range(trainers, trainers + gen)),
        trainer_gpu_ids=tuple(range(trainers)),
        engines=engines,
        tensor_parallel_size=tp,
        rollouts_per_engine=per_engine,
        gpu_memory_utilization=VLLM_DEDICATED_UTIL if engine == "vllm" else 0.0,
        max_model_length=seq,
        idle_gpus=idle,
    )
    return out if arch is None else _sized(out, arch, hardware, prompt)


def _cpu(cfg: RunConfig, hardware: hw.Hardware, procs: int, engine: str, rollouts: int) -> AsyncSplit:
    """The CPU split: rl.async_rollout.generators generator processes (default one per node) beside `procs`
    trainer processes per node, the node's cores shared out as torch threads."""
    nodes = hardware.nodes
    engines = cfg.rl.async_rollout.generators or nodes
    if engines % nodes:
        raise UserError(
            f"Invalid config: rl.async_rollout.generators={engines} does not divide over {nodes} nodes (each node "
            f"runs the same number of generator processes); use a multiple of {nodes}, e.g. "
            f"--set rl.async_rollout.generators={max(nodes, engines // nodes * nodes)}."
        )
    here = engines // nodes
    cores = max(hardware.cpu_cores, 2)
    gen = max(1, cores // (procs + here))
    train = max(1, (cores - here * gen) // procs)
    kind = "vLLM's CPU build" if engine == "vllm" else "transformers"
    name = "vllm" if engine == "vllm" else "transformers"
    per_engine = _per_engine(rollouts, engines)
    over = " (more threads than cores: they share them)" if here * gen + procs * train > cores else ""
    why = (
        f"{cores} CPU cores: {gen} for each of {here} generator process(es) ({kind}, {per_engine} rollouts each per "
        f"step), {train} for each of {procs} trainer process(es){over}"
    )
    if nodes > 1:
        why += f", on each of {nodes} nodes"
    return AsyncSplit(name, 0, 0, gen, train, why, engines=engines, rollouts_per_engine=per_engine)


def _per_engine(rollouts: int, engines: int) -> int:
    """Rollouts each engine samples per round; a UserError when a round has fewer rollouts than engines."""
    if rollouts < engines:
        raise UserError(
            f"Invalid config: rl.async_rollout runs {engines} generator engines, more than the {rollouts} rollouts of "
            "a round (rl.prompts_per_step x rl.group_size), so some would sample nothing; use fewer engines "
            f"(--set rl.async_rollout.generators={rollouts}) or a larger round."
        )
    return math.ceil(rollouts / engines)


def _wanted_engines(gpus: int, tp: int, nodes: int, wanted: int, fixed: int | None) -> int:
    """The generator's GPUs per node for rl.async_rollout.generators=`wanted` engines of `tp` GPUs; a UserError
    when they do not divide over the nodes or leave no GPU for the trainers."""
    per_node = wanted // nodes
    gen = per_node * tp
    trainers = fixed if fixed is not None else gpus - gen
    if wanted % nodes or gen + max(trainers, 1) > gpus:
        most = max((gpus - max(fixed or 1, 1)) // tp, 0) * nodes
        raise UserError(
            f"Invalid config: rl.async_rollout.generators={wanted} engines of {tp} GPU(s) over {nodes} node(s) of "
            f"{gpus} GPUs"
            + (f" beside hardware.num_processes={fixed} trainers" if fixed is not None else "")
            + f" does not fit: each node needs the same whole number of engines and at least one trainer GPU. Use a "
            f"multiple of {nodes} up to {most}, or unset it (the planner splits the node)."
        )
    return gen


_FIXED = "hardware.num_processes (set by you) trainer processes per node"
_RULE = "from a quarter of the node up to half, whole engines, the first count leaving trainers that divide the batch"


def _sized(out: AsyncSplit, arch: Arch, hardware: hw.Hardware, prompt: int) -> AsyncSplit:
    """`out` with the generator's memory per GPU."""
    from dataclasses import replace

    from rlctl.plan.memory.generation import dedicated
    from rlctl.plan.memory.model import GPU_RESERVE, GiB, gib

    total = hardware.gpu_usable_gib * GiB
    tp, engine = out.tensor_parallel_size, out.generator_engine
    budget = total * (1 - GPU_RESERVE)
    size = dedicated(arch, engine, total, budget, out.rollouts_per_engine, prompt, out.max_model_length, tp)
    comps = size.components
    weights = comps.get("vLLM weights", comps.get("policy weights (bf16)", 0.0))
    return replace(
        out,
        concurrent_per_engine=size.concurrent,
        generator_gib_per_gpu=gib(size.per_gpu),
        generator_weights_gib=gib(weights),
        generator_kv_cache_gib=gib(comps.get("vLLM KV cache", comps.get("KV cache, prefill, sampling", 0.0))),
        budget_gib_per_gpu=gib(budget),
    )


def _tensor_parallel(
    arch: Arch | None, hardware: hw.Hardware, engine: str, rollouts: int, prompt: int, seq: int
) -> int:
    """The smallest tensor-parallel size at which one generator engine fits its GPUs (1 without model.arch, and
    for transformers, which generates on one GPU); a UserError where none does within half the node."""
    if arch is None:
        return 1
    from rlctl.plan.memory.generation import dedicated
    from rlctl.plan.memory.model import GPU_RESERVE, GiB, gib_str

    total = hardware.gpu_usable_gib * GiB
    budget = total * (1 - GPU_RESERVE)
    most = hardware.gpus_per_node // 2 if engine == "vllm" else 1
    sizes = [t for t in TP_SIZES if t <= most and arch.heads % t == 0 and arch.kv_heads % t == 0] or [1]
    for tp in sizes:
        if dedicated(arch, engine, total, budget, rollouts, prompt, seq, tp).fits:
            return tp
    weights = gib_str(arch.params() * 2.0)
    raise UserError(
        f"rl.async_rollout: the generator's {engine} engine does not fit {hardware.spec}: its {weights} GiB of bf16 "
        f"weights and a KV cache for {min(rollouts, 16)} sequences of {seq} tokens need more than "
        f"{sizes[-1]} GPU(s) of {hardware.gpu_usable_gib:g} GiB (the generator may take at most half the node). "
        "Plan for more or larger GPUs, shorten rl.max_new_tokens, or turn async off (rl.async_rollout.enabled=false)."
    )


def _generator_gpus(gpus: int, tp: int, nodes: int, batches: list[int]) -> int:
    """The generator's GPUs per node (the rule in the module docstring); a UserError when no count works."""
    half = gpus // 2
    quarter = max(tp, math.ceil(gpus / 4 / tp) * tp)
    counts = [*range(quarter, half + 1, tp), *range(quarter - tp, 0, -tp)]
    for gen in counts:
        if all(batch % ((gpus - gen) * nodes) == 0 for batch in batches):
            return gen
    tried = ", ".join(str(gpus - gen) for gen in counts)
    raise UserError(
        f"rl.async_rollout: no split of {gpus} GPUs per node leaves a trainer count that divides every stage's batch "
        f"({', '.join(map(str, batches))} sequences; trainer processes per node tried: {tried}, over {nodes} node(s)). "
        "Pick the trainer count with --set hardware.num_processes=T (the generator takes the other GPUs) and batches "
        "that divide over it, or change the batch (rl.prompts_per_step x rl.group_size)."
    )


def _fixed_trainers(gpus: int, tp: int, trainers: int) -> int:
    """The generator's GPUs per node when hardware.num_processes fixes the trainers: the whole engines that fit
    the rest; a UserError when not even one does."""
    left = gpus - trainers
    if left < tp:
        need = f"an engine of {tp} GPU(s)" if tp > 1 else "a GPU"
        raise UserError(
            f"Invalid config: hardware.num_processes={trainers} with rl.async_rollout leaves {max(left, 0)} of {gpus} "
            f"GPUs per node for the generator, which needs {need}; use --set hardware.num_processes="
            f"{max(gpus - tp, 1)} or less (or unset it: the planner splits the node)."
        )
    return left // tp * tp


def _one_gpu(hardware: hw.Hardware, arch: Arch | None) -> str:
    """Why a one-GPU machine cannot run async RL, with what time-sharing the card would cost."""
    from rlctl.plan.memory.model import gib_str

    weights = f"its {gib_str(arch.params() * 2.0)} GiB of bf16 weights" if arch is not None else "its weights"
    bigger = f"{hardware.nodes}x" if hardware.nodes > 1 else ""
    bigger += f"2x{hardware.gpu_name}-{hardware.gpu_memory_gib:g}GB"
    return (
        f"rl.async_rollout needs the generator on devices the trainer does not use, but {hardware.spec} has one "
        "GPU per node. Overlapping there would time-share the card through vLLM's sleep mode: every step the "
        f"engine wakes ({weights} reloaded from the trainer and its KV cache rebuilt), generates while the "
        "trainer waits, and sleeps again while the trainer steps, so nothing overlaps: it would cost a sleep and "
        "a wake per step for no speed-up over the synchronous loop, which does exactly that. Turn it off "
        f"(rl.async_rollout.enabled=false) or plan for 2 or more GPUs (--hardware {bigger})."
    )

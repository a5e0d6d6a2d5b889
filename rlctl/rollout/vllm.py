"""vLLM for RL rollouts: the one module that imports vllm, on its public API only (`LLM`, `SamplingParams`,
token-id prompts, `sleep` / `wake_up`, `collective_rpc`).

* `llm_kwargs(plan, ...)` is the one argument dialect: the `vllm.LLM(...)` arguments of the plan's engine,
  colocated with the trainer (rlctl's RL loop; sleep mode on GPUs) or dedicated (the async generator process's
  own engine: placeholder weights that the first push replaces). It is tested without vLLM or a GPU.
* `VLLMGenerator` builds that engine (one warm-up generate) and is the loop's `Generator`: token ids in and out
  (no detokenizing), the sampled tokens' log-probs in vLLM's flat form only when asked for, one batched
  `load_weights` per push, awake for a whole rollout (`awake`), and the process's global RNG left as it was.
  `colocated` and `dedicated` are its two uses.

The optimizer-state offload between phases that vLLM's memory plan relies on is the trainer's
(`rlctl.trainer.offload`). Which engine a plan uses is decided at plan time (`rlctl.plan.engine`). Importing this
module is cheap (no torch, no vllm): they are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlctl import processes
from rlctl.errors import UserError
from rlctl.plan import engine as choice

if TYPE_CHECKING:
    from rlctl.plan import Plan
    from rlctl.rollout.vision import VisionInputs

SLEEP_LEVEL = 2  # between rollouts: weights and KV cache both released (the weights are pushed again)
MAX_NUM_BATCHED_TOKENS = 4096  # vLLM v1's memory profiler misreads its 32768 default on a shared GPU

Weights = Iterable[tuple[str, Any]]


def sleep_mode(plan: Plan) -> bool:
    return choice.sleep_mode_for(plan.hardware)


def process_environment(plan: Plan) -> None:
    """Set (where unset) the environment vLLM reads when a training process builds its colocated engine."""
    for key, value in _environment(plan).items():
        os.environ.setdefault(key, value)


def _environment(plan: Plan) -> dict[str, str]:
    """In-process engines (an engine subprocess would re-import the trainer), and on CPU the KV cache in whole GiB
    (vLLM's CPU build sizes it from this variable; its share-of-RAM default counts the trainer's own memory as
    used and refuses)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if plan.hardware.is_cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(plan.vllm_settings.kv_cache_gib or 1.0)))
    return env


def dedicated_environment(plan: Plan, threads: int) -> dict[str, str]:
    """The environment of the async generator's engine (set in its process before vLLM loads): in-process, and on
    CPU the planned KV cache with `threads` unbound torch threads (the trainer has the other cores)."""
    env = _environment(plan)
    if plan.hardware.is_cpu:
        env |= {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)}
    return env


def llm_kwargs(plan: Plan, model: str = "<policy>", dedicated: bool = False, group: int = 0) -> dict[str, Any]:
    """The `vllm.LLM(...)` arguments of the plan's rollout engine ({} without one). Colocated (rlctl's loop): in
    each training process (`external_launcher`; `group` is its tensor-parallel group, whose ranks sample alike),
    every rollout of the group at once, sleep mode on GPUs, bitsandbytes under QLoRA. Dedicated (rl.async_rollout;
    `model` is a folder of the policy's config and tokenizer): on devices of its own, a round's rollouts at once,
    placeholder weights the first push replaces, the trainer's precision on CPU. Both return log-probs after
    temperature, as the trainer computes them."""
    if plan.generation_engine != "vllm":
        return {}
    v, rl, cfg = plan.vllm_settings, plan.config.rl, plan.config
    common = {
        "model": model,
        # the trainer's precision on CPU (fp32: vLLM's "auto" would serve a float32 checkpoint in bfloat16)
        "dtype": "float32" if plan.hardware.is_cpu else "auto",
        "gpu_memory_utilization": v.gpu_memory_utilization,
        "max_model_len": v.max_model_length,
        "logprobs_mode": "processed_logprobs",
        "trust_remote_code": cfg.model.trust_remote_code,
        # CPU: no torch.compile, which costs each engine 30-40 s of warm-up (vLLM 0.31's CPU build, tiny model),
        # more than a CPU run's rollouts gain from it; GPUs keep vLLM's compiled graphs
        "enforce_eager": plan.hardware.is_cpu,
    }
    if dedicated:  # one of the async generator's engines: its share of a round, on its tensor-parallel group
        split = plan.async_split
        share = split.rollouts_per_engine if split is not None and split.rollouts_per_engine else None
        tp = split.tensor_parallel_size if split is not None and split.on_gpus else 1
        sizes = {"tensor_parallel_size": tp, "max_num_seqs": share or rl.prompts_per_step * rl.group_size}
        return common | sizes | {"load_format": "dummy", "seed": cfg.seed}
    stage = next(s for s in plan.stages if s.name == "rl")
    tp = v.tensor_parallel_size
    return common | {
        "tensor_parallel_size": tp,
        "max_num_seqs": stage.micro_batch_size * stage.grad_accum * tp,  # every rollout of the process's TP group
        "enable_sleep_mode": sleep_mode(plan),
        "model_impl": "vllm",
        "distributed_executor_backend": "external_launcher",
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "quantization": "bitsandbytes" if plan.adapter == "qlora" else None,
        "seed": cfg.seed + group,
    }


def needs_logprobs(plan: Plan) -> bool:
    """Whether the loop reads vLLM's log-probs of its samples: the rollout correction or the weight-sync check."""
    mismatch = plan.config.rl.mismatch
    return mismatch.correction != "off" or mismatch.sync_tolerance > 0


@dataclass(frozen=True)
class Sampling:
    """How rollouts are sampled (as the loop's transformers path: temperature, no top-k / top-p): a completion
    ends at its first stop token (kept) or after `max_new_tokens`; `logprobs`: return the sampled tokens'."""

    max_new_tokens: int
    temperature: float
    stops: tuple[int, ...]
    logprobs: bool

    def params(self, greedy: bool) -> Any:
        """vLLM's SamplingParams of one generate call; greedy: temperature 0, no log-probs."""
        from vllm import SamplingParams

        logprobs = self.logprobs and not greedy
        return SamplingParams(
            temperature=0.0 if greedy else self.temperature,
            top_p=1.0,
            top_k=0,
            max_tokens=self.max_new_tokens,
            stop_token_ids=list(self.stops),
            ignore_eos=True,  # the stops end a completion, EOS among them
            logprobs=0 if logprobs else None,  # 0: the sampled token's alone
            flat_logprobs=logprobs,
            detokenize=False,
        )


class EngineRng:
    """The global random generators (Python, NumPy, torch's CPU and current CUDA device) as the engine last left
    them, swapped in around each engine call: vLLM seeds them when it builds and samples from them, and the
    trainer's stay where they were."""

    def __init__(self) -> None:
        self.state: tuple | None = None  # None: the engine has not run yet (it starts from the trainer's)

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        outer = _rng_state()
        if self.state is not None:
            _set_rng_state(self.state)
        try:
            yield
        finally:
            self.state = _rng_state()
            _set_rng_state(outer)

    def seed(self, seed: int) -> None:
        """Restart the engine's generators from `seed`."""
        import numpy as np
        import torch

        with self.swapped():
            random.seed(seed)
            np.random.seed(seed % 2**32)
            torch.manual_seed(seed)


def _rng_state() -> tuple:
    import numpy as np
    import torch

    cuda = torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def _set_rng_state(state: tuple) -> None:
    import numpy as np
    import torch

    python, numpy, cpu, cuda = state
    random.setstate(python)
    np.random.set_state(numpy)
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)


def policy_weights(model: Any) -> Iterator[tuple[str, Any]]:
    """(Hugging Face name, tensor) of every weight of an unsharded policy, as vLLM names them; a PEFT model's
    LoRA adapters are merged while it is iterated (unmerged when exhausted), their own weights skipped."""
    peft = hasattr(model, "merge_adapter") and hasattr(model, "peft_config")
    if not peft:
        for name, param in model.named_parameters():
            yield name.replace("_checkpoint_wrapped_module.", ""), param.detach()
        return
    model.merge_adapter()
    try:
        for name, param in model.named_parameters():
            if model.prefix in name or "original_module" in name:  # adapters, and modules_to_save's frozen copy
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            name = name.replace("modules_to_save.default.", "").replace("_checkpoint_wrapped_module.", "")
            yield name, param.detach()
    finally:
        model.unmerge_adapter()


def _push(worker: Any, weights: Weights) -> None:
    """Load (name, tensor) pairs into the engine's model in one call (run in its worker by `collective_rpc`). On
    vLLM's CPU build linear layers are packed for oneDNN after loading and drop their loadable parameters, so
    `reload_weights` restores the loadable layout, loads and packs again (a tied LM head is packed from the
    embedding once more, else it would keep serving the old one); the weights are copied out as they come (a
    LoRA policy unmerges when its iterator ends, before the last layers are packed)."""
    runner = worker.model_runner
    if worker.device.type != "cpu":
        runner.model.load_weights(weights=weights)
        return
    runner.reload_weights(weights_iterator=((n, t.clone()) for n, t in weights), is_checkpoint_format=True)
    model = runner.get_model()
    if getattr(runner.model_config.hf_config, "tie_word_embeddings", False) and hasattr(model, "lm_head"):
        model.lm_head.quant_method.process_weights_after_loading(model.lm_head)


class VLLMGenerator:
    """A `vllm.LLM` built from `llm_kwargs` behind rlctl's `Generator` boundary. `sync(model)` pushes the policy's
    weights (`weights(model)`: LoRA merged, or a sharded policy's gathered `rlctl.trainer.sharding.full_weights`),
    `load(weights)` pushes given ones (the async generator's). With sleep mode the engine sleeps at level 2
    outside `awake()`, which a whole (multi-turn) rollout runs in: it wakes the KV cache once (pushing the
    weights again when a sleep dropped them) and sleeps after the last turn. `tp_group`: the process group of a
    tensor-parallel engine's ranks, each of which generates every rank's prompts."""

    def __init__(
        self,
        llm_args: dict[str, Any],
        sampling: Sampling,
        weights: Callable[[Any], Weights] = policy_weights,
        tp_group: Any = None,
    ):
        from vllm import LLM

        self.sampling, self.weights, self.tp_group = sampling, weights, tp_group
        self.synced = tp_group is not None  # multi-turn: every rank of the group runs every turn's call
        self.sleeps = bool(llm_args.get("enable_sleep_mode"))
        self.rng = EngineRng()
        with self.rng.swapped():  # vLLM seeds the global generators as it builds
            self.llm = LLM(**llm_args)
        self._generate([[0]], greedy=False)  # warm-up: the first call's one-time costs, here
        self.model: Any = None  # the policy `sync` last pushed
        self.loaded = True  # whether the engine holds its weights (a level-2 sleep drops them)
        self.depth = 0  # nested awake() blocks
        self.logprobs: list[list[float]] | None = None
        if self.sleeps:
            self._sleep()

    def sync(self, model: Any) -> None:
        """Push `model`'s current weights (every process takes part: a sharded policy gathers each weight)."""
        self.model = model
        self.load(self.weights(model))

    def load(self, weights: Weights) -> None:
        """Push (Hugging Face name, tensor) pairs in one batched `load_weights`; a sleeping engine's weights are
        woken first."""
        if not self.loaded and self.sleeps:
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc(_push, kwargs={"weights": weights})
        self.llm.reset_prefix_cache()
        self.loaded = True

    def seed(self, seed: int) -> None:
        """Sample from `seed` on (the async generator seeds each round: a regenerated round is the same)."""
        self.rng.seed(seed)

    @contextlib.contextmanager
    def awake(self) -> Iterator[None]:
        """The engine ready to generate for the whole block (nested blocks share the outermost one)."""
        if self.depth == 0 and self.sleeps:
            if not self.loaded:
                assert self.model is not None, "sync(model) before the first generate"
                self.sync(self.model)
            self.llm.wake_up(tags=["kv_cache"])
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0 and self.sleeps:
                self._sleep()

    def generate(
        self, prompts: list[list[int]], greedy: bool = False, vision: list[VisionInputs | None] | None = None
    ) -> list[list[int]]:
        """Completion token ids of each prompt, up to and including its first stop token (greedy: temperature 0);
        `logprobs` then holds each completion's sampled-token log-probs (None when greedy or not asked for). The
        engine gets token ids only: a prompt with images (`vision`) is refused (the plan generates for such a
        model with transformers)."""
        if vision is not None and any(v is not None for v in vision):
            raise UserError(
                "vLLM generation got prompts with images, but rlctl's vLLM engines get token ids only and cannot "
                "read images yet; generate for a vision-language model with transformers (rl.use_vllm=false). See "
                "docs/vlm.md."
            )
        with self.awake():
            if self.tp_group is None:
                out, logprobs = self._generate(prompts, greedy)
            else:
                out, logprobs = self._generate_in_group(prompts, greedy)
        self.logprobs = logprobs
        return out

    def _generate(self, prompts: list[list[int]], greedy: bool) -> tuple[list[list[int]], list[list[float]] | None]:
        params = self.sampling.params(greedy)
        with self.rng.swapped():
            outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        completions = [o.outputs[0] for o in outs]
        ids = [list(c.token_ids) for c in completions]
        if params.logprobs is None:
            return ids, None
        return ids, [c.logprobs.logprobs for c in completions]  # flat: one float per token at logprobs=0

    def _generate_in_group(self, prompts: list[list[int]], greedy: bool) -> tuple[list, list | None]:
        """Every rank of the tensor-parallel group generates all of the group's prompts; each keeps its own."""
        import torch.distributed as dist

        shares: list[Any] = [None] * dist.get_world_size(self.tp_group)
        dist.all_gather_object(shares, prompts, group=self.tp_group)
        start = sum(len(s) for s in shares[: dist.get_rank(self.tp_group)])
        ids, logprobs = self._generate([p for s in shares for p in s], greedy)
        mine = slice(start, start + len(prompts))
        return ids[mine], logprobs[mine] if logprobs is not None else None

    def probe_logprobs(self, ids: list[int]) -> list[float]:
        """log p(ids[t] | ids[:t]) for t >= 1 from the engine's current weights, before temperature."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0, detokenize=False)
        with self.awake(), self.rng.swapped():
            out = self.llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
        return [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:], strict=True)]

    def _sleep(self) -> None:
        self.llm.sleep(level=SLEEP_LEVEL)
        self.loaded = False


def colocated(
    plan: Plan,
    model: Any,
    accelerator: Any,
    tokenizer: Any,
    weights: Callable[[Any], Weights] | None = None,
    stop_ids: tuple[int, ...] = (),
) -> VLLMGenerator:
    """rlctl's loop's engine: vLLM inside this training process, serving `model` (the unwrapped policy; `weights`
    yields a sharded one's full weights), stopping at EOS or `stop_ids`."""
    process_environment(plan)
    tp = plan.vllm_settings.tensor_parallel_size
    _launcher_environment(accelerator)
    rl = plan.config.rl
    sampling = Sampling(rl.max_new_tokens, rl.temperature, stop_ids or (tokenizer.eos_token_id,), needs_logprobs(plan))
    args = llm_kwargs(plan, model.name_or_path, group=accelerator.process_index // tp)
    engine = VLLMGenerator(args, sampling, weights or policy_weights, _tp_group(accelerator.num_processes, tp))
    accelerator.wait_for_everyone()
    return engine


def dedicated(llm_args: dict[str, Any], tokenizer: Any, rl: Any, stop_ids: tuple[int, ...] = ()) -> VLLMGenerator:
    """The async generator process's engine (`llm_kwargs(plan, folder, dedicated=True)`), on devices of its own;
    the rollout correction always reads its log-probs (the behaviour policy's)."""
    sampling = Sampling(rl.max_new_tokens, rl.temperature, stop_ids or (tokenizer.eos_token_id,), logprobs=True)
    return VLLMGenerator(llm_args, sampling)


def _launcher_environment(accelerator: Any) -> None:
    """What vLLM's `external_launcher` reads: this process's place in the training job (and a rendezvous when
    the job was started without one)."""
    os.environ["RANK"] = str(accelerator.process_index)
    os.environ["LOCAL_RANK"] = str(accelerator.local_process_index)
    os.environ["WORLD_SIZE"] = str(accelerator.num_processes)
    os.environ.setdefault("MASTER_ADDR", "localhost")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(processes.free_port())


def _tp_group(world: int, tp: int) -> Any:
    """This process's tensor-parallel group of `tp` consecutive ranks (None at TP 1)."""
    if tp == 1:
        return None
    import torch.distributed as dist

    if world % tp:
        raise ValueError(f"vLLM's tensor_parallel_size {tp} must divide the {world} training processes")
    group, _ = dist.new_subgroups_by_enumeration([list(range(i, i + tp)) for i in range(0, world, tp)])
    return group

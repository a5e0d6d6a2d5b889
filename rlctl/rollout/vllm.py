"""vLLM colocated with training: the one runtime module that talks to vLLM (through TRL 1.16's `VLLMGeneration`).

* `trl_kwargs(plan)` builds the exact vLLM arguments of TRL's GRPOConfig / RLOOConfig for a plan, and
  `llm_kwargs(plan)` the `vllm.LLM(...)` arguments TRL 1.16 derives from them (trl/generation/vllm_generation.py),
  so the boundary is tested without vLLM or a GPU.
* `ColocatedVLLM` is the generation engine of rlctl's own RL loop (ppo, dapo, reinforce-pp, remax, pf-ppo) on
  TRL's `VLLMGeneration`, built from `vllm_generation_kwargs(plan)`: the same engine, arguments and sleep
  cycle as the TRL stages.

The optimizer-state offload between phases that vLLM's memory plan relies on is the trainer's
(`rlctl.trainer.offload`).

Which engine a plan uses is decided at plan time (`rlctl.plan.engine`). Importing this module is cheap (no torch,
no vllm): torch and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rlctl.plan import engine as choice
from rlctl.rollout import trl_compat

if TYPE_CHECKING:
    from rlctl.plan import Plan

VLLM_MODE = "colocate"  # vLLM runs inside each training process and shares its GPU
SLEEP_LEVEL = 2  # what TRL 1.16 calls between phases: weights and KV cache both released
MAX_NUM_BATCHED_TOKENS = 4096  # TRL 1.16 fixes it for colocated engines


def sleep_mode(plan: Plan) -> bool:
    return choice.sleep_mode_for(plan.hardware)


def process_environment(plan: Plan) -> None:
    """Set (where unset) the environment vLLM reads when a training process builds its colocated engine."""
    import os

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


def adapt(generation: Any, plan: Plan) -> Any:
    """Fit TRL's `VLLMGeneration` to the plan's machine: on CPU, its weight push goes through `_reload_on_cpu`."""
    if plan.hardware.is_cpu:
        trl_compat.replace_push(generation, _reload_on_cpu)
    return generation


def _reload_on_cpu(generation: Any) -> None:
    """The policy -> vLLM weight push for vLLM's CPU build (`reload`). The weights are copied out while TRL's
    iterator has LoRA merged (it unmerges when exhausted, before vLLM packs the last layers), one at a time as vLLM
    loads them (a sharded policy is gathered one weight at a time, never whole)."""
    reload(generation.llm, ((name, tensor.detach().clone()) for name, tensor in trl_compat.pushed_weights(generation)))


def reload(llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """Load (Hugging Face name, tensor) pairs into an in-process engine. Its CPU linear layers pack their weights
    for oneDNN after loading and drop the loadable parameters, so a per-parameter `load_weights` cannot reach them;
    vLLM's in-place `reload_weights` restores the loadable layout, loads and packs again (on GPUs it loads). A tied
    LM head is packed from the embedding once more, else it would keep serving the old embedding."""
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    model = runner.get_model()
    if getattr(runner.model_config.hf_config, "tie_word_embeddings", False) and hasattr(model, "lm_head"):
        model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
    llm.reset_prefix_cache()


def trl_kwargs(plan: Plan) -> dict[str, Any]:
    """The vLLM arguments of TRL's GRPOConfig / RLOOConfig for this plan (TRL 1.16 names)."""
    if plan.generation_engine != "vllm":
        return {"use_vllm": False}
    v = plan.vllm_settings
    return {
        "use_vllm": True,
        "vllm_mode": VLLM_MODE,
        "vllm_enable_sleep_mode": sleep_mode(plan),
        "vllm_gpu_memory_utilization": v.gpu_memory_utilization,
        "vllm_tensor_parallel_size": v.tensor_parallel_size,
        "vllm_max_model_length": v.max_model_length,
    }


grpo_kwargs = trl_kwargs


def trl_correction_kwargs(plan: Plan) -> dict[str, Any]:
    """GRPOConfig's rollout-training mismatch correction, from rl.mismatch.correction (TRL computes the weights
    and logs the log-prob gap the sync check reads); RLOOConfig has none."""
    if plan.generation_engine != "vllm":
        return {}
    rl = plan.config.rl
    if rl.mismatch.correction == "off":
        return {"vllm_importance_sampling_correction": False}
    cap = rl.mismatch.correction_cap
    return {
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": rl.mismatch.correction,
        "vllm_importance_sampling_clip_max": cap,
        "vllm_importance_sampling_clip_min": 1 / cap if rl.mismatch.correction == "sequence_mask" else None,
    }


def llm_kwargs(plan: Plan, model: str = "<policy>") -> dict[str, Any]:
    """The `vllm.LLM(...)` arguments TRL 1.16 builds from `trl_kwargs(plan)` in colocate mode
    (VLLMGeneration.__init__), for the RL stage's batching; `quantization` is bitsandbytes under QLoRA."""
    args = trl_kwargs(plan)
    if not args["use_vllm"]:
        return {}
    rl = next(s for s in plan.stages if s.name == "rl")
    tp = args["vllm_tensor_parallel_size"]
    return {
        "model": model,
        "tensor_parallel_size": tp,
        "gpu_memory_utilization": args["vllm_gpu_memory_utilization"],
        "max_model_len": args["vllm_max_model_length"],
        # per_device_train_batch_size x TP x steps_per_generation: every rollout of the process's TP group
        "max_num_seqs": rl.micro_batch_size * rl.grad_accum * tp,
        "enable_sleep_mode": args["vllm_enable_sleep_mode"],
        "model_impl": "vllm",
        "distributed_executor_backend": "external_launcher",
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "logprobs_mode": "processed_logprobs",
        "quantization": "bitsandbytes" if plan.adapter == "qlora" else None,
        "trust_remote_code": plan.config.model.trust_remote_code,
    }


def vllm_generation_kwargs(plan: Plan) -> dict[str, Any]:
    """The arguments of TRL's `VLLMGeneration` for rlctl's RL loop: the `llm_kwargs(plan)` engine (colocated,
    sleep mode) sampling like the loop's transformers path (temperature, no top-k/top-p, max_new_tokens)."""
    llm, rl = llm_kwargs(plan), plan.config.rl
    return {
        "mode": VLLM_MODE,
        "tensor_parallel_size": llm["tensor_parallel_size"],
        "gpu_memory_utilization": llm["gpu_memory_utilization"],
        "max_model_length": llm["max_model_len"],
        "max_num_seqs": llm["max_num_seqs"],
        "enable_sleep_mode": llm["enable_sleep_mode"],
        "model_impl": llm["model_impl"],
        "trust_remote_code": llm["trust_remote_code"],
        "temperature": rl.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "max_completion_length": rl.max_new_tokens,
        "logprobs": 0,  # the sampled token's log-prob: the sync check and rollout correction compare it
    }


class ColocatedVLLM:
    """rlctl's RL loop generation boundary (`sync`, `generate`, as `rlctl.rollout.generate.HFGenerator`) on TRL's
    `VLLMGeneration`: vLLM inside each training process, asleep at level 2 (weights and KV cache released)
    outside generation. Sampling stops at the tokenizer's EOS (and `stop_ids`), as the transformers path does.
    `weights`, when given, yields the (name, full tensor) pairs each sync pushes (rlctl's sharded policy:
    `sharding.full_weights`) in place of TRL's iteration, which knows only accelerate's FSDP."""

    def __init__(
        self, plan: Plan, model: Any, accelerator: Any, tokenizer: Any, weights: Any = None, stop_ids: tuple = ()
    ):
        process_environment(plan)
        self.stops = list(stop_ids) or [tokenizer.eos_token_id]
        self.vllm = trl_compat.vllm_generation(
            model=model,
            accelerator=accelerator,
            processing_class=tokenizer,
            generation_kwargs={"ignore_eos": True, "stop_token_ids": self.stops},
            **vllm_generation_kwargs(plan),
        )
        if weights is not None:
            trl_compat.push_weights_from(self.vllm, lambda: weights(model))
        adapt(self.vllm, plan)
        self.temperature = self.vllm.temperature
        self.logprobs: list[list[float | None]] | None = None

    def sync(self, model: Any) -> None:
        """Wake vLLM's weights and push the policy's current ones (`model` is the policy given at construction;
        every process takes part: a sharded policy gathers each weight, LoRA adapters are merged for the push)."""
        assert model is self.vllm.model, "ColocatedVLLM pushes the policy it was built with"
        self.vllm.sync_weights()

    def generate(self, prompts: list[list[int]], greedy: bool = False) -> list[list[int]]:
        """Completion token ids of each prompt, up to and including the first EOS. vLLM wakes its KV cache,
        samples (greedy: temperature 0) and sleeps again; weights dropped by an earlier sleep are pushed first.
        `logprobs` then holds vLLM's log-prob of each sampled token (None where vLLM gave none)."""
        from rlctl.rollout.samples import through_stop

        self.vllm.temperature = 0.0 if greedy else self.temperature
        _, completions, logprobs, _ = self.vllm.generate(prompts, images=None, num_generations=1)
        out = [through_stop(ids, self.stops) for ids in completions]
        self.logprobs = None
        if logprobs is not None and not greedy:
            pairs = zip(logprobs, out, strict=True)
            self.logprobs = [[lp[0] if lp else None for lp in seq[: len(ids)]] for seq, ids in pairs]
        return out


def dedicated_environment(plan: Plan, threads: int) -> dict[str, str]:
    """The environment of the async generator's engine (set in its process before vLLM loads): in-process, and on
    CPU the planned KV cache with `threads` unbound torch threads (the trainer has the other cores)."""
    env = _environment(plan)
    if plan.hardware.is_cpu:
        env |= {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)}
    return env


def dedicated_llm_kwargs(plan: Plan) -> dict[str, Any]:
    """The `vllm.LLM(...)` arguments of the async generator's engine (rl.async_rollout), but its `model` (a folder
    of the policy's config and tokenizer the generator writes): on devices of its own, so no sleep mode; placeholder
    weights that the first push replaces; a round's rollouts at once; log-probs after temperature, as the trainer
    computes them."""
    llm, rl = llm_kwargs(plan), plan.config.rl
    return {
        "load_format": "dummy",
        "dtype": "float32" if plan.hardware.is_cpu else "auto",  # CPU: the trainer's own precision
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": llm["gpu_memory_utilization"],
        "max_model_len": llm["max_model_len"],
        "max_num_seqs": rl.prompts_per_step * rl.group_size,
        "logprobs_mode": "processed_logprobs",
        "trust_remote_code": llm["trust_remote_code"],
        "seed": plan.config.seed,
    }


class DedicatedVLLM:
    """The async generator's engine (`rlctl.rollout.async_engine`): a vLLM engine in the generator process, on its
    own devices, behind the same `generate` boundary as `ColocatedVLLM`. `load` takes each pushed policy version;
    `seed` makes a round's sampling reproducible (one seed per request, drawn from the round's seed)."""

    def __init__(self, llm_args: dict[str, Any], tokenizer: Any, max_new_tokens: int, temperature: float, stop_ids=()):
        from vllm import LLM

        self.llm = LLM(**llm_args)
        self.stops = list(stop_ids) or [tokenizer.eos_token_id]
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.rng = random.Random(0)
        self.logprobs: list[list[float | None]] | None = None

    def sync(self, model: Any) -> None:
        """Nothing: the engine holds its own weights, which `load` replaces."""

    def load(self, weights: Iterable[tuple[str, Any]]) -> None:
        reload(self.llm, weights)

    def seed(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def generate(self, prompts: list[list[int]], greedy: bool = False) -> list[list[int]]:
        """Completion token ids of each prompt, up to and including the first stop token; `logprobs` then holds
        the log-prob of each sampled token (None when greedy)."""
        from vllm import SamplingParams, TokensPrompt

        from rlctl.rollout.samples import through_stop

        temperature = 0.0 if greedy else self.temperature
        params = [
            SamplingParams(
                temperature=temperature,
                top_p=1.0,
                top_k=0,
                max_tokens=self.max_new_tokens,
                stop_token_ids=self.stops,
                ignore_eos=True,  # the stops above end a completion, EOS among them
                logprobs=0,
                seed=self.rng.getrandbits(31),
            )
            for _ in prompts
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        out, logprobs = [], []
        for o in (x.outputs[0] for x in outs):
            out.append(through_stop(o.token_ids, self.stops))
            logprobs.append([lp[t].logprob for t, lp in zip(out[-1], o.logprobs or [], strict=False)])
        self.logprobs = None if greedy else logprobs
        return out

    def probe_logprobs(self, ids: list[int]) -> list[float]:
        """log p(ids[t] | ids[:t]) for t >= 1 from the engine's current weights, before temperature."""
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        return [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:], strict=True)]

"""Generation engines behind one small interface (`Generator`): the policy's token ids in, completion token ids
out, one batched call per turn, a whole rollout inside `awake()`. `HFGenerator` samples with transformers'
`generate` on the policy in training; `rlctl.rollout.vllm.VLLMGenerator` does the same with vLLM colocated in the
training process."""

from __future__ import annotations

import contextlib
import copy
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from rlctl.rollout.samples import through_stop
from rlctl.rollout.vision import VisionInputs, model_inputs, vision_token_ids

if TYPE_CHECKING:
    from rlctl.plan import Plan


class Generator(Protocol):
    """What the RL loop asks of an engine. `sync` before each rollout hands it the current policy weights;
    `awake()` holds the engine ready for every turn of a rollout (vLLM sleeps outside it); `generate` returns each
    prompt's completion ids up to and including the first EOS (`vision`: each prompt's images, passed only when a
    prompt has any); `logprobs` then holds the engine's log-prob of each sampled token, or None when the trainer's
    own forward pass gave the samples."""

    logprobs: list[list[float]] | None

    def sync(self, model: Any) -> None: ...

    def awake(self) -> contextlib.AbstractContextManager: ...

    def generate(
        self, prompts: list[list[int]], greedy: bool = False, vision: list[VisionInputs | None] | None = None
    ) -> list[list[int]]: ...


class HFGenerator:
    """Sampling with transformers' `generate` on the policy in training."""

    logprobs: list[list[float]] | None = None  # the policy itself samples: its log-probs are the trainer's

    def __init__(
        self,
        tokenizer,
        max_new_tokens: int,
        temperature: float,
        batch_size: int = 64,
        synced: bool = False,
        stop_ids: tuple = (),
        top_p: float = 1.0,
    ):
        from transformers import GenerationConfig

        self.tok, self.max_new_tokens, self.temperature = tokenizer, max_new_tokens, temperature
        self.batch_size, self.model = batch_size, cast(Any, None)  # the policy, from `sync`
        self.stops = list(stop_ids) or [tokenizer.eos_token_id]  # tokens that end a completion (a turn)
        self.synced = synced  # a sharded policy: every process steps until all are done (each step gathers)
        # built once, as TRL does: generate() then validates no per-call keyword arguments
        common = {"max_new_tokens": max_new_tokens, "pad_token_id": tokenizer.pad_token_id}
        common |= {"eos_token_id": self.stops if stop_ids else tokenizer.eos_token_id, "disable_compile": True}
        self.configs = {
            False: GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=top_p, **common),
            True: GenerationConfig(do_sample=False, **common),
        }

    def sync(self, model) -> None:
        """Use the current policy weights (a separate inference engine would reload them here)."""
        self.model = model

    def awake(self) -> contextlib.AbstractContextManager:
        """Nothing to wake: the policy in training samples."""
        return contextlib.nullcontext()

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], greedy: bool = False, vision: list[VisionInputs | None] | None = None
    ) -> list[list[int]]:
        """Completion token ids of each prompt (with its images' `vision` inputs where it has images), up to and
        including the first EOS. The policy samples in eval
        mode (its dropout is off already): in training mode gradient checkpointing would switch off the KV cache
        and each new token would see none of the sequence before it."""
        was_training = self.model.training
        self.model.eval()
        try:
            return self._generate(prompts, greedy, vision or [None] * len(prompts))
        finally:
            self.model.train(was_training)

    def _generate(self, prompts: list[list[int]], greedy: bool, vision: list[VisionInputs | None]) -> list[list[int]]:
        pad, out = self.tok.pad_token_id, []
        calls = -(-len(prompts) // self.batch_size)
        if self.synced:  # as many generate calls as the busiest process (multi-turn: live rollouts differ)
            calls = _most_over_processes(calls, self.model.device)
        for i in range(0, calls * self.batch_size, self.batch_size):
            real = prompts[i : i + self.batch_size]
            chunk = real or [[pad]]  # nothing left on this process: a stand-in keeps it in step
            width = max(map(len, chunk))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=self.model.device)
            attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=self.model.device)
            config, synced = self.configs[greedy], self.synced
            images = model_inputs(self.model, ids, vision[i : i + self.batch_size])
            if images:  # no image placeholder sampled into a completion
                config = copy.copy(config)
                config.suppress_tokens = vision_token_ids(self.model)
            gen = self.model.generate(
                input_ids=ids, attention_mask=attn, generation_config=config, synced_gpus=synced, **images
            )
            out += [through_stop(row, self.stops) for row in gen[: len(real), width:].tolist()]
        return out


def _most_over_processes(value: int, device: Any) -> int:
    """The largest `value` of any process (the value itself outside a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def for_plan(
    plan: Plan, tokenizer: Any, policy: Any, accelerator: Any, weights: Any = None, stop_ids: tuple = ()
) -> Generator:
    """The plan's generation engine for `policy` (the unwrapped model the loop syncs before each rollout). A
    sharded policy comes with `weights` (its gathered weights, one at a time: the vLLM push) and generates in step
    on every process; `stop_ids` end a completion besides EOS (a multi-turn rollout's end-of-turn token)."""
    if plan.generation_engine == "vllm" and plan.async_split is None:  # async: the generator process samples
        from rlctl.rollout import vllm

        return vllm.colocated(plan, policy, accelerator, tokenizer, weights, stop_ids)
    rl = plan.config.rl
    chunk = plan.rollouts_per_generate
    synced = weights is not None
    return HFGenerator(tokenizer, rl.max_new_tokens, rl.temperature, chunk, synced=synced, stop_ids=stop_ids)

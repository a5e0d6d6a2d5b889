"""A rollout batch's pieces: one completion of one prompt (`Sample`), the prompt stream that feeds the loop, the
padded tensors (`Batch`) the trainer's forward passes read, and the log-probs of a batch's completion tokens
(`token_logprobs`), which the trainer and the async generator process compute alike; where a completion ends
(`through_stop`), for every engine."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from rlctl.plan.memory.model import LOGPROB_CHUNK_ENTRIES
from rlctl.rollout.vision import VisionInputs, model_inputs


@dataclass
class Sample:
    """One completion of one prompt; `group` is the prompt's position in the prompt stream (unique per prompt)."""

    group: int
    row: dict
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    truncated: bool = False
    score: float = 0.0
    correct: bool = False  # the run's correctness reward scored it above 0.5 (VAPO's positive examples)
    baseline: float = 0.0
    rollout_logprobs: list[float] | None = None  # the engine's log-prob of each sampled token (vLLM; NaN: none)
    # multi-turn rollouts (rlctl.rollout.multiturn): 1 for the model's tokens, 0 for tool results (None: all 1)
    loss_mask: list[int] | None = None
    messages: list[dict] | None = None  # the trajectory: prompt, assistant turns and tool results
    turns: int = 1
    tool_calls: int = 0
    tool_errors: int = 0
    vision: VisionInputs | None = None  # the prompt's images as model inputs (a vision-language model's prompt)


def through_stop(ids: Sequence[int], stops: Sequence[int]) -> list[int]:
    """`ids` up to and including the first token in `stops` (all of them when none is): where a completion (a
    turn) ends, whichever engine sampled it."""
    end = next((t for t, token in enumerate(ids) if token in stops), len(ids) - 1)
    return list(ids[: end + 1])


class PromptStream:
    """The rl dataset in a seeded shuffled order, one epoch after another; `cursor` is all its state."""

    def __init__(self, rows: list[dict], seed: int, cursor: int = 0):
        self.rows, self.seed, self.cursor = rows, seed, cursor

    def take(self, n: int) -> list[tuple[int, dict]]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.cursor, len(self.rows))
            order = list(range(len(self.rows)))
            random.Random(self.seed + epoch).shuffle(order)
            out.append((self.cursor, self.rows[order[i]]))
            self.cursor += 1
        return out


@dataclass
class Batch:
    """Left-padded prompts followed by right-padded completions; `mask` marks the completion tokens, `loss_mask`
    those of them the model wrote (tool results between turns excluded): the loss, KL and advantages use it."""

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    completion_ids: Tensor
    mask: Tensor
    loss_mask: Tensor
    vision: list[VisionInputs | None] = field(default_factory=list)  # each row's images (empty: no row has any)

    def __getitem__(self, rows) -> Batch:
        tensors = {f: getattr(self, f)[rows] for f in self.__dataclass_fields__ if f != "vision"}
        picked = torch.arange(len(self.input_ids))[rows].tolist() if self.vision else []
        return Batch(**tensors, vision=[self.vision[i] for i in picked])


def collate(samples: list[Sample], pad_id: int, device) -> Batch:
    p = max(len(s.prompt_ids) for s in samples)
    t = max(len(s.completion_ids) for s in samples)
    ids = torch.full((len(samples), p + t), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    trained = torch.zeros((len(samples), t))
    for i, s in enumerate(samples):
        ids[i, p - len(s.prompt_ids) : p] = torch.tensor(s.prompt_ids)
        ids[i, p : p + len(s.completion_ids)] = torch.tensor(s.completion_ids)
        attn[i, p - len(s.prompt_ids) : p + len(s.completion_ids)] = 1
        own = s.loss_mask if s.loss_mask is not None else [1] * len(s.completion_ids)
        trained[i, : len(own)] = torch.tensor(own, dtype=torch.float)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    ids, attn, pos = ids.to(device), attn.to(device), pos.to(device)
    vision = [s.vision for s in samples] if any(s.vision is not None for s in samples) else []
    return Batch(ids, attn, pos, ids[:, p:], attn[:, p:].float(), trained.to(device), vision)


def pad_to(x: Tensor, length: int) -> Tensor:
    """Right-pad a [b, t] tensor with zeros to [b, length]."""
    return torch.nn.functional.pad(x, (0, length - x.shape[1]))


def rollout_logprobs(samples: list[Sample], like: Tensor) -> Tensor | None:
    """The engine's log-probs of the sampled tokens as a [b, T] tensor shaped like the trainer's (None when the
    policy generated itself), built in one go; where the engine gave none (NaN, or past its end), the trainer's
    value (no difference)."""
    if any(s.rollout_logprobs is None for s in samples):
        return None
    t = like.shape[1]
    rows = [lps[:t] + [math.nan] * (t - len(lps[:t])) for lps in (s.rollout_logprobs for s in samples)]
    engine = torch.tensor(rows, dtype=like.dtype).to(like.device)
    return torch.where(torch.isfinite(engine), engine, like)


def token_logprobs(model, batch: Batch, temperature: float) -> Tensor:
    """log π(y_t | x, y_<t) of the completion tokens, [b, T], from logits / temperature (as sampled).

    The LM head runs in chunks of tokens (`LOGPROB_CHUNK_ENTRIES` logits at a time, each recomputed in the
    backward pass) on the final hidden states, which a hook on the head takes from the model's own forward (so DDP,
    FSDP2, LoRA and autocast see an ordinary forward); the model itself projects one position. No
    [tokens x vocabulary] tensor is ever whole, and no division at temperature 1. Models whose logits the head alone
    does not make (soft-capped or scaled logits) get the plain forward. Rows with images pass their pixel values
    and token types (`rlctl.rollout.vision.model_inputs`); a family that computes its own (multimodal) positions
    then does."""
    t = batch.completion_ids.shape[1]
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False}
    inputs |= model_inputs(model, batch.input_ids, batch.vision, batch.position_ids) or {
        "position_ids": batch.position_ids
    }
    head = _output_head(model)
    if head is None:
        logits = model(**inputs, logits_to_keep=t + 1).logits[:, :-1].float()
        return _picked_logprobs(logits, batch.completion_ids, temperature)
    captured: list[Tensor] = []

    def take_hidden(_module, args):
        captured.append(args[0][:, -t - 1 : -1])
        return (args[0][:, -1:],)  # the model's own projection: one position, whose logits nobody reads

    handle = head.register_forward_pre_hook(take_hidden)
    try:
        model(**inputs, logits_to_keep=t + 1)
    finally:
        handle.remove()
    hidden, ids = captured[0], batch.completion_ids
    rows = max(1, LOGPROB_CHUNK_ENTRIES // head.weight.shape[0] // max(1, hidden.shape[0]))
    parts = []
    for i in range(0, t, rows):
        h, y = hidden[:, i : i + rows], ids[:, i : i + rows]
        if torch.is_grad_enabled():
            parts.append(checkpoint(_head_logprobs, head, h, y, temperature, use_reentrant=False))
        else:
            parts.append(_head_logprobs(head, h, y, temperature))
    return torch.cat(parts, dim=1)


def _output_head(model) -> torch.nn.Module | None:
    """The LM head whose output alone gives the logits (None for soft-capped or scaled logits, or no head)."""
    inner = getattr(model, "module", model)  # DDP's wrapper
    config = getattr(inner, "config", None)
    if any(getattr(config, key, None) for key in ("final_logit_softcapping", "logit_scale", "logits_scaling")):
        return None
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if get is not None else None
    return head if isinstance(head, torch.nn.Module) and hasattr(head, "weight") else None


def _head_logprobs(head: torch.nn.Module, hidden: Tensor, ids: Tensor, temperature: float) -> Tensor:
    return _picked_logprobs(head(hidden).float(), ids, temperature)


def _picked_logprobs(logits: Tensor, ids: Tensor, temperature: float) -> Tensor:
    """log-softmax(logits / temperature) at `ids`, as the label's logit less the log-sum-exp (no log-softmax copy)."""
    if temperature != 1.0:
        logits = logits / temperature
    return logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)

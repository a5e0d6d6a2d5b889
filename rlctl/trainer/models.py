"""The RL loop's models (loaded by the rl stage, `rlctl.stages.rl`): dropout off, their optimizers, and the
per-token forward passes every phase of a step uses beside the policy's log-probs of the sampled tokens
(`rlctl.rollout.samples.token_logprobs`, shared with the async generator): reference log-probs and critic values."""

from __future__ import annotations

import torch
from torch import Tensor

from rlctl.config.rl import RLConfig
from rlctl.rollout.samples import Batch, token_logprobs


def token_values(critic, batch: Batch) -> Tensor:
    """V(state before each completion token), [b, T] (same alignment as the log-probs)."""
    t = batch.completion_ids.shape[1]
    out = critic(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    return out.logits[:, -t - 1 : -1, 0].float()


def no_dropout(model):
    """Dropout off, so log-probs in the update match the rollout's (TRL's disable_dropout)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def ref_logprobs(policy, ref, batch: Batch, temperature: float) -> Tensor:
    """Reference log-probs: the frozen copy, or the LoRA policy with its adapters switched off."""
    if ref is not None:
        return token_logprobs(ref, batch, temperature)
    with policy.disable_adapter():
        return token_logprobs(policy, batch, temperature)


def optimizer_and_schedule(rl: RLConfig, model, lr: float, updates: int):
    """AdamW over `model`'s trainable parameters at `lr` and rl.lr_scheduler over `updates` optimizer steps."""
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=rl.weight_decay)
    sched = get_scheduler(rl.lr_scheduler, opt, int(rl.warmup_ratio * updates), max(updates, 1))
    return opt, sched

"""The RL loop's models: loading the policy, its frozen reference and the PPO critic, their optimizers, and the
per-token forward passes every phase of a step uses beside the policy's log-probs of the sampled tokens
(`rlctl.rollout.samples.token_logprobs`, shared with the async generator): reference log-probs and critic values."""

from __future__ import annotations

import torch
from torch import Tensor

from rlctl.rollout.samples import Batch, token_logprobs
from rlctl.runtime import models
from rlctl.runtime.context import StageContext
from rlctl.runtime.models import lora_config, torch_dtype


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


def load_models(ctx: StageContext):
    """(policy, reference or None, critic or None): the reference is the starting policy, frozen."""
    from transformers import AutoModelForTokenClassification

    rl, init = ctx.cfg.rl, ctx.stage.init_from
    policy = no_dropout(models.causal_lm(ctx, init))
    if ctx.plan.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = lora_config(ctx)
    ref = None
    if rl.beta > 0 and lora is None:
        ref = no_dropout(models.causal_lm(ctx, init, trainable=False)).eval().requires_grad_(False)
    if lora is not None:
        from peft import get_peft_model

        policy = get_peft_model(policy, lora)
    critic = None
    if rl.critic.init is not None:
        path = init if rl.critic.init == "policy" else str(ctx.run_dir / "rm" / "final")
        critic = AutoModelForTokenClassification.from_pretrained(
            path,
            num_labels=1,
            dtype=torch_dtype(ctx),
            trust_remote_code=ctx.cfg.model.trust_remote_code,
        )
        critic = no_dropout(critic)
        if ctx.plan.gradient_checkpointing:
            critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora_config(ctx, task_type="TOKEN_CLS") is not None:
            from peft import get_peft_model

            critic = get_peft_model(critic, lora_config(ctx, task_type="TOKEN_CLS"))
    return policy, ref, critic


def ref_logprobs(policy, ref, batch: Batch, temperature: float) -> Tensor:
    """Reference log-probs: the frozen copy, or the LoRA policy with its adapters switched off."""
    if ref is not None:
        return token_logprobs(ref, batch, temperature)
    with policy.disable_adapter():
        return token_logprobs(policy, batch, temperature)


def optimizer_and_schedule(ctx: StageContext, model, lr: float, updates: int):
    from transformers import get_scheduler

    sc = ctx.cfg.rl
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=sc.weight_decay)
    sched = get_scheduler(sc.lr_scheduler, opt, int(sc.warmup_ratio * updates), max(updates, 1))
    return opt, sched

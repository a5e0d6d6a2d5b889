"""The RL loop's models (loaded by the rl stage, `rlctl.stages.rl`): dropout off, their optimizers, and the
per-token forward passes every phase of a step uses beside the policy's log-probs of the sampled tokens
(`rlctl.rollout.samples.token_logprobs`, shared with the async generator): reference log-probs and critic values;
the critic of a vision-language policy (`VisionValueModel`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel
from transformers.modeling_outputs import TokenClassifierOutput

from rlctl.config.rl import RLConfig
from rlctl.rollout.samples import Batch, token_logprobs
from rlctl.rollout.vision import model_inputs


class VisionValueModel(torch.nn.Module):
    """PPO's critic for a vision-language policy, which transformers has no token classifier for: the model's own
    backbone (`AutoModel`'s: vision tower and language model, no LM head) and a linear value head `score`,
    initialised as transformers initialises a token classifier's. Its output's `.logits` are one value per token,
    [b, L, 1], as the text critic's (`AutoModelForTokenClassification`, num_labels=1)."""

    base_model_prefix = "model"  # where the backbone lives, as in transformers' models (PEFT reads it)

    def __init__(self, backbone: PreTrainedModel):
        super().__init__()
        self.model, self.config = backbone, backbone.config
        self._no_split_modules = backbone._no_split_modules  # the blocks FSDP2 shards (rlctl.trainer.sharding)
        hidden = self.config.get_text_config().hidden_size
        self.score = torch.nn.Linear(hidden, 1, bias=getattr(self.config, "token_classification_bias", True))
        torch.nn.init.normal_(self.score.weight, std=getattr(self.config, "initializer_range", None) or 0.02)
        if self.score.bias is not None:
            torch.nn.init.zeros_(self.score.bias)
        self.score.to(backbone.dtype)

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        """The backbone's (the head keeps no activations worth recomputing)."""
        self.model.gradient_checkpointing_enable(**kwargs)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, use_cache: bool | None = None, **inputs: Tensor
    ) -> TokenClassifierOutput:
        """The values of every position; `inputs`: position ids, or the images' model inputs. `use_cache` is taken
        as a token classifier's is, and ignored: the backbone never builds a KV cache here."""
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **inputs)
        return TokenClassifierOutput(logits=self.score(hidden.last_hidden_state))


def token_values(critic, batch: Batch) -> Tensor:
    """V(state before each completion token), [b, T] (same alignment as the log-probs). Rows with images pass their
    pixel values, as the policy's forward passes do. No KV cache: a scoring forward never reads one back (a token
    classifier's backbone builds one by default, as its config's use_cache says)."""
    t = batch.completion_ids.shape[1]
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False}
    inputs |= model_inputs(critic, batch.input_ids, batch.vision, batch.position_ids) or {
        "position_ids": batch.position_ids
    }
    return critic(**inputs).logits[:, -t - 1 : -1, 0].float()


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

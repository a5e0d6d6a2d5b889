"""Offline preference optimisation through TRL's DPOTrainer (the reference is the starting policy); the held-out
tenth of data.preference is scored at the end (implicit-reward accuracy and margin)."""

from __future__ import annotations

from rlctl.runtime import models
from rlctl.runtime.rows import preference_split
from rlctl.stages.common import kept_rows
from rlctl.stages.context import StageContext
from rlctl.stages.trl_common import score_held_out_pairs, train_causal_lm, training_args


def run(ctx: StageContext) -> None:
    from trl import DPOConfig, DPOTrainer

    tok = models.tokenizer(ctx.source())
    train_rows = kept_rows(ctx, tok)
    sc = ctx.settings
    args = training_args(ctx, DPOConfig, max_length=sc.max_length, beta=sc.beta, loss_type=[sc.loss_type])
    trainer = train_causal_lm(ctx, DPOTrainer, args, train_rows, tok)
    held = preference_split(ctx.stage_data())[1][: sc.eval_samples]
    score_held_out_pairs(ctx, trainer, held, "eval_rewards/accuracies")

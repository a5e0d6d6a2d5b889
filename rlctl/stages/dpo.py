"""Offline preference optimisation through TRL's DPOTrainer (the reference is the starting policy)."""

from __future__ import annotations

from rlctl.stages import lengths, models
from rlctl.stages.common import StageContext, train_causal_lm, training_args


def run(ctx: StageContext) -> None:
    from trl import DPOConfig, DPOTrainer

    tok = models.tokenizer(ctx, ctx.stage.init_from)
    train_rows = lengths.training_rows(ctx, tok)
    sc = ctx.settings
    args = training_args(ctx, DPOConfig, max_length=sc.max_length, beta=sc.beta, loss_type=[sc.loss_type])
    train_causal_lm(ctx, DPOTrainer, args, train_rows, tok)

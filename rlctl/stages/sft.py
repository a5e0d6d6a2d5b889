"""Supervised fine-tuning through TRL's SFTTrainer (completion-only loss for prompt/completion data)."""

from __future__ import annotations

from rlctl.stages import lengths, models
from rlctl.stages.common import StageContext, train_causal_lm, training_args


def run(ctx: StageContext) -> None:
    from trl import SFTConfig, SFTTrainer

    tok = models.tokenizer(ctx, ctx.stage.init_from)
    kept = lengths.training_rows(ctx, tok)
    args = training_args(ctx, SFTConfig, max_length=ctx.settings.max_length, packing=False)
    train_causal_lm(ctx, SFTTrainer, args, kept, tok)

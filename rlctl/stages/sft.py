"""Supervised fine-tuning through TRL's SFTTrainer (completion-only loss for prompt/completion data)."""

from __future__ import annotations

from rlctl.stages import layout, lengths, models
from rlctl.stages.common import (
    StageContext,
    StreamMetrics,
    lora_config,
    resume_point,
    save_final,
    training_args,
)


def run(ctx: StageContext) -> None:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = models.tokenizer(ctx, ctx.stage.init_from)
    kept = lengths.training_rows(ctx, tok)
    args = training_args(ctx, SFTConfig, max_length=ctx.settings.max_length, packing=False)
    trainer = SFTTrainer(
        model=models.causal_lm(ctx, ctx.stage.init_from),
        args=args,
        train_dataset=Dataset.from_list(kept),
        processing_class=tok,
        peft_config=lora_config(ctx),
        callbacks=[StreamMetrics(ctx)],
    )
    layout.follow_plan(ctx, trainer)
    trainer.train(resume_from_checkpoint=resume_point(ctx))
    save_final(ctx, trainer, tok)

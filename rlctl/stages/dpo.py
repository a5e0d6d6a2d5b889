"""Offline preference optimisation through TRL's DPOTrainer (the reference is the starting policy)."""

from __future__ import annotations

from rlctl.stages import layout, lengths, models
from rlctl.stages.common import StageContext, StreamMetrics, lora_config, resume_point, save_final, training_args


def run(ctx: StageContext) -> None:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    tok = models.tokenizer(ctx, ctx.stage.init_from)
    train_rows = lengths.training_rows(ctx, tok)
    sc = ctx.settings
    args = training_args(ctx, DPOConfig, max_length=sc.max_length, beta=sc.beta, loss_type=[sc.loss_type])
    trainer = DPOTrainer(
        model=models.causal_lm(ctx, ctx.stage.init_from),
        args=args,
        train_dataset=Dataset.from_list(train_rows),
        processing_class=tok,
        peft_config=lora_config(ctx),
        callbacks=[StreamMetrics(ctx)],
    )
    layout.follow_plan(ctx, trainer)
    trainer.train(resume_from_checkpoint=resume_point(ctx))
    save_final(ctx, trainer, tok)

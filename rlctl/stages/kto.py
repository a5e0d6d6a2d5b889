"""Offline unpaired preference optimisation through TRL's KTOTrainer (the reference is the starting policy).

KTO learns from single completions labelled desirable or undesirable. The data layer's `kto` role reads
data.preference either as KTO rows (`prompt`, `completion`, boolean `label`) or as preference pairs, each pair
becoming two rows: the chosen completion desirable, the rejected one undesirable. A tenth is held out, as in the
rm and dpo stages.
"""

from __future__ import annotations

from rlctl.stages import layout, lengths, models
from rlctl.stages.common import StageContext, StreamMetrics, lora_config, resume_point, save_final, training_args


def run(ctx: StageContext) -> None:
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    tok = models.tokenizer(ctx, ctx.stage.init_from)
    rows = lengths.training_rows(ctx, tok)
    sc = ctx.settings
    args = training_args(
        ctx,
        KTOConfig,
        max_length=sc.max_length,
        beta=sc.beta,
        loss_type=sc.loss_type,
        desirable_weight=sc.desirable_weight,
        undesirable_weight=sc.undesirable_weight,
    )
    trainer = KTOTrainer(
        model=models.causal_lm(ctx, ctx.stage.init_from),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        peft_config=lora_config(ctx),
        callbacks=[StreamMetrics(ctx)],
    )
    layout.follow_plan(ctx, trainer)
    trainer.train(resume_from_checkpoint=resume_point(ctx))
    save_final(ctx, trainer, tok)

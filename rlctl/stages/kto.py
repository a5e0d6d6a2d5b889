"""Offline unpaired preference optimisation through TRL's KTOTrainer (the reference is the starting policy).

KTO learns from single completions labelled desirable or undesirable. rlctl's preference data holds pairs
(`chosen`, `rejected`); each pair becomes two unpaired rows: the chosen completion desirable, the rejected one
undesirable. The same held-out tenth as the rm and dpo stages is kept out of training.
"""

from __future__ import annotations

from rlctl.stages import models
from rlctl.stages.common import StageContext, StreamMetrics, lora_config, resume_point, save_final, training_args
from rlctl.stages.rm import preference_split


def unpaired(pairs: list[dict]) -> list[dict]:
    """KTO rows (prompt, completion, label) from preference pairs: chosen -> True, rejected -> False."""
    rows = []
    for pair in pairs:
        prompt = pair.get("prompt", "")
        rows.append({"prompt": prompt, "completion": pair["chosen"], "label": True})
        rows.append({"prompt": prompt, "completion": pair["rejected"], "label": False})
    return rows


def run(ctx: StageContext) -> None:
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    tok = models.tokenizer(ctx, ctx.stage.init_from)
    train_pairs, _ = preference_split(ctx)
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
        train_dataset=Dataset.from_list(unpaired(train_pairs)),
        processing_class=tok,
        peft_config=lora_config(ctx),
        callbacks=[StreamMetrics(ctx)],
    )
    trainer.train(resume_from_checkpoint=resume_point(ctx))
    save_final(ctx, trainer, tok)

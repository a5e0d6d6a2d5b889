"""Pairwise reward model through TRL's RewardTrainer (Bradley-Terry loss on chosen/rejected)."""

from __future__ import annotations

from rlctl.monitors import layout
from rlctl.runtime import models
from rlctl.runtime.models import lora_config
from rlctl.runtime.rows import training_rows
from rlctl.stages.common import StageContext, StreamMetrics, save_final, train, training_args


def run(ctx: StageContext) -> None:
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    tok = models.tokenizer(ctx, ctx.stage.init_from)
    train_rows = training_rows(ctx, tok)
    args = training_args(ctx, RewardConfig, max_length=ctx.settings.max_length)
    trainer = RewardTrainer(
        model=models.reward_model(ctx, ctx.stage.init_from, tok.pad_token_id),
        args=args,
        train_dataset=Dataset.from_list(train_rows),
        processing_class=tok,
        peft_config=lora_config(ctx, task_type="SEQ_CLS"),
        callbacks=[StreamMetrics(ctx)],
    )
    layout.follow_plan(ctx, trainer)
    save_final(ctx, train(ctx, trainer, tok))

"""Pairwise reward model through TRL's RewardTrainer (Bradley-Terry loss on chosen/rejected)."""

from __future__ import annotations

from rlctl.monitors import trl_callbacks
from rlctl.runtime import models
from rlctl.runtime.models import lora_config
from rlctl.stages.common import kept_rows, save_final
from rlctl.stages.context import StageContext
from rlctl.stages.trl_common import StreamMetrics, train, training_args


def run(ctx: StageContext) -> None:
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    source = ctx.source()
    tok = models.tokenizer(source)
    train_rows = kept_rows(ctx, tok)
    args = training_args(ctx, RewardConfig, max_length=ctx.settings.max_length)
    trainer = RewardTrainer(
        model=models.reward_model(source, tok.pad_token_id),
        args=args,
        train_dataset=Dataset.from_list(train_rows),
        processing_class=tok,
        peft_config=lora_config(source, task_type="SEQ_CLS"),
        callbacks=[StreamMetrics(ctx)],
    )
    trl_callbacks.follow(ctx.monitors(), trainer)
    save_final(ctx, train(ctx, trainer, tok))

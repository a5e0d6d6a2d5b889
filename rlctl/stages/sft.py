"""Supervised fine-tuning through TRL's SFTTrainer (completion-only loss for prompt/completion data)."""

from __future__ import annotations

from rlctl import data
from rlctl.stages import models
from rlctl.stages.common import (
    StageContext,
    StreamMetrics,
    lora_config,
    resume_point,
    save_final,
    training_args,
)


def _fits(row: dict, tok, max_length: int) -> bool:
    """Whether a training row, as SFT will tokenize it (with EOS), fits `max_length` tokens."""
    if "messages" in row or isinstance(row.get("prompt"), list):
        messages = row["messages"] if "messages" in row else row["prompt"] + row["completion"]
        n = len(tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    elif "text" in row:
        n = len(tok(row["text"])["input_ids"]) + 1
    else:
        n = len(tok(row["prompt"] + row["completion"])["input_ids"]) + 1
    return n <= max_length


def run(ctx: StageContext) -> None:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = models.tokenizer(ctx, ctx.stage.init_from)
    rows = data.check(ctx.data["sft"], "sft")
    kept = [r for r in rows if _fits(r, tok, ctx.settings.max_length)]
    if len(kept) < len(rows):
        ctx.log.write(stage="sft", event="data", dropped_too_long=len(rows) - len(kept), kept=len(kept))
    args = training_args(ctx, SFTConfig, max_length=ctx.settings.max_length, packing=False)
    trainer = SFTTrainer(
        model=models.causal_lm(ctx, ctx.stage.init_from),
        args=args,
        train_dataset=Dataset.from_list(kept),
        processing_class=tok,
        peft_config=lora_config(ctx),
        callbacks=[StreamMetrics(ctx)],
    )
    trainer.train(resume_from_checkpoint=resume_point(ctx))
    save_final(ctx, trainer, tok)

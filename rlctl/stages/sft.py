"""Supervised fine-tuning through TRL's SFTTrainer. The loss covers what the model should write: the completion of
prompt/completion rows (TRL's completion-only loss), and the assistant turns of chat `messages` rows (each assistant
turn becomes a conversational prompt/completion row: the conversation before it as the prompt, the turn, with the
end-of-turn token the chat template closes it with, as the completion). TRL's own `assistant_only_loss` needs
`{% generation %}` markers that most chat templates (SmolLM2's, ChatML) do not have."""

from __future__ import annotations

from typing import Any

from rlctl.runtime import models
from rlctl.stages.common import kept_rows
from rlctl.stages.context import StageContext
from rlctl.stages.trl_common import train_causal_lm, training_args


def assistant_turns(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat `messages` rows as one prompt/completion row per assistant turn (other columns, such as `tools`,
    kept); rows of other formats as they are."""
    out: list[dict[str, Any]] = []
    for row in rows:
        messages = row.get("messages")
        if not isinstance(messages, list):
            out.append(row)
            continue
        rest = {k: v for k, v in row.items() if k != "messages"}
        turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]
        out += [{**rest, "prompt": messages[:i], "completion": [messages[i]]} for i in turns]
    return out


def run(ctx: StageContext) -> None:
    """A vision-language model trains through TRL's own vision path: the processor as the processing class and
    each row's images (opened) in its `images` column; TRL's collator then masks the prompt, images included."""
    from trl import SFTConfig, SFTTrainer

    from rlctl.rollout import vision

    source = ctx.source()
    tok = models.tokenizer(source)
    kept = assistant_turns(kept_rows(ctx, tok))
    processor = models.processor(source)
    if processor is not None:
        kept = [{**r, "images": vision.row_images(r, None)} for r in kept]
    unused = {"ddp_find_unused_parameters": True} if processor is not None else {}  # DDP: batches without images
    args = training_args(ctx, SFTConfig, max_length=ctx.settings.max_length, packing=False, **unused)
    train_causal_lm(ctx, SFTTrainer, args, kept, processor or tok)

"""Each stage's training rows with the length policy applied. A row longer than its limit (RL prompts:
`data.max_prompt_length`; sft, rm, dpo and kto sequences: the stage's `max_length`) is dropped and counted, or
the run is refused naming it (`data.over_length`). Rows are never truncated, so no trainer truncates silently."""

from __future__ import annotations

from typing import Any

from rlctl import data
from rlctl.errors import UserError
from rlctl.rollout import evaluate
from rlctl.stages.context import StageContext
from rlctl.stages.heldout import preference_split


def stage_rows(ctx: StageContext) -> list[dict[str, Any]]:
    """The rows the stage trains on, before the length policy (rm, dpo and kto leave a tenth out for eval)."""
    name, cfg = ctx.stage.name, ctx.cfg
    if name == "sft":
        return data.check(ctx.data["sft"], "sft", columns=cfg.data.columns)
    if name in ("rm", "dpo", "kto"):
        return preference_split(ctx, "kto" if name == "kto" else "preference")[0]
    return data.check(ctx.data["rl"], "rl", cfg.data.answer_field, columns=cfg.data.columns)


def limit_key(stage: str) -> str:
    return "data.max_prompt_length" if stage == "rl" else f"{stage}.max_length"


def _tokens(text: str, tok) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def _text(value: Any, tok) -> str:
    """Plain text as is; a message list rendered through the chat template."""
    return tok.apply_chat_template(value, tokenize=False) if isinstance(value, list) else value


def length(row: dict[str, Any], tok, stage: str) -> int:
    """Tokens of a row as the stage's trainer sees it: the prompt alone for rl; the whole sequence with EOS for sft;
    prompt plus the longer response (tokenized apart, as TRL does) with EOS for rm, dpo and kto."""
    if stage == "rl":
        return _tokens(evaluate.prompt_text(row["prompt"], tok), tok)
    if stage == "sft":
        if "messages" in row or isinstance(row.get("prompt"), list):
            messages = row["messages"] if "messages" in row else row["prompt"] + row["completion"]
            return len(tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
        text = row["text"] if "text" in row else row["prompt"] + row["completion"]
        return _tokens(text, tok) + 1
    prompt = row.get("prompt") or ""
    responses = [row["chosen"], row["rejected"]] if "chosen" in row else [row["completion"]]
    head = _tokens(evaluate.prompt_text(prompt, tok), tok) if prompt else 0
    return head + max(_tokens(_text(r, tok), tok) for r in responses) + 1


def training_rows(ctx: StageContext, tok) -> list[dict[str, Any]]:
    """The stage's rows that fit its limit. Over-long ones are dropped and counted (metrics.jsonl `data` event,
    summary.json), or, with data.over_length=refuse, a UserError names the first one."""
    name = ctx.stage.name
    rows = stage_rows(ctx)
    limit = ctx.cfg.data.max_prompt_length if name == "rl" else ctx.settings.max_length
    sizes = [length(r, tok, name) for r in rows]
    over = [i for i, n in enumerate(sizes) if n > limit]
    if not over:
        return rows
    first = rows[over[0]]
    shown = str(first.get("prompt") or first.get("text") or first.get("messages") or first)[:80]
    if ctx.cfg.data.over_length == "refuse":
        where = f"row {over[0] + 1} of {ctx.data['rl' if name == 'rl' else 'sft']}, " if name in ("sft", "rl") else ""
        raise UserError(
            f"{len(over)} of {len(rows)} {name} rows are longer than {limit_key(name)}={limit} tokens (first: "
            f"{where}{sizes[over[0]]} tokens, {shown!r}). data.over_length=refuse, so nothing was trained: raise "
            f"{limit_key(name)}, shorten or remove those rows, or set data.over_length=drop to leave them out "
            "(counted)."
        )
    skip = set(over)
    kept = [r for i, r in enumerate(rows) if i not in skip]
    if not kept:
        raise UserError(
            f"Every one of the {len(rows)} {name} rows is longer than {limit_key(name)}={limit} tokens (the first "
            f"has {sizes[0]}): nothing is left to train on. Raise {limit_key(name)} or shorten the data."
        )
    ctx.notes.update(dropped_too_long=len(over), kept=len(kept), limit=limit)
    ctx.log.write(stage=name, event="data", dropped_too_long=len(over), kept=len(kept), limit=limit)
    return kept

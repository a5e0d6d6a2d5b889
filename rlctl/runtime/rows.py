"""Each stage's training rows with the length policy applied. A row longer than its limit (RL prompts:
`data.max_prompt_length`; sft, rm, dpo and kto sequences: the stage's `max_length`) is dropped and counted, or
the run is refused naming it (`data.over_length`). Rows are never truncated, so no trainer truncates silently.
The rm, dpo and kto stages train on data.preference less the tenth held out for scoring (`preference_split`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlctl import data
from rlctl.data import images as image_entries
from rlctl.data.tokens import length, limit_key, too_many_dropped
from rlctl.errors import UserError
from rlctl.rollout import tools
from rlctl.rundir import DataNote
from rlctl.runtime.context import StageContext

HOLDOUT = data.PREFERENCE_HOLDOUT  # the fraction of preference pairs held out to score reward models

__all__ = ["anchored", "length", "limit_key", "preference", "preference_split", "stage_rows", "training_rows"]


def anchored(rows: list[dict[str, Any]], data_file: Path) -> list[dict[str, Any]]:
    """`rows` with their relative image paths made absolute from the data file's folder (where they are read
    from), so the stages open them wherever they run; rows without images as they are."""
    base = data_file.parent

    def entry(e: Any) -> Any:
        return str(base / e) if isinstance(e, str) and not Path(e).is_absolute() else e

    out = []
    for row in rows:
        found = image_entries.entries(row)
        out.append({**row, "images": [entry(e) for e in found]} if found else row)
    return out


def preference_split(ctx: StageContext, role: str = "preference") -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows of data.preference, read as `role` (preference pairs, or kto rows); the held-out
    tenth measures the reward model's accuracy."""
    rows, _ = preference(ctx, role)
    return data.holdout(rows, HOLDOUT, ctx.cfg.seed)


def preference(ctx: StageContext, role: str = "preference") -> tuple[list[dict], data.DataInfo]:
    """Every row of data.preference read as `role`, with where each came from."""
    stage = ctx.stage.name if ctx.stage.name in ("rm", "dpo", "kto") else "rm"
    columns = data.stage_columns(ctx.cfg, stage)
    return data.load(ctx.data["preference"], role, columns=columns, encoding=ctx.cfg.data.encoding)


def stage_rows(ctx: StageContext) -> list[dict[str, Any]]:
    """The rows the stage trains on, before the length policy (rm, dpo and kto leave a tenth out for eval)."""
    name, cfg = ctx.stage.name, ctx.cfg
    columns, encoding = data.stage_columns(cfg, name), cfg.data.encoding
    if name == "sft":
        return anchored(data.check(ctx.data["sft"], "sft", columns=columns, encoding=encoding), ctx.data["sft"])
    if name in ("rm", "dpo", "kto"):
        return preference_split(ctx, "kto" if name == "kto" else "preference")[0]
    rows = data.check(ctx.data["rl"], "rl", cfg.data.answer_field, columns=columns, encoding=encoding)
    return anchored(rows, ctx.data["rl"])


def training_rows(ctx: StageContext, tok) -> list[dict[str, Any]]:
    """The stage's rows that fit its limit. Over-long ones are dropped and counted (metrics.jsonl `data` event,
    summary.json), or, with data.over_length=refuse, a UserError names the first one."""
    name = ctx.stage.name
    rows = stage_rows(ctx)
    limit = ctx.cfg.data.max_prompt_length if name == "rl" else ctx.settings.max_length
    schemas = [t.schema for t in tools.resolve_all(ctx.cfg.rl.tools).values()] if name == "rl" else None
    sizes = [length(r, tok, name, schemas) for r in rows]  # RL prompts with the tools listed, as rolled out
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
    refused = too_many_dropped(name, len(over), len(rows), limit, ctx.cfg.data.max_drop_fraction, sizes)
    if refused:
        raise UserError(refused)
    ctx.notes = DataNote(len(over), len(kept), limit)
    ctx.log.write(stage=name, event="data", dropped_too_long=len(over), kept=len(kept), limit=limit)
    return kept

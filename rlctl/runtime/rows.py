"""Each stage's training rows with the length policy applied. A row longer than its limit (RL prompts:
`data.max_prompt_length`; sft, rm, dpo and kto sequences: the stage's `max_length`) is dropped and counted, or
the run is refused naming it (`data.over_length`). Rows are never truncated, so no trainer truncates silently.
The rm, dpo and kto stages train on data.preference less the tenth held out for scoring (`preference_split`).
Where a stage's rows come from is its `StageData`; the rows it keeps come back with their `DataNote`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl import data
from rlctl.config.sections import DataConfig
from rlctl.data import images as image_entries
from rlctl.data.tokens import length, limit_key, too_many_dropped
from rlctl.errors import UserError
from rlctl.rollout import tools
from rlctl.rundir import DataNote

HOLDOUT = data.PREFERENCE_HOLDOUT  # the fraction of preference pairs held out to score reward models

__all__ = [
    "StageData",
    "anchored",
    "eval_rows",
    "length",
    "limit_key",
    "preference",
    "preference_split",
    "stage_rows",
    "training_rows",
]


@dataclass(frozen=True)
class StageData:
    """Where a stage's rows come from: the stage (`name`), its data files by role (data.sft, data.preference,
    data.rl, data.eval), the data section (answer field, encoding, the length policy), the columns the stage and the
    held-out prompts are read with (data.columns with the stage's own, and rl's), the stage's length limit
    (data.max_prompt_length for rl, its max_length otherwise), the tools RL prompts list (rl.tools: they count
    towards the prompt's length) and the seed that holds the preference tenth out."""

    name: str
    files: dict[str, Path]
    data: DataConfig
    columns: dict[str, str]
    eval_columns: dict[str, str]
    limit: int
    seed: int
    tools: list[Any] = field(default_factory=list)


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


def preference_split(stage: StageData, role: str = "preference") -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows of data.preference, read as `role` (preference pairs, or kto rows); the held-out
    tenth measures the reward model's accuracy."""
    rows, _ = preference(stage, role)
    return data.holdout(rows, HOLDOUT, stage.seed)


def preference(stage: StageData, role: str = "preference") -> tuple[list[dict], data.DataInfo]:
    """Every row of data.preference read as `role`, with where each came from."""
    return data.load(stage.files["preference"], role, columns=stage.columns, encoding=stage.data.encoding)


def eval_rows(stage: StageData) -> tuple[list[dict], data.DataInfo]:
    """The held-out prompts (data.eval, read with rl's columns), with where each came from."""
    path = stage.files["eval"]
    rows, info = data.load(path, "eval", stage.data.answer_field, stage.eval_columns, stage.data.encoding)
    return anchored(rows, path), info


def stage_rows(stage: StageData) -> list[dict[str, Any]]:
    """The rows the stage trains on, before the length policy (rm, dpo and kto leave a tenth out for eval)."""
    name, columns, encoding = stage.name, stage.columns, stage.data.encoding
    if name == "sft":
        path = stage.files["sft"]
        return anchored(data.check(path, "sft", columns=columns, encoding=encoding), path)
    if name in ("rm", "dpo", "kto"):
        return preference_split(stage, "kto" if name == "kto" else "preference")[0]
    path = stage.files["rl"]
    return anchored(data.check(path, "rl", stage.data.answer_field, columns=columns, encoding=encoding), path)


def training_rows(stage: StageData, tok) -> tuple[list[dict[str, Any]], DataNote | None]:
    """The stage's rows that fit its limit, and the note of those dropped as too long (None: none was), which the
    stage logs (metrics.jsonl `data` event) and keeps for summary.json; with data.over_length=refuse a UserError
    names the first over-long row instead."""
    name, limit = stage.name, stage.limit
    rows = stage_rows(stage)
    schemas = [t.schema for t in tools.resolve_all(stage.tools).values()] if name == "rl" else None
    sizes = [length(r, tok, name, schemas) for r in rows]  # RL prompts with the tools listed, as rolled out
    over = [i for i, n in enumerate(sizes) if n > limit]
    if not over:
        return rows, None
    first = rows[over[0]]
    shown = str(first.get("prompt") or first.get("text") or first.get("messages") or first)[:80]
    if stage.data.over_length == "refuse":
        where = f"row {over[0] + 1} of {stage.files[name]}, " if name in ("sft", "rl") else ""
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
    refused = too_many_dropped(name, len(over), len(rows), limit, stage.data.max_drop_fraction, sizes)
    if refused:
        raise UserError(refused)
    return kept, DataNote(len(over), len(kept), limit)

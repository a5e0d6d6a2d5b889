"""Datasets: read and validate jsonl files before anything starts (errors name the file and line)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlctl.errors import UserError

# What each role needs: every column of one of the alternatives.
LAYOUTS: dict[str, list[tuple[str, ...]]] = {
    "sft": [("prompt", "completion"), ("messages",), ("text",)],
    "preference": [("chosen", "rejected")],
    "rl": [("prompt",)],
    "eval": [("prompt",)],
}


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) pairs of a jsonl file; a UserError naming file:line for a malformed line."""
    if not path.is_file():
        raise UserError(f"Dataset file not found: {path}.")
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"Malformed JSON in {path}:{n}: {e.msg} (column {e.colno}).") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}:{n} must be a JSON object, not {type(row).__name__}.")
            rows.append((n, row))
    if not rows:
        raise UserError(f"Dataset {path} is empty.")
    return rows


def check(path: Path, role: str, answer_field: str | None = None) -> list[dict[str, Any]]:
    """Rows of `path`, checked for the columns its role needs (and the answer column for rl/eval)."""
    rows = read_jsonl(path)
    layouts = LAYOUTS[role]
    first_line, first = rows[0]
    layout = next((cols for cols in layouts if all(c in first for c in cols)), None)
    if layout is None:
        want = " or ".join("+".join(cols) for cols in layouts)
        raise UserError(
            f"{path}:{first_line} has columns {sorted(first)}, but {role} data needs {want}. "
            f"Rename the columns or point data.{role} at another file."
        )
    need = (*layout, answer_field) if answer_field and role in ("rl", "eval") else layout
    for n, row in rows:
        missing = [c for c in need if c not in row]
        if missing:
            raise UserError(f"{path}:{n} lacks column(s) {', '.join(missing)} needed for {role} data.")
        bad = [c for c in layout if not isinstance(row[c], str | list) or not row[c]]
        if bad:
            raise UserError(f"{path}:{n}: column(s) {', '.join(bad)} must be non-empty text.")
    return [row for _, row in rows]


def holdout(rows: list[dict[str, Any]], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) split of `rows`, the same for the same seed; at least one row on each side."""
    import random

    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_held = min(max(1, int(len(rows) * fraction)), len(rows) - 1)
    held = set(order[:n_held])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]

"""Datasets: read, recognise and validate them before anything starts (errors name the file and line or row).

Where rows come from (files, folders, the Hub, encodings) is rlctl.data.sources and rlctl.data.files; this module
recognises their format for a role and returns them in the layout that role's trainer expects.

Formats are recognised from the columns (see FORMATS) and rows come back as plain dicts in the layout the
stages and TRL expect; verl's parquet layout is read as is, its `reward_model.ground_truth` copied into the
answer column. `data.columns` maps differently named columns (dotted paths reach into nested ones).

Package `rlctl.data`: reading and recognising datasets (this module) and the built-in synthetic tasks
(`tasks`).
May import: base, vision, config, sandbox, rundir.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.data import images, kinds
from rlctl.data.files import DEFAULT_ENCODING, FILE_TYPES, Table, read_jsonl
from rlctl.data.sources import HUB_PREFIX, PEEK_ROWS, Source, absolute, is_hub, parse_source, peek, read
from rlctl.errors import RowFailure, UserError, is_out_of_memory

__all__ = [  # re-exported: where callers have always found them
    "FILE_TYPES",
    "HUB_PREFIX",
    "PEEK_ROWS",
    "Source",
    "Table",
    "absolute",
    "is_hub",
    "parse_source",
    "read",
    "read_jsonl",
]

# Format key -> (what it looks like, roles it serves). The docs' dataset table is generated from this.
FORMATS: dict[str, tuple[str, tuple[str, ...]]] = {
    "messages": ("chat: `messages`, a list of `{role, content}`", ("sft",)),
    "prompt_completion": ("`prompt` + `completion` (text, or message lists)", ("sft",)),
    "text": ("`text` (plain language modelling)", ("sft",)),
    "preference": ("`prompt` + `chosen` + `rejected`", ("preference", "kto")),
    "preference_implicit": (
        "`chosen` + `rejected`, no `prompt` (the prompt is their shared start)",
        ("preference", "kto"),
    ),
    "kto": ("KTO unpaired: `prompt` + `completion` + boolean `label`", ("kto", "preference", "sft")),
    "verl": (
        "verl's layout: `prompt` as a message list, `data_source`, `reward_model.ground_truth`, `extra_info`",
        ("rl", "eval"),
    ),
    "prompt_answer": ("`prompt` + the ground-truth column (`data.answer_field`, default `answer`)", ("rl", "eval")),
    "bigbench": (
        "BIG-bench task.json `examples`: `input` + `target` (one answer or a list; `target_scores` read too)",
        ("sft", "rl", "eval"),
    ),
}

# Columns each format needs, and the formats each role accepts in the order they are tried.
FORMAT_COLUMNS: dict[str, tuple[str, ...]] = {
    "messages": ("messages",),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
    "preference": ("prompt", "chosen", "rejected"),
    "preference_implicit": ("chosen", "rejected"),
    "kto": ("prompt", "completion", "label"),
    "verl": ("prompt", "reward_model"),
    "prompt_answer": ("prompt",),
    "bigbench": ("input", "target"),
}
ROLE_FORMATS: dict[str, tuple[str, ...]] = {
    "sft": ("messages", "kto", "prompt_completion", "text", "bigbench"),
    "preference": ("preference", "preference_implicit", "kto"),
    "kto": ("kto", "preference", "preference_implicit"),
    "rl": ("verl", "prompt_answer", "bigbench"),
    "eval": ("verl", "prompt_answer", "bigbench"),
}
_TRUE = {True, "1", "true", "True", "TRUE", "yes", "desirable"}
_FALSE = {False, "0", "false", "False", "FALSE", "no", "undesirable"}


# ------------------------------------------------------------------------------------- formats and rows
def get_path(row: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    """(found, value) of `a.b.c` inside nested dicts."""
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def stage_columns(cfg: Any, stage: str) -> dict[str, str]:
    """The column mapping a stage reads its data with: data.columns, the stage's own `columns` on top (eval data
    reads with rl's)."""
    own = getattr(cfg, "rl" if stage == "eval" else stage).columns
    return {**cfg.data.columns, **own}


def map_columns(row: dict[str, Any], columns: dict[str, str]) -> dict[str, Any]:
    """`row` with each canonical column taken from the source column (dotted path) `columns` names for it."""
    if not columns:
        return row
    found = {canonical: get_path(row, src) for canonical, src in columns.items()}
    row = {k: v for k, v in row.items() if k in columns or k not in columns.values()}  # renamed, not copied
    for canonical, (ok, value) in found.items():
        if ok:
            row[canonical] = value
    return row


def _has(row: dict[str, Any], fmt: str) -> bool:
    if fmt == "verl":
        return "prompt" in row and isinstance(row.get("reward_model"), dict) and "ground_truth" in row["reward_model"]
    if fmt == "prompt_completion" and "label" in row:
        return False
    return all(c in row for c in FORMAT_COLUMNS[fmt])


def detect(row: dict[str, Any], role: str) -> str | None:
    """The format key of `row` for `role`, or None when it fits none of the role's formats."""
    return next((fmt for fmt in ROLE_FORMATS[role] if _has(row, fmt)), None)


def _want(role: str, answer_field: str | None) -> str:
    parts = []
    for fmt in ROLE_FORMATS[role]:
        cols = "+".join(FORMAT_COLUMNS[fmt])
        if fmt == "prompt_answer" and answer_field:
            cols = f"prompt+{answer_field}"
        if fmt == "verl":
            cols = "prompt+reward_model.ground_truth (verl)"
        parts.append(cols)
    return " or ".join(parts)


def _text_ok(value: Any) -> bool:
    return isinstance(value, str | list) and len(value) > 0


def _label(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if not isinstance(value, str | int | float):
        return None
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    return None


@dataclass
class DataInfo:
    """What was recognised in a dataset: shown by `rlctl plan` and `rlctl train`."""

    role: str
    source: str
    format: str
    rows: int
    notes: list[str] = field(default_factory=list)
    where: Callable[[int], str] | None = field(default=None, repr=False)  # file and line of row i, rows 1:1
    base: Path | None = None  # the folder image paths are relative to (the data file's); None: a Hub dataset

    def row(self, i: int) -> str:
        """Where row i of the recognised rows was read: file and line, when rows map one to one to the file's."""
        return self.where(i) if self.where else f"row {i + 1} of {self.source} as read for {self.role}"

    def describe(self) -> str:
        text = f"{self.format} ({FORMATS[self.format][0]})" if self.format in FORMATS else self.format
        return f"{self.rows} rows, {text}" + "".join(f"; {n}" for n in self.notes)


def _validate(table: Table, role: str, fmt: str, answer_field: str | None) -> None:
    need = list(FORMAT_COLUMNS[fmt])
    if fmt == "prompt_answer" and answer_field:
        need.append(answer_field)
    text_cols = [c for c in FORMAT_COLUMNS[fmt] if c not in ("label", "reward_model")]
    for i, row in enumerate(table.rows):
        missing = [c for c in need if c not in row]
        if fmt == "verl" and get_path(row, "reward_model.ground_truth")[1] in (None, "", []):
            missing.append("reward_model.ground_truth")
        if missing:
            raise UserError(f"{table.where(i)} lacks column(s) {', '.join(missing)} needed for {role} data.")
        bad = [c for c in text_cols if not _text_ok(row[c])]
        if fmt == "prompt_answer" and answer_field and row[answer_field] in (None, "", []):
            bad.append(answer_field)
        if bad:
            raise UserError(f"{table.where(i)}: column(s) {', '.join(bad)} must be non-empty text.")
        if fmt == "kto" and _label(row["label"]) is None:
            raise UserError(
                f"{table.where(i)}: column label must be true or false (desirable or not), got {row['label']!r}."
            )


def _from_bigbench(row: dict[str, Any], role: str, answer_field: str) -> dict[str, Any]:
    target = row["target"]
    if role == "sft":
        return {"prompt": row["input"], "completion": target[0] if isinstance(target, list) else target}
    return {"prompt": row["input"], answer_field: target}


def _user(value: Any) -> Any:
    return [{"role": "user", "content": value}] if isinstance(value, str) else value


def _assistant(value: Any) -> Any:
    return [{"role": "assistant", "content": value}] if isinstance(value, str) else value


def _harmonised(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with prompt and replies in one form, as TRL's trainers need them: a text reply (completion, chosen,
    rejected) to a message-list prompt becomes an assistant message, a text prompt to message-list replies a
    user message."""
    replies = [k for k in ("completion", "chosen", "rejected") if k in row]
    if "prompt" not in row or not replies:
        return row
    conversational = [isinstance(row[k], list) for k in ("prompt", *replies)]
    if all(conversational) or not any(conversational):
        return row
    return {**row, "prompt": _user(row["prompt"]), **{k: _assistant(row[k]) for k in replies}}


def conversational(rows: list[dict[str, Any]]) -> bool:
    """Whether any row holds message lists (so the tokenizer needs a chat template)."""
    keys = ("messages", "prompt", "completion", "chosen", "rejected")
    return any(isinstance(row.get(k), list) for row in rows for k in keys)


def _pair_kto(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Preference pairs from unpaired KTO rows: per prompt, desirable and undesirable completions zipped in
    order. Returns (pairs, rows left without a partner)."""
    by_prompt: dict[str, tuple[list, list]] = {}
    firsts: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = json.dumps(row["prompt"], sort_keys=True) + repr(row.get("images"))  # a prompt and its images
        firsts.setdefault(key, row)
        by_prompt.setdefault(key, ([], []))[0 if _label(row["label"]) else 1].append(row["completion"])
    pairs = []
    for key, (good, bad) in by_prompt.items():
        first = firsts[key]
        pairs += [
            {"prompt": first["prompt"], "chosen": g, "rejected": b, **_images_of(first)}
            for g, b in zip(good, bad, strict=False)
        ]
    return pairs, len(rows) - 2 * len(pairs)


def _images_of(row: dict[str, Any]) -> dict[str, Any]:
    """The row's `images`, carried into the rows made from it (nothing for a row of a dataset without images)."""
    return {"images": row["images"]} if "images" in row else {}


def _shared_start(chosen: Any, rejected: Any) -> tuple[Any, Any, Any]:
    """(prompt, chosen reply, rejected reply) of an implicit-prompt pair: the prompt is the longest shared start
    (whole messages of message lists; text up to the first difference, a space before it left to the replies)."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if isinstance(chosen, str) and n and chosen[n - 1] == " ":
        n -= 1
    return chosen[:n], chosen[n:], rejected[n:]


def _unpair(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """KTO rows from preference pairs: chosen desirable, rejected undesirable (implicit prompts split off)."""
    out = []
    for row in rows:
        if "prompt" in row:
            prompt, chosen, rejected = row["prompt"], row["chosen"], row["rejected"]
        else:
            prompt, chosen, rejected = _shared_start(row["chosen"], row["rejected"])
        out.append({"prompt": prompt, "completion": chosen, "label": True, **_images_of(row)})
        out.append({"prompt": prompt, "completion": rejected, "label": False, **_images_of(row)})
    return out


def normalise(table: Table, role: str, answer_field: str | None = None) -> tuple[list[dict[str, Any]], DataInfo]:
    """Recognise the format of `table` for `role`, validate every row, and return rows in the role's layout."""
    if role not in ROLE_FORMATS:
        raise ValueError(f"unknown data role {role!r}")
    first = table.rows[0]
    fmt = detect(first, role)
    if fmt is None:
        raise UserError(
            f"{table.where(0)} has columns {sorted(first)}, but {role} data needs {_want(role, answer_field)}. "
            f"Rename the columns, map them in the config (data.columns for every stage, e.g. --set "
            f"data.columns.prompt=question, or one stage's own: sft.columns, rm.columns, rl.columns), "
            f"or point data.{role} at another file."
        )
    _validate(table, role, fmt, answer_field)
    rows, notes, where = table.rows, [], table.where
    if fmt == "bigbench":
        rows = [_from_bigbench(r, role, answer_field or "answer") for r in rows]
        notes.append("BIG-bench input -> prompt, target -> " + ("completion" if role == "sft" else "ground truth"))
    if images.has_images(rows):
        rows = images.canonical(rows, where)
        notes.append(
            f"{sum(1 for r in rows if r['images'])} rows with images (message contents as text and image parts)"
        )
    elif any(c in r for r in rows for c in images.IMAGE_COLUMNS):  # `images: []` of text rows: no images at all
        rows = [{k: v for k, v in r.items() if k not in images.IMAGE_COLUMNS} for r in rows]
        notes.append("empty images column left out (no row has an image)")
    wrapped = [_harmonised(r) for r in rows]
    if wrapped != rows:
        rows = wrapped
        notes.append("text replies next to message-list prompts taken as assistant messages (and vice versa)")
    if fmt == "verl":
        key = answer_field or "answer"
        rows = [{**r, key: r["reward_model"]["ground_truth"]} if key not in r else r for r in rows]
        notes.append(f"ground truth reward_model.ground_truth -> {key}")
    elif fmt == "kto":
        for r in rows:
            r["label"] = _label(r["label"])
        if role == "preference":
            rows, unpaired = _pair_kto(rows)
            if not rows:
                raise UserError(
                    f"{table.source}: KTO data has no prompt with both a desirable and an undesirable completion, "
                    "so no preference pairs can be formed for the reward model / DPO; use the kto stage."
                )
            notes.append(f"paired into {len(rows)} chosen/rejected pairs ({unpaired} rows without a partner)")
            where = None
        elif role == "sft":
            kept = [{"prompt": r["prompt"], "completion": r["completion"], **_images_of(r)} for r in rows if r["label"]]
            if not kept:
                raise UserError(f"{table.source}: KTO data has no desirable (label true) rows to fine-tune on.")
            notes.append(f"{len(kept)} desirable rows kept for SFT")
            rows, where = kept, None
    elif role == "kto" and fmt in ("preference", "preference_implicit"):
        rows, where = _unpair(rows), None
        notes.append(f"unpaired into {len(rows)} rows")
    info = DataInfo(role, table.source, fmt, len(rows), notes, where)
    answer = (answer_field or "answer") if role in ("rl", "eval") else None
    return kinds.normalise(rows, info.row, answer), info


def load(
    spec: str | Path,
    role: str,
    answer_field: str | None = None,
    columns: dict[str, str] | None = None,
    encoding: str = DEFAULT_ENCODING,
) -> tuple[list[dict[str, Any]], DataInfo]:
    """(rows, what was recognised) of the dataset `spec` for `role`."""
    table = read(spec, role, encoding)
    if columns:
        table = Table([map_columns(r, columns) for r in table.rows], table.where, table.source)
    rows, info = normalise(table, role, answer_field)
    info.base = parse_source(spec, role).folder
    return rows, info


def check(
    path: str | Path,
    role: str,
    answer_field: str | None = None,
    columns: dict[str, str] | None = None,
    encoding: str = DEFAULT_ENCODING,
) -> list[dict[str, Any]]:
    """Rows of the dataset at `path` (any supported source), checked for the columns its role needs (and the
    answer column for rl/eval), in the layout the role's trainer expects."""
    return load(path, role, answer_field if role in ("rl", "eval") else None, columns, encoding)[0]


PEEK_ABOVE_BYTES = 32 * 2**20  # larger local files are only sampled by `rlctl plan`


def describe(
    spec: str | Path,
    role: str,
    answer_field: str | None = None,
    columns: dict[str, str] | None = None,
    encoding: str = DEFAULT_ENCODING,
) -> DataInfo:
    """What `spec` holds for `role`, for the plan. Hub datasets are not downloaded here, and files over
    PEEK_ABOVE_BYTES are judged by their first rows (every row is checked when training starts)."""
    return sample(spec, role, answer_field, columns, encoding)[1]


def sample(
    spec: str | Path,
    role: str,
    answer_field: str | None = None,
    columns: dict[str, str] | None = None,
    encoding: str = DEFAULT_ENCODING,
) -> tuple[list[dict[str, Any]], DataInfo]:
    """(rows, what was recognised) as `describe` sees them: every row of a small file, the first PEEK_ROWS of a
    large one, none of a Hub dataset."""
    source = parse_source(spec, role)
    if source.kind == "hub":
        return [], DataInfo(role, str(source), "hub", 0, ["downloaded and checked when training starts"])
    answer = answer_field if role in ("rl", "eval") else None
    peeked = peek(source, PEEK_ABOVE_BYTES, encoding) if source.kind != "disk" and source.kind != "folder" else None
    if peeked is None:
        return load(spec, role, answer, columns, encoding)
    table, total = peeked
    if columns:
        table = Table([map_columns(r, columns) for r in table.rows], table.where, table.source)
    rows, info = normalise(table, role, answer)
    info.rows, info.base = total, source.folder
    info.notes.append(f"first {len(table.rows)} rows checked; all of them when training starts")
    return rows, info


def each_row(fn: Callable[[Any], Any], items: Sequence[Any], start: int = 0) -> list[Any]:
    """fn of every item (a row); a failure becomes a RowFailure naming the item's place (`start` + its index)."""
    out = []
    for i, item in enumerate(items):
        try:
            out.append(fn(item))
        except Exception as e:
            if is_out_of_memory(e):
                raise
            raise RowFailure(start + i, e) from e
    return out


PREFERENCE_HOLDOUT = 0.1  # the fraction of preference pairs the rm, dpo and kto stages hold out (and epochs skip)


def holdout(rows: list[dict[str, Any]], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) split of `rows`, the same for the same seed; at least one row on each side."""
    held = set(held_out(len(rows), fraction, seed))
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def held_out(n: int, fraction: float, seed: int) -> list[int]:
    """The places, in order, of the rows `holdout` holds out of n."""
    import random

    order = list(range(n))
    random.Random(seed).shuffle(order)
    return sorted(order[: min(max(1, int(n * fraction)), n - 1)])


def texts(rows: list[dict[str, Any]]) -> list[str]:
    """Every string in `rows`, nested values (chat messages, verl's fields) included, in order."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for row in rows:
        for column, value in row.items():
            if column not in images.IMAGE_COLUMNS:  # image paths and bytes are not text
                walk(value)
    return out

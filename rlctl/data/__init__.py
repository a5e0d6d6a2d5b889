"""Datasets: read, recognise and validate them before anything starts (errors name the file and line or row).

Sources (`data.sft`, `data.preference`, `data.rl`, `data.eval`, `rlctl eval --data`):

- local files: `.jsonl` (`.ndjson`), `.json` (an array of objects, or jsonl), `.parquet`, `.csv` / `.tsv`;
- local folders: written by `datasets.save_to_disk` (a Dataset, or a DatasetDict: pick the split with
  `folder@test`), or holding data files of one of the types above (read in name order);
- Hugging Face Hub datasets: `hf://owner/name`, or `owner/name` when no such local path exists, with an
  optional config and split: `openai/gsm8k:main@test` (default split: train; test for eval data).

Formats are recognised from the columns (see FORMATS) and rows come back as plain dicts in the layout the
stages and TRL expect; verl's parquet layout is read as is, its `reward_model.ground_truth` copied into the
answer column. `data.columns` maps differently named columns (dotted paths reach into nested ones).

Package `rlctl.data`: reading and recognising datasets (this module) and the built-in synthetic tasks
(`tasks`).
May import: base, config.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.errors import UserError

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
}
ROLE_FORMATS: dict[str, tuple[str, ...]] = {
    "sft": ("messages", "kto", "prompt_completion", "text"),
    "preference": ("preference", "preference_implicit", "kto"),
    "kto": ("kto", "preference", "preference_implicit"),
    "rl": ("verl", "prompt_answer"),
    "eval": ("verl", "prompt_answer"),
}
FILE_TYPES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
}
HUB_PREFIX = "hf://"
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+)?(@[\w.:%\[\]+-]+)?$")
_TRUE = {True, "1", "true", "True", "TRUE", "yes", "desirable"}
_FALSE = {False, "0", "false", "False", "FALSE", "no", "undesirable"}


# --------------------------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class Source:
    """Where a dataset comes from: a local file or folder, or a Hub dataset (name, config, split)."""

    kind: str  # jsonl | json | parquet | csv | disk | folder | hub
    path: Path | None = None
    name: str = ""
    config: str | None = None
    split: str | None = None

    def __str__(self) -> str:
        if self.kind == "hub":
            return (
                f"{HUB_PREFIX}{self.name}"
                + (f":{self.config}" if self.config else "")
                + (f"@{self.split}" if self.split else "")
            )
        return str(self.path) + (f"@{self.split}" if self.split else "")


def _hub_prefixed(text: str) -> str | None:
    """The name after an `hf://` prefix (also as `hf:/`, the way a Path writes it), or None without one."""
    match = re.match(r"^hf:/*", text)
    return text[match.end() :] if match else None


def is_hub(spec: str | Path) -> bool:
    """Whether `spec` names a Hub dataset rather than a local path."""
    text = str(spec)
    if _hub_prefixed(text) is not None:
        return True
    if Path(text).exists() or text.startswith((".", "/", "~")):
        return False
    base = text.split("@", 1)[0]
    if Path(base).exists() or Path(base).suffix in FILE_TYPES:
        return False
    return bool(_HUB_NAME.match(text))


def parse_source(spec: str | Path, role: str = "rl") -> Source:
    """The Source that a data setting names (see the module docstring for the forms)."""
    text = str(spec)
    if is_hub(text):
        rest = _hub_prefixed(text)
        rest = text if rest is None else rest
        rest, _, split = rest.partition("@")
        name, _, config = rest.partition(":")
        if not name:
            raise UserError(f"Empty Hub dataset name in '{text}'; write hf://owner/name[:config][@split].")
        return Source("hub", name=name, config=config or None, split=split or None)
    path, split = Path(text), None
    if not path.exists() and "@" in path.name:
        base, _, split = text.rpartition("@")
        if Path(base).is_dir():
            path = Path(base)
        else:
            split = None
    if not path.exists():
        raise UserError(f"Dataset file not found: {path}.")
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return Source("disk", path=path, split=split)
        return Source("folder", path=path)
    kind = FILE_TYPES.get(path.suffix.lower())
    if kind is None:
        raise UserError(
            f"Unsupported dataset file type '{path.suffix or path.name}' for {path}; "
            f"use one of {', '.join(sorted(FILE_TYPES))}, a folder saved with datasets' save_to_disk, "
            "or a Hub dataset name."
        )
    return Source(kind, path=path)


def absolute(spec: str) -> str:
    """`spec` with a local path made absolute (so a run can resume from any folder); Hub names unchanged."""
    if is_hub(spec):
        return spec
    path = Path(spec)
    if not path.exists() and "@" in path.name:
        base, _, split = spec.rpartition("@")
        if Path(base).is_dir():
            return f"{Path(base).resolve()}@{split}"
    return str(path.resolve())


@dataclass
class Table:
    """Rows of a dataset with a way to name each row's place for error messages."""

    rows: list[dict[str, Any]]
    where: Callable[[int], str]
    source: str


def _json_row(path: Path, n: int, line: str) -> dict[str, Any]:
    """Line `n` of a jsonl file as a row; a UserError naming file:line when it is not a JSON object."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"Malformed JSON in {path}:{n}: {e.msg} (column {e.colno}).") from None
    if not isinstance(row, dict):
        raise UserError(f"{path}:{n} must be a JSON object, not {type(row).__name__}.")
    return row


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) pairs of a jsonl file; a UserError naming file:line for a malformed line."""
    if not path.is_file():
        raise UserError(f"Dataset file not found: {path}.")
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            rows.append((n, _json_row(path, n, line)))
    return rows


def _jsonl(path: Path) -> Table:
    pairs = read_jsonl(path)
    lines = [n for n, _ in pairs]
    return Table([r for _, r in pairs], lambda i: f"{path}:{lines[i]}", str(path))


def _json(path: Path) -> Table:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if text.lstrip().startswith("{") and e.msg == "Extra data":
            return _jsonl(path)  # jsonl content in a .json file
        raise UserError(f"Malformed JSON in {path}:{e.lineno}: {e.msg} (column {e.colno}).") from None
    if isinstance(data, dict):  # {"data": [...]} or {"train": [...]}: the single list of rows inside
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise UserError(f"{path} must hold a JSON array of objects (or one object wrapping such an array).")
        data = lists[0]
    if not isinstance(data, list):
        raise UserError(f"{path} must hold a JSON array of objects, not {type(data).__name__}.")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise UserError(f"{path} row {i + 1} must be a JSON object, not {type(row).__name__}.")
    return Table(data, lambda i: f"{path} row {i + 1}", str(path))


def _cell(value: str) -> Any:
    """A CSV cell: JSON lists and objects (e.g. chat messages) decoded, everything else kept as text."""
    stripped = value.strip()
    if stripped[:1] in "[{":
        try:
            return json.loads(stripped)
        except json.JSONDecodeError:
            return value
    return value


def _csv(path: Path) -> Table:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    rows, lines = [], []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        try:
            for row in reader:
                if None in row:
                    raise UserError(
                        f"{path}:{reader.line_num} has more cells than the header's {len(reader.fieldnames or [])}."
                    )
                rows.append({k: _cell(v) if isinstance(v, str) else v for k, v in row.items()})
                lines.append(reader.line_num)
        except csv.Error as e:
            raise UserError(f"Malformed CSV in {path}:{reader.line_num}: {e}.") from None
    return Table(rows, lambda i: f"{path}:{lines[i]}", str(path))


def _arrow_rows(table) -> list[dict[str, Any]]:
    return table.to_pylist()


def _parquet(path: Path) -> Table:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:
        raise UserError(f"Cannot read parquet file {path}: {e}.") from None
    return Table(_arrow_rows(table), lambda i: f"{path} row {i + 1}", str(path))


def _disk(source: Source, role: str) -> Table:
    """A folder written by `datasets.save_to_disk`: the Arrow files listed in its state.json."""
    import pyarrow as pa

    folder = source.path
    if (folder / "dataset_dict.json").is_file():
        splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        split = source.split or _default_split(splits, role)
        if split not in splits:
            raise UserError(
                f"{folder} has no split '{split}'; it has {', '.join(splits)} (pick one as {folder}@SPLIT)."
            )
        folder = folder / split
    state = json.loads((folder / "state.json").read_text())
    tables = []
    for entry in state["_data_files"]:
        with pa.memory_map(str(folder / entry["filename"])) as mm:
            tables.append(pa.ipc.open_stream(mm).read_all())
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    return Table(_arrow_rows(table), lambda i: f"{folder} row {i + 1}", str(folder))


def _folder(path: Path) -> Table:
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in FILE_TYPES)
    if not files:
        raise UserError(
            f"Dataset folder {path} holds no data files ({', '.join(sorted(FILE_TYPES))}) and was not written "
            "by datasets' save_to_disk."
        )
    kinds = {FILE_TYPES[p.suffix.lower()] for p in files}
    if len(kinds) > 1:
        raise UserError(f"Dataset folder {path} mixes file types ({', '.join(sorted(kinds))}); keep one type.")
    parts = [_read_file(Source(FILE_TYPES[p.suffix.lower()], path=p)) for p in files]
    if len(parts) == 1:
        return parts[0]
    rows, offsets = [], []
    for part in parts:
        offsets.append(len(rows))
        rows.extend(part.rows)

    def where(i: int) -> str:
        k = max(j for j, start in enumerate(offsets) if start <= i)
        return parts[k].where(i - offsets[k])

    return Table(rows, where, str(path))


def _read_file(source: Source) -> Table:
    return {"jsonl": _jsonl, "json": _json, "parquet": _parquet, "csv": _csv}[source.kind](source.path)


def _default_split(splits: list[str], role: str) -> str:
    order = ("test", "validation", "train") if role == "eval" else ("train",)
    return next((s for s in order if s in splits), splits[0])


def _hub(source: Source, role: str) -> Table:
    """A Hub dataset through `datasets.load_dataset` (cached under HF_HOME; honours HF_ENDPOINT, HF_TOKEN)."""
    import datasets

    label = str(source)
    try:
        if source.split:
            ds = datasets.load_dataset(source.name, source.config, split=source.split)
        else:
            dd = datasets.load_dataset(source.name, source.config)
            split = _default_split(list(dd), role)
            ds = dd[split]
            label = str(Source("hub", name=source.name, config=source.config, split=split))
    except Exception as e:  # not found, gated, offline, bad config or split: all the user's to fix
        raise UserError(
            f"Cannot load Hub dataset '{source.name}'"
            + (f" (config {source.config})" if source.config else "")
            + (f", split {source.split}" if source.split else "")
            + f": {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. Check the name, config and split "
            "on the Hub page, your network, and `rlctl doctor` for the Hub login."
        ) from None
    return Table(ds.to_list(), lambda i: f"{label} row {i + 1}", label)


def read(spec: str | Path, role: str = "rl") -> Table:
    """Every row of a dataset, whatever its source."""
    source = parse_source(spec, role)
    if source.kind == "hub":
        table = _hub(source, role)
    elif source.kind == "disk":
        table = _disk(source, role)
    elif source.kind == "folder":
        table = _folder(source.path)
    else:
        table = _read_file(source)
    if not table.rows:
        raise UserError(f"Dataset {table.source} is empty.")
    return table


# ------------------------------------------------------------------------------------- formats and rows
def get_path(row: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    """(found, value) of `a.b.c` inside nested dicts."""
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


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


# The last dataset recognised for each role in this process (what `rlctl train` reports after validating).
RECOGNISED: dict[str, DataInfo] = {}


@dataclass
class DataInfo:
    """What was recognised in a dataset: shown by `rlctl plan` and `rlctl train`."""

    role: str
    source: str
    format: str
    rows: int
    notes: list[str] = field(default_factory=list)

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


def _pair_kto(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Preference pairs from unpaired KTO rows: per prompt, desirable and undesirable completions zipped in
    order. Returns (pairs, rows left without a partner)."""
    by_prompt: dict[str, tuple[list, list]] = {}
    prompts: dict[str, Any] = {}
    for row in rows:
        key = json.dumps(row["prompt"], sort_keys=True)
        prompts.setdefault(key, row["prompt"])
        by_prompt.setdefault(key, ([], []))[0 if _label(row["label"]) else 1].append(row["completion"])
    pairs = []
    for key, (good, bad) in by_prompt.items():
        pairs += [{"prompt": prompts[key], "chosen": g, "rejected": b} for g, b in zip(good, bad, strict=False)]
    return pairs, len(rows) - 2 * len(pairs)


def _unpair(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """KTO rows from preference pairs: chosen desirable, rejected undesirable."""
    out = []
    for row in rows:
        prompt = row.get("prompt", "")
        out.append({"prompt": prompt, "completion": row["chosen"], "label": True})
        out.append({"prompt": prompt, "completion": row["rejected"], "label": False})
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
            f"Rename the columns, map them in the config (data.columns, e.g. --set data.columns.prompt=question), "
            f"or point data.{role} at another file."
        )
    _validate(table, role, fmt, answer_field)
    rows, notes = table.rows, []
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
        elif role == "sft":
            kept = [{"prompt": r["prompt"], "completion": r["completion"]} for r in rows if r["label"]]
            if not kept:
                raise UserError(f"{table.source}: KTO data has no desirable (label true) rows to fine-tune on.")
            notes.append(f"{len(kept)} desirable rows kept for SFT")
            rows = kept
    elif role == "kto" and fmt in ("preference", "preference_implicit"):
        rows = _unpair(rows)
        notes.append(f"unpaired into {len(rows)} rows")
    return rows, DataInfo(role, table.source, fmt, len(rows), notes)


def load(
    spec: str | Path, role: str, answer_field: str | None = None, columns: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], DataInfo]:
    """(rows, what was recognised) of the dataset `spec` for `role`."""
    table = read(spec, role)
    if columns:
        table = Table([map_columns(r, columns) for r in table.rows], table.where, table.source)
    rows, info = normalise(table, role, answer_field)
    RECOGNISED[role] = info
    return rows, info


def check(
    path: str | Path, role: str, answer_field: str | None = None, columns: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Rows of the dataset at `path` (any supported source), checked for the columns its role needs (and the
    answer column for rl/eval), in the layout the role's trainer expects."""
    return load(path, role, answer_field if role in ("rl", "eval") else None, columns)[0]


PEEK_ROWS = 50
PEEK_ABOVE_BYTES = 32 * 2**20  # larger local files are only sampled by `rlctl plan`


def _peek(source: Source) -> tuple[Table, int] | None:
    """(the first PEEK_ROWS rows, the total row count) of a large jsonl, csv or parquet file; None otherwise."""
    path = source.path
    if source.kind not in ("jsonl", "csv", "parquet") or path.stat().st_size < PEEK_ABOVE_BYTES:
        return None
    if source.kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        first = next(pf.iter_batches(batch_size=PEEK_ROWS)).to_pylist()
        return Table(first, lambda i: f"{path} row {i + 1}", str(path)), pf.metadata.num_rows
    if source.kind == "csv":
        table = _csv_head(path, PEEK_ROWS)
        with path.open("rb") as f:
            total = max(0, sum(1 for line in f if line.strip()) - 1)  # lines, not records: an estimate
        return table, total
    rows, lines, total = [], [], 0
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            total += 1
            if len(rows) < PEEK_ROWS:
                rows.append(_json_row(path, n, line))
                lines.append(n)
    if not rows:
        raise UserError(f"Dataset {path} is empty.")
    return Table(rows, lambda i: f"{path}:{lines[i]}", str(path)), total


def _csv_head(path: Path, n: int) -> Table:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    rows, lines = [], []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        for row in reader:
            rows.append({k: _cell(v) if isinstance(v, str) else v for k, v in row.items()})
            lines.append(reader.line_num)
            if len(rows) >= n:
                break
    if not rows:
        raise UserError(f"Dataset {path} is empty.")
    return Table(rows, lambda i: f"{path}:{lines[i]}", str(path))


def describe(
    spec: str | Path, role: str, answer_field: str | None = None, columns: dict[str, str] | None = None
) -> DataInfo:
    """What `spec` holds for `role`, for the plan. Hub datasets are not downloaded here, and files over
    PEEK_ABOVE_BYTES are judged by their first rows (every row is checked when training starts)."""
    source = parse_source(spec, role)
    if source.kind == "hub":
        return DataInfo(role, str(source), "hub", 0, ["downloaded and checked when training starts"])
    answer = answer_field if role in ("rl", "eval") else None
    peeked = _peek(source)
    if peeked is None:
        return load(spec, role, answer, columns)[1]
    table, total = peeked
    if columns:
        table = Table([map_columns(r, columns) for r in table.rows], table.where, table.source)
    _, info = normalise(table, role, answer)
    info.rows = total
    info.notes.append(f"first {len(table.rows)} rows checked; all of them when training starts")
    return info


def holdout(rows: list[dict[str, Any]], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) split of `rows`, the same for the same seed; at least one row on each side."""
    import random

    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_held = min(max(1, int(len(rows) * fraction)), len(rows) - 1)
    held = set(order[:n_held])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


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
        for value in row.values():
            walk(value)
    return out

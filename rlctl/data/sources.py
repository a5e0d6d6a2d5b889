"""Where a dataset comes from and how its rows are had: local files and folders, `datasets.save_to_disk` folders,
Hugging Face Hub datasets; and the quick look at large files that `rlctl plan` takes.

Sources (`data.sft`, `data.preference`, `data.rl`, `data.eval`, `rlctl eval --data`):

- local files: `.jsonl` (`.ndjson`), `.json` (an array of objects, jsonl, or a BIG-bench task.json), `.parquet`,
  `.csv` / `.tsv`;
- local folders: written by `datasets.save_to_disk` (a Dataset, or a DatasetDict: pick the split with
  `folder@test`), or holding data files of one of the types above (read in name order);
- Hugging Face Hub datasets: `hf://owner/name`, or `owner/name` when no such local path exists, with an
  optional config and split: `openai/gsm8k:main@test` (default split: train; test for eval data).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from rlctl.data.files import (
    BOMS,
    DEFAULT_ENCODING,
    FILE_TYPES,
    Table,
    binary_lines,
    csv_rows,
    json_row,
    read_file,
)
from rlctl.errors import UserError

HUB_PREFIX = "hf://"
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+)?(@[\w.:%\[\]+-]+)?$")


@dataclass(frozen=True)
class Source:
    """Where a dataset comes from: a local file or folder, or a Hub dataset (name, config, split)."""

    kind: str  # jsonl | json | parquet | csv | disk | folder | hub
    path: Path | None = None
    name: str = ""
    config: str | None = None
    split: str | None = None

    @property
    def folder(self) -> Path | None:
        """The folder a row's relative image paths start from: the data file's, or the dataset folder; None for a
        Hub dataset (its images come as bytes)."""
        if self.path is None:
            return None
        return self.path if self.kind in ("disk", "folder") else self.path.parent

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


def _default_split(splits: list[str], role: str) -> str:
    order = ("test", "validation", "train") if role == "eval" else ("train",)
    return next((s for s in order if s in splits), splits[0])


def _disk(source: Source, role: str) -> Table:
    """A folder written by `datasets.save_to_disk`: the Arrow files listed in its state.json; a UserError naming
    the folder when its records or Arrow files are damaged (cut short, edited, missing)."""
    try:
        return _disk_table(source, role)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:  # pyarrow's ArrowInvalid is a ValueError
        what = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}".rstrip(": .")
        raise UserError(
            f"{source.path} looks like a datasets save_to_disk folder but cannot be read ({what}). Save it again "
            "with save_to_disk, or export the rows to a .jsonl file."
        ) from None


def _disk_table(source: Source, role: str) -> Table:
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
    return Table(table.to_pylist(), lambda i: f"{folder} row {i + 1}", str(folder))


def _folder(path: Path, encoding: str) -> Table:
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in FILE_TYPES)
    if not files:
        raise UserError(
            f"Dataset folder {path} holds no data files ({', '.join(sorted(FILE_TYPES))}) and was not written "
            "by datasets' save_to_disk."
        )
    kinds = {FILE_TYPES[p.suffix.lower()] for p in files}
    if len(kinds) > 1:
        raise UserError(f"Dataset folder {path} mixes file types ({', '.join(sorted(kinds))}); keep one type.")
    parts = [read_file(FILE_TYPES[p.suffix.lower()], p, encoding) for p in files]
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


def read(spec: str | Path, role: str = "rl", encoding: str = DEFAULT_ENCODING) -> Table:
    """Every row of a dataset, whatever its source."""
    source = parse_source(spec, role)
    if source.kind == "hub":
        table = _hub(source, role)
    elif source.kind == "disk":
        table = _disk(source, role)
    elif source.kind == "folder":
        table = _folder(source.path, encoding)
    else:
        table = read_file(source.kind, source.path, encoding)
    if not table.rows:
        raise UserError(f"Dataset {table.source} is empty.")
    return table


PEEK_ROWS = 50


def _wide_bom(path: Path) -> bool:
    """Whether `path` starts with a UTF-16/32 byte-order mark (such files are not read line by line)."""
    with path.open("rb") as f:
        head = f.read(4)
    return any(head.startswith(bom) for bom, name in BOMS if name != "utf-8-sig")


def peek(source: Source, above_bytes: int, encoding: str = DEFAULT_ENCODING) -> tuple[Table, int] | None:
    """(the first PEEK_ROWS rows, the total row count) of a jsonl, csv or parquet file of `above_bytes` or more;
    None for other sources."""
    path = source.path
    if source.kind not in ("jsonl", "csv", "parquet") or path.stat().st_size < above_bytes:
        return None
    if source.kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        first = next(pf.iter_batches(batch_size=PEEK_ROWS)).to_pylist()
        return Table(first, lambda i: f"{path} row {i + 1}", str(path)), pf.metadata.num_rows
    if _wide_bom(path):
        return None
    head, total = [], 0
    for n, line in binary_lines(path, encoding):
        if line.strip():
            total += 1
            if len(head) < PEEK_ROWS + 1:
                head.append((n, line))
    if not head:
        raise UserError(f"Dataset {path} is empty.")
    if source.kind == "csv":  # lines, not records: the count is an estimate
        table = csv_rows(path, "".join(line for _, line in head), PEEK_ROWS)
        return table, max(0, total - 1)
    lines = [n for n, _ in head[:PEEK_ROWS]]
    rows = [json_row(path, n, line) for n, line in head[:PEEK_ROWS]]
    return Table(rows, lambda i: f"{path}:{lines[i]}", str(path)), total

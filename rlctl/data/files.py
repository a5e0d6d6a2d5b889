"""Reading one local data file into rows: `.jsonl` (`.ndjson`), `.json`, `.csv` / `.tsv`, `.parquet`.

Text files are decoded as `data.encoding` says (default UTF-8; a byte-order mark is honoured: UTF-8's is dropped,
UTF-16/32 ones decode the file). Bytes that do not decode stop with a UserError naming the file, line and byte
offset, the encoding the bytes look like, and the fix (`data.encoding`, or an `iconv` line); never a
UnicodeDecodeError. Errors name the file and line (or row) at fault.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.errors import UserError

FILE_TYPES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
}
DEFAULT_ENCODING = "utf-8"
BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
# Encodings tried, in order, to name what undecodable bytes probably are.
LIKELY = (("cp1252", "Windows-1252, Excel/Notepad on Western European Windows"), ("latin-1", "ISO-8859-1"))


@dataclass
class Table:
    """Rows of a dataset with a way to name each row's place for error messages."""

    rows: list[dict[str, Any]]
    where: Callable[[int], str]
    source: str


def _codec(raw: bytes, encoding: str) -> str:
    """The codec to decode `raw` with: a byte-order mark wins over UTF-8 (the default), else `encoding`."""
    if codecs.lookup(encoding).name != "utf-8":
        return encoding
    return next((name for bom, name in BOMS if raw.startswith(bom)), DEFAULT_ENCODING)


def _guess(chunk: bytes) -> tuple[str, str]:
    """(codec, label) the undecodable `chunk` most likely is in."""
    if chunk.count(b"\x00") > len(chunk) // 4:
        return "utf-16", "UTF-16 without a byte-order mark"
    for name, label in LIKELY:
        try:
            chunk.decode(name)
        except UnicodeDecodeError:
            continue
        return name, label
    return "latin-1", "ISO-8859-1"


def decode_error(
    path: Path, raw: bytes, error: UnicodeDecodeError, codec: str, line_offset: int = 0, byte_offset: int = 0
) -> UserError:
    """The one-paragraph explanation of bytes in `path` that `codec` cannot decode (`raw` starting at line
    `line_offset` + 1, byte `byte_offset` of the file)."""
    start = error.start
    line = line_offset + raw[:start].count(b"\n") + 1
    bad = raw[start : start + 4]
    line_start = raw.rfind(b"\n", 0, start) + 1
    guess, label = _guess(raw[max(0, start - 2000) : start + 2000])
    context = raw[line_start : start + 12].decode(guess, errors="replace").strip()[-60:]
    shown = codec.replace("-sig", "")
    converted = path.with_name(path.stem + ".utf8" + path.suffix)
    return UserError(
        f"{path}:{line} (byte {byte_offset + start}) is not valid {shown}: bytes {bad.hex(' ')} (near {context!r}). "
        f"The file looks like {guess} ({label}). Read it as such with data.encoding: {guess} "
        f"(--set data.encoding={guess}), or convert it once: iconv -f {guess} -t utf-8 {path} > {converted}."
    )


def read_text(path: Path, encoding: str = DEFAULT_ENCODING) -> str:
    """The text of `path` (see the module docstring for encodings)."""
    if not path.is_file():
        raise UserError(f"Dataset file not found: {path}.")
    raw = path.read_bytes()
    codec = _codec(raw, encoding)
    try:
        text = raw.decode(codec)
    except UnicodeDecodeError as e:
        raise decode_error(path, raw, e, codec) from None
    return text.removeprefix("\ufeff")


def binary_lines(path: Path, encoding: str) -> Iterator[tuple[int, str]]:
    """(line number, decoded line) of a large file, read line by line (UTF-8 or single-byte encodings)."""
    offset = 0
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            codec = _codec(raw, encoding) if n == 1 else encoding
            try:
                yield n, raw.decode(codec).removeprefix("\ufeff")
            except UnicodeDecodeError as e:
                raise decode_error(path, raw, e, codec, n - 1, offset) from None
            offset += len(raw)


def _snippet(text: str, pos: int) -> str:
    return text[max(0, pos - 20) : pos + 20].strip()


# The longest line of a jsonl file read as one row: about a million tokens, past any model's context. A longer one
# is refused before it is parsed (a 20 MB record would take minutes to count in tokens).
ROW_CHARS = 4 << 20


def json_row(path: Path, n: int, line: str) -> dict[str, Any]:
    """Line `n` of a jsonl file as a row; a UserError naming file:line:column when it is not a JSON object, or
    file:line when it is longer than ROW_CHARS."""
    if len(line) > ROW_CHARS:
        raise UserError(
            f"{path}:{n} is a row of {len(line) / 2**20:,.1f} M characters, more than rlctl reads as one row "
            f"({ROW_CHARS >> 20} M, about a million tokens: longer than any model's context). Shorten or drop it."
        )
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(
            f"Malformed JSON in {path}:{n}, column {e.colno}: {e.msg} (near {_snippet(line, e.pos)!r})."
        ) from None
    if not isinstance(row, dict):
        raise UserError(f"{path}:{n} must be a JSON object, not {type(row).__name__}.")
    return row


def _jsonl_text(path: Path, text: str) -> Table:
    pairs = [(n, json_row(path, n, line)) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    lines = [n for n, _ in pairs]
    return Table([r for _, r in pairs], lambda i: f"{path}:{lines[i]}", str(path))


def read_jsonl(path: Path, encoding: str = DEFAULT_ENCODING) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) pairs of a jsonl file; a UserError naming file:line for a malformed line."""
    text = read_text(path, encoding)
    return [(n, json_row(path, n, line)) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _jsonl(path: Path, encoding: str) -> Table:
    text = read_text(path, encoding)
    if text.lstrip().startswith("["):  # a JSON array saved as .jsonl (pretty-printed exports)
        return _json_text(path, text)
    return _jsonl_text(path, text)


def _bigbench(data: dict[str, Any]) -> list[dict[str, Any]] | None:
    """BIG-bench task.json examples as rows {input, target}; `target_scores` become the best-scored targets."""
    examples = data.get("examples")
    if not isinstance(examples, list) or not all(isinstance(e, dict) and "input" in e for e in examples):
        return None
    rows = []
    for e in examples:
        target = e.get("target")
        if target is None and isinstance(e.get("target_scores"), dict):
            best = max(e["target_scores"].values())
            target = [k for k, v in e["target_scores"].items() if v == best]
        rows.append({"input": e["input"], "target": target})
    return rows


def _json_text(path: Path, text: str) -> Table:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if text.lstrip().startswith("{") and e.msg == "Extra data":
            return _jsonl_text(path, text)  # jsonl content in a .json file
        raise UserError(
            f"Malformed JSON in {path}:{e.lineno}, column {e.colno}: {e.msg} (near {_snippet(text, e.pos)!r})."
        ) from None
    if isinstance(data, dict):  # {"data": [...]}, {"train": [...]}, BIG-bench's {"examples": [...], ...}
        rows = _bigbench(data)
        if rows is not None:
            return Table(rows, lambda i: f"{path} examples[{i}]", str(path))
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise UserError(
                f"{path} must hold a JSON array of objects, one object wrapping such an array, or a BIG-bench "
                f"task.json (examples: [{{input, target}}]); it has keys {', '.join(sorted(data)) or 'none'}."
            )
        data = lists[0]
    if not isinstance(data, list):
        raise UserError(f"{path} must hold a JSON array of objects, not {type(data).__name__}.")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise UserError(f"{path} row {i + 1} must be a JSON object, not {type(row).__name__}.")
    return Table(data, lambda i: f"{path} row {i + 1}", str(path))


def _json(path: Path, encoding: str) -> Table:
    return _json_text(path, read_text(path, encoding))


def cell(value: str) -> Any:
    """A CSV cell: JSON lists and objects (e.g. chat messages) decoded, everything else kept as text."""
    stripped = value.strip()
    if stripped[:1] in "[{":
        try:
            return json.loads(stripped)
        except json.JSONDecodeError:
            return value
    return value


def csv_rows(path: Path, text: str, limit: int | None = None) -> Table:
    """The rows of CSV/TSV `text` (at most `limit`), each named by its file line."""
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    rows, lines = [], []
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        for row in reader:
            if None in row:
                raise UserError(
                    f"{path}:{reader.line_num} has more cells than the header's {len(reader.fieldnames or [])}."
                )
            rows.append({k: cell(v) if isinstance(v, str) else v for k, v in row.items()})
            lines.append(reader.line_num)
            if limit is not None and len(rows) >= limit:
                break
    except csv.Error as e:
        raise UserError(f"Malformed CSV in {path}:{reader.line_num}: {e}.") from None
    return Table(rows, lambda i: f"{path}:{lines[i]}", str(path))


def _csv(path: Path, encoding: str) -> Table:
    return csv_rows(path, read_text(path, encoding))


def _parquet(path: Path, encoding: str) -> Table:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:
        raise UserError(f"Cannot read parquet file {path}: {str(e).strip().rstrip('.')}.") from None
    return Table(table.to_pylist(), lambda i: f"{path} row {i + 1}", str(path))


READERS: dict[str, Callable[[Path, str], Table]] = {"jsonl": _jsonl, "json": _json, "parquet": _parquet, "csv": _csv}


def read_file(kind: str, path: Path, encoding: str = DEFAULT_ENCODING) -> Table:
    """Every row of one local file of type `kind` (a value of FILE_TYPES)."""
    return READERS[kind](path, encoding)

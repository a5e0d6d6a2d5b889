"""JSON that strict readers accept: NaN and ±inf, which Python's json writes as bare `NaN`/`Infinity`, are written
as `null`, with what they were under the key `null_reasons` ({key: "nan" | "inf" | "-inf"}) of the same object.
metrics.jsonl, summary.json, checkpoint markers and `rlctl eval` results are written through `dumps`.

Every file of a run rlctl reads back (summary.json, plan.json, checkpoint markers, ...) is read through `read`: a
damaged one is a `DamagedFile` naming the file, the damage and what still works, never a traceback. Files are read
with a size bound (`bounded`): one that is not a regular file (a link to /dev/zero, a pipe) or far larger than
its kind of record can be is refused before it is read, not read until memory runs out."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from rlctl.errors import UserError

REASONS = "null_reasons"


def _reason(value: float) -> str:
    return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"


def clean(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by None; a dict that held one gains `null_reasons`."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        out = {k: clean(v) for k, v in obj.items()}
        reasons = {k: _reason(v) for k, v in obj.items() if isinstance(v, float) and not math.isfinite(v)}
        if reasons:
            out[REASONS] = {**out.get(REASONS, {}), **reasons}
        return out
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps of `clean(obj)`; never writes NaN or Infinity."""
    return json.dumps(clean(obj), allow_nan=False, **kwargs)


def _refuse(name: str) -> Any:
    raise ValueError(f"not strict JSON: {name}")


def loads(text: str) -> Any:
    """json.loads that refuses NaN, Infinity and -Infinity, as strict JSON readers do."""
    return json.loads(text, parse_constant=_refuse)


class DamagedFile(UserError):
    """A run file that cannot be read (cut short, not JSON, not the shape rlctl wrote); exit 2 with one paragraph
    naming the file, the damage and what still works."""

    def __init__(self, path: Path, damage: str, works: str = ""):
        super().__init__(f"{path} is damaged: {damage}. {works}".strip())
        self.path, self.damage = path, damage


_MISSING: Any = object()


def _kind(value: Any) -> str:
    kinds: dict[type, str] = {dict: "a JSON object", list: "a JSON array", str: "a string"}
    return kinds.get(type(value), type(value).__name__)


def damage(text: str, error: json.JSONDecodeError) -> str:
    """What is wrong with JSON `text` that failed to parse, in words."""
    if not text.strip():
        return "it is empty"
    where = f"line {error.lineno}, column {error.colno}"
    if error.pos >= len(text.rstrip()) - 1:
        return f"it ends early, at {where} ({len(text.encode())} bytes): a copy or a write was cut short"
    return f"it is not valid JSON at {where} ({error.msg})"


RECORD_BYTES = 64 * 2**20  # the largest record rlctl reads back (summary.json, markers, plan.json: kilobytes)
LOG_BYTES = 4 * 2**30  # the largest log it reads whole (metrics.jsonl: about 1 kB per logged step)


class TooLarge(ValueError):
    """A file that is not a regular file, or larger than its kind of file can be: the message says which."""


def bounded(path: Path, limit: int = RECORD_BYTES) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them. A TooLarge when it is no regular file (a
    device such as /dev/zero, a pipe, a socket: they never end) or holds more than `limit` bytes; OSError
    (FileNotFoundError, ...) when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a named pipe would block a plain open until written to
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TooLarge(f"it is not a regular file (a device, a pipe or a socket; {_target(path)})")
        if info.st_size > limit:
            raise TooLarge(f"it is {info.st_size:,} bytes, more than such a file can be ({limit:,} at most)")
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew while read
        raise TooLarge(f"it holds more than {limit:,} bytes, more than such a file can be")
    return data


def _target(path: Path) -> str:
    """Where a link leads, in words (or that it is no link)."""
    return f"a link to {os.path.realpath(path)}" if os.path.islink(path) else "not a link"


def lines(path: Path, works: str = "", limit: int = LOG_BYTES) -> list[str]:
    """The lines of a log rlctl appends to (metrics.jsonl), read with a size bound (`bounded`), bytes that are not
    UTF-8 replaced; a DamagedFile naming the file when it cannot be read that way (none when it is missing)."""
    try:
        return bounded(path, limit).decode("utf-8", errors="replace").splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return []
    except TooLarge as e:
        raise DamagedFile(path, str(e), works) from None
    except OSError as e:
        raise DamagedFile(path, f"it cannot be read ({e.strerror or e})", works) from None


def read(path: Path, works: str = "", missing: Any = _MISSING, shape: type = dict, limit: int = RECORD_BYTES) -> Any:
    """The JSON value in `path` (NaN and Infinity of older runs accepted), which must be a `shape`; `missing` when
    the file does not exist and a default is given. Read with a size bound (`bounded`, `limit` bytes). Raises
    DamagedFile (a UserError) naming the file and the damage, followed by `works`: what still works without it."""
    try:
        text = bounded(path, limit).decode("utf-8")
    except (FileNotFoundError, NotADirectoryError):  # a path under a file does not exist either
        if missing is not _MISSING:
            return missing
        raise DamagedFile(path, "it is missing", works) from None
    except TooLarge as e:
        raise DamagedFile(path, str(e), works) from None
    except UnicodeDecodeError as e:
        raise DamagedFile(path, f"it is not text (byte {e.start} is not UTF-8)", works) from None
    except OSError as e:
        raise DamagedFile(path, f"it cannot be read ({e.strerror or e})", works) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise DamagedFile(path, damage(text, e), works) from None
    if not isinstance(value, shape):
        raise DamagedFile(path, f"it holds {_kind(value)} where rlctl wrote {_kind(shape())}", works)
    return value

"""JSON that strict readers accept: NaN and ±inf, which Python's json writes as bare `NaN`/`Infinity`, are written
as `null`, with what they were under the key `null_reasons` ({key: "nan" | "inf" | "-inf"}) of the same object.
metrics.jsonl, summary.json, checkpoint markers and `rlctl eval` results are written through `dumps`."""

from __future__ import annotations

import json
import math
from typing import Any

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

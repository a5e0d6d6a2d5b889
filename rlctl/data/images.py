"""Images of vision-language datasets, as TRL and verl keep them: an `images` column (or `image`, one) of file
paths (relative to the data file's folder), raw bytes, or `datasets` Image features (`{"bytes": ..., "path": ...}`,
verl's parquet layout). Opened with Pillow (torch-free, so the pre-flight can check every image before launch)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL.Image import Image

IMAGE_COLUMNS = ("images", "image")  # TRL's `images` (a list) and `image` (one)


def entries(row: dict[str, Any]) -> list[Any]:
    """The row's image entries, in order (none for a text-only row)."""
    for column in IMAGE_COLUMNS:
        value = row.get(column)
        if value is not None:
            return list(value) if isinstance(value, list | tuple) else [value]
    return []


def open_image(entry: Any, base: Path | None = None) -> Image:
    """One image entry as an RGB Pillow image: a path (relative paths from `base`), bytes, a `{"bytes", "path"}`
    mapping (datasets' Image feature) or a Pillow image."""
    from PIL import Image as PILImage

    if isinstance(entry, PILImage.Image):
        return entry.convert("RGB")
    if isinstance(entry, dict):
        entry = entry.get("bytes") or entry.get("path")
    if isinstance(entry, bytes | bytearray):
        return PILImage.open(io.BytesIO(entry)).convert("RGB")
    path = Path(str(entry))
    if base is not None and not path.is_absolute():
        path = base / path
    with PILImage.open(path) as image:
        return image.convert("RGB")

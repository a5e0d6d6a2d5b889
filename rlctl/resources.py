"""Where the shipped presets, templates and plugins live (installed wheel or source checkout)."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The folder `name` (presets, templates, plugins): packaged under rlctl/_data, or at the repo root."""
    packaged = _PKG / "_data" / name
    return packaged if packaged.is_dir() else _PKG.parent / name

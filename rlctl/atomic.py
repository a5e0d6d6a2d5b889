"""Files and folders written whole or not at all: built under a temporary name beside the target, flushed to disk
(fsync), renamed into place, and the rename made durable (the folder fsync'ed). A reader, or a machine that lost
power, finds the old file or the new one, never a part of one."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path


def write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a unique temporary file next to it (its mode as the umask says, as for any
    new file), fsync'ed, and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        sync(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def temp_path(path: Path) -> Path:
    """A new name for `write_text`'s temporary file next to `path`: `.NAME.PID.HEX8.rlctl-tmp` (this process's pid,
    8 random hex digits). `rlctl.checkpoint.safewrite.drop_stale` removes one that a killed write left."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.rlctl-tmp")


def sync(path: Path) -> None:
    """fsync one file, or one folder (the names created or renamed in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(folder: Path) -> None:
    """fsync every file and folder under `folder`, and `folder`: all of it on disk before it is renamed into place."""
    for path in sorted(folder.rglob("*"), reverse=True):  # files before the folders that name them
        sync(path)
    sync(folder)


def probe(folder: Path) -> None:
    """Raise the OSError that writing into `folder` would raise (or into the nearest folder above it that exists,
    where it would be made), by creating and removing a temporary file there: nothing is left behind."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise NotADirectoryError(20, f"{folder} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".rlctl-probe-"):
            pass
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(folder)) from None

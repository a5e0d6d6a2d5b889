"""Writing where the user's files may be, without ever losing one.

A folder rlctl writes as a whole (an export, a report) is built in its own temporary folder next to the target
(`staging`) and put in place by `publish`: a missing or empty target, or one that holds only what an earlier
rlctl write of the same kind recorded in its manifest, is replaced by a rename; a target holding anything else is
refused (a UserError naming it) unless `force`, and even then only the files rlctl wrote are replaced. `lock` keeps
two rlctl processes from writing one target at once: the second is refused, naming the first one's pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rlctl import atomic, strictjson
from rlctl.checkpoint import integrity
from rlctl.errors import UserError
from rlctl.rundir import FileEntry, FilesManifest, read_record, write_record

MANIFEST = "rlctl_files.json"  # {"kind": ..., "files": {relative path: {size, xxh3}}} of what rlctl wrote


def listed(names: list[str], n: int = 5) -> str:
    shown = ", ".join(names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def _holder(fd: int) -> str:
    """The pid in a lock file another process holds: it writes it just after taking the lock, so a file still
    empty is read again for up to a second."""
    for _ in range(50):
        if text := os.pread(fd, 32, 0).decode(errors="replace").strip():
            return text
        time.sleep(0.02)
    return "unknown"


def _take(path: Path, target: Path, what: str) -> int:
    """An open descriptor of the lock file at `path`, flock'ed by this process (see `lock`)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UserError(
                f"{target} is being written by another rlctl {what} (pid {holder}); wait for it to finish, or write "
                "to another folder."
            ) from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:  # not a file its last holder removed meanwhile
                return fd
        os.close(fd)


@contextlib.contextmanager
def lock(target: Path, what: str) -> Iterator[None]:
    """Hold `.NAME.rlctl-lock` next to `target` while writing it (removed afterwards); a UserError naming the pid
    of the process that holds it. fcntl.flock, not the `filelock` package: the holder's pid must stay readable in
    the lock file, and filelock 3.x opens the lock file with O_TRUNC on every attempt to take it."""
    path = target.parent / f".{target.name}.rlctl-lock"
    with unwritable(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = _take(path, target, what)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)  # while still held: a process that opened it before sees it gone and retries
        os.close(fd)


def staging(target: Path) -> Path:
    """A new, unique temporary folder next to `target` (same filesystem, so `publish` can rename it)."""
    with unwritable(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".rlctl-tmp", dir=target.parent))


def drop_stale(target: Path) -> str:
    """Remove what an earlier write of `target` that was killed left half-written next to it (its `staging`
    folder, the old folder `publish` set aside, or `atomic.write_text`'s temporary file); a note naming it, '' when
    nothing was left. Call under `lock(target)`: then no write of `target` is under way."""
    name = re.escape(target.name)
    made = re.compile(rf"\.{name}\.[A-Za-z0-9_]{{8}}\.rlctl-(tmp|old)")  # mkdtemp's (and mkstemp's) 8 characters
    written = re.compile(rf"\.{name}\.[0-9]+\.[0-9a-f]{{8}}\.rlctl-tmp")  # atomic.temp_path's: pid, 8 hex digits
    # a folder named as `written` is not write_text's (a file) but the staging folder of a target NAME.<digits>
    stale = sorted(
        p
        for p in target.parent.glob(".*.rlctl-*")
        if made.fullmatch(p.name) or (written.fullmatch(p.name) and not p.is_dir())
    )
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if not stale:
        return ""
    return (
        f"Removed {listed([p.name for p in stale])} next to {target}: left half-written by an earlier write of it "
        "that was stopped."
    )


def check_writable(target: Path) -> None:
    """A UserError when `target` could not be written next to (its folder, or the nearest one that exists, is not
    a writable folder), found by creating and removing a temporary file there: nothing is left behind."""
    with unwritable(target):
        atomic.probe(target.parent)


@contextlib.contextmanager
def unwritable(target: Path) -> Iterator[None]:
    """A UserError naming `target` when its folder cannot be made or written (read-only, /proc, no permission),
    before anything is written there."""
    try:
        yield
    except OSError as e:
        where = f" ({e.filename})" if e.filename and str(e.filename) != str(target) else ""
        raise UserError(
            f"Cannot write {target}: {e.strerror or type(e).__name__}{where}; nothing was written. Pick a folder "
            "you can write to."
        ) from None


def _manifest(folder: Path) -> tuple[str | None, dict[str, FileEntry]]:
    """(kind, {file: entry}) of the manifest an earlier rlctl write left in `folder`; (None, {}) without one."""
    path = folder / MANIFEST
    if not path.is_file():
        return None, {}
    try:
        found = read_record(path, FilesManifest.from_json)
        return found.kind, found.files
    except strictjson.DamagedFile:
        return None, {}


def recorded(folder: Path) -> tuple[str | None, set[str]]:
    """(kind, files) of the manifest an earlier rlctl write left in `folder`; (None, empty) without a readable one."""
    kind, files = _manifest(folder)
    return kind, set(files)


def not_as_written(folder: Path, rels: list[str], kind: str) -> list[str]:
    """The files of `rels` in `folder` that are not as an earlier rlctl write of `kind` left them: never recorded
    (the user's), or changed since (the user's now)."""
    old_kind, files = _manifest(folder)
    entries = files if old_kind == kind else {}
    return [rel for rel in rels if (folder / rel).exists() and entries.get(rel) != integrity.file_entry(folder / rel)]


def record(folder: Path, kind: str, rels: list[str]) -> None:
    """Record the files `rels` of `folder` (a folder the user shares, e.g. a project) as written by rlctl, with
    those an earlier write of `kind` recorded that are still as it left them."""
    old_kind, earlier = _manifest(folder)
    files = {rel: integrity.file_entry(folder / rel) for rel in rels}
    for rel, entry in earlier.items() if old_kind == kind else ():
        if rel not in files and (folder / rel).is_file() and integrity.file_entry(folder / rel) == entry:
            files[rel] = entry
    _save_manifest(folder, kind, dict(sorted(files.items())))


def _save_manifest(folder: Path, kind: str, files: dict[str, FileEntry]) -> None:
    write_record(folder / MANIFEST, FilesManifest(kind, files))


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir())


def write_manifest(folder: Path, kind: str) -> None:
    """Record every file now in `folder` as written by rlctl (`kind`: export, adapter export, report, ...)."""
    _save_manifest(folder, kind, integrity.manifest(folder, skip=(MANIFEST,)))


def foreign(target: Path, kind: str) -> tuple[list[str], set[str]]:
    """(files in `target` that no earlier rlctl write of `kind` recorded, the files rlctl recorded there)."""
    old_kind, owned = recorded(target)
    present = [f for f in _files(target) if f != MANIFEST]
    if old_kind is None:
        return present, set()
    strangers = [f for f in present if f not in owned]
    return (present if old_kind != kind else strangers), owned


def check_target(target: Path, kind: str, force: bool, option: str = "--force") -> None:
    """Refuse (UserError) a target that is a file, or that holds files no earlier rlctl write of `kind` made,
    unless `force`."""
    if target.exists() and not target.is_dir():
        raise UserError(f"{target} is a file, not a folder; pick another output folder.")
    check_writable(target)
    if not target.is_dir() or force:
        return
    strangers, _ = foreign(target, kind)
    if strangers:
        raise UserError(
            f"{target} already holds files rlctl did not write as its {kind} ({listed(strangers)}); nothing was "
            f"changed. Pick an empty or new folder, or add {option} to write there anyway (only files rlctl wrote "
            "are replaced; yours are kept)."
        )


def publish(staged: Path, target: Path, kind: str, force: bool) -> Path:
    """Put the folder built in `staged` in place as `target` (see the module doc); `staged` is gone afterwards.
    Call under `lock(target)`; on a refusal `staged` is removed too."""
    try:
        return _publish(staged, target, kind, force)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _publish(staged: Path, target: Path, kind: str, force: bool) -> Path:
    check_target(target, kind, force)
    write_manifest(staged, kind)
    new = set(_files(staged))
    if not target.is_dir():
        os.replace(staged, target)
        return target
    strangers, owned = foreign(target, kind)
    clash = sorted(new & set(strangers))
    clash += [rel for rel in sorted(new) if (target / rel).is_dir() or _file_on_the_way(target, rel)]
    if clash:
        raise UserError(
            f"{target} holds files or folders of yours that the {kind} would have to replace ({listed(clash)}); "
            "nothing was changed. Move them away or pick another folder."
        )
    folders = {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_dir()}
    ours = {p.as_posix() for rel in owned for p in Path(rel).parents if str(p) != "."}
    if not strangers and folders <= ours:  # only rlctl's files and folders there: swap the folders
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".rlctl-old", dir=target.parent))
        os.replace(target, aside / "old")
        os.replace(staged, target)
        shutil.rmtree(aside, ignore_errors=True)
        return target
    for rel in sorted(owned - new):  # rlctl's old files the new write does not have
        (target / rel).unlink(missing_ok=True)
    for rel in sorted(new - {MANIFEST}):
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged / rel, target / rel)
    os.replace(staged / MANIFEST, target / MANIFEST)  # last: the manifest names only files already in place
    return target


def _file_on_the_way(target: Path, rel: str) -> bool:
    """Whether a file (not a folder) of `target` sits where a folder above `rel` has to go."""
    return any((target / p).exists() and not (target / p).is_dir() for p in Path(rel).parents if str(p) != ".")


def check_file(path: Path, ours: Callable[[Path], bool], what: str) -> None:
    """Refuse (UserError) to replace a file that `ours` does not recognise as an earlier rlctl `what`: rlctl
    replaces only what it wrote."""
    if path.is_dir():
        raise UserError(f"{path} is a folder; give a file name for the {what}.")
    check_writable(path)
    if path.exists() and not ours(path):
        raise UserError(
            f"{path} already exists and is not an earlier rlctl {what}; nothing was written (rlctl never replaces a "
            "file it did not write). Pick another file, or move that one away."
        )

"""The one path check of `rlctl ui`: every path the page reads or writes, whether typed into a box (config file,
data file, run directory, model, export folder) or named by a config (data files, the model, a chat template, reward
and tool plugins), is taken relative to the served folder and refused when it leads outside it: `..`, an absolute
path, `~`, or a symlink whose target lies outside. No UI library here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from rlctl.errors import UserError

if TYPE_CHECKING:
    from rlctl.config import RunConfig

PLUGIN = re.compile(r"^(?P<path>[^:(]+\.py):")  # a reward or tool plugin `path/to/file.py:function`


def inside(root: Path, typed: str, what: str) -> Path:
    """A path typed into the page (or named by its config), relative to `root`, the folder `rlctl ui` serves; a
    UserError when it is empty or leads outside it (symlinks followed): the page reads and writes only there."""
    text = typed.strip()
    if not text:
        raise UserError(f"Name the {what}: a path inside {root}.")
    outside = UserError(f"The {what} {text} is outside {root}, the folder rlctl ui serves; name one inside.")
    if text.startswith("~") or "\0" in text:
        raise outside
    base = root.resolve()
    try:
        path = (base / text).resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a name the system refuses
        raise outside from None
    if not path.is_relative_to(base):
        raise outside
    return path.relative_to(base)


def named_paths(cfg: RunConfig) -> list[tuple[str, str]]:
    """Every (key, value) of a config that names a local path rlctl would read: the data of each role, the model
    (and its GGUF file), a chat template file, reward and tool plugins. Hub names and built-ins are among them and
    pass the check (a Hub id is a relative name that stays inside)."""
    from rlctl.config import presets
    from rlctl.data.tokens import BUILTIN_TEMPLATES

    data = cfg.data
    found = [(f"data.{role}", getattr(data, role)) for role in presets.DATA_FILES if getattr(data, role)]
    for key, value in found[:]:
        if "@" in value:  # a saved dataset's `folder@split`: the folder too
            found.append((key, value.rpartition("@")[0]))
    found.append(("model.name_or_path", cfg.model.name_or_path))
    if cfg.model.gguf_file:
        found.append(("model.gguf_file", f"{cfg.model.name_or_path}/{cfg.model.gguf_file}"))
    if data.chat_template and data.chat_template not in BUILTIN_TEMPLATES:
        found.append(("data.chat_template", data.chat_template))
    plugins = [("rl.rewards", r.name) for r in cfg.rl.rewards] + [("rl.tools", t) for t in cfg.rl.tools]
    found += [(key, m.group("path")) for key, value in plugins if (m := PLUGIN.match(value.strip()))]
    return found


FOLDER_ENTRIES = 10_000  # the most entries of a data folder checked (a folder of files, a save_to_disk folder)


def outside_entry(root: Path, folder: Path) -> Path | None:
    """The first entry of a data folder (its files, and subfolders as save_to_disk writes them) that leads outside
    `root` through a symlink, if any; a folder with more than FOLDER_ENTRIES entries is refused (UserError)."""
    for count, entry in enumerate(folder.rglob("*")):  # a symlinked folder is listed, not entered
        if count >= FOLDER_ENTRIES:
            raise UserError(
                f"{folder} holds over {FOLDER_ENTRIES} entries: rlctl ui checks each one stays inside {root}; name a "
                "file or a smaller folder."
            )
        try:
            inside(root, str(entry), "data file")
        except UserError:
            return entry
    return None


def check_config(root: Path, cfg: RunConfig, source: str = "the config") -> None:
    """A UserError naming the key when `cfg` names a path outside the served folder: one check for every route a
    path comes through (the overrides, the YAML, a run directory's config.yaml), a data folder's entries included."""
    for key, value in named_paths(cfg):
        try:
            rel = inside(root, value, key)
        except UserError:
            rel = None
        escaped = None if rel is None or not (root / rel).is_dir() else outside_entry(root, root / rel)
        if rel is None or escaped is not None:
            through = f" (its entry {escaped.name} is a symlink)" if escaped is not None else ""
            raise UserError(
                f"{key}={value} in {source} leads outside {root}{through}, the folder rlctl ui serves; the page reads "
                "only files inside it. Copy the file into this folder (or start rlctl ui in a folder that holds it)."
            )

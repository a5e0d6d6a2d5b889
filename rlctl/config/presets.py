"""Presets: YAML layers (models, algorithms, hardware, recipes) combined through `defaults:` inheritance.

A preset is named by its file stem (`qwen7b-grpo`, `grpo`, `1xH100-80GB`); names are unique across kinds.
A layer's `defaults:` list is merged first, in order, then the layer's own keys on top (deep merge; lists
and scalars are replaced, mappings merged).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from rlctl.errors import UserError, did_you_mean
from rlctl.resources import data_dir

KINDS = ("recipes", "algorithms", "models", "hardware")


@dataclass(frozen=True)
class Preset:
    name: str
    kind: str
    path: Path


@cache
def all_presets() -> dict[str, Preset]:
    """Every shipped preset by name."""
    found: dict[str, Preset] = {}
    root = data_dir("presets")
    for kind in KINDS:
        for path in sorted((root / kind).glob("*.yaml")):
            found[path.stem] = Preset(path.stem, kind, path)
    return found


def get(name: str, kind: str | None = None) -> Preset:
    """The preset called `name` (optionally `kind/name`), or a UserError listing the close matches."""
    typed = name
    if "/" in name:
        kind, name = name.split("/", 1)
    a_path = kind not in (None, *KINDS)  # ./tiny-demo, /tmp/run.yaml: refused, compared by its last part
    if a_path:
        kind, name = None, Path(typed).stem
    presets = {n: p for n, p in all_presets().items() if kind is None or p.kind == kind}
    if name not in presets or a_path:
        what = f"{kind[:-1] if kind != 'hardware' else 'hardware'} preset" if kind else "preset"
        path = " (a YAML file is passed with --config FILE)" if typed.endswith(".yaml") or Path(typed).exists() else ""
        raise UserError(
            f"Unknown {what} '{typed}'{path}.{did_you_mean(name, presets)} Run `rlctl presets list` to see them all."
        )
    return presets[name]


# libyaml's parser when PyYAML was built with it (the wheels are): ~10x faster than the pure-Python one.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# The most a config file may hold: a config is a few KB of `key: value` lines; a data file or a device given as
# --config is refused after reading this much (bounded memory and time), never parsed.
CONFIG_BYTES = 1 << 20


def _config_text(path: Path) -> str:
    """The text of the config file at `path`, read at most CONFIG_BYTES (+1 to tell a larger one)."""
    with path.open("rb") as f:
        raw = f.read(CONFIG_BYTES + 1)
    if len(raw) > CONFIG_BYTES:
        shown = f"{path.stat().st_size / 2**20:,.1f} MiB" if path.is_file() else f"over {CONFIG_BYTES >> 20} MiB"
        raise UserError(
            f"{path} is too large for a config file ({shown}; a config holds at most {CONFIG_BYTES >> 20} MiB of "
            "`key: value` lines). Is it a dataset? Name data files in the config or with --set data.rl=FILE (or "
            "data.sft, data.preference, data.eval)."
        )
    return raw.decode()


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping from `path` (at most CONFIG_BYTES); a UserError naming the file and line when it is not one."""
    try:
        data = yaml.load(_config_text(path), Loader=YAML_LOADER)
    except FileNotFoundError:
        raise UserError(f"Config file not found: {path}.") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a folder, not a YAML config file.") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not a text YAML file (byte {e.start} is not UTF-8).") from None
    except OSError as e:
        raise UserError(f"Cannot read {path}: {e.strerror or e}.") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise UserError(f"Malformed YAML in {where}: {getattr(e, 'problem', e)}.") from None
    if data is None:  # an empty file
        return {}
    if not isinstance(data, dict):
        got = "an empty list" if data == [] else type(data).__name__
        raise UserError(f"{path} must hold a YAML mapping of config keys (key: value lines), not {got}.")
    return data


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`: nested mappings merge, everything else is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _flag(name: str) -> str:
    """The command-line flag that layers preset `name` alone, when there is one (`--algorithm grpo`)."""
    preset = all_presets().get(name)
    flags = {"algorithms": "--algorithm", "hardware": "--hardware", "recipes": "--preset"}
    return f" (or pass {flags[preset.kind]} {name})" if preset and preset.kind in flags else ""


def default_names(defaults: Any, source: str) -> list[str]:
    """The preset names of a layer's `defaults:` (a list of names, or one name); a UserError naming the file for
    any other shape, with rlctl's spelling of Hydra's `- group: name` entries."""
    if defaults is None:
        return []
    if isinstance(defaults, str):
        return [defaults]
    if not isinstance(defaults, list):
        raise UserError(
            f"{source}: defaults must be a list of preset names, layered in order (defaults: [tiny-demo, grpo]), "
            f"not {type(defaults).__name__} {defaults!r}. See `rlctl presets list`."
        )
    hydra = [e for e in defaults if isinstance(e, dict)]
    if hydra:
        names = [str(v) for e in defaults for v in (e.values() if isinstance(e, dict) else [e])]
        group, name = next(iter(hydra[0].items()), ("group", "name"))
        raise UserError(
            f"{source}: defaults entry {{{group}: {name}}} is Hydra's `- group: name` form; rlctl's defaults list "
            f"preset names, layered in order: write defaults: [{', '.join(names)}]{_flag(str(name))}."
        )
    if "_self_" in defaults:
        raise UserError(
            f"{source}: defaults entry _self_ is Hydra's; rlctl always layers a file's own keys over its defaults, "
            f"so remove it: defaults: [{', '.join(str(e) for e in defaults if e != '_self_')}]."
        )
    bad = [e for e in defaults if not isinstance(e, str) or not e]
    if bad:
        shown = "null" if bad[0] is None else repr(bad[0])
        raise UserError(
            f"{source}: defaults entry {shown} is not a preset name; defaults must be a list of preset names, "
            "layered in order (defaults: [tiny-demo, grpo]). See `rlctl presets list`."
        )
    return defaults


DATA_FILES = ("sft", "preference", "rl", "eval")


def merge_layer(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` layered on `base` (`deep_merge`), where the upper layer's choice of data wins whole: data files it
    sets (data.sft, preference, rl, eval) drop a data.generate set below, and a data.generate it sets drops the
    data files set below. Explicit beats implicit: a preset's generated task never hides the user's files."""
    data, below = over.get("data"), base.get("data")
    if isinstance(data, dict) and isinstance(below, dict):
        if data.get("generate"):
            below = {k: v for k, v in below.items() if k not in DATA_FILES}
        elif "generate" not in data and any(data.get(role) for role in DATA_FILES):
            below = {k: v for k, v in below.items() if k != "generate"}
        base = {**base, "data": below}
    return deep_merge(base, over)


def resolve_layers(data: dict[str, Any], seen: tuple[str, ...] = (), source: str = "config") -> dict[str, Any]:
    """`data` with its `defaults:` presets merged underneath it, recursively."""
    data = dict(data)
    merged: dict[str, Any] = {}
    for name in default_names(data.pop("defaults", None), source):
        preset = get(name)
        if preset.name in seen:
            raise UserError(f"Preset inheritance loops: {' -> '.join((*seen, preset.name))}.")
        layer = resolve_layers(read_yaml(preset.path), (*seen, preset.name), str(preset.path))
        merged = merge_layer(merged, layer)
    return merge_layer(merged, data)


def load(name: str, kind: str | None = None, tuning: bool = False) -> dict[str, Any]:
    """The fully merged config mapping of preset `name`; with its recipe's `for_algorithm:` block when `tuning`
    (`config.layered` reads it), without it otherwise."""
    preset = get(name, kind)
    data = resolve_layers(read_yaml(preset.path), (preset.name,), str(preset.path))
    return data if tuning else split_tuning(data, str(preset.path))[0]


TUNING = "for_algorithm"


def split_tuning(data: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """`data` without its `for_algorithm:` block, and the block: {algorithm name: the config layer the recipe
    puts over that algorithm's preset when `--algorithm NAME` layers it} (a recipe's learning rate tuned for one
    update per rollout batch, divided for an algorithm that makes 16). A UserError naming `source` for any other
    shape."""
    data = dict(data)
    tuning = data.pop(TUNING, None) or {}
    algorithms = {n for n, p in all_presets().items() if p.kind == "algorithms"}
    if not isinstance(tuning, dict) or not all(isinstance(v, dict) for v in tuning.values()):
        raise UserError(
            f"{source}: {TUNING} must map algorithm names to config layers ({TUNING}: {{vapo: {{rl: "
            f"{{learning_rate: 1.875e-5}}}}}}), not {tuning!r}."
        )
    unknown = sorted(set(tuning) - algorithms)
    if unknown:
        raise UserError(
            f"{source}: {TUNING} names {', '.join(map(str, unknown))}, not an algorithm preset. "
            f"Known: {', '.join(sorted(algorithms))}."
        )
    return data, tuning

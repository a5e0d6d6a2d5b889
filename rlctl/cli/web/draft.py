"""The page's config before a run, as plain data and text: a draft checked and planned with the CLI's own functions
and messages, the common settings' form as `--set` items, the saved configs and data files of the served folder and
a paged preview of one. No UI library here."""

from __future__ import annotations

import io
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.cli.web.paths import check_config, inside
from rlctl.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console

    from rlctl.config import RunConfig

# the curves the Run tab plots (the CLI's live keys): every stage's loss, RL's reward and KL; and held-out scores
LOSS_KEYS = ("loss",)
RL_KEYS = ("reward", "kl")
TRAINING_KEYS = LOSS_KEYS + RL_KEYS
LOG_LINES = 40


@dataclass(frozen=True)
class Draft:
    """The page's config: a YAML config file's text, layered with the run commands' options."""

    yaml_text: str
    config_path: str  # where the page saves the YAML, relative to the served folder
    algorithm: str = ""
    hardware: str = ""
    stages: tuple[str, ...] = ()  # empty: the config's own
    sets: tuple[str, ...] = ()  # --set KEY=VALUE items

    def args(self) -> list[str]:
        """The options `rlctl plan` and `rlctl train` take for this draft."""
        out = ["--config", self.config_path]
        out += ["--algorithm", self.algorithm] if self.algorithm else []
        out += ["--hardware", self.hardware] if self.hardware else []
        out += ["--stages", ",".join(self.stages)] if self.stages else []
        for item in self.sets:
            out += ["--set", item]
        return out

    def train_command(self, run_dir: str) -> str:
        """The exact command that starts this run from a terminal, in the served folder."""
        return shlex.join(["rlctl", "train", *self.args(), "--run-dir", run_dir])


def set_items(text: str) -> tuple[str, ...]:
    """The overrides box: one KEY=VALUE a line (blank lines and # comments left out)."""
    lines = (line.strip() for line in text.splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


@dataclass(frozen=True)
class Checked:
    """A draft as the CLI judges it: the config, or the CLI's own message."""

    config: RunConfig | None
    message: str
    notes: tuple[str, ...] = ()


def check(root: Path, draft: Draft) -> Checked:
    """Validate the draft as `rlctl train` would (the YAML in a scratch file named like the config's): the config
    and the notes on moved keys, or the UserError's message with its did-you-mean."""
    from rlctl.cli.app import resolve_config

    notes: list[str] = []
    try:
        inside(root, draft.config_path, "config file")
        with tempfile.TemporaryDirectory(prefix="rlctl-ui-") as tmp:
            scratch = Path(tmp) / Path(draft.config_path).name
            scratch.write_text(draft.yaml_text)
            try:
                stages = ",".join(draft.stages) or None
                cfg = resolve_config(
                    None, scratch, draft.algorithm or None, draft.hardware or None, list(draft.sets), stages, notes
                )
            except UserError as e:
                raise UserError(str(e).replace(str(scratch), draft.config_path)) from None
        check_config(root, cfg)
        refuse_missing(root, cfg)
    except UserError as e:
        return Checked(None, str(e))
    return Checked(cfg, describe(cfg), tuple(notes))


def refuse_missing(root: Path, cfg: RunConfig) -> None:
    """A UserError naming the first data file the config names that is not there (a Hub name aside): the check's
    line turns red at once, and Start names that file rather than what the launch would trip on later."""
    from rlctl.config import presets
    from rlctl.data import sources

    for role in presets.DATA_FILES:
        value = getattr(cfg.data, role)
        if not value or sources.is_hub(value):
            continue
        path = root / value
        saved = "@" in value and (root / value.rpartition("@")[0]).is_dir()  # a saved dataset's `folder@split`
        if not path.exists() and not saved:
            raise UserError(f"data.{role}={value}: no such file in {root}. Pick a file of this folder (tab 2, Data).")


def describe(cfg: RunConfig) -> str:
    """One line on a valid config: what it trains, how, where."""
    from rlctl.config import RLConfig

    online = any(isinstance(getattr(cfg, stage), RLConfig) for stage in cfg.stages)
    algorithm = f" ({cfg.rl.algorithm})" if online else ""
    stages = ", ".join(cfg.stages)
    return f"Valid: {cfg.name}: {cfg.model.name_or_path}, stages {stages}{algorithm}, {cfg.hardware.spec}"


def save(root: Path, draft: Draft, ours: set[Path]) -> Path:
    """Write the draft's YAML where the page says (the file `--config` names in the shown command). A file the page
    did not write (`ours`: what this server wrote) is never replaced by another text."""
    path = root / inside(root, draft.config_path, "config file")
    if path.is_dir() or path.suffix not in (".yaml", ".yml"):  # never a .py a reward plugin could name
        raise UserError(f"{draft.config_path} is not a YAML file name; name the config file NAME.yaml.")
    if path.exists() and path not in ours and path.read_text(errors="replace") != draft.yaml_text:
        raise UserError(
            f"{draft.config_path} already exists and the page did not write it; nothing was written. Name another "
            "config file (or paste that file's text into the editor to start from it)."
        )
    ours.add(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(draft.yaml_text)
    return path


def recorder() -> Console:
    """A console that records what the CLI prints, as a terminal 110 columns wide would show it."""
    from rich.console import Console

    return Console(file=io.StringIO(), record=True, width=110, highlight=False, emoji=False, color_system=None)


@dataclass(frozen=True)
class PlanView:
    """`rlctl plan` for the page: its printed plan, its pre-flight of the data, the memory table's rows, the
    pre-flight's errors and a few rows of each dataset."""

    text: str
    data_text: str
    memory: Sequence[Sequence[object]]
    errors: tuple[str, ...]
    data_rows: dict[str, list[dict]] = field(default_factory=dict)


MEMORY_COLUMNS = ["stage", "phase", "peak GiB", "budget GiB", "headroom GiB", "fits"]


def plan(cfg: RunConfig, run_dir: Path) -> PlanView:
    """The plan and pre-flight exactly as `rlctl plan` prints them, with the per-phase memory table and a few
    rows of each dataset the pre-flight read."""
    from rlctl.cli import plan_view
    from rlctl.cli.run import plan_with_preflight
    from rlctl.launch import preflight

    the_plan, report = plan_with_preflight(cfg, run_dir)
    console, data_console = recorder(), recorder()
    plan_view.show(console, the_plan)
    preflight.show(data_console, report)
    mem = the_plan.memory
    rows = [
        [p.stage, p.phase, p.peak_gib, p.budget_gib, p.headroom_gib, "yes" if p.fits else "NO"]
        for p in (mem.phases if mem is not None else ())
    ]
    samples = {stage: rows[:3] for stage, rows in report.rows.items()}
    return PlanView(console.export_text(), data_console.export_text(), rows, tuple(report.errors), samples)


# ------------------------------------------------------------------------------------------- the settings' form
# The common settings the form shows (LlamaBoard's and ms-swift's first screen), each written as the `--set` item
# the CLI takes; the form's widgets and choices come from the schema's types. Per stage: its length, learning rate
# and batch; RL's own sampling settings after it.
MODEL_KEYS = ("model.name_or_path", "model.adapter", "model.lora_r")
STAGE_KEYS = ("max_steps", "learning_rate", "batch_size")
ROLLOUT_KEYS = ("prompts_per_step", "group_size", "max_new_tokens", "temperature", "use_vllm")


def form_keys() -> dict[str, tuple[str, ...]]:
    """The form's keys by group: `model`, then one group per stage (in pipeline order) with the keys its section has."""
    from rlctl.config import STAGE_ORDER, RunConfig

    groups: dict[str, tuple[str, ...]] = {"model": MODEL_KEYS}
    for stage in STAGE_ORDER:
        section = RunConfig.model_fields[stage].annotation.model_fields
        rollouts = [k for k in ROLLOUT_KEYS if k in section]  # a section that samples counts its batch in prompts
        own = [k for k in STAGE_KEYS if k in section and not (rollouts and k == "batch_size")] + rollouts
        groups[stage] = tuple(f"{stage}.{k}" for k in own)
    return groups


@dataclass(frozen=True)
class FormField:
    """One key of the form: what widget shows it (`number`, `integer`, `text`, `choice`, `switch`) and its choices."""

    key: str
    kind: str
    choices: tuple[str, ...] = ()


def form_field(key: str) -> FormField:
    """The widget a key takes, read from its type in the schema (a Literal: its choices; int; float; bool; text)."""
    import typing

    from rlctl.config import RunConfig

    model: Any = RunConfig
    *sections, name = key.split(".")
    for section in sections:
        model = model.model_fields[section].annotation
    kind = model.model_fields[name].annotation
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    literals = [v for a in args for v in typing.get_args(a)] if args else list(typing.get_args(kind))
    if typing.get_origin(kind) is typing.Literal or any(typing.get_origin(a) is typing.Literal for a in args):
        values = list(typing.get_args(kind)) if typing.get_origin(kind) is typing.Literal else literals
        values += ["true", "false"] if bool in args else []
        return FormField(key, "choice", tuple(str(v) for v in values))
    if kind is bool:
        return FormField(key, "switch")
    if kind is int:
        return FormField(key, "integer")
    if kind is float:
        return FormField(key, "number")
    return FormField(key, "text")


def form_values(cfg: RunConfig) -> dict[str, object]:
    """The value of each form key in a resolved config (booleans and choices as the form shows them)."""
    out: dict[str, object] = {}
    for keys in form_keys().values():
        for key in keys:
            value: object = cfg
            for part in key.split("."):
                value = getattr(value, part)
            out[key] = str(value).lower() if isinstance(value, bool) and form_field(key).kind == "choice" else value
    return out


def with_set(sets: str, key: str, value: object) -> str:
    """The overrides box with `key=value` in place of any earlier item for `key` (the form writes what a user would
    type: one --set item a line)."""
    if isinstance(value, bool):
        value = str(value).lower()
    elif isinstance(value, float) and value.is_integer() and form_field(key).kind == "integer":
        value = int(value)
    lines = [x for x in sets.splitlines() if x.strip() and not x.strip().startswith(f"{key}=")]
    return "\n".join([*lines, f"{key}={value}"])


# ---------------------------------------------------------------------------------------- files of the folder
SKIPPED = ("runs", ".git", ".venv", "node_modules", "__pycache__")  # not searched for configs and data files
FOUND_AT_MOST = 200


def files_of(root: Path, suffixes: tuple[str, ...]) -> list[str]:
    """Files of the served folder with one of `suffixes` (run directories and hidden folders not searched), sorted;
    at most FOUND_AT_MOST; a symlink leading outside is left out (`inside`)."""
    import os

    found: list[str] = []
    base = root.resolve()
    for folder, subfolders, names in os.walk(base):  # symlinked folders are not entered
        subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED and not d.startswith("."))
        for name in sorted(names):
            if Path(name).suffix.lower() not in suffixes:
                continue
            rel = (Path(folder) / name).relative_to(base).as_posix()
            try:
                found.append(inside(root, rel, "file").as_posix())
            except UserError:
                continue
            if len(found) >= FOUND_AT_MOST:
                return sorted(found)
    return sorted(found)


def saved_configs(root: Path) -> list[str]:
    """The YAML configs of the folder (configs/ first), to load into the editor."""
    found = files_of(root, (".yaml", ".yml"))
    return sorted(found, key=lambda p: (not p.startswith("configs/"), p))


def data_files(root: Path) -> list[str]:
    """The dataset files of the folder, for the data picker."""
    from rlctl.data.files import FILE_TYPES

    return files_of(root, tuple(FILE_TYPES))


def read_saved(root: Path, typed: str) -> str:
    """A config file's text (inside the folder, a YAML file name)."""
    path = root / inside(root, typed, "config file")
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        raise UserError(f"{typed} is not a YAML config file of {root}.")
    return path.read_text(encoding="utf-8", errors="replace")


PAGE_ROWS = 10


@dataclass(frozen=True)
class Preview:
    """A page of a data file's rows, as the CLI's reader reads them (every column, values as text)."""

    columns: list[str]
    rows: list[list[str]]
    first: int  # the first row shown, counted from 1
    total: int  # rows in the file (or read of it: a file above the peek size is read in part)
    pages: int


def preview(rows: list[dict], page: int) -> Preview:
    """Page `page` (from 1, clamped) of `rows`, PAGE_ROWS a page."""
    import json

    pages = max(1, -(-len(rows) // PAGE_ROWS))
    page = min(max(1, page), pages)
    shown = rows[(page - 1) * PAGE_ROWS : page * PAGE_ROWS]
    columns = list(dict.fromkeys(k for r in shown for k in r))

    def cell(v: object) -> str:
        text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
        return text if len(text) <= 300 else text[:300] + "..."

    return Preview(columns, [[cell(r.get(c, "")) for c in columns] for r in shown], (page - 1) * PAGE_ROWS + 1,
                   len(rows), pages)  # fmt: skip


def file_rows(root: Path, typed: str) -> list[dict]:
    """The rows of a data file of the folder as the CLI's reader reads them (a large file: its first rows)."""
    from rlctl.data import sources

    rel = inside(root, typed, "data file")
    source = sources.parse_source(str(root / rel))
    if source.kind == "hub":
        raise UserError(f"{typed} is not a file of {root}.")
    peeked = sources.peek(source, PEEK_ABOVE_BYTES) if source.path is not None and source.path.is_file() else None
    table = peeked[0] if peeked else sources.read(str(root / rel))
    return [r if isinstance(r, dict) else {"value": r} for r in table.rows]


PEEK_ABOVE_BYTES = 8 * 2**20  # a larger file is previewed from its first rows

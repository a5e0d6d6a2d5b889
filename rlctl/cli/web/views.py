"""What `rlctl ui` shows, as plain data and text: a draft config checked and planned with the CLI's own functions
and messages, a run's live state read from its run directory, the runs of a folder and two of them compared, an
export's model card. No UI library here: `page` renders these."""

from __future__ import annotations

import io
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rlctl.cli.web.paths import check_config, inside
from rlctl.errors import UserError
from rlctl.rundir import RunDir

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
    except UserError as e:
        return Checked(None, str(e))
    return Checked(cfg, describe(cfg), tuple(notes))


def describe(cfg: RunConfig) -> str:
    """One line on a valid config: what it trains, how, where."""
    algorithm = f" ({cfg.rl.algorithm})" if "rl" in cfg.stages else ""
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
    memory: list[list[object]]
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


# ------------------------------------------------------------------------------------------------- a run's state
@dataclass(frozen=True)
class Point:
    """One point of a curve: the series (`stage metric`, or `run: stage metric`), the step, the value."""

    series: str
    step: int
    value: float


@dataclass(frozen=True)
class RunState:
    """What the run directory says now: a headline (stage, step, ETA, metrics), the curves, alarms, the log's tail."""

    headline: str
    finished: bool
    loss: list[Point]
    reward: list[Point]
    heldout: list[Point]
    alarms: list[str]
    log_tail: str


def records(run_dir: Path) -> list[dict]:
    """metrics.jsonl's records as `rlctl report` reads them, less those whose stage or step is not of its kind (a
    damaged line shows nothing, rather than breaking the page)."""
    from rlctl.after import report

    path = RunDir(run_dir).metrics
    return [r for r in report.read_records(path) if well_formed(r)] if path.is_file() else []


def well_formed(rec: dict) -> bool:
    """A record whose `stage` is text and whose `step` (and `max_steps`) are whole numbers where present."""
    whole = all(isinstance(rec.get(k, 0), int) and not isinstance(rec.get(k), bool) for k in ("step", "max_steps"))
    return isinstance(rec.get("stage", ""), str) and whole


def points(recs: list[dict], keys: tuple[str, ...] | None, prefix: str = "") -> list[Point]:
    """The curves of `keys` (None: the held-out `eval_*` scores) of every stage, as `rlctl report` reads them."""
    from rlctl.after import report

    out = []
    for stage, metrics in report.curves(recs).items():
        for key, pts in metrics.items():
            wanted = key in keys if keys is not None else key.startswith("eval_") and key != "eval_rows"
            if wanted:
                out += [Point(f"{prefix}{stage} {key}", step, value) for step, value in pts]
    return out


def progress_line(recs: list[dict]) -> str:
    """The latest stage's line as `rlctl train` prints it off a terminal: step of steps, metrics, ETA."""
    from rlctl.launch.progress import StageProgress

    stages: dict[str, StageProgress] = {}
    current = ""
    for rec in recs:
        if rec.get("stage"):
            stages.setdefault(rec["stage"], StageProgress(rec["stage"])).update(rec)
        if "max_steps" in rec or rec.get("event") == "scoring":  # a stage's step or scoring, not the base's eval
            current = rec["stage"]
    return stages[current].line() if current else "no step logged yet"


def served_run_config(root: Path, rel: Path) -> RunConfig:
    """A run directory's config, refused (UserError) when it is damaged or names a file outside the served folder:
    what the page reads of a run's data (its held-out rows) passes the same path check as a draft's."""
    from rlctl import config as config_mod

    run = RunDir(root / rel)
    if not run.is_run():
        raise UserError(f"{rel} is not a run directory (it has no config.yaml).")
    try:
        cfg = config_mod.load_run_config(run.config)
    except (OSError, ValueError) as e:  # bytes that are not text, a file that went away
        raise UserError(f"{rel}/config.yaml cannot be read: {e}") from None
    check_config(root, cfg, f"{rel}/config.yaml")
    return cfg


def finished(run_dir: Path) -> bool:
    """Whether every stage of the run completed (its summary.json says so)."""
    from rlctl import config as config_mod
    from rlctl.launch import resume_check

    try:
        return resume_check.finished(run_dir, config_mod.load_run_config(RunDir(run_dir).config))
    except Exception:  # a run still being prepared, or damaged: not finished
        return False


def tail(path: Path, lines: int = LOG_LINES) -> str:
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def run_state(run_dir: Path, log: Path | None) -> RunState:
    """A run's state from its run directory alone (any tab, any time, whoever started it); `log` is the output
    of the command the page started on it, else the run's own train log."""
    from rlctl.monitors import alarms

    recs = records(run_dir)
    shown = [
        f"{a.get('stage', '?')} step {a.get('step', '?')}: {a['alarm']}: {a.get('message', '')}"
        for a in alarms.alarms_of(recs)
    ]
    log_text = tail(log) if log is not None else tail(RunDir(run_dir).log())
    done = finished(run_dir)
    curves = points(recs, LOSS_KEYS), points(recs, RL_KEYS), points(recs, None)
    return RunState(progress_line(recs), done, *curves, shown, log_text)


# ------------------------------------------------------------------------------------------------ runs of a folder
@dataclass(frozen=True)
class RunRow:
    """A run in the runs list."""

    path: str
    name: str
    stages: str
    completed: str
    latest: str
    modified: float = 0.0  # config.yaml's time: the list's order, not shown


def runs(root: Path, folder: str) -> list[RunRow]:
    """The run directories in `folder` (those with a config.yaml), newest first; a run whose records are damaged is
    listed with what is wrong, and the others as usual."""
    base = root / inside(root, folder, "runs folder")
    found = [d for d in sorted(base.iterdir()) if RunDir(d).is_run()] if base.is_dir() else []
    return sorted((run_row(root, d) for d in found), key=lambda r: r.modified, reverse=True)


def run_row(root: Path, run_dir: Path) -> RunRow:
    """One run of the list; a damaged config.yaml or summary.json named in the row instead of failing the list."""
    from rlctl import config as config_mod
    from rlctl.rundir import read_summary

    path = run_dir.relative_to(root).as_posix()
    try:
        modified = RunDir(run_dir).config.stat().st_mtime
    except OSError:
        modified = 0.0
    try:
        cfg = config_mod.load_run_config(RunDir(run_dir).config)
    except (UserError, OSError, ValueError) as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        return RunRow(path, "(damaged)", "", "", f"config.yaml cannot be read: {reason}", modified)
    try:
        completed = ",".join(read_summary(run_dir).completed)
    except (UserError, OSError, ValueError) as e:
        completed = f"summary.json cannot be read: {' '.join(str(e).split())}"
    return RunRow(path, cfg.name, ",".join(cfg.stages), completed, progress_line(records(run_dir)), modified)


def config_diff(a: Path, b: Path) -> list[list[str]]:
    """The keys whose values differ between two runs' config.yaml: [key, value in a, value in b]."""
    import yaml

    def flat(data: object, prefix: str = "") -> dict[str, str]:
        if isinstance(data, dict):
            return {k: v for key, value in data.items() for k, v in flat(value, f"{prefix}{key}.").items()}
        return {prefix.rstrip("."): yaml.safe_dump(data, default_flow_style=True).strip().removesuffix("...").strip()}

    fa, fb = (flat(yaml.safe_load(RunDir(d).config.read_text()) or {}) for d in (a, b))
    return [[k, fa.get(k, "-"), fb.get(k, "-")] for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)]


def card(run_dir: Path, out: Path, repo_id: str | None) -> str:
    """The model card `rlctl export` writes, before anything is written."""
    from rlctl.after import export

    return export.card_text(run_dir, out, repo_id=repo_id or None)


# ---------------------------------------------------------------------------------------------------- try a model
def model_folders(root: Path, run_dir: Path) -> list[str]:
    """What the chat box can load from a run: each policy stage's final folder, then its checkpoints, newest first,
    and the run's exports."""
    from rlctl.checkpoint import complete_checkpoints
    from rlctl.plan.planner import POLICY_STAGES
    from rlctl.rundir import RunDir

    base = root / run_dir
    found: list[Path] = []
    for stage in POLICY_STAGES:
        found += [RunDir(base).final(stage)] if RunDir(base).final(stage).is_dir() else []
        found += reversed(complete_checkpoints(RunDir(base).checkpoints(stage)))
    found += [d for d in (RunDir(base).export(), RunDir(base).export("gguf")) if (d / "config.json").is_file()]
    return [d.relative_to(root).as_posix() for d in found]


@dataclass
class Loaded:
    """The model the chat box talks to (one at a time, loaded on first use)."""

    folder: str = ""
    model: object = None
    tokenizer: object = None


def reply(root: Path, loaded: Loaded, folder: str, history: list[dict], max_new_tokens: int) -> str:
    """The model's greedy answer to the conversation (its chat template when it has one, else the last message as
    plain text), generated as `rlctl eval` generates."""
    from rlctl.rollout import evaluate

    path = root / inside(root, folder, "model folder")
    if loaded.folder != folder:
        loaded.model, loaded.tokenizer = evaluate.load_causal_lm(path, evaluate.default_device())
        loaded.folder = folder
    tok = loaded.tokenizer
    prompt = history if getattr(tok, "chat_template", None) else history[-1]["content"]
    return evaluate.generate(loaded.model, tok, [prompt], max_new_tokens)[0]

"""What `rlctl ui` shows of runs, as plain data: a run's live state read from its run directory (metrics.jsonl read
only where it grew since the last look, so a refresh costs the same on a long run as on a short one), its curves on
one step axis across stages, the processes' memory and utilisation beside the plan's budget, the runs of a folder,
and two runs compared. No UI library here."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.cli.web.paths import check_config, inside
from rlctl.errors import UserError
from rlctl.rundir import RunDir

if TYPE_CHECKING:
    from rlctl.config import RunConfig
    from rlctl.launch.progress import StageProgress

LOG_LINES = 40
LOG_TAIL_BYTES = 64 * 1024  # the log's end is read from its last bytes, whatever its length
TRAINING_KEYS = ("loss", "reward", "kl")  # the curves Compare draws


@dataclass(frozen=True)
class Point:
    """One point of a curve: the series (`stage metric`, or `run: stage metric`), the step on the run's one axis
    (each stage's steps after those of the stages before it), the value."""

    series: str
    step: int
    value: float


def panel_of(key: str, held_out: bool) -> str | None:
    """Which plot a metric goes to: `loss`, `reward` (RL's reward and KL), `accuracy` (held-out accuracies, all
    between 0 and 1) or `scores` (other held-out scores: margins, rewards, losses); None for the rest."""
    if held_out:
        return "accuracy" if "accura" in key else "scores"
    return {"loss": "loss", "reward": "reward", "kl": "reward"}.get(key)


def well_formed(rec: Any) -> bool:
    """A record whose `stage` is text and whose `step`, `max_steps` and `time` are numbers where present: a damaged
    line shows nothing, rather than breaking the page."""
    if not isinstance(rec, dict) or not isinstance(rec.get("stage", ""), str):
        return False
    whole = all(isinstance(rec.get(k, 0), int) and not isinstance(rec.get(k), bool) for k in ("step", "max_steps"))
    return whole and isinstance(rec.get("time", 0), int | float)


@dataclass
class Watched:
    """A run's metrics.jsonl as the page has read it so far: each refresh reads only the bytes appended since the
    last one (a file that shrank or was replaced is read again from its start), and keeps what the page shows."""

    run_dir: Path
    offset: int = 0
    identity: tuple[int, int] | None = None  # (device, inode) of the file read
    partial: bytes = b""  # a last line still being written
    bytes_read: int = 0  # by the latest refresh
    curves: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)  # stage -> key -> step -> value
    totals: dict[str, int] = field(default_factory=dict)  # each stage's max_steps, in the order stages appeared
    progress: dict[str, StageProgress] = field(default_factory=dict)
    current: str = ""
    alarms: list[str] = field(default_factory=list)
    samples: dict = field(default_factory=dict)  # the latest `samples` record (RL: the step's best and worst)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh(self) -> None:
        """Read what was appended to metrics.jsonl since the last refresh."""
        path = RunDir(self.run_dir).metrics
        with self.lock:
            self.bytes_read = 0
            try:
                st = path.stat()
            except OSError:
                return
            if (st.st_dev, st.st_ino) != self.identity or st.st_size < self.offset:
                self._reset((st.st_dev, st.st_ino))
            if st.st_size == self.offset:
                return
            with path.open("rb") as f:
                f.seek(self.offset)
                data = f.read(st.st_size - self.offset)
            self.offset += len(data)
            self.bytes_read = len(data)
            *lines, self.partial = (self.partial + data).split(b"\n")
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if well_formed(rec):
                    self._take(rec)

    def _reset(self, identity: tuple[int, int]) -> None:
        fresh = Watched(self.run_dir)
        for name in ("offset", "partial", "curves", "totals", "progress", "current", "alarms", "samples"):
            setattr(self, name, getattr(fresh, name))
        self.identity = identity

    def _take(self, rec: dict) -> None:
        """One record: the progress line's stage, the curves (as `rlctl report` reads them: a step logged again by a
        resume replaces the earlier value), the alarms."""
        from rlctl.after.report import SKIP
        from rlctl.launch.progress import StageProgress

        stage = rec.get("stage")
        if rec.get("event") == "alarm":
            self.alarms.append(f"{stage or '?'} step {rec.get('step', '?')}: {rec['alarm']}: {rec.get('message', '')}")
        if rec.get("event") == "samples":
            self.samples = rec
            return
        if not stage:
            return
        self.totals.setdefault(stage, 0)
        if rec.get("max_steps"):
            self.totals[stage] = rec["max_steps"]
        with contextlib.suppress(KeyError, TypeError, ValueError):  # a damaged progress record: the line stays
            self.progress.setdefault(stage, StageProgress(stage)).update(rec)
        if "max_steps" in rec or rec.get("event") == "scoring":  # a stage's step or scoring, not the base's eval
            self.current = stage
        if "step" not in rec:
            return
        for key, value in rec.items():
            if key in SKIP or not isinstance(value, int | float) or isinstance(value, bool) or value != value:
                continue
            if abs(value) != float("inf"):
                self.curves.setdefault(stage, {}).setdefault(key, {})[rec["step"]] = float(value)

    def headline(self) -> str:
        """The latest stage's line as `rlctl train` prints it off a terminal: step of steps, metrics, ETA."""
        with self.lock:
            return self.progress[self.current].line() if self.current else "no step logged yet"

    def panels(self, prefix: str = "") -> dict[str, list[Point]]:
        """The curves by plot (`panel_of`), every stage on one step axis: a stage's step 0 is where the stage before
        it ended."""
        out: dict[str, list[Point]] = {"loss": [], "reward": [], "accuracy": [], "scores": []}
        with self.lock:
            start = 0
            for stage, total in self.totals.items():
                for key, steps in self.curves.get(stage, {}).items():
                    held_out = key.startswith("eval_")
                    panel = panel_of(key, held_out) if key != "eval_rows" else None
                    if panel is not None:
                        out[panel] += [Point(f"{prefix}{stage} {key}", start + s, v) for s, v in sorted(steps.items())]
                start += total or max((s for steps in self.curves.get(stage, {}).values() for s in steps), default=0)
        return out


SAMPLE_COLUMNS = ["rank", "step", "prompt", "completion", "reward"]


def sample_rows(rec: dict, best: str = "best", worst: str = "worst") -> list[list[object]]:
    """The rows of a `samples` record: its best completions, then its worst, with their rewards (a malformed
    entry left out)."""
    rows: list[list[object]] = []
    for kind, word in (("best", best), ("worst", worst)):
        entries = rec.get(kind) if isinstance(rec.get(kind), list) else []
        for i, entry in enumerate(entries, 1):
            if isinstance(entry, dict) and isinstance(entry.get("reward"), int | float):
                rows.append([f"{word} {i}", rec.get("step", ""), str(entry.get("prompt", "")),
                             str(entry.get("completion", "")), round(float(entry["reward"]), 4)])  # fmt: skip
    return rows


def tail(path: Path, lines: int = LOG_LINES) -> str:
    """The last lines of a log, read from its last LOG_TAIL_BYTES."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


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


# ------------------------------------------------------------------------------------------- the device view
DEVICE_COLUMNS = ["device", "memory GiB", "of GiB", "utilisation %", "plan budget GiB"]


def plan_budget(run_dir: Path) -> float | None:
    """The memory budget per device (per process on CPU) of the run's plan, None where it has none."""
    from rlctl.plan import resolved

    try:
        table = resolved.read(run_dir).memory
    except Exception:  # no plan yet, or one an older rlctl wrote: no budget to show
        return None
    return table.budget_gib if table is not None else None


def gpu_rows(budget: float | None) -> list[list[object]]:
    """One row per GPU (nvidia-smi's numbers): memory used, total, utilisation; none without GPUs."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = "--query-gpu=index,name,memory.used,memory.total,utilization.gpu"
    try:
        out = subprocess.run([smi, query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5 and parts[2].isdigit() and parts[3].isdigit():
            used, total = int(parts[2]) / 1024, int(parts[3]) / 1024
            rows.append([f"cuda:{parts[0]} {parts[1]}", round(used, 2), round(total, 2), parts[4], budget or "-"])
    return rows


@dataclass
class ProcessUse:
    """The run's processes (the rlctl command and every process under it), kept between refreshes so that their
    CPU use is measured over the time since the last one."""

    seen: dict[int, Any] = field(default_factory=dict)

    def row(self, pid: int | None, budget: float | None) -> list[list[object]]:
        """One row: resident memory of the process tree (GiB) against the machine's, and its CPU use."""
        import psutil

        total = psutil.virtual_memory().total / 2**30
        idle = [["cpu: no process of this run is running", "-", round(total, 1), "-", budget or "-"]]
        if pid is None:
            return idle
        try:
            top = psutil.Process(pid)
            tree = [top, *top.children(recursive=True)]
        except psutil.Error:
            return idle
        rss, cpu = 0, 0.0
        for proc in tree:
            known = self.seen.setdefault(proc.pid, proc)
            try:
                rss += known.memory_info().rss
                cpu += known.cpu_percent(None)
            except psutil.Error:
                continue
        return [[f"cpu: {len(tree)} processes", round(rss / 2**30, 2), round(total, 1), round(cpu), budget or "-"]]


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
    watched = Watched(run_dir)
    watched.refresh()
    return RunRow(path, cfg.name, ",".join(cfg.stages), completed, watched.headline(), modified)


def config_diff(a: Path, b: Path) -> list[list[str]]:
    """The keys whose values differ between two runs' config.yaml: [key, value in a, value in b]."""
    import yaml

    def flat(data: object, prefix: str = "") -> dict[str, str]:
        if isinstance(data, dict):
            return {k: v for key, value in data.items() for k, v in flat(value, f"{prefix}{key}.").items()}
        return {prefix.rstrip("."): yaml.safe_dump(data, default_flow_style=True).strip().removesuffix("...").strip()}

    def read(d: Path) -> dict[str, str]:
        try:
            return flat(yaml.safe_load(RunDir(d).config.read_text(encoding="utf-8")) or {})
        except (OSError, ValueError, yaml.YAMLError):
            return {"config.yaml": "(cannot be read)"}

    fa, fb = read(a), read(b)
    return [[k, fa.get(k, "-"), fb.get(k, "-")] for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)]


FINAL_COLUMNS = ["stage", "metric", "A", "B"]


def final_metrics(a: Path, b: Path) -> list[list[object]]:
    """The held-out metrics each stage of two runs ended with (their summary.json), side by side."""
    from rlctl.rundir import read_summary

    def stages(d: Path) -> dict[str, dict[str, Any]]:
        try:
            return {s: m.metrics for s, m in read_summary(d).stages.items()}
        except (UserError, OSError, ValueError):
            return {}

    sa, sb = stages(a), stages(b)
    rows = []
    for stage in dict.fromkeys([*sa, *sb]):
        ma, mb = sa.get(stage, {}), sb.get(stage, {})
        for key in dict.fromkeys([*ma, *mb]):
            if key != "null_reasons":
                rows.append([stage, key, shown(ma.get(key)), shown(mb.get(key))])
    return rows


def shown(value: object) -> object:
    """A metric as a table cell: numbers to 4 significant digits, a missing one as '-'."""
    if value is None:
        return "-"
    return float(f"{value:.4g}") if isinstance(value, float) else value

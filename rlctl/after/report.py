"""`rlctl report RUN_DIR`: PNG plots of every stage's training curves (a fixed colour per stage, whole-number steps,
constant metrics named instead of drawn), the policies' held-out chart, the held-out preference pairs' chart (rm,
dpo, kto), a planned vs measured memory chart per phase, a report.md that embeds them with the run's configuration
and final metrics, and TensorBoard event files, all from the run directory's metrics.jsonl and summary.json (no
tracker account needed)."""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl import strictjson
from rlctl.after.plots import (
    LABELS,
    memory_rows,
    ordered,
    plot_memory,
    plot_preference,
    plot_stage,
    plot_summary,
    plotted,
    policy_heldout,
    preference_heldout,
)
from rlctl.errors import UserError
from rlctl.monitors.alarms import alarms_of
from rlctl.rundir import LayoutRecord, RunDir, Summary, read_summary

if TYPE_CHECKING:
    from rlctl.config import RunConfig

SKIP = ("step", "max_steps", "time", "epoch")


@dataclass
class Report:
    folder: Path
    markdown: Path
    plots: dict[str, Path] = field(default_factory=dict)
    tensorboard: Path | None = None
    notes: list[str] = field(default_factory=list)  # damaged run files and what the report did without them


def read_records(path: Path, damaged: list[int] | None = None) -> list[dict[str, Any]]:
    """metrics.jsonl records (a half-written last line, from a run still going or killed, is left out); the line
    numbers of other lines that are not JSON records are appended to `damaged`."""
    records = []
    lines = strictjson.lines(path, "`rlctl report` draws its charts from it: restore it from a copy.")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif damaged is not None and number < len(lines):
            damaged.append(number)
    return records


def curves(records: list[dict[str, Any]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{stage: {metric: [(step, value)]}} from the training records; for a step logged twice (a resumed run
    redoes the steps after its checkpoint) the later value wins."""
    by_stage: dict[str, dict[str, dict[int, float]]] = {}
    for rec in records:
        if "step" not in rec or "stage" not in rec:
            continue
        metrics = by_stage.setdefault(rec["stage"], {})
        for key, value in rec.items():
            if key in SKIP or not isinstance(value, int | float) or isinstance(value, bool):
                continue
            if math.isfinite(value):
                metrics.setdefault(key, {})[int(rec["step"])] = float(value)
    return {
        stage: {k: sorted(v.items()) for k, v in metrics.items() if v}
        for stage, metrics in by_stage.items()
        if any(metrics.values())
    }


def memory_lines(summary: Summary, plots: dict[str, Path]) -> list[str]:
    """report.md's planned-vs-measured memory table (empty when the run measured none)."""
    rows = memory_rows(summary)
    if not rows:
        return []
    source = next(iter(summary.memory.values())).measured_source
    lines = ["", "## Memory: planned vs measured", "", f"Measured peak per phase ({source}), GiB.", ""]
    lines += ["| phase | planned | measured | error |", "| --- | --- | --- | --- |"]
    for name, r in rows:
        error = f"{r.error_pct:+.0f}%" if r.error_pct is not None else "-"
        planned, measured = _fmt(r.planned_peak_gib or "-"), _fmt(r.peak_gib)
        lines.append(f"| {name} | {planned} | {measured} | {error} |")
    if "memory" in plots:
        lines += ["", f"![planned vs measured memory]({plots['memory'].name})"]
    return lines


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


def _durations(records: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds each stage ran (first to last record of the stage, over all attempts)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for rec in records:
        stage, t = rec.get("stage"), rec.get("time")
        if stage and isinstance(t, int | float) and stage != "base":
            first.setdefault(stage, t)
            last[stage] = t
    return {s: last[s] - first[s] for s in first}


def _hms(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def markdown(cfg, summary: Summary, records: list[dict], plots: dict[str, Path], run_dir: Path, tb: Path | None) -> str:
    from rlctl.after.card import hyperparameters

    stages = cfg.stages
    label = [f"{s} ({cfg.rl.algorithm})" if s == "rl" else s for s in stages]
    completed = summary.completed
    durations = _durations(records)
    lines = [
        f"# {cfg.name}: training report",
        "",
        cfg.description or "",
        "",
        "| | |",
        "| --- | --- |",
        f"| run directory | `{run_dir}` |",
        f"| model | `{cfg.model.name_or_path}` ({cfg.model.adapter}) |",
        f"| stages | {' -> '.join(label)} |",
        f"| finished | {', '.join(completed) or 'none yet'} |",
        f"| hardware | {cfg.hardware.spec}, {summary.world_size or 1} process(es) |",
        f"| seed | {cfg.seed} |",
    ]
    if durations:
        lines.append(f"| time per stage | {', '.join(f'{s} {_hms(d)}' for s, d in durations.items())} |")
    lines.append(f"| written | {time.strftime('%Y-%m-%d %H:%M:%S')} |")
    lines += heldout_lines(summary, records, plots, bool(cfg.data.eval or cfg.data.generate))
    lines += memory_lines(summary, plots)
    lines += layout_section(summary.layout)
    lines += ["", "## Configuration", "", f"Resolved config: `{RunDir(run_dir).config}`.", ""]
    data = cfg.data
    sources = {r: getattr(data, r) for r in ("sft", "preference", "rl", "eval") if getattr(data, r)}
    if data.generate:
        lines.append(f"- **data**: generated `{data.generate}`")
    else:
        lines.append("- **data**: " + (", ".join(f"{r} `{p}`" for r, p in sources.items()) or "none"))
    for stage in stages:
        params = ", ".join(f"{k}={v}" for k, v in hyperparameters(cfg, stage).items())
        lines.append(f"- **{stage}**: {params}")
    if "rl" in stages:
        rewards = ", ".join(f"`{r.name}` x{r.weight:g}" for r in cfg.rl.rewards)
        lines.append(f"- **rewards**: {rewards}")
    fired = alarms_of(records)
    if fired:
        lines += ["", "## Alarms", "", "Conditions under which a run learns nothing (`logging.alarms`):", ""]
        lines += [f"- **{a['alarm']}** ({a.get('stage')}, step {a.get('step')}): {a['message']}" for a in fired]
    series = curves(records)
    for stage, metrics in series.items():
        lines += ["", f"## {stage}", ""]
        last_step = max(step for points in metrics.values() for step, _ in points)
        lines.append(f"Last logged step {last_step}. Final values:")
        flat = plotted(metrics)[1]
        lines += ["", "| metric | first | last | min | max |", "| --- | --- | --- | --- | --- |"]
        for name in ordered(metrics):
            values = [v for _, v in metrics[name]]
            lines.append(
                f"| {LABELS.get(name, name)} | {_fmt(values[0])} | {_fmt(values[-1])} | "
                f"{_fmt(min(values))} | {_fmt(max(values))} |"
            )
        if flat:
            shown = ", ".join(f"{LABELS.get(n, n)} = {_fmt(metrics[n][0][1])}" for n in flat)
            lines += ["", f"Constant, not plotted: {shown}."]
        if stage in plots:
            lines += ["", f"![{stage} training curves]({plots[stage].name})"]
    if tb is not None:
        lines += [
            "",
            "## TensorBoard",
            "",
            f"Event files: `{tb.parent}`. View them with `tensorboard --logdir {tb.parent}`.",
        ]
    return "\n".join(lines) + "\n"


def heldout_lines(summary: Summary, records: list[dict[str, Any]], plots: dict[str, Path], has_eval: bool) -> list[str]:
    """report.md's held-out sections: the policies' task metrics (or one line saying the run had no held-out
    prompts) and the preference-pair accuracy and margin of rm, dpo and kto."""
    held = policy_heldout(summary)
    lines = ["", "## Final metrics (held-out)", ""]
    if held:
        keys = sorted({k for m in held.values() for k in m} - {strictjson.REASONS})
        lines += ["| stage | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
        for stage, metrics in held.items():
            nulls = metrics.get(strictjson.REASONS, {})
            cells = [nulls.get(k, "n/a") if metrics.get(k, "") is None else _fmt(metrics.get(k, "")) for k in keys]
            lines.append(f"| {stage} | " + " | ".join(cells) + " |")
        if "summary" in plots:
            lines += ["", f"![held-out metrics per stage]({plots['summary'].name})"]
    elif has_eval:
        lines.append("No policy stage has been scored on `data.eval` yet.")
    else:
        lines.append("No held-out prompts: set `data.eval` to score each policy stage after training.")
    pref = preference_heldout(summary, records)
    if pref:
        lines += ["", "Held-out preference pairs (a tenth of `data.preference`):", ""]
        lines += ["| stage | chosen preferred | mean reward margin |", "| --- | --- | --- |"]
        lines += [f"| {s} | {_fmt(m.get('accuracy'))} | {_fmt(m.get('margin'))} |" for s, m in pref.items()]
        if "preference" in plots:
            lines += ["", f"![held-out preference pairs]({plots['preference'].name})"]
    return lines


def layout_section(layout: dict[str, LayoutRecord]) -> list[str]:
    """summary.json's layout records: each value the plan chose beside what the stage ran, and what was counted."""
    if not layout:
        return []
    lines = ["", "## Layout: planned vs observed", "", "| stage | setting | planned | observed | |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for stage, record in layout.items():
        for key, want in record.planned.items():
            mark = "**MISMATCH**" if key in record.mismatched else "ok"
            lines.append(f"| {stage} | {key} | {_fmt(want)} | {_fmt(record.observed.get(key, '-'))} | {mark} |")
    lines.append("")
    for stage, record in layout.items():
        live = record.observed
        counted = [f"{live.get('trainable_parameters', 0):,} of {live.get('total_parameters', 0):,} parameters train"]
        counted.append(f"LoRA modules {live.get('lora_modules', 0)}, Linear4bit {live.get('linear4bit_modules', 0)}")
        counted.append(f"DTensor parameters {live.get('dtensor_parameters', 0)}")
        state = live.get("optimizer_state")
        if state:
            where = "/".join(state["devices"]) or "none"
            counted.append(f"optimizer state {state['bytes']:,} B ({'/'.join(state['dtypes'])}) on {where}")
        if "optimizer_switches" in live:
            counted.append(f"offload switches {json.dumps(live['optimizer_switches'])}")
        processes = record.processes_recorded or 1
        lines.append(f"- **{stage}** ({processes} process(es) recorded): " + "; ".join(counted))
    return lines


def build(run_dir: Path, out: Path | None = None, force: bool = False) -> Report:
    """Write the plots, report.md and TensorBoard events of `run_dir` (the folder through `safewrite`: a folder
    holding the user's files is refused unless `force`); returns what was written. A damaged summary.json or
    metrics.jsonl line is named in the report's notes and left out."""
    from rlctl.checkpoint import safewrite, verify

    if not RunDir(run_dir).is_run():
        raise UserError(f"{run_dir} is not a run directory (no config.yaml).")
    metrics_path = RunDir(run_dir).metrics
    if not metrics_path.is_file():
        raise UserError(
            f"{run_dir} has no metrics.jsonl yet: nothing was trained. Start it with `rlctl resume {run_dir}`."
        )
    cfg = verify.run_config(run_dir)
    damaged: list[int] = []
    records = read_records(metrics_path, damaged)
    notes = [f"{metrics_path}: line(s) {', '.join(map(str, damaged[:5]))} are damaged and left out"] if damaged else []
    try:
        summary = read_summary(run_dir)
    except strictjson.DamagedFile as e:
        summary = Summary()
        notes.append(
            f"{e.path} is damaged ({e.damage}); the report is built from metrics.jsonl alone (no held-out summary "
            "table or chart)"
        )
    final = out or RunDir(run_dir).report
    safewrite.check_target(final, "report", force)
    with safewrite.lock(final, "report"):
        notes += [stale] if (stale := safewrite.drop_stale(final)) else []
        tmp = safewrite.staging(final)
        try:
            rep = _write(cfg, summary, records, run_dir, tmp)
            safewrite.publish(tmp, final, "report", force)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    plots = {k: final / p.relative_to(tmp) for k, p in rep.plots.items()}
    return Report(final, final / rep.markdown.name, plots, rep.tensorboard, notes)


def _write(cfg: RunConfig, summary: Summary, records: list[dict[str, Any]], run_dir: Path, out: Path) -> Report:
    """The plots and report.md into `out`, the TensorBoard events into the run."""
    from rlctl.launch import tbevents

    charts = {
        stage: plot_stage(stage, m, out / f"{stage}.png", f"{cfg.name}: {stage}")
        for stage, m in curves(records).items()
    }
    charts["summary"] = plot_summary(summary, out / "summary.png")
    charts["preference"] = plot_preference(preference_heldout(summary, records), out / "preference.png")
    charts["memory"] = plot_memory(summary, out / "memory.png")
    plots = {name: chart for name, chart in charts.items() if chart is not None}
    tb = tbevents.write_metrics(records, RunDir(run_dir).tensorboard)
    md = out / "report.md"
    md.write_text(markdown(cfg, summary, records, plots, run_dir, tb))
    return Report(out, md, plots, tb)

"""What `rlctl train` shows while a launch runs: new `metrics.jsonl` records read as they are appended, turned into
progress bars on a terminal (plain lines elsewhere) and event lines (alarms, restarts, tracker failures, slow
rewards), and the held-out summary table a finished run ends with. Each stage's progress is
`rlctl.launch.progress`'s."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from rlctl import tables
from rlctl.launch import progress as progress_mod
from rlctl.launch import restarts
from rlctl.rundir import Summary

if TYPE_CHECKING:  # rich's progress and tables load only when a run starts or a summary is shown
    from rich.progress import Progress, TaskID
    from rich.table import Table


LIVE_BYTES = 64 * 2**20  # metrics.jsonl read per poll of a running launch


def read_new(path: Path, offset: int) -> tuple[list[dict], int]:
    """Complete jsonl records appended to `path` since byte `offset`, at most LIVE_BYTES of them per call (a line
    longer than that is no record: it is skipped)."""
    if not path.is_file():  # not yet, or no regular file (a link to a device): nothing to show
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        chunk = f.read(LIVE_BYTES)
    end = chunk.rfind(b"\n") + 1
    if not end and len(chunk) == LIVE_BYTES:
        return [], offset + len(chunk)
    records = []
    for line in chunk[:end].splitlines():
        with contextlib.suppress(ValueError):  # a damaged line (a disk that filled up) is not a record
            record = json.loads(line) if line.strip() else None
            records += [record] if isinstance(record, dict) else []
    return records, offset + end


def _cell(value: object) -> str:
    """A summary number to 4 significant digits; `n/a` for a value that was NaN/inf (written as null)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


def summary_table(summary: Summary) -> Table:
    """The per-stage held-out metrics of summary.json as a table: a row per metric, a column per stage (a column
    per metric was too wide for 80 columns once a run has tool metrics)."""
    from rich.table import Table

    stages = {name: stage.metrics for name, stage in summary.stages.items()}
    table = Table(title="Summary (held-out)", title_justify="left")
    table.add_column("metric", no_wrap=True)
    for stage in stages:
        table.add_column(stage, justify="right", no_wrap=True)
    for k in sorted({k for m in stages.values() for k in m} - {"null_reasons"}):
        table.add_row(k, *[_cell(metrics.get(k, "")) for metrics in stages.values()])
    return table


def show_summary(console: Console, summary: Summary) -> None:
    """The table a finished run ends with, or one line where no stage has a held-out metric (an empty table of
    stage names said nothing)."""
    if any(k != "null_reasons" for m in summary.stages.values() for k in m.metrics):
        tables.show(console, summary_table(summary))
    else:
        console.print("No held-out metrics: set data.eval to score each policy stage after training.")


def bar_columns() -> list:
    """The progress bars' columns: at 80 columns the stage name and the step count stay whole and the metrics wrap
    at spaces (a 40-wide bar squeezed them into `r…` and `eval_reward …`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
    from rich.table import Column

    return [
        TextColumn("[bold]{task.description:<6}", table_column=Column(no_wrap=True)),
        BarColumn(bar_width=16),
        MofNCompleteColumn(table_column=Column(no_wrap=True)),
        TextColumn("{task.fields[info]}", table_column=Column(ratio=1)),
        TextColumn("{task.fields[eta]}", table_column=Column(no_wrap=True)),
    ]


def plain_lines(console: Console, stages: dict[str, progress_mod.StageProgress], every_s: float) -> None:
    """Off a terminal: a plain line per step each stage logged since the last poll, and a held-out scoring's
    progress at most every `every_s` seconds (StageProgress.plain_lines), flushed at once."""
    for stage in stages.values():
        for line in stage.plain_lines(every_s):
            console.print(line, markup=False)
    console.file.flush()


def show_record(
    progress: Progress, tasks_by_stage: dict[str, TaskID], stages: dict[str, progress_mod.StageProgress], rec: dict
) -> None:
    stage = rec.get("stage", "?")
    if rec.get("event") == "alarm":
        progress.console.print(f"[yellow]alarm[/] ({stage}, step {rec.get('step')}): {escape(rec['message'])}")
        return
    if rec.get("event") == "restart":
        progress.console.print(restarts.restart_line(rec))
        return
    if rec.get("event") == "tracker_failed":
        progress.console.print(f"[yellow]warning[/] ({stage}): {escape(rec['message'])}")
        return
    if rec.get("event") == "reward_slow":
        progress.console.print(
            f"[yellow]slow reward[/] ({stage}): '{escape(rec['reward'])}' has run {rec['seconds']:g} s on one batch; "
            f"it is stopped at its timeout_s of {rec['timeout_s']:g} s."
        )
        return
    if stage not in tasks_by_stage:
        tasks_by_stage[stage] = progress.add_task(stage, total=rec.get("max_steps"), info="", eta="")
        stages[stage] = progress_mod.StageProgress(stage, plain=not progress.console.is_terminal)
    task, state = tasks_by_stage[stage], stages[stage]
    state.update(rec)
    if rec.get("event") == "data" and "dropped_too_long" in rec:
        progress.console.print(f"[yellow]{progress_mod.dropped_line(rec)}[/]")
    if rec.get("event") == "end":
        progress.update(task, completed=progress.tasks[task].total or 0, info=state.info(), eta="")
        return
    progress.update(task, completed=state.step, total=state.total, info=state.info(), eta=state.eta_text())

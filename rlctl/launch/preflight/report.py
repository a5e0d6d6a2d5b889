"""What the pre-flight found (`Report`), the state its checks share while it runs (`Preflight`), and how `rlctl plan`
shows the report and `rlctl train` refuses it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl import data, tables
from rlctl.config import RunConfig
from rlctl.data import DataInfo, tokens
from rlctl.data.images import ImageBudget
from rlctl.errors import UserError


@dataclass
class Report:
    """What the pre-flight found: one line per check, the datasets by role, the length counts by stage."""

    checks: dict[str, str] = field(default_factory=dict)
    data: dict[str, dict[str, Any]] = field(default_factory=dict)
    lengths: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # {stage: rows}, not reported
    infos: dict[str, DataInfo] = field(default_factory=dict)  # {stage: what was read}, not reported
    images: dict[str, ImageBudget] = field(default_factory=dict)  # {stage: its rows' image tokens}

    def to_json(self) -> dict[str, Any]:
        images_read = {"images": {s: b.to_json() for s, b in self.images.items()}} if self.images else {}
        return {"checks": self.checks, "lengths": self.lengths, "errors": self.errors, **images_read}

    def recognised(self) -> dict[str, DataInfo]:
        """What was recognised in each dataset, by data role (a role read by two stages once)."""
        return {info.role: info for info in self.infos.values()}


@dataclass
class Preflight:
    """What the checks share while the pre-flight runs: its inputs (`full`: every row is read, else large files are
    sampled; `paths`: the datasets when they are not the config's own, generated data; `bf16`: the plan's precision,
    the dtype a GGUF file is converted in), the report they fill, and what one check finds for the next (the
    model's folder, the rows, the chat template, the tokenizer)."""

    cfg: RunConfig
    run_dir: Path
    full: bool = False
    paths: dict[str, Path] | None = None
    bf16: bool = False
    report: Report = field(default_factory=Report)
    folder: Path | None = None
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    template: str | None = None
    tokenizer: tokens.FileTokenizer | None = None


def longest(report: Report) -> dict[str, int]:
    """The lengths the memory model plans, {stage: tokens} (rlctl.plan.data_lengths.LENGTH_KEYS): each training stage's
    longest kept row as counted (RL: its longest prompt); a stage whose rows were not counted is left out."""
    return {stage: n["longest"] for stage, n in report.lengths.items() if stage != "eval" and n.get("longest")}


def require(report: Report) -> None:
    """Raise the report's problems as one UserError (exit 2)."""
    if report.errors:
        head = "Pre-flight failed: " if len(report.errors) > 1 else ""
        raise UserError(head + " ".join(report.errors))


def show(console: Any, report: Report) -> None:
    """The pre-flight as `rlctl plan` prints it: the checks, the datasets, the over-long rows per stage."""
    from rich.markup import escape
    from rich.table import Table

    for name, text in report.checks.items():
        console.print(f"[bold]{name.capitalize()}[/] {escape(text)}")
    if report.data:
        table = Table(title="Data", title_justify="left")
        for col in ("role", "read by", "source", "format", "rows"):
            table.add_column(col, overflow="fold")
        for role, info in report.data.items():
            stages = ", ".join("held-out eval" if s == "eval" else s for s in info.get("stages", []))
            if "error" in info:
                table.add_row(role, stages, escape(info["source"]), f"[red]{escape(info['error'])}[/]", "")
                continue
            fmt = info.get("format", "")
            text = f"{fmt}: {data.FORMATS[fmt][0]}" if fmt in data.FORMATS else fmt
            text += "".join(f"; {n}" for n in info.get("notes", []))
            table.add_row(role, stages, escape(info["source"]), escape(text), str(info.get("rows", "")))
        tables.show(console, table)  # a block per dataset where a path is too long for its column
    show_lengths(console, report)


def show_lengths(console: Any, report: Report) -> None:
    """One line per stage with rows over its length limit."""
    for stage, n in report.lengths.items():
        sampled = " (of the rows sampled)" if n["sampled"] else ""
        console.print(
            f"[bold]Lengths[/] {stage}: {n['over_limit']} of {n['rows']} rows ({n['share']:.1%}) over "
            f"{n['limit_key']}={n['limit']} tokens{sampled}, dropped at launch; {n['keeps_95']} keeps 95%"
        )

"""What `rlctl doctor` does and prints."""

from __future__ import annotations

import json
import sys

from rich import box
from rich.markup import escape
from rich.table import Table

from rlctl import tables
from rlctl.cli.cockpit import UI

STATUS_STYLE = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]", "info": "[blue]info[/]"}


def doctor_command(ui: UI, online: bool, as_json: bool) -> int:
    """Print the checks; 1 when any failed (each with its fix command), else 0."""
    from rlctl.after import doctor

    with ui.console.status("Checking this machine..."):
        checks = doctor.run(online=online)
    failed = [c for c in checks if c.status == doctor.FAIL]
    if as_json:
        sys.stdout.write(json.dumps({"ok": not failed, "checks": doctor.as_json(checks)}, indent=2) + "\n")
        return 1 if failed else 0
    # Status and name never wrap, the detail wraps at spaces; each fix command is printed whole on its own line
    # below the table (four columns broke paths and commands mid-word at 80 columns).
    table = Table(title="rlctl doctor", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("detail")
    for c in checks:
        table.add_row(STATUS_STYLE[c.status], escape(c.name), escape(c.detail))
    tables.show(ui.results(), table)
    for c in checks:
        if c.fix:
            ui.results().print(f"[bold]fix {escape(c.name)}:[/] {escape(c.fix)}", soft_wrap=True)
        elif c.install:  # a command in the detail cell wrapped at its spaces
            ui.results().print(f"[bold]install {escape(c.name)} (optional):[/] {escape(c.install)}", soft_wrap=True)
    if failed:
        ui.results().print(
            f"[bold red]{len(failed)} problem(s).[/] Run the fix command(s) above, then rlctl doctor again."
        )
        if ui.verbose:
            for c in failed:
                ui.console.print(f"  {c.fix}", markup=False)
        return 1
    warned = sum(c.status == doctor.WARN for c in checks)
    ui.results().print("[green]Ready.[/]" + (f" {warned} warning(s) above." if warned else ""))
    return 0

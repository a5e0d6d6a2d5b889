"""What `rlctl verify` does and prints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.markup import escape

from rlctl.cli.cockpit import UI
from rlctl.errors import UserError
from rlctl.rundir import RunDir


def _harmless_extras(folder: Path) -> list[str]:
    """The files beside an export that its manifest does not list and no model load reads (a README, notes)."""
    from rlctl.checkpoint import verify

    return verify.unrecorded(folder)[1] if verify.is_export(folder) else []


def verify_command(ui: UI, run_dir: Path, as_json: bool) -> int:
    """`rlctl verify`: one line per checkpoint, final folder and export of a run, or one for an export folder; 1
    when any is damaged."""
    from rlctl.checkpoint import verify
    from rlctl.checkpoint.safewrite import listed

    is_run = RunDir(run_dir).is_run()
    if is_run:
        checks = verify.verify_run(run_dir)
    elif verify.is_export(run_dir):
        checks = [(str(run_dir), verify.verify_export(run_dir))]
    else:
        raise UserError(
            f"{run_dir} is neither a run directory (no config.yaml) nor a folder written by `rlctl export` (no "
            f"{verify.MANIFEST})."
        )
    damaged = [name for name, problems in checks if problems]
    extras = {name: _harmless_extras(run_dir / name if is_run else run_dir) for name, _ in checks}
    if as_json:
        report = [
            {"path": name, "intact": not problems, "problems": problems, "not_written_by_rlctl": extras[name]}
            for name, problems in checks
        ]
        sys.stdout.write(json.dumps({"ok": not damaged, "checked": report}, indent=2) + "\n")
        return 1 if damaged else 0
    for name, problems in checks:
        mark = "[green]intact[/]" if not problems else "[red]damaged[/]: " + escape("; ".join(problems))
        also = f" (also holds {escape(listed(extras[name]))}, not written by rlctl; no model load reads them)"
        ui.results().print(f"{escape(name)}: {mark}{also if extras[name] else ''}")
    if not checks:
        ui.results().print(f"{escape(str(run_dir))} holds no checkpoint, final folder or export yet.")
    elif damaged and not is_run:
        ui.results().print("[red]Damaged.[/] Export it again with `rlctl export RUN_DIR --out FOLDER`.")
    elif damaged:
        ui.results().print(
            f"[red]{len(damaged)} of {len(checks)} damaged.[/] `rlctl resume {escape(str(run_dir))}` falls back to the "
            "newest intact checkpoint; re-export a damaged export with `rlctl export`."
        )
    else:
        ui.results().print(f"[green]All {len(checks)} intact.[/]")
    return 1 if damaged else 0

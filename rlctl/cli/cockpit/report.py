"""What `rlctl report` does and prints."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from rlctl.cli.cockpit import UI


def report_command(ui: UI, run_dir: Path, out: Path | None, force: bool = False) -> None:
    from rlctl.after import report as report_mod

    with ui.console.status("Plotting metrics..."):
        rep = report_mod.build(run_dir, out, force)
    for note in rep.notes:
        ui.console.print(f"[yellow]warning:[/] {escape(note)}")
    for name, path in rep.plots.items():
        ui.console.print(f"  {name}: {path}")
    if rep.tensorboard:
        ui.console.print(f"  tensorboard: tensorboard --logdir {rep.tensorboard.parent}")
    ui.results().print(f"[green]Wrote[/] {rep.markdown}")

"""The `rlctl` command line. Torch-free: heavy imports happen only inside train/export code paths.

Package `rlctl.cli`: the entry point (this module), the Typer app and its shared options (`app`), the commands
before training (`prepare`: init, presets, rewards), the run commands (`run`: plan, train, resume), the job files
for schedulers (`jobs`: slurm, k8s, sky), the commands after training (`results`: export, eval, report, verify,
doctor), the bodies of rewards, eval, report, doctor and verify, one module per command (`cockpit`), the web page
(`web`: rlctl ui), the generated docs (`docs_gen`) and the code map (`codemap`).
May import: every other package.
"""

from __future__ import annotations

import sys

import typer

# isort: off
# Each module registers its commands on the app; `rlctl --help` lists them in this order.
from rlctl.cli import prepare  # noqa: F401
from rlctl.cli import run  # noqa: F401
from rlctl.cli import jobs  # noqa: F401
from rlctl.cli import results  # noqa: F401
from rlctl.cli import web  # noqa: F401

# isort: on
from rlctl.cli.app import app, cli_command, err_console
from rlctl.errors import UserError
from rlctl.scrub import scrub

__all__ = ["app", "cli_command", "main"]


def _only_invoked_command(args: list[str]) -> None:
    """Keep only the command named on the command line: Typer builds every command's options before parsing
    (~10-15 ms of `rlctl plan`). Help, completion and unknown names keep the full set."""
    name = next((a for a in args if not a.startswith("-")), None)
    if name is None or any(a.endswith("-completion") for a in args):
        return
    named = typer.main.get_command_name
    commands = [c for c in app.registered_commands if (c.name or named(c.callback.__name__)) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if commands or groups:
        app.registered_commands, app.registered_groups = commands, groups


def main() -> None:
    """Entry point: bad input exits 2 with one paragraph and no traceback (usage errors too, via Typer)."""
    _only_invoked_command(sys.argv[1:])
    try:
        cli_command()()
    except UserError as e:
        from rich.markup import escape

        err_console.print(f"[bold red]error:[/] {escape(scrub(str(e)))}")  # keep 'rlctl[vllm]' and the like intact
        sys.exit(2)


if __name__ == "__main__":
    main()

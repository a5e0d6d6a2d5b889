"""The Typer app every command registers on, its shared options and consoles, and the config resolution all
run commands share."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
import typer.main
from rich.console import Console

from rlctl import __version__
from rlctl.errors import UserError

if TYPE_CHECKING:  # the config schema loads on demand, keeping `rlctl --help` fast
    import click

    from rlctl.cli.cockpit import UI
    from rlctl.config import RunConfig

app = typer.Typer(
    help="Post-train LLMs without writing Python: SFT -> reward model -> RL, planned for your hardware.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
presets_app = typer.Typer(help="Browse the shipped presets.", no_args_is_help=True)
app.add_typer(presets_app, name="presets")
rewards_app = typer.Typer(help="Reward functions: the built-ins, and a dry run on your data.", no_args_is_help=True)
app.add_typer(rewards_app, name="rewards")


def make_console(stderr: bool = False, quiet: bool = False) -> Console:
    """A console for rlctl's output. Off a terminal (a pipe, a file, CI logs) a printed line stays one line: nothing
    is wrapped at COLUMNS, so paths, commands and YAML come out whole. On a terminal prose wraps at spaces; print
    commands with soft_wrap=True."""
    out = Console(stderr=stderr, quiet=quiet, highlight=False, emoji=False)
    out.soft_wrap = not out.is_terminal
    return out


err_console = make_console(stderr=True)  # errors and notes beside machine-readable stdout; never quiet

PresetOpt = Annotated[
    str | None, typer.Option("--preset", "-p", metavar="NAME", help="Preset to start from (rlctl presets list).")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", metavar="FILE", help="YAML config layered on the preset.")
]
AlgoOpt = Annotated[
    str | None, typer.Option("--algorithm", "-a", metavar="NAME", help="Algorithm preset (grpo, ppo, dapo, ...).")
]
HwOpt = Annotated[
    str | None, typer.Option("--hardware", metavar="SPEC", help="Plan for: cpu, 1xH100-80GB, 2x8xH100-80GB, ...")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", metavar="KEY=VALUE", help="Override one key (repeatable): --set rl.beta=0.04"),
]
RunDirOpt = Annotated[
    Path | None, typer.Option("--run-dir", metavar="RUN_DIR", help="Run directory (default runs/NAME-TIME).")
]
StagesOpt = Annotated[str | None, typer.Option("--stages", metavar="LIST", help="Run a subset: sft,rm,rl.")]
NodesOpt = Annotated[
    int | None,
    typer.Option("--nodes", min=1, metavar="N", help="Machines the run spans; run rlctl once on each (rlctl slurm)."),
]
NodeRankOpt = Annotated[
    int | None,
    typer.Option("--node-rank", min=0, metavar="RANK", help="This machine's rank, 0 to N-1 (0 at --main-address)."),
]
MainOpt = Annotated[
    str | None,
    typer.Option(
        "--main-address",
        metavar="HOST[:PORT]",
        help="The rank-0 node of a multi-node run (port 29500 by default).",
    ),
]


def _version(value: bool) -> None:
    if value:
        make_console().print(f"rlctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only errors and final results.")] = False,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="More detail: full texts, every eval sample, the plan before training."),
    ] = False,
) -> None:
    """rlctl: no-code post-training for LLMs. Colours turn off when output is not a terminal (or NO_COLOR is set).
    Shell completion: rlctl --install-completion."""
    from rlctl.cli.cockpit import UI

    if quiet and verbose:
        raise UserError("--quiet and --verbose contradict each other; pick one.")
    ctx.obj = UI(make_console(quiet=quiet), verbose)  # the commands' output, through `_ui()`


def _resolve(
    preset: str | None,
    config_file: Path | None,
    algorithm: str | None,
    hardware: str | None,
    sets: list[str] | None,
    stages: str | None,
) -> RunConfig:
    if not preset and not config_file and Path("rlctl.yaml").is_file():
        config_file = Path("rlctl.yaml")
    notes: list[str] = []
    cfg = resolve_config(preset, config_file, algorithm, hardware, sets, stages, notes)
    show_notes(notes)
    return cfg


def resolve_config(
    preset: str | None,
    config_file: Path | None,
    algorithm: str | None,
    hardware: str | None,
    sets: list[str] | None,
    stages: str | None,
    notes: list[str],
) -> RunConfig:
    """The run commands' options (--preset, --config, --algorithm, --hardware, --set, --stages) as one validated
    config, a line in `notes` for each moved key; what `rlctl ui` checks its page against too."""
    from rlctl import config as config_mod

    sets = list(sets or [])
    if stages:
        sets.append(f"stages=[{stages}]")
    return config_mod.resolve(preset, config_file, algorithm, hardware, sets, notes)


def show_notes(notes: list[str]) -> None:
    """Config notes (keys that moved, read at their new places) on stderr, beside any machine-readable stdout."""
    from rich.markup import escape

    for note in notes:
        err_console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


RewardOpt = Annotated[
    list[str] | None,
    typer.Option("--reward", "-r", metavar="NAME", help="Reward to use (repeatable; default: rl.rewards)."),
]
ColumnOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--column", metavar="ROLE=COLUMN", help="Map a column: prompt=question (repeatable; adds to data.columns)."
    ),
]


def _metavar(param: click.Parameter) -> str:
    """What to type for a parameter that names no metavar: nothing for a flag, else its name or its kind
    (Typer would show the Python type: `<bool>`, `<list[str]>`, `<path>`)."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    kind = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if param.param_type_name == "option" and kind is int:
        return "N"
    if param.param_type_name == "option" and kind is float:
        return "X"
    if param.param_type_name == "option" and kind is Path:
        return "PATH"
    return (param.name or "value").strip("_").upper()


def _reflow(text: str) -> str:
    """Docstring paragraphs as single lines, so that help wraps them to the terminal (Typer keeps line breaks)."""
    return "\n\n".join(" ".join(p.split()) for p in text.strip().split("\n\n"))


def for_terminal(command: click.Command) -> click.Command:
    """The command tree with a metavar on every parameter (--help included) and help paragraphs that reflow;
    what `rlctl --help` and docs/cli.md show."""
    if command.help:
        command.help = _reflow(command.help)
    help_option = command.get_help_option(typer.Context(command))
    for param in [*command.params, *([help_option] if help_option else [])]:
        if param.metavar is None:
            param.metavar = _metavar(param)
        if param.param_type_name == "argument":  # Typer's usage line writes a required one as {NAME}
            shown = param.metavar if param.required else f"[{param.metavar}]"
            param.get_usage_pieces = lambda ctx, shown=shown: [shown]
            param.display_type_rich = lambda ctx: None  # its name says what to type; Typer adds `<path>`
    for child in getattr(command, "commands", {}).values():
        for_terminal(child)
    return command


def cli_command() -> click.Command:
    """The Click command tree `rlctl` runs: the Typer app with metavars that say what to type (`KEY=VALUE`,
    `RUN_DIR`) and reflowing help."""
    return for_terminal(typer.main.get_command(app))


def _ui(ctx: typer.Context, stderr: bool = False) -> UI:
    """Where a command prints: the UI the root command made of --quiet and --verbose (`ctx.obj`); `stderr=True`
    when stdout carries JSON (`--json`)."""
    ui: UI = ctx.obj
    return dataclasses.replace(ui, console=err_console) if stderr else ui

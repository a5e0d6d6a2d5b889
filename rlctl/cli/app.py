"""The Typer app every command registers on, its shared options and consoles, and the config resolution all
run commands share."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from rlctl import __version__
from rlctl.errors import UserError

if TYPE_CHECKING:  # the config schema loads on demand, keeping `rlctl --help` fast
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
console = Console(highlight=False, emoji=False)
err_console = Console(stderr=True, highlight=False, emoji=False)

PresetOpt = Annotated[str | None, typer.Option("--preset", "-p", help="Preset to start from (rlctl presets list).")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config layered on the preset.")]
AlgoOpt = Annotated[str | None, typer.Option("--algorithm", "-a", help="Algorithm preset (grpo, ppo, dapo, ...).")]
HwOpt = Annotated[str | None, typer.Option("--hardware", help="Plan for: cpu, 1xH100-80GB, 2x8xH100-80GB, ...")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override one key: --set rl.beta=0.04")]
RunDirOpt = Annotated[Path | None, typer.Option("--run-dir", help="Run directory (default runs/<name>-<time>).")]
StagesOpt = Annotated[str | None, typer.Option("--stages", help="Run a subset: sft,rm,rl.")]
NodesOpt = Annotated[
    int | None, typer.Option("--nodes", min=1, help="Machines the run spans; run rlctl once on each (see rlctl slurm).")
]
NodeRankOpt = Annotated[
    int | None, typer.Option("--node-rank", min=0, help="This machine's rank, 0 to nodes-1 (0 at --main-address).")
]
MainOpt = Annotated[
    str | None,
    typer.Option("--main-address", help="HOST[:PORT] of the rank-0 node for a multi-node run (port 29500 default)."),
]


def _version(value: bool) -> None:
    if value:
        console.print(f"rlctl {__version__}")
        raise typer.Exit()


VERBOSE = {"on": False}


@app.callback()
def _root(
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
    if quiet and verbose:
        raise UserError("--quiet and --verbose contradict each other; pick one.")
    console.quiet = quiet
    VERBOSE["on"] = verbose


def _resolve(
    preset: str | None,
    config_file: Path | None,
    algorithm: str | None,
    hardware: str | None,
    sets: list[str] | None,
    stages: str | None,
) -> RunConfig:
    from rlctl import config as config_mod

    if not preset and not config_file and Path("rlctl.yaml").is_file():
        config_file = Path("rlctl.yaml")
    sets = list(sets or [])
    if stages:
        sets.append(f"stages=[{stages}]")
    return config_mod.resolve(preset, config_file, algorithm, hardware, sets)


RewardOpt = Annotated[
    list[str] | None,
    typer.Option("--reward", "-r", help="Reward to use (repeatable); default: the config's rl.rewards."),
]
ColumnOpt = Annotated[
    list[str] | None, typer.Option("--column", help="Map a column: prompt=question (repeatable; adds to data.columns).")
]


def _ui():
    from rlctl.cli.cockpit import UI

    return UI(console, VERBOSE["on"])

"""Before training: `rlctl init` (a project scaffold), `rlctl presets list|show` and `rlctl rewards list|test`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rlctl.errors import UserError

if TYPE_CHECKING:  # the config schema and planner load on demand, keeping `rlctl --help` fast
    pass

from rlctl.cli.app import (
    ColumnOpt,
    ConfigOpt,
    PresetOpt,
    RewardOpt,
    SetOpt,
    _resolve,
    _ui,
    app,
    console,
    presets_app,
    rewards_app,
)


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Project folder to create.")] = Path("."),
    preset: Annotated[str, typer.Option("--preset", "-p", help="Preset the project starts from.")] = "tiny-demo",
    force: Annotated[bool, typer.Option("--force", help="Overwrite files of the scaffold that already exist.")] = False,
) -> None:
    """Scaffold a project: a commented rlctl.yaml, sample datasets and a reward plugin template. Files already in
    DIRECTORY are never overwritten without --force."""
    from rlctl.config import presets
    from rlctl.resources import data_dir

    presets.get(preset)
    template = data_dir("templates") / "project"
    files = sorted(p.relative_to(template) for p in template.rglob("*") if p.is_file())
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{directory} is a file, not a folder; pick another project folder.")
    taken = [str(f) for f in files if (directory / f).exists()]
    if taken and not force:
        shown = ", ".join(taken[:5]) + (f" and {len(taken) - 5} more" if len(taken) > 5 else "")
        raise UserError(
            f"{shown} already exists in {directory}; nothing was written (rlctl never overwrites your files). Pick "
            "an empty folder, or add --force to overwrite them with the scaffold's."
        )
    target = directory / "rlctl.yaml"
    shutil.copytree(template, directory, dirs_exist_ok=True)
    text = (template / "rlctl.yaml").read_text().replace("{preset}", preset)
    target.write_text(text)
    console.print(f"[green]Created[/] {directory}/ from preset [bold]{preset}[/]:")
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.relative_to(directory).parts[0] != "runs"):
        console.print(f"  {path.relative_to(directory)}")
    console.print(f"Next: [bold]cd {directory} && rlctl plan && rlctl train[/]")


@presets_app.command("list")
def presets_list() -> None:
    """Every preset: recipes (name, model, algorithm, stages, minimum hardware), then the building blocks."""
    from rich.table import Table

    from rlctl import config as config_mod
    from rlctl.config import presets

    table = Table(title="Recipes", title_justify="left")
    for col in ("name", "model", "algorithm", "stages", "min hardware", "description"):
        table.add_column(col, overflow="fold")
    by_kind: dict[str, list[str]] = {}
    for name, p in presets.all_presets().items():
        by_kind.setdefault(p.kind, []).append(name)
    for name in by_kind.get("recipes", []):
        cfg = config_mod.validate(presets.load(name), source=f"preset {name}")
        algo = cfg.rl.algorithm if "rl" in cfg.stages else "-"
        table.add_row(name, cfg.model.name_or_path, algo, ",".join(cfg.stages), cfg.hardware.spec, cfg.description)
    console.print(table)
    blocks = Table(
        title="Building blocks (use with --algorithm, --hardware, or defaults: in a config)", title_justify="left"
    )
    blocks.add_column("kind")
    blocks.add_column("names", overflow="fold")
    for kind in ("algorithms", "models", "hardware"):
        blocks.add_row(kind, ", ".join(by_kind.get(kind, [])))
    console.print(blocks)


@presets_app.command("show")
def presets_show(name: Annotated[str, typer.Argument(help="Preset name.")]) -> None:
    """A preset's file and the config it resolves to."""
    from rlctl import config as config_mod
    from rlctl.config import presets

    preset = presets.get(name)
    console.print(
        f"[bold]{preset.name}[/] ({preset.kind[:-1] if preset.kind != 'hardware' else 'hardware'}) from {preset.path}\n"
    )
    console.print(preset.path.read_text(), markup=False)
    if preset.kind == "recipes":
        console.print("[bold]Resolved config:[/]")
        cfg = config_mod.validate(presets.load(name), source=f"preset {name}")
        console.print(config_mod.dump(cfg), markup=False)


@rewards_app.command("list")
def rewards_list() -> None:
    """The built-in rewards with their arguments, and rewards installed as `rlctl.rewards` entry points."""
    from rlctl.cli import cockpit

    cockpit.rewards_list(_ui())


@rewards_app.command("test")
def rewards_test(
    data_file: Annotated[str, typer.Option("--data", "-d", help="Samples: prompt, completion, ground truth.")],
    reward: RewardOpt = None,
    run: Annotated[Path | None, typer.Option("--run", help="Use this run's rewards (and its reward model).")] = None,
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    column: ColumnOpt = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Rows to score.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print the scores as JSON.")] = False,
) -> None:
    """Run the configured rewards on sample rows and print each reward and the weighted total per row.

    Rows need a prompt and the ground truth; the `completion` column is what gets scored (without one, the
    ground truth itself is scored: a sanity check that a right answer gets full marks)."""
    from rlctl import config as config_mod
    from rlctl.cli import cockpit

    cfg = None
    if run is not None:
        if not (run / "config.yaml").is_file():
            raise UserError(f"{run} is not a run directory (no config.yaml).")
        cfg = config_mod.load_run_config(run / "config.yaml")
    elif preset or config or set_ or Path("rlctl.yaml").is_file():
        cfg = _resolve(preset, config, None, None, set_, None)
    specs, answer_field, columns, rm_dir = cockpit.reward_setup(run, cfg, reward)
    columns.update(cockpit.columns_opt(column))
    encoding = cfg.data.encoding if cfg else "utf-8"
    cockpit.rewards_test(_ui(), data_file, specs, answer_field, columns, rm_dir, limit, as_json, encoding)

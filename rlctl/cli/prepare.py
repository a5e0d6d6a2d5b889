"""Before training: `rlctl init` (a project scaffold), `rlctl presets list|show` and `rlctl rewards list|test`."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from rlctl import tables
from rlctl.cli.app import (
    ColumnOpt,
    ConfigOpt,
    PresetOpt,
    RewardOpt,
    SetOpt,
    _resolve,
    _ui,
    app,
    err_console,
    presets_app,
    rewards_app,
)
from rlctl.errors import UserError
from rlctl.rundir import RunDir

if TYPE_CHECKING:  # the config schema and planner load on demand, keeping `rlctl --help` fast
    from rlctl.config import RunConfig


# The data key each stage reads (rm, dpo and kto read preference pairs); RL recipes also get held-out prompts.
DATA_KEY_OF_STAGE = {"sft": "sft", "rm": "preference", "dpo": "preference", "kto": "preference", "rl": "rl"}


def data_keys(cfg: RunConfig) -> list[str]:
    """The data keys a recipe's stages read, held-out prompts included for RL."""
    keys = list(dict.fromkeys(DATA_KEY_OF_STAGE[s] for s in cfg.stages))
    return [*keys, "eval"] if "rl" in cfg.stages else keys


def project_data(cfg: RunConfig, data: Path) -> dict[str, Path]:
    """Write the datasets a recipe's stages read into `data` ({key: file}): the preset's own generated task
    where it has one (the same rows a run would generate), else the shipped samples for the keys it needs."""
    import tempfile

    from rlctl.data import tasks
    from rlctl.resources import data_dir

    data.mkdir(parents=True, exist_ok=True)
    if not cfg.data.generate:
        samples = data_dir("templates") / "samples"
        return {k: Path(shutil.copy(samples / f"{k}.jsonl", data / f"{k}.jsonl")) for k in data_keys(cfg)}
    with tempfile.TemporaryDirectory() as tmp:  # the generator writes every role; keep those the stages read
        written = tasks.GENERATORS[cfg.data.generate](Path(tmp), cfg.seed)
        images = Path(tmp) / "images"  # an image task's pictures, which its rows name relative to their file
        if images.is_dir():  # beside what the folder holds already (written over only where names meet)
            shutil.copytree(images, data / "images", dirs_exist_ok=True)
        return {k: Path(shutil.move(written[k], data / written[k].name)) for k in data_keys(cfg)}


def data_block(cfg: RunConfig, files: dict[str, Path], directory: Path) -> str:
    """The `data:` section of the project's rlctl.yaml: every file wired in."""
    lines = ["data:"]
    if cfg.data.generate:
        lines.append(f"  generate: null  # the preset generates '{cfg.data.generate}' data; these files are that data")
    lines += [f"  {key}: {path.relative_to(directory).as_posix()}" for key, path in files.items()]
    return "\n".join(lines) + "\n"


@app.command()
def init(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Argument(help="Project folder to create.")] = Path("."),
    preset: Annotated[
        str, typer.Option("--preset", "-p", metavar="NAME", help="Recipe the project starts from.")
    ] = "tiny-demo",
    force: Annotated[
        bool, typer.Option("--force", help="Replace the files an earlier rlctl init wrote (unless you changed them).")
    ] = False,
) -> None:
    """Scaffold a project that plans and trains as it is: an rlctl.yaml on the recipe with its datasets wired in
    (the recipe's generated task, or samples in the format each stage reads: replace them with yours) and a
    reward plugin template. Files already in DIRECTORY are never overwritten; --force replaces those an earlier
    rlctl init wrote, as it wrote them (recorded in rlctl_files.json)."""
    from rlctl import config as config_mod
    from rlctl.checkpoint import safewrite
    from rlctl.config import presets
    from rlctl.resources import data_dir

    console = _ui(ctx).console
    if presets.get(preset).kind != "recipes":
        raise UserError(f"{preset} is not a recipe; rlctl init starts from one of: {', '.join(_recipe_names())}.")
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{directory} is a file, not a folder; pick another project folder.")
    target = directory / "rlctl.yaml"
    cfg = config_mod.validate(presets.load(preset), source=f"preset {preset}")
    ours = [Path("rlctl.yaml"), *(Path("data") / f"{k}.jsonl" for k in data_keys(cfg))]
    _check_folder(directory, ours, force)
    template = data_dir("templates") / "project"
    safewrite.check_writable(target)
    plugin_ours = not safewrite.not_as_written(directory, ["rewards.py"], "project")
    directory.mkdir(parents=True, exist_ok=True)
    files = project_data(cfg, directory / "data")
    text = (template / "rlctl.yaml").read_text()
    target.write_text(text.replace("{preset}", preset).replace("{data}", data_block(cfg, files, directory)))
    if not (directory / "rewards.py").exists():
        shutil.copy(data_dir("plugins") / "example_rewards.py", directory / "rewards.py")  # the smallest plugin
    written = [f.as_posix() for f in ours] + (["rewards.py"] if plugin_ours else [])
    safewrite.record(directory, "project", written)
    console.print(f"[green]Created[/] {escape(str(directory))}/ from recipe [bold]{preset}[/]:", soft_wrap=True)
    for key, path in files.items():
        console.print(f"  {path.relative_to(directory).as_posix()}  (data.{key})", soft_wrap=True)
    console.print("  rewards.py  (reward plugin template)\n  rlctl.yaml")
    if not cfg.data.generate:
        console.print("Sample data: replace the files above with yours (same formats; see the comments in rlctl.yaml).")
    if cfg.hardware.spec != "cpu":
        console.print(f"rlctl plan sizes the run for the recipe's {cfg.hardware.spec}; --hardware SPEC for yours.")
    cd = "" if directory.resolve() == Path.cwd().resolve() else f"cd {shlex.quote(str(directory))} && "
    console.print(f"Next: [bold]{escape(cd)}rlctl plan && rlctl train[/]", soft_wrap=True)


def _check_folder(directory: Path, ours: list[Path], force: bool) -> None:
    """Refuse (UserError; nothing written) a project folder where the scaffold would replace anything of the user's:
    a file or folder in its way, an existing file without --force, and with it any file an earlier rlctl init did
    not write or that was changed since."""
    from rlctl.checkpoint import safewrite

    taken = [f.as_posix() for f in ours if (directory / f).exists()]
    blocking = [
        f for f in (Path("data"), *ours) if (directory / f).exists() and (f.suffix == "") != (directory / f).is_dir()
    ]
    if blocking:  # a file where the scaffold's folder goes, or a folder where one of its files goes: even --force
        what = "a file" if blocking[0].suffix == "" else "a folder"
        raise UserError(
            f"{blocking[0].as_posix()} in {directory} is {what}, where the scaffold writes "
            f"{'its data folder' if blocking[0].suffix == '' else 'a file'}; nothing was written. Move it away or "
            "pick another project folder."
        )
    if taken and not force:
        raise UserError(
            f"{safewrite.listed(taken)} already exists in {directory}; nothing was written (rlctl never overwrites "
            "your files). Pick an empty folder, or add --force to replace what an earlier rlctl init wrote there."
        )
    if (directory / safewrite.MANIFEST).exists() and safewrite.recorded(directory)[0] != "project":
        raise UserError(
            f"{directory} holds an {safewrite.MANIFEST} that is not rlctl init's (an export or report folder?); "
            "nothing was written. Pick another project folder."
        )
    theirs = safewrite.not_as_written(directory, taken, "project")
    if theirs:
        raise UserError(
            f"{safewrite.listed(theirs)} in {directory} {'is' if len(theirs) == 1 else 'are'} yours (not written by "
            "rlctl init, or changed since); nothing was written. --force replaces only the files rlctl init wrote "
            "and you left as they were: move yours away, or pick another project folder."
        )


def _recipe_names() -> list[str]:
    from rlctl.config import presets

    return [name for name, p in presets.all_presets().items() if p.kind == "recipes"]


@dataclass(frozen=True)
class RecipeRow:
    """A recipe as `presets list` shows it (and `presets list --json` prints it)."""

    name: str
    model: str
    algorithm: str
    stages: list[str]
    hardware: str
    description: str


def recipe_rows() -> list[RecipeRow]:
    """Every shipped recipe, resolved."""
    from rlctl import config as config_mod
    from rlctl.config import presets

    rows = []
    for name in _recipe_names():
        cfg = config_mod.validate(presets.load(name), source=f"preset {name}")
        algorithm = cfg.rl.algorithm if "rl" in cfg.stages else "-"
        rows.append(
            RecipeRow(name, cfg.model.name_or_path, algorithm, list(cfg.stages), cfg.hardware.spec, cfg.description)
        )
    return rows


@presets_app.command("list")
def presets_list(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the presets as JSON.")] = False,
) -> None:
    """Every preset: recipes (name, model, algorithm, stages, minimum hardware), then the building blocks."""
    from rich.table import Table

    from rlctl.config import presets

    console = _ui(ctx).console
    recipes = recipe_rows()
    blocks: dict[str, list[str]] = {"algorithms": [], "models": [], "hardware": []}
    for name, p in presets.all_presets().items():
        if p.kind in blocks:
            blocks[p.kind].append(name)
    if as_json:
        sys.stdout.write(json.dumps({"recipes": [asdict(r) for r in recipes], **blocks}, indent=2) + "\n")
        return
    # Two columns whatever the width: names never wrap; the model, algorithm, stages and hardware share a line and
    # the description wraps at spaces under them (six columns broke names mid-word at 80 columns).
    table = Table(title="Recipes (rlctl presets show NAME)", title_justify="left", box=None, pad_edge=False)
    table.add_column("name", no_wrap=True, style="bold")
    table.add_column("model, algorithm, stages, min hardware")
    for r in recipes:
        table.add_row(r.name, f"{r.model}  {r.algorithm}  {','.join(r.stages)}  {r.hardware}\n{r.description}")
        table.add_row("", "")
    tables.show(console, table)
    console.print("[bold]Building blocks[/] (use with --algorithm, --hardware, or defaults: in a config)")
    grid = Table(box=None, pad_edge=False, show_header=False)
    grid.add_column(no_wrap=True)
    grid.add_column()
    for kind, names in blocks.items():
        grid.add_row(kind, ", ".join(names))
    tables.show(console, grid)


@presets_app.command("show")
def presets_show(
    name: Annotated[str, typer.Argument(help="Preset name.")],
    resolved: Annotated[
        bool, typer.Option("--resolved", help="Print the full config the recipe resolves to instead.")
    ] = False,
) -> None:
    """A preset's YAML file exactly as shipped (copy it with `rlctl presets show NAME > my.yaml`); with --resolved,
    the full config a recipe resolves to (valid YAML as well). Where the file lives goes to stderr."""
    from rlctl import config as config_mod
    from rlctl.config import presets

    preset = presets.get(name)
    kind = preset.kind[:-1] if preset.kind != "hardware" else "hardware"
    if resolved and preset.kind != "recipes":
        raise UserError(f"{name} is not a recipe ({kind}); only recipes resolve to a full config (rlctl presets list).")
    err_console.print(f"# {preset.name} ({kind}{', resolved' if resolved else ''}) from {preset.path}", soft_wrap=True)
    if resolved:
        sys.stdout.write(config_mod.dump(config_mod.validate(presets.load(name), source=f"preset {name}")))
    else:
        sys.stdout.write(preset.path.read_text())
    sys.stdout.flush()


@rewards_app.command("list")
def rewards_list(ctx: typer.Context) -> None:
    """The built-in rewards with their arguments, and rewards installed as `rlctl.rewards` entry points."""
    from rlctl.cli.cockpit import rewards as rewards_body

    rewards_body.rewards_list(_ui(ctx))


@rewards_app.command("test")
def rewards_test(
    ctx: typer.Context,
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
    from rlctl.cli.cockpit import rewards as rewards_body

    cfg = None
    if run is not None:
        if not RunDir(run).is_run():
            raise UserError(f"{run} is not a run directory (no config.yaml).")
        cfg = config_mod.load_run_config(RunDir(run).config)
    elif preset or config or set_ or Path("rlctl.yaml").is_file():
        cfg = _resolve(preset, config, None, None, set_, None)
    specs, answer_field, columns, rm_dir = rewards_body.reward_setup(run, cfg, reward)
    columns.update(cockpit.columns_opt(column))
    encoding = cfg.data.encoding if cfg else "utf-8"
    rewards_body.rewards_test(_ui(ctx), data_file, specs, answer_field, columns, rm_dir, limit, as_json, encoding)

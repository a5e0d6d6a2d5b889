"""The `rlctl` command line. Torch-free: heavy imports happen only inside train/export code paths.

Package `rlctl.cli`: the Typer app (this module), the bodies of eval / rewards / report / doctor (`cockpit`),
the generated docs (`docs_gen`) and the code map (`codemap`).
May import: every other package.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from rlctl import __version__
from rlctl.errors import UserError

if TYPE_CHECKING:  # the config schema and planner load on demand, keeping `rlctl --help` fast
    from rlctl.config import RunConfig
    from rlctl.plan import Plan

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


def split_address(address: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `[v6]:port` or a bare IPv6 address as (host, port or None)."""
    host, port = address, ""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
    elif address.count(":") == 1:
        host, port = address.split(":")
    if not host or (port and not (port.isdigit() and 1 <= int(port) <= 65535)):
        raise UserError(f"--main-address {address!r} is not HOST[:PORT] (e.g. 10.0.0.1:29500 or node001).")
    return host, int(port) if port else None


def _apply_nodes(cfg: RunConfig, nodes: int | None, node_rank: int | None, main_address: str | None) -> None:
    """--nodes / --node-rank / --main-address onto cfg.hardware (they win over --set and config files)."""
    if nodes is not None:
        cfg.hardware.nodes = nodes
    if node_rank is not None:
        cfg.hardware.node_rank = node_rank
    if main_address is not None:
        cfg.hardware.main_address, port = split_address(main_address)
        if port is not None:
            cfg.hardware.main_port = port


def _node_count(cfg: RunConfig) -> int:
    """How many machines the run spans (node_rank and --nodes checked against the spec)."""
    from rlctl.plan import hardware as hw
    from rlctl.plan import planner as plan_mod

    return plan_mod._nodes(cfg, hw.resolve(cfg.hardware.spec)).nodes


def _check_rendezvous(cfg: RunConfig, nodes: int) -> None:
    if nodes > 1 and not cfg.hardware.main_address:
        raise UserError(
            f"A {nodes}-node run needs the rank-0 node's address: start rlctl on every node with the same "
            "--main-address HOST[:PORT] (the rank-0 node's host, default port 29500) and its own --node-rank "
            "0..N-1; or let `rlctl slurm` write the job script."
        )


def _wait_for_rank0(run_dir: Path, timeout: float) -> None:
    """Nodes other than 0 join the run directory node 0 prepares (a shared filesystem)."""
    deadline = time.monotonic() + timeout
    if not (run_dir / "config.yaml").is_file():
        console.print(f"Waiting for node 0 to prepare {run_dir} ...")
    while not (run_dir / "config.yaml").is_file():
        if time.monotonic() > deadline:
            raise UserError(
                f"node 0 did not prepare {run_dir} within {timeout:.0f} s: the run directory must be on a filesystem "
                "every node shares, and node 0 must be started with the same --run-dir."
            )
        time.sleep(1.0)


def _launch(the_plan: Plan, resuming: bool) -> int:
    """Run the plan; nodes other than 0 do not take the run directory's lock (node 0 holds it)."""
    from rlctl import launch

    if the_plan.config.hardware.node_rank == 0:
        return launch.run(the_plan, console, resuming=resuming)
    return launch._run(the_plan, console, resuming)


def _default_run_dir(cfg: RunConfig, preset: str | None) -> Path:
    return Path("runs") / f"{preset or cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Project folder to create.")] = Path("."),
    preset: Annotated[str, typer.Option("--preset", "-p", help="Preset the project starts from.")] = "tiny-demo",
) -> None:
    """Scaffold a project: a commented rlctl.yaml, sample datasets and a reward plugin template."""
    from rlctl.config import presets
    from rlctl.resources import data_dir

    presets.get(preset)
    target = directory / "rlctl.yaml"
    if target.exists():
        raise UserError(f"{target} already exists; refusing to overwrite it.")
    template = data_dir("templates") / "project"
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


def _data_report(cfg: RunConfig) -> dict[str, dict]:
    """What each dataset of the run holds, recognised from its columns ({role: {source, format, rows, notes}}
    or {role: {source, error}}). Generated data and Hub datasets are not read here."""
    from rlctl import data
    from rlctl.plan import planner as plan_mod

    if cfg.data.generate:
        return {role: {"source": f"generated ({cfg.data.generate})"} for role in plan_mod.DATA_ROLES}
    out: dict[str, dict] = {}
    kto = "kto" in cfg.stages
    for role in plan_mod.DATA_ROLES:
        spec = getattr(cfg.data, role)
        if not spec:
            continue
        as_role = "kto" if role == "preference" and kto and not {"rm", "dpo"} & set(cfg.stages) else role
        try:
            info = data.describe(spec, as_role, cfg.data.answer_field, cfg.data.columns)
        except UserError as e:
            out[role] = {"source": spec, "error": str(e)}
            continue
        out[role] = {"source": info.source, "format": info.format, "rows": info.rows, "notes": info.notes}
    return out


def _print_data(report: dict[str, dict]) -> None:
    from rich.table import Table

    from rlctl import data

    if not report:
        return
    table = Table(title="Data", title_justify="left")
    for col in ("role", "source", "format", "rows"):
        table.add_column(col, overflow="fold")
    for role, info in report.items():
        if "error" in info:
            table.add_row(role, info["source"], f"[red]{info['error']}[/]", "")
            continue
        fmt = info.get("format", "")
        text = f"{fmt}: {data.FORMATS[fmt][0]}" if fmt in data.FORMATS else fmt
        text += "".join(f"; {n}" for n in info.get("notes", []))
        table.add_row(role, info["source"], text, str(info.get("rows", "")))
    console.print(table)


def _print_recognised() -> None:
    """One line per dataset validated in this process: its source and recognised format."""
    from rlctl import data

    for role, info in data.RECOGNISED.items():
        console.print(f"[bold]Data[/] {role}: {info.source}: {info.describe()}")


def _print_plan(plan: Plan) -> None:
    from rich.markup import escape
    from rich.table import Table

    cfg = plan.config
    hw = plan.hardware
    where = "CPU" if hw.is_cpu else f"{hw.nodes} node(s) x {hw.gpus_per_node} x {hw.gpu_name} {hw.gpu_memory_gib:g} GiB"
    console.print(f"[bold]Run[/] {cfg.name}  ->  {plan.run_dir}")
    console.print(f"[bold]Model[/] {cfg.model.name_or_path}   [bold]Hardware[/] {hw.spec} ({where})")
    if plan.model.get("params"):
        count = plan.model["params"]
        size = f"{count / 1e9:.2f}B" if count >= 1e8 else f"{count / 1e6:.1f}M"
        console.print(f"[bold]Parameters[/] {size} (architecture from {plan.model['arch_source']})")
    console.print(
        f"[bold]Strategy[/] {plan.strategy}, {plan.num_processes} process(es) per node, "
        f"mixed precision {plan.mixed_precision}"
    )
    table = Table(title="Stages", title_justify="left")
    for col in ("stage", "starts from", "steps", "batch", "micro x accum", "lr", "writes"):
        table.add_column(col, overflow="fold")
    for s in plan.stages:
        sc = getattr(cfg, s.name)
        label = f"rl ({cfg.rl.algorithm})" if s.name == "rl" else s.name
        table.add_row(
            label,
            s.init_from,
            str(s.max_steps),
            str(s.batch_size),
            f"{s.micro_batch_size} x {s.grad_accum}",
            f"{sc.learning_rate:g}",
            s.output,
        )
    console.print(table)
    _print_data(_data_report(cfg))
    lay = plan.layout
    if lay:
        per = "CPU process" if hw.is_cpu else f"GPU ({hw.gpu_name} {hw.gpu_memory_gib:g} GiB)"
        line = (
            f"[bold]Layout[/] {lay['nodes']} node(s) x {lay['processes_per_node']} process(es) = world size "
            f"{lay['world_size']}, one process per {per}"
        )
        if lay["nodes"] > 1:
            line += f"; this node: rank {lay['node_rank']} of {lay['nodes']}, main {lay['main'] or '(unset)'}"
        console.print(line)
        peak = plan.memory.get("peak_gib")
        if peak is not None:
            console.print(
                f"[bold]Per GPU[/] peak {peak:g} GiB ({plan.memory.get('peak_phase')}) of "
                f"{plan.memory.get('budget_gib'):g} GiB budget; per stage micro batch x accumulation above",
            )
    console.print("[bold]Launch[/]", plan.command, markup=True)
    for w in plan.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")


@app.command()
def plan(
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    algorithm: AlgoOpt = None,
    hardware: HwOpt = None,
    set_: SetOpt = None,
    run_dir: RunDirOpt = None,
    stages: StagesOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    nodes: NodesOpt = None,
    node_rank: NodeRankOpt = None,
    main_address: MainOpt = None,
) -> None:
    """Show the resolved config, the stages, the node/GPU layout and the exact launch command, without running
    anything."""
    from rlctl.plan import planner as plan_mod

    cfg = _resolve(preset, config, algorithm, hardware, set_, stages)
    _apply_nodes(cfg, nodes, node_rank, main_address)
    the_plan = plan_mod.build(cfg, run_dir or _default_run_dir(cfg, preset))
    if as_json:
        out = the_plan.to_json()
        out["data"] = _data_report(cfg)
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        _print_plan(the_plan)


@app.command()
def train(
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    algorithm: AlgoOpt = None,
    hardware: HwOpt = None,
    set_: SetOpt = None,
    run_dir: RunDirOpt = None,
    stages: StagesOpt = None,
    nodes: NodesOpt = None,
    node_rank: NodeRankOpt = None,
    main_address: MainOpt = None,
) -> None:
    """Validate, plan and run the stages through `accelerate launch`, with live progress.

    Several machines: run the same command on each with --nodes N, its own --node-rank and the rank-0 node's
    --main-address, and a --run-dir on a shared filesystem; node 0 prepares the run directory, the others join it
    (torch.distributed static rendezvous through accelerate)."""
    from rlctl import launch

    cfg = _resolve(preset, config, algorithm, hardware, set_, stages)
    _apply_nodes(cfg, nodes, node_rank, main_address)
    count = _node_count(cfg)
    _check_rendezvous(cfg, count)
    if count > 1 and run_dir is None:
        raise UserError("A multi-node run needs --run-dir: a folder on a filesystem every node shares.")
    run_dir = run_dir or _default_run_dir(cfg, preset)
    if cfg.hardware.node_rank > 0:
        from rlctl import config as config_mod
        from rlctl.plan import planner as plan_mod

        _wait_for_rank0(run_dir, float(os.environ.get("RLCTL_NODE_WAIT", "600")))
        shared = config_mod.load_run_config(run_dir / "config.yaml")  # node 0's config, this node's rank
        _apply_nodes(shared, count, cfg.hardware.node_rank, main_address)
        shared.hardware.main_address, shared.hardware.main_port = cfg.hardware.main_address, cfg.hardware.main_port
        node_plan = plan_mod.build(shared, run_dir)
        raise typer.Exit(_finish(_launch(node_plan, resuming=False), node_plan))
    if (run_dir / "config.yaml").exists():
        raise UserError(
            f"{run_dir} already holds a run; continue it with `rlctl resume {run_dir}` or pick another --run-dir."
        )
    the_plan = launch.prepare(cfg, run_dir)
    if VERBOSE["on"]:
        _print_plan(the_plan)
    _print_recognised()
    raise typer.Exit(_finish(launch.run(the_plan, console), the_plan))


@app.command()
def resume(
    run_dir: Annotated[Path, typer.Argument(help="Run directory to continue.")],
    nodes: NodesOpt = None,
    node_rank: NodeRankOpt = None,
    main_address: MainOpt = None,
    set_: SetOpt = None,
) -> None:
    """Continue a run from its last complete checkpoint; finished stages are not redone.

    --set may change what a resume can (micro-batch sizes, gradient checkpointing, checkpoint retention, logging),
    e.g. after an out-of-memory error; the change is saved in the run's config.yaml.
    A multi-node run resumes with the same command on every node: each gives its own --node-rank (the run's
    config.yaml is shared, so the rank is never read from it) and, when the nodes changed, the new --main-address."""
    from rlctl import config as config_mod
    from rlctl.plan import planner as plan_mod

    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(f"{run_dir} is not a run directory (no config.yaml). Start one with `rlctl train`.")
    cfg = config_mod.load_run_config(cfg_path)
    if set_:
        cfg = config_mod.with_resume_overrides(cfg, set_)
    shared = config_mod.dump(cfg)  # before this node's rank is applied: every node reads the same file
    cfg.hardware.node_rank = 0
    _apply_nodes(cfg, nodes, node_rank, main_address)
    _check_rendezvous(cfg, _node_count(cfg))
    the_plan = plan_mod.build(cfg, run_dir)
    if set_:
        cfg_path.write_text(shared)
    raise typer.Exit(_finish(_launch(the_plan, resuming=True), the_plan))


@app.command()
def slurm(
    run_dir: Annotated[
        Path, typer.Option("--run-dir", help="Run directory on a filesystem every node shares (required).")
    ],
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    algorithm: AlgoOpt = None,
    hardware: HwOpt = None,
    set_: SetOpt = None,
    stages: StagesOpt = None,
    nodes: NodesOpt = None,
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Rendezvous port on the first node.")] = 29500,
    cpus_per_task: Annotated[
        int | None, typer.Option("--cpus-per-task", min=1, help="CPU cores per node task (default 8 per GPU).")
    ] = None,
    partition: Annotated[str | None, typer.Option("--partition", help="#SBATCH --partition.")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", help="#SBATCH --time, e.g. 24:00:00.")] = None,
) -> None:
    """Write a ready SLURM sbatch script to stdout: one task per node running `rlctl train` with its rank and the
    first node's address from SLURM, `rlctl resume` when the job is requeued, a checkpoint before preemption.

    The plan is checked now (exit 2 if it does not fit); RUN_DIR/logs is created so SLURM can write its log there.
    Usage: rlctl slurm --preset qwen7b-grpo --hardware 2x8xH100-80GB --run-dir /shared/runs/q7 > job.sbatch"""
    from rlctl.launch import slurm as slurm_mod
    from rlctl.plan import planner as plan_mod

    cfg = _resolve(preset, config, algorithm, hardware, set_, stages)
    _apply_nodes(cfg, nodes, 0, "$MAIN")
    run_dir = run_dir.absolute()
    the_plan = plan_mod.build(cfg, run_dir)  # refuses now what would fail on the cluster
    lay, hw = the_plan.layout, the_plan.hardware
    args: list[str] = []
    for flag, value in (("--preset", preset), ("--config", config and str(config.absolute()))):
        args += [flag, value] if value else []
    args += ["--algorithm", algorithm] if algorithm else []
    args += ["--hardware", hardware] if hardware else []
    for item in set_ or []:
        args += ["--set", item]
    args += ["--stages", stages] if stages else []
    where = "CPU" if hw.is_cpu else f"{hw.gpus_per_node} x {hw.gpu_name}-{hw.gpu_memory_gib:g}GB"
    layout = f"{cfg.name} on {lay['nodes']} node(s) x {where} = {lay['world_size']} processes, run directory {run_dir}"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    text = slurm_mod.script(
        args,
        run_dir,
        lay["nodes"],
        hw.gpus_per_node,
        port,
        f"rlctl-{preset or cfg.name}",
        layout,
        cpus_per_task=cpus_per_task,
        partition=partition,
        time_limit=time_limit,
    )
    sys.stdout.write(text)


def _finish(code: int, the_plan: Plan) -> int:
    """With --quiet the live display is silent: still say where the run ended up (and why, on failure)."""
    from rlctl.launch import node_log

    run_dir = Path(the_plan.run_dir)
    log = node_log(run_dir, the_plan.config.hardware.node_rank)
    if console.quiet:
        if code == 0:
            _ui().results().print(f"[green]Done.[/] {run_dir} (summary.json, rlctl report {run_dir})")
        else:
            err_console.print(
                f"[red]Training stopped (exit {code}).[/] Log: {log}. "
                f"After fixing the cause: rlctl resume {run_dir}",
            )
    return code


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="Run directory to export from.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder to write the model to (default RUN_DIR/export).")
    ] = None,
    push: Annotated[
        str | None, typer.Option("--push", help="Also upload to this Hub repo id (namespace/name).")
    ] = None,
    private: Annotated[bool, typer.Option("--private", help="Create the Hub repo as private.")] = False,
    adapter: Annotated[
        bool, typer.Option("--adapter", help="Export the LoRA adapter alone instead of merged full weights.")
    ] = False,
) -> None:
    """Write the final policy as a Hugging Face folder (safetensors, tokenizer, model card), LoRA merged or as an
    adapter; with --push, create the Hub repo and upload it (token from HF_TOKEN or `hf auth login`)."""
    from rlctl.after import export as export_mod

    out = out or run_dir / "export"
    with console.status("Exporting the model..."):
        folder = export_mod.export(run_dir, out, adapter=adapter, repo_id=push)
    _ui().results().print(f"[green]Exported[/] {folder}")
    if push:
        console.print(f"Pushing to {push}{' (private)' if private else ''}...")
        url = export_mod.push(folder, push, private=private, quiet=console.quiet)
        _ui().results().print(f"[green]Pushed[/] {url}")


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
    cockpit.rewards_test(_ui(), data_file, specs, answer_field, columns, rm_dir, limit, as_json)


@app.command("eval")
def eval_(
    target: Annotated[Path, typer.Argument(help="Run directory, exported model folder, or Hub model id.")],
    data_file: Annotated[str, typer.Option("--data", "-d", help="Held-out prompts with ground truth (any format).")],
    stage: Annotated[str | None, typer.Option("--stage", help="For a run: evaluate this stage's model.")] = None,
    samples: Annotated[int, typer.Option("--samples", "-k", min=1, help="Completions per prompt (pass@k).")] = 1,
    temperature: Annotated[
        float | None, typer.Option("--temperature", "-t", min=0.0, help="Sample at this temperature.")
    ] = None,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="Nucleus sampling mass.")] = 1.0,
    greedy: Annotated[bool, typer.Option("--greedy", help="Greedy decoding (the default with one sample).")] = False,
    max_new_tokens: Annotated[
        int | None, typer.Option("--max-new-tokens", min=1, help="Default: the run's rl.max_new_tokens, else 256.")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", "-n", min=1, help="Evaluate the first N rows.")] = None,
    reward: RewardOpt = None,
    accuracy: Annotated[
        str | None, typer.Option("--accuracy", help="Reward that decides correctness (exact_match, gsm8k, boxed, ...).")
    ] = None,
    column: ColumnOpt = None,
    answer_field: Annotated[str | None, typer.Option("--answer-field", help="Ground-truth column.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Prompts per generation batch.")] = 16,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="JSON file (default RUN_DIR/eval/<data>.json).")
    ] = None,
) -> None:
    """Accuracy, mean reward and pass@k of a model on held-out data; a table, a JSON file and every sample.

    One greedy completion per prompt by default; --samples K draws K at --temperature (default: the run's
    rl.temperature, else 1.0) and adds pass@1..pass@K. A sample is correct when the --accuracy reward gives it
    more than 0.5 (default: the run's first correctness reward, else exact_match)."""
    from rlctl.cli import cockpit

    options = cockpit.EvalOptions(
        stage=stage,
        samples=samples,
        temperature=temperature,
        top_p=top_p,
        greedy=greedy,
        max_new_tokens=max_new_tokens,
        limit=limit,
        reward=reward,
        accuracy=accuracy,
        columns=cockpit.columns_opt(column),
        answer_field=answer_field,
        batch_size=batch_size,
        out=out,
    )
    cockpit.evaluate_command(_ui(), target, data_file, options)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory (finished, running, or interrupted).")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder for the report (default RUN_DIR/report).")
    ] = None,
) -> None:
    """PNG plots of every stage's curves against steps, a report.md with the config and final metrics, and
    TensorBoard event files (RUN_DIR/tensorboard)."""
    from rlctl.cli import cockpit

    cockpit.report_command(_ui(), run_dir, out)


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
    offline: Annotated[bool, typer.Option("--offline", help="Do not contact the Hub to verify the token.")] = False,
) -> None:
    """Check this machine: Python, torch/CUDA, GPUs, library versions against the supported matrix (with the
    exact fix command for each mismatch), free disk, and the Hub login (the token is never printed).
    Exits 1 when something needs fixing."""
    from rlctl.cli import cockpit

    raise typer.Exit(cockpit.doctor_command(_ui(), online=not offline, as_json=as_json))


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
        app()
    except UserError as e:
        from rich.markup import escape

        err_console.print(f"[bold red]error:[/] {escape(str(e))}")  # keep 'rlctl[vllm]' and the like intact
        sys.exit(2)


if __name__ == "__main__":
    main()

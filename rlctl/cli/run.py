"""`rlctl plan`, `train` and `resume`: resolve the config, plan it, and launch it (one node or many)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rlctl import atomic
from rlctl.errors import UserError
from rlctl.rundir import RunDir, WrongRecord, write_record

if TYPE_CHECKING:  # the config schema and planner load on demand, keeping `rlctl --help` fast
    from rich.console import Console

    from rlctl.cli.cockpit import UI
    from rlctl.config import RunConfig
    from rlctl.launch import preflight
    from rlctl.plan import Plan

from rlctl.cli.app import (
    AlgoOpt,
    ConfigOpt,
    HwOpt,
    MainOpt,
    NodeRankOpt,
    NodesOpt,
    PresetOpt,
    RunDirOpt,
    SetOpt,
    StagesOpt,
    _resolve,
    _ui,
    app,
    err_console,
    show_notes,
)


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


def _wait_for_rank0(console: Console, run_dir: Path, timeout: float) -> None:
    """Nodes other than 0 join the run directory node 0 prepares (a shared filesystem)."""
    deadline = time.monotonic() + timeout
    if not RunDir(run_dir).is_run():
        console.print(f"Waiting for node 0 to prepare {run_dir} ...")
    while not RunDir(run_dir).is_run():
        if time.monotonic() > deadline:
            raise UserError(
                f"node 0 did not prepare {run_dir} within {timeout:.0f} s: the run directory must be on a filesystem "
                "every node shares, and node 0 must be started with the same --run-dir."
            )
        time.sleep(1.0)


def _launch(console: Console, the_plan: Plan, resuming: bool) -> int:
    """Run the plan; nodes other than 0 do not take the run directory's lock (node 0 holds it)."""
    from rlctl.launch import start
    from rlctl.plan import packages

    packages.require(the_plan)

    if the_plan.config.hardware.node_rank == 0:
        return start.run(the_plan, console, resuming=resuming)
    return start._run(the_plan, console, resuming)


def default_run_dir(cfg: RunConfig | None, preset: str | None) -> Path:
    """runs/NAME-TIME: the run directory of a run started without --run-dir (`rlctl ui` proposes it too)."""
    assert preset or cfg is not None
    return Path("runs") / f"{preset or cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _print_recognised(console: Console, report: preflight.Report) -> None:
    """One line per dataset the pre-flight validated: its source and recognised format; then the lengths."""
    from rlctl.launch import preflight

    for role, info in report.recognised().items():
        console.print(f"[bold]Data[/] {role}: {info.source}: {info.describe()}")
    preflight.show_lengths(console, report)


@app.command()
def plan(
    ctx: typer.Context,
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
    from rlctl.launch import preflight

    console = _ui(ctx).console
    cfg = _resolve(preset, config, algorithm, hardware, set_, stages)
    _apply_nodes(cfg, nodes, node_rank, main_address)
    the_plan, report = plan_with_preflight(cfg, run_dir or default_run_dir(cfg, preset))
    if as_json:
        out = the_plan.to_json()
        out["data"], out["preflight"] = report.data, report.to_json()
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        from rlctl.cli import plan_view

        plan_view.show(console, the_plan)
        preflight.show(console, report)
    preflight.require(report)


def plan_with_preflight(cfg: RunConfig, run_dir: Path) -> tuple[Plan, preflight.Report]:
    """What `rlctl plan` shows: the plan, with memory planned for the lengths the data has (as `rlctl train` plans
    it), and the pre-flight of the data."""
    from rlctl.launch import preflight
    from rlctl.plan import planner as plan_mod

    facts = plan_mod.facts(cfg, run_dir)
    report = _preflight_for_plan(facts.cfg, run_dir, facts.precision == "bf16")
    lengths = preflight.longest(report)
    images = report.images if report.images and not report.errors else None
    return plan_mod.build_from(facts, lengths if lengths and not report.errors else None, images), report


def _preflight_for_plan(cfg: RunConfig, run_dir: Path, bf16: bool) -> preflight.Report:
    """The pre-flight `rlctl plan` shows: on the config's datasets, sampled; a generated task (data.generate) is
    generated into a scratch folder first, as `rlctl train` does, so its lengths are counted and planned alike."""
    from rlctl.launch import preflight

    if not cfg.data.generate:
        return preflight.run(cfg, run_dir, bf16=bf16)
    import tempfile

    from rlctl.data import tasks
    from rlctl.plan import planner as plan_mod

    with tempfile.TemporaryDirectory(prefix="rlctl-plan-data-") as scratch:
        tasks.GENERATORS[cfg.data.generate](RunDir(Path(scratch)).data, cfg.seed)
        report = preflight.run(cfg, run_dir, paths=plan_mod.data_paths(cfg, scratch), bf16=bf16)
    source = f"generated ({cfg.data.generate}, data.generate)"  # not the scratch file, gone now
    for entry in report.data.values():
        entry["source"] = source
    return report


def _refuse_foreign(run_dir: Path) -> None:
    """A new run goes into a missing or empty folder (its `logs/` from `rlctl slurm` aside): a run writes data/,
    logs/, base/ and a folder per stage, which must never land among the user's files."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir} is a file; pick a new folder for the run.")
    found = sorted(p.name for p in run_dir.iterdir() if p != RunDir(run_dir).logs) if run_dir.is_dir() else []
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise UserError(
            f"--run-dir {run_dir} already holds files that are not an rlctl run ({shown}); a run writes its own "
            "folders there, so it needs a new or empty folder. Nothing was written; pick another --run-dir."
        )
    from rlctl.checkpoint import safewrite

    safewrite.check_writable(RunDir(run_dir).config)  # a read-only or missing place is refused before the start


@app.command()
def train(
    ctx: typer.Context,
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
    from rlctl.launch import start

    ui = _ui(ctx)
    console = ui.console
    cfg = _resolve(preset, config, algorithm, hardware, set_, stages)
    _apply_nodes(cfg, nodes, node_rank, main_address)
    count = _node_count(cfg)
    _check_rendezvous(cfg, count)
    if count > 1 and run_dir is None:
        raise UserError("A multi-node run needs --run-dir: a folder on a filesystem every node shares.")
    run_dir = run_dir or default_run_dir(cfg, preset)
    if cfg.hardware.node_rank > 0:
        from rlctl import config as config_mod
        from rlctl.plan import planner as plan_mod

        _wait_for_rank0(console, run_dir, float(os.environ.get("RLCTL_NODE_WAIT", "600")))
        shared = config_mod.load_run_config(RunDir(run_dir).config)  # node 0's config, this node's rank
        _apply_nodes(shared, count, cfg.hardware.node_rank, main_address)
        shared.hardware.main_address, shared.hardware.main_port = cfg.hardware.main_address, cfg.hardware.main_port
        node_plan = plan_mod.build(shared, run_dir)
        raise typer.Exit(_finish(ui, _launch(console, node_plan, resuming=False), node_plan))
    if RunDir(run_dir).config.exists():
        raise UserError(
            f"{run_dir} already holds a run; continue it with `rlctl resume {run_dir}` or pick another --run-dir."
        )
    _refuse_foreign(run_dir)
    prepared = launch.prepare(cfg, run_dir)
    if ui.verbose:
        from rlctl.cli import plan_view

        plan_view.show(console, prepared.plan)
    _print_recognised(console, prepared.report)
    raise typer.Exit(_finish(ui, start.run(prepared.plan, console), prepared.plan))


@app.command()
def resume(
    ctx: typer.Context,
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
    from rich.markup import escape

    from rlctl import config as config_mod
    from rlctl import strictjson
    from rlctl.plan import planner as plan_mod

    ui = _ui(ctx)
    console = ui.console
    cfg_path = RunDir(run_dir).config
    if not cfg_path.is_file():
        raise UserError(f"{run_dir} is not a run directory (no config.yaml). Start one with `rlctl train`.")
    from rlctl.after import finals
    from rlctl.checkpoint import verify
    from rlctl.launch import preflight, resume_check

    notes: list[str] = []
    cfg = verify.run_config(run_dir, notes=notes)
    try:
        resume_check.read_summary(run_dir, cfg)
    except WrongRecord as e:  # edited, not cut short: what it says is not rlctl's to guess
        raise UserError(
            f"{e.path} is damaged: {e.damage}. Nothing was resumed: from it resume learns which stages finished. "
            'Set it right (`completed`: the finished stages in order, e.g. ["sft", "rl"]), or move it aside and '
            f"`rlctl resume {run_dir}` rebuilds it from metrics.jsonl."
        ) from None
    except strictjson.DamagedFile as e:
        _, how = resume_check.rebuild_summary(run_dir, cfg)
        console.print(f"[yellow]warning:[/] {escape(str(e.path))} is damaged ({escape(e.damage)}); {escape(how)}.")
    for note in finals.restore_finals(run_dir, cfg):
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if resume_check.finished(run_dir, cfg):
        console.print(f"{run_dir} is finished: every stage ({', '.join(cfg.stages)}) completed. Nothing to resume.")
        raise typer.Exit(0)
    if set_:
        new = config_mod.with_resume_overrides(cfg, set_, notes)
        resume_check.check(cfg, new, run_dir)
        cfg = new
    show_notes(notes)
    preflight.model_folder(cfg.model)  # a moved or uncached model is refused before launch
    shared = config_mod.dump(cfg)  # before this node's rank is applied: every node reads the same file
    cfg.hardware.node_rank = 0
    _apply_nodes(cfg, nodes, node_rank, main_address)
    _check_rendezvous(cfg, _node_count(cfg))
    the_plan = plan_mod.build(cfg, run_dir)
    left = [s for s in cfg.stages if s not in resume_check.read_summary(run_dir, cfg).completed]
    preflight.check_resume_images(the_plan.config, run_dir, left)  # moved or deleted images: exit 2, nothing written
    if set_:
        atomic.write_text(cfg_path, shared)
    if cfg.hardware.node_rank == 0:  # node 0 verifies the checkpoints before any trainer reads them
        write_record(RunDir(run_dir).plan, the_plan)  # what every rank reads
        for note in verify.resume_check(run_dir, cfg.stages):
            console.print(f"[yellow]Damaged checkpoint:[/] {note}", markup=True)
    raise typer.Exit(_finish(ui, _launch(console, the_plan, resuming=True), the_plan))


def _finish(ui: UI, code: int, the_plan: Plan) -> int:
    """With --quiet the live display is silent: still say where the run ended up (and why, on failure)."""
    run_dir = Path(the_plan.run_dir)
    log = RunDir(run_dir).log(the_plan.config.hardware.node_rank)
    if ui.console.quiet:
        if code == 0:
            ui.results().print(f"[green]Done.[/] {run_dir} (summary.json, rlctl report {run_dir})", soft_wrap=True)
        else:
            err_console.print(
                f"[red]Training stopped (exit {code}).[/] Log: {log}. After fixing the cause: rlctl resume {run_dir}",
                soft_wrap=True,
            )
    return code

"""Prepare a run directory and start the stages through `accelerate launch`, showing live progress.

The launched processes (rlctl.launch.runner) write `metrics.jsonl`; this side tails it into rich progress bars,
keeps the full log in `logs/train.log` (`logs/train.node{R}.log` on node R > 0 of a multi-node run, so nodes
sharing the run directory do not write one file), and prints the summary table at the end.

Package `rlctl.launch`: the launch on this side (this module), the process every rank runs (`runner`), SLURM
scripts (`slurm`) and TensorBoard event files (`tbevents`).
May import: base, config, data, rewards, plan, algorithms, checkpoint, rollout, stages.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from rlctl import config as config_mod
from rlctl import data, rewards
from rlctl.data import tasks
from rlctl.errors import UserError
from rlctl.launch import tbevents
from rlctl.plan import planner as plan_mod

PR_SET_PDEATHSIG = 1


def _absolute(cfg: config_mod.RunConfig) -> config_mod.RunConfig:
    """Data files and reward plugins as absolute paths, so `rlctl resume` works from any folder (Hub dataset
    names stay as they are)."""
    cfg = cfg.model_copy(deep=True)
    for role in plan_mod.DATA_ROLES:
        value = getattr(cfg.data, role)
        if value:
            setattr(cfg.data, role, data.absolute(value))
    for spec in cfg.rl.rewards:
        if ".py:" in spec.name:
            path, _, fn = spec.name.rpartition(":")
            spec.name = f"{Path(path).resolve()}:{fn}"
    return cfg


def check_inputs(cfg: config_mod.RunConfig, paths: dict[str, Path]) -> None:
    """Validate datasets and rewards before anything starts; raises UserError."""
    missing = plan_mod.missing_data(cfg)
    if missing:
        raise UserError("Missing data: " + "; ".join(missing) + ".")
    columns = cfg.data.columns
    rows: dict[str, list] = {}
    for stage in cfg.stages:
        role = plan_mod.DATA_ROLE[stage]
        rows[stage] = data.check(paths[role], "kto" if stage == "kto" else role, cfg.data.answer_field, columns)
    if "eval" in paths:
        data.check(paths["eval"], "eval", cfg.data.answer_field, columns)
    if "rl" in cfg.stages:
        names = [spec.name for spec in cfg.rl.rewards if spec.name not in rewards.MODEL_REWARDS]
        rewards.dry_run(names, rows["rl"], cfg.data.answer_field)  # plugin errors surface now, not mid-run


def prepare(cfg: config_mod.RunConfig, run_dir: Path) -> plan_mod.Plan:
    """Validate everything, then write config.yaml, accelerate.yaml and the data into a new run directory."""
    cfg = _absolute(cfg)
    the_plan = plan_mod.build(cfg, run_dir)
    if cfg.data.generate:
        gen_dir = run_dir / "data"
        tasks.GENERATORS[cfg.data.generate](gen_dir, cfg.seed)
    check_inputs(cfg, plan_mod.data_paths(cfg, run_dir))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "accelerate.yaml").write_text(yaml.safe_dump(the_plan.accelerate, sort_keys=False))
    (run_dir / "plan.json").write_text(json.dumps(the_plan.to_json(), indent=2))
    (run_dir / "config.yaml").write_text(config_mod.dump(cfg))
    return the_plan


def _env(the_plan: plan_mod.Plan) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if the_plan.hardware.is_cpu:
        env["ACCELERATE_USE_CPU"] = "1"
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(the_plan.num_processes, 1))))
    return env


def _read_new(path: Path, offset: int) -> tuple[list[dict], int]:
    """Complete jsonl records appended to `path` since byte `offset`."""
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        chunk = f.read()
    end = chunk.rfind(b"\n") + 1
    records = [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]
    return records, offset + end


def summary_table(summary: dict) -> Table:
    """The per-stage held-out metrics of summary.json as a table."""
    table = Table(title="Summary (held-out)", title_justify="left")
    table.add_column("stage")
    keys = sorted({k for m in summary.get("stages", {}).values() for k in m})
    for k in keys:
        table.add_column(k, justify="right")
    for stage, metrics in summary.get("stages", {}).items():
        cells = [f"{metrics[k]:.4g}" if isinstance(metrics.get(k), float) else str(metrics.get(k, "")) for k in keys]
        table.add_row(stage, *cells)
    return table


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire_lock(run_dir: Path) -> Path:
    """Claim the run directory for this process; a lock left by a dead process (kill -9) is taken over."""
    lock = run_dir / "run.lock"
    if lock.exists():
        try:
            pid = int(lock.read_text().strip() or 0)
        except ValueError:
            pid = 0
        if pid and pid != os.getpid() and _pid_alive(pid):
            raise UserError(f"{run_dir} is in use by a running rlctl (pid {pid}); wait for it or stop it first.")
    lock.write_text(f"{os.getpid()}\n")
    return lock


def run(the_plan: plan_mod.Plan, console: Console, resuming: bool = False) -> int:
    """Run the launch command to completion; returns its exit code (130/143 when interrupted)."""
    run_dir = Path(the_plan.run_dir)
    lock = acquire_lock(run_dir)
    try:
        return _run(the_plan, console, resuming)
    finally:
        lock.unlink(missing_ok=True)


def die_with_parent() -> None:
    """Pre-exec step (Linux): the child is killed when the process that started it dies, even by kill -9."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class _Signalled(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def _raise_signal(signum, frame) -> None:
    raise _Signalled(signum)


def _runners(proc: subprocess.Popen) -> list:
    """The training processes (rlctl.launch.runner) under the launcher."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [c for c in children if "rlctl.launch.runner" in " ".join(_cmdline(c))]


def _cmdline(process) -> list[str]:
    import psutil

    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _kill_all(proc: subprocess.Popen) -> None:
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    proc.kill()


def node_log(run_dir: Path, node_rank: int) -> Path:
    """This node's launch log in the (shared) run directory: node 0 `logs/train.log`, node R `logs/train.nodeR.log`."""
    return run_dir / "logs" / ("train.log" if node_rank == 0 else f"train.node{node_rank}.log")


def _run(the_plan: plan_mod.Plan, console: Console, resuming: bool) -> int:
    run_dir = Path(the_plan.run_dir)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    log_path = node_log(run_dir, the_plan.config.hardware.node_rank)
    metrics_path = run_dir / "metrics.jsonl"
    offset = metrics_path.stat().st_size if metrics_path.exists() else 0
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *the_plan.launch[2:]]
    console.print(f"[bold]{'Resuming' if resuming else 'Starting'}[/] {the_plan.config.name} in {run_dir}")
    console.print(f"[dim]{the_plan.command}\nlog: {log_path}[/]")
    stopped = 0
    errors: list[dict] = []
    previous = signal.signal(signal.SIGTERM, _raise_signal)
    try:
        with log_path.open("ab") as log:
            # Its own session: a terminal Ctrl-C reaches only this CLI, which asks the trainers to stop at a step
            # boundary. Killed with its parent, so no trainer outlives this CLI (kill -9 included).
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_env(the_plan),
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
            tasks_by_stage: dict[str, int] = {}
            events = tbevents.MetricsEvents(run_dir / "tensorboard")  # TensorBoard, live, no account needed
            columns = [
                TextColumn("[bold]{task.description:<6}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
            ]
            with Progress(*columns, console=console, transient=False) as progress:
                while True:
                    try:
                        done = proc.poll() is not None
                        records, offset = _read_new(metrics_path, offset)
                        for rec in records:
                            events.add(rec)
                            if rec.get("event") == "error":
                                errors.append(rec)
                            _show(progress, tasks_by_stage, rec)
                        if done:
                            break
                        time.sleep(0.5)
                    except (KeyboardInterrupt, _Signalled) as e:
                        signum = e.signum if isinstance(e, _Signalled) else signal.SIGINT
                        if stopped:
                            _kill_all(proc)
                            progress.console.print("[red]Stopped at once.[/] The last complete checkpoint stands.")
                        else:
                            stopped = signum
                            for runner in _runners(proc):
                                with contextlib.suppress(Exception):
                                    runner.send_signal(signal.SIGTERM)
                            progress.console.print(
                                "[yellow]Stopping at the next step with a checkpoint[/] (Ctrl-C again to stop at once)."
                            )
    finally:
        signal.signal(signal.SIGTERM, previous)
    proc.wait()
    if stopped:
        console.print(f"[yellow]Interrupted.[/] Continue with: rlctl resume {run_dir}")
        return 128 + stopped
    code = proc.returncode
    summary_path = run_dir / "summary.json"
    if code == 0 and summary_path.exists():
        console.print(summary_table(json.loads(summary_path.read_text())))
        console.print(f"[green]Done.[/] Export with: rlctl export {run_dir} --out {run_dir}/export")
        return 0
    if errors:
        # --quiet still prints why training stopped
        shown = Console(stderr=True, highlight=False, emoji=False) if console.quiet else console
        shown.print(f"[red]Training stopped:[/] {errors[-1]['message']}")
        return errors[-1].get("exit_code", 1)  # 2: the runner found bad input (data) before training on it
    tail = log_path.read_text(errors="replace").splitlines()[-25:] if log_path.exists() else []
    console.print("\n".join(tail), markup=False)
    console.print(
        f"[red]Training failed (exit {code}).[/] Full log: {log_path}. After fixing the cause: rlctl resume {run_dir}"
    )
    return 1


def _show(progress: Progress, tasks_by_stage: dict[str, int], rec: dict) -> None:
    stage = rec.get("stage", "?")
    if stage not in tasks_by_stage:
        tasks_by_stage[stage] = progress.add_task(stage, total=rec.get("max_steps"), info="")
    task = tasks_by_stage[stage]
    if rec.get("event") == "eval":
        info = "  ".join(f"{k} {v:.3f}" for k, v in rec.items() if k.startswith("eval_") and isinstance(v, float))
        progress.update(task, info=info)
        return
    if rec.get("event") == "end":
        progress.update(task, completed=progress.tasks[task].total or 0)
        return
    if "step" in rec:
        keys = ("loss", "reward", "kl", "sync_logp_diff_mean")  # the last: vLLM's weight-sync check, when it runs
        values = [(k.removesuffix("_logp_diff_mean"), rec[k]) for k in keys if isinstance(rec.get(k), int | float)]
        shown = [f"{k} {v:.4g}" for k, v in values]
        progress.update(task, completed=rec["step"], total=rec.get("max_steps"), info="  ".join(shown))

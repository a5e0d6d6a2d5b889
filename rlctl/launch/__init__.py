"""Prepare a run directory and start the stages through `accelerate launch`, showing live progress.

The launched processes (rlctl.launch.runner) write `metrics.jsonl`; this side tails it into rich progress bars,
keeps the full log in `logs/train.log` (`logs/train.node{R}.log` on node R > 0 of a multi-node run, so nodes
sharing the run directory do not write one file), and prints the summary table at the end.

Package `rlctl.launch`: the launch on this side (this module), the process every rank runs (`runner`), what an
elastic restart was (`restarts`), the job files of schedulers (`jobs`: SLURM scripts in `slurm`, Kubernetes
manifests in `k8s`, SkyPilot tasks in `sky`) and TensorBoard event files (`tbevents`).
May import: base, vision, config, sandbox, rundir, data, rewards, plan, algorithms, checkpoint, rollout, runtime,
monitors, trainer, stages.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from rich.console import Console
from rich.markup import escape

from rlctl import checkpoint, data, processes, strictjson, tables
from rlctl import config as config_mod
from rlctl.data import tasks
from rlctl.errors import UserError
from rlctl.launch import logfile, preflight, restarts, tbevents
from rlctl.launch import progress as progress_mod
from rlctl.plan import data_lengths, engine, packages, resolved
from rlctl.plan import planner as plan_mod
from rlctl.rundir import RunDir, Summary, read_summary, write_record
from rlctl.scrub import scrub

if TYPE_CHECKING:  # rich's progress and tables load only when a run starts or a summary is shown
    from rich.progress import Progress
    from rich.table import Table

    from rlctl.plan.gguf import GgufImport


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


def check_inputs(
    cfg: config_mod.RunConfig, run_dir: Path, paths: dict[str, Path] | None, bf16: bool = False
) -> preflight.Report:
    """The pre-flight over every row (model, chat template, run directory, datasets, lengths), then the rewards
    called on the first RL rows; raises UserError. Returns the pre-flight's report."""
    from rlctl import rewards

    missing = plan_mod.missing_data(cfg)
    if missing:
        raise UserError("Missing data: " + "; ".join(missing) + ".")
    report = preflight.run(cfg, run_dir, full=True, paths=paths, bf16=bf16)
    preflight.require(report)
    if "rl" in cfg.stages:
        specs = [spec for spec in cfg.rl.rewards if spec.name not in rewards.MODEL_REWARDS]
        names, timeouts = [s.name for s in specs], [s.timeout_s for s in specs]
        rewards.dry_run(names, report.rows["rl"], cfg.data.answer_field, timeouts=timeouts)  # plugin errors surface now
    return report


@dataclass
class Prepared:
    """A new run directory's plan, and the pre-flight report of its inputs (what was recognised in the data, the
    rows over their length limits)."""

    plan: plan_mod.Plan
    report: preflight.Report


def prepare(cfg: config_mod.RunConfig, run_dir: Path) -> Prepared:
    """Validate everything, then write config.yaml, accelerate.yaml and the data into a new run directory. The plan
    is built once, from the plan's facts and the lengths the pre-flight counts in the data (recorded: every rank and
    resume plans the same)."""
    cfg = _absolute(cfg)
    facts = plan_mod.facts(cfg, run_dir)
    problem = preflight.run_dir_problem(run_dir)
    if problem:
        raise UserError(problem)
    imported = import_model(facts.model_import, Console(highlight=False), quiet=False)
    with tempfile.TemporaryDirectory(prefix="rlctl-data-") as scratch:  # a refused run leaves nothing behind
        paths = None
        if cfg.data.generate:
            tasks.GENERATORS[cfg.data.generate](Path(scratch) / "data", cfg.seed)
            paths = plan_mod.data_paths(cfg, scratch)
        report = check_inputs(facts.cfg, run_dir, paths, facts.precision == "bf16")
        lengths = preflight.longest(report)
        the_plan = plan_mod.build_from(facts, lengths or None, report.images or None)  # the data's lengths
        packages.require(the_plan)  # after the inputs: a data problem is named whether or not the extras are here
        run_dir.mkdir(parents=True, exist_ok=True)
        if paths:
            shutil.move(RunDir(Path(scratch)).data, RunDir(run_dir).data)
    data_lengths.record(run_dir, lengths, report.images)  # what the plan used, for every rank and resume
    if imported is not None:  # what the import fixed, kept with the run
        RunDir(run_dir).model_import.write_text(json.dumps(imported, indent=2))
    RunDir(run_dir).accelerate.write_text(yaml.safe_dump(the_plan.accelerate, sort_keys=False))
    write_record(run_dir / resolved.PLAN_FILE, the_plan)
    RunDir(run_dir).config.write_text(config_mod.dump(the_plan.config))  # as the plan resolved it
    return Prepared(the_plan, report)


def import_model(spec: GgufImport | None, console: Console, quiet: bool) -> dict | None:
    """The plan's GGUF model (`spec`) converted into its cached folder (rlctl.stages.gguf_import), once per machine
    before the ranks start; the import's record (what it fixed), or None for other models. `quiet`: say nothing when
    it is cached already (a resume). A file transformers cannot convert is a UserError (exit 2)."""
    if spec is None:
        return None
    from rlctl.stages import gguf_import

    lines: list[str] = []
    try:
        done = gguf_import.ensure(spec, lines.append)
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        raise UserError(
            f"transformers could not convert {spec.file} into a Hugging Face model ({type(e).__name__}: {e}). "
            "rlctl trains GGUF files of the architectures transformers' GGUF loader supports (Llama, Qwen2/3, "
            "Mistral, Gemma, Phi-3 ...); convert it by hand into a folder and point model.name_or_path there."
        ) from None
    if done.converted_now or not quiet:
        for line in lines:
            console.print(f"[bold]Model[/] {escape(line)}", soft_wrap=True)  # the cached folder's path stays whole
    return done.record


def _env(the_plan: plan_mod.Plan) -> dict[str, str]:
    """The launched processes' environment: the user's, with rlctl's defaults where the user set none."""
    env = dict(os.environ)
    # OpenMP ignores a value that is not a count (`export OMP_NUM_THREADS=`); accelerate's int() stops the launch
    if not env.get("OMP_NUM_THREADS", "1").strip().isdigit():
        del env["OMP_NUM_THREADS"]  # unset: the default below on CPU, accelerate's own elsewhere
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if the_plan.config.rl.allow_unconfined_code:
        env["RLCTL_ALLOW_UNCONFINED_CODE"] = "1"  # read by rlctl.sandbox.jail
    env[restarts.NODE_ENV] = str(the_plan.config.hardware.node_rank)  # c10d numbers the nodes in its own order
    if the_plan.config.hardware.max_restarts and the_plan.layout.nodes > 1:
        env.setdefault(restarts.SHARED_STORE_OFF, "1")
    colocated = the_plan.generation_engine == "vllm" and the_plan.async_split is None
    if engine.expandable_segments(the_plan.hardware, colocated, packages.installed_version("vllm")):
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    if the_plan.hardware.is_cpu:
        env["ACCELERATE_USE_CPU"] = "1"
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(the_plan.num_processes, 1))))
    return env


LOG_DRAIN_S = 10.0  # the wait for the launch's last output once it ended (a process it left may hold the pipe)
LIVE_BYTES = 64 * 2**20  # metrics.jsonl read per poll of a running launch
LOG_TAIL_BYTES = 4 * 2**20  # the end of a failed launch's log searched for its cause


def _read_new(path: Path, offset: int) -> tuple[list[dict], int]:
    """Complete jsonl records appended to `path` since byte `offset`, at most LIVE_BYTES of them per call (a line
    longer than that is no record: it is skipped)."""
    if not path.is_file():  # not yet, or no regular file (a link to a device): nothing to show
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        chunk = f.read(LIVE_BYTES)
    end = chunk.rfind(b"\n") + 1
    if not end and len(chunk) == LIVE_BYTES:
        return [], offset + len(chunk)
    records = []
    for line in chunk[:end].splitlines():
        with contextlib.suppress(ValueError):  # a damaged line (a disk that filled up) is not a record
            record = json.loads(line) if line.strip() else None
            records += [record] if isinstance(record, dict) else []
    return records, offset + end


def _cell(value: object) -> str:
    """A summary number to 4 significant digits; `n/a` for a value that was NaN/inf (written as null)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


def summary_table(summary: Summary) -> Table:
    """The per-stage held-out metrics of summary.json as a table: a row per metric, a column per stage (a column
    per metric was too wide for 80 columns once a run has tool metrics)."""
    from rich.table import Table

    stages = {name: stage.metrics for name, stage in summary.stages.items()}
    table = Table(title="Summary (held-out)", title_justify="left")
    table.add_column("metric", no_wrap=True)
    for stage in stages:
        table.add_column(stage, justify="right", no_wrap=True)
    for k in sorted({k for m in stages.values() for k in m} - {"null_reasons"}):
        table.add_row(k, *[_cell(metrics.get(k, "")) for metrics in stages.values()])
    return table


def show_summary(console: Console, summary: Summary) -> None:
    """The table a finished run ends with, or one line where no stage has a held-out metric (an empty table of
    stage names said nothing)."""
    if any(k != "null_reasons" for m in summary.stages.values() for k in m.metrics):
        tables.show(console, summary_table(summary))
    else:
        console.print("No held-out metrics: set data.eval to score each policy stage after training.")


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
    lock = RunDir(run_dir).lock
    if lock.exists():
        try:
            pid = int(strictjson.bounded(lock, 64).strip() or 0)
        except (OSError, ValueError):  # unreadable, not a regular file, or not a pid: no live owner named
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


def _run(the_plan: plan_mod.Plan, console: Console, resuming: bool) -> int:
    run_dir = Path(the_plan.run_dir)
    RunDir(run_dir).logs.mkdir(parents=True, exist_ok=True)
    log_path = RunDir(run_dir).log(the_plan.config.hardware.node_rank)
    metrics_path = RunDir(run_dir).metrics
    offset = metrics_path.stat().st_size if metrics_path.exists() else 0
    log_start = log_path.stat().st_size if log_path.exists() else 0  # this launch's part of an appended log
    port = ["--main_process_port", str(processes.free_port())] if the_plan.num_processes > 1 else []  # not all 29500
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *port, *the_plan.launch[2:]]  # a node's plan port wins
    import_model(the_plan.model_import, console, quiet=True)  # a resume, another node: the folder may not be here
    console.print(f"[bold]{'Resuming' if resuming else 'Starting'}[/] {the_plan.config.name} in {run_dir}")
    console.print(f"[dim]{escape(the_plan.command)}\nlog: {escape(str(log_path))}[/]", soft_wrap=True)  # pastes as is
    stopped = 0
    errors: list[dict] = []
    alarmed: list[dict] = []
    last_stage = ""  # the stage the last record came from: where a launch that dies without a word was
    previous = signal.signal(signal.SIGTERM, _raise_signal)
    # Ctrl-C or kill -INT stops at a checkpoint even where SIGINT came in ignored (a background job of a script)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with log_path.open("ab") as log:
            # Its own session: a terminal Ctrl-C reaches only this CLI, which asks the trainers to stop at a step
            # boundary. Killed with its parent, so no trainer outlives this CLI (kill -9 included). Its output goes
            # through a pipe into the log, progress bars as lines (logfile.LogLines).
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=_env(the_plan),
                start_new_session=True,
                preexec_fn=processes.die_with_parent,
            )
            copying = logfile.copy(proc.stdout, logfile.LogLines(log, the_plan.config.logging.console_every_s))
            from rich.progress import Progress

            tasks_by_stage: dict[str, int] = {}
            stages: dict[str, progress_mod.StageProgress] = {}
            every_s = the_plan.config.logging.console_every_s
            events = tbevents.MetricsEvents(RunDir(run_dir).tensorboard)  # TensorBoard, live, no account needed
            columns = bar_columns()
            # Off a terminal the bars stay off (rich would print their last frame, cut to COLUMNS, on exit): plain
            # lines from _plain_lines instead, one per logged step.
            with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as progress:
                while True:
                    try:
                        done = proc.poll() is not None
                        records, offset = _read_new(metrics_path, offset)
                        for rec in records:
                            events.add(rec)
                            last_stage = str(rec.get("stage") or last_stage)
                            if rec.get("event") == "error":
                                errors.append(rec)
                            if rec.get("event") == "restart":
                                errors.clear()  # the failure the elastic agent restarted the processes after
                            if rec.get("event") == "alarm":
                                alarmed.append(rec)
                            _show(progress, tasks_by_stage, stages, rec)
                        if not console.is_terminal:
                            _plain_lines(console, stages, every_s)
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
            copying.join(timeout=LOG_DRAIN_S)  # what the processes printed last, before the log closes
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    proc.wait()
    if stopped:
        console.print(f"[yellow]Interrupted.[/] Continue with: rlctl resume {run_dir}", soft_wrap=True)
        return 128 + stopped
    code = proc.returncode
    if alarmed:
        names = ", ".join(a["alarm"] for a in alarmed)
        console.print(f"[yellow]{len(alarmed)} alarm(s)[/] ({names}): `rlctl report {run_dir}` lists their causes.")
    if code == 0 and RunDir(run_dir).summary.exists():
        show_summary(console, read_summary(run_dir))
        console.print(f"[green]Done.[/] Export with: rlctl export {run_dir} --out {run_dir}/export", soft_wrap=True)
        return 0
    with log_path.open("rb") as f:  # the end of this launch's part of the node's log
        f.seek(max(log_start, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
        launched = f.read(LOG_TAIL_BYTES).decode(errors="replace")
    if the_plan.config.hardware.max_restarts and restarts.RENDEZVOUS_TIMEOUT in launched:
        console.print(restarts.nodes_missing(the_plan, last_stage, log_path), soft_wrap=True)
        return 1
    if errors:
        # --quiet still prints why training stopped
        shown = Console(stderr=True, highlight=False, emoji=False) if console.quiet else console
        shown.print(f"[red]Training stopped{_stopped_where(errors[-1], log_path)}")
        return errors[-1].get("exit_code", 1)  # 2: the runner found bad input (data) before training on it
    cause = scrub(failure(launched))
    if code < 0:  # the launcher itself (its processes die with it)
        cause = f"The training launcher (pid {proc.pid}) {processes.exit_text(code)}."
    console.print(_failed(last_stage, code, cause, log_path, run_dir))
    return 2 if code == 2 else 1


def _failed(stage: str, code: int, cause: str, log_path: Path, run_dir: Path) -> str:
    """The paragraph of a launch that ended without an `error` event: the stage it was in, the cause, the log, and
    the stage's last complete checkpoint, which a resume continues from."""
    where = f" in stage {stage}" if stage and f"Stage {stage} " not in cause else ""
    last = checkpoint.last_complete(RunDir(run_dir).checkpoints(stage)) if stage else None
    start = f" (it continues from {stage}/checkpoints/{last.name}, the last complete checkpoint)" if last else ""
    return (
        f"[red]Training failed{escape(where)} (exit {code}).[/] {escape(cause)} Full log: {log_path}. After fixing "
        f"the cause: rlctl resume {run_dir}{start}"
    )


def _stopped_where(error: dict, log_path: Path) -> str:
    """An `error` event's paragraph as printed: its stage (when the message does not name it), its message, and
    where the full log is (when the message does not say)."""
    stage, message = error.get("stage"), str(error.get("message", "")).strip()
    named = not stage or stage == "?" or f"Stage {stage} " in message or f"stage {stage}" in message
    where = "" if str(log_path) in message else f" Full log: {log_path}."
    return f"{'' if named else f' in stage {stage}'}:[/] {escape(message)}{where}"


def failure(log: str) -> str:
    """The cause of a launch that ended without an `error` event, from its log: the paragraph a rank printed
    (`rlctl: ...`), else the last exception line of a traceback, else that none was found."""
    lines = [line.strip() for line in log.splitlines()]
    said = [line for line in lines if line.startswith("rlctl: ")]
    if said:
        return said[-1].removeprefix("rlctl: ")
    signum = _killed_by(lines)
    if signum is not None:
        return f"A training process {processes.exit_text(-signum)}."
    raised = []  # the exception line ending each traceback; the launcher's own (CalledProcessError) left out
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            ends = [x for x in lines[i + 1 :] if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", x)]
            if ends and "CalledProcessError" not in ends[0]:
                raised.append(ends[0])
    if raised:
        return f"The training process raised {raised[-1]}."
    return "The training process ended without saying why (killed by the system, out of memory?)."


# how accelerate's launcher logs a training process a signal killed: one process (subprocess's CalledProcessError),
# several (torch.distributed.elastic's error summary)
KILLED = (re.compile(r"died with <Signals\.\w+: (\d+)>"), re.compile(r"exitcode\s*:\s*-(\d+)"))


def _killed_by(lines: list[str]) -> int | None:
    """The signal that killed a training process, as its launcher logged it last; None when none did."""
    for line in reversed(lines):
        for pattern in KILLED:
            if found := pattern.search(line):
                return int(found[1])
    return None


def bar_columns() -> list:
    """The progress bars' columns: at 80 columns the stage name and the step count stay whole and the metrics wrap
    at spaces (a 40-wide bar squeezed them into `r…` and `eval_reward …`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
    from rich.table import Column

    return [
        TextColumn("[bold]{task.description:<6}", table_column=Column(no_wrap=True)),
        BarColumn(bar_width=16),
        MofNCompleteColumn(table_column=Column(no_wrap=True)),
        TextColumn("{task.fields[info]}", table_column=Column(ratio=1)),
        TextColumn("{task.fields[eta]}", table_column=Column(no_wrap=True)),
    ]


def _plain_lines(console: Console, stages: dict[str, progress_mod.StageProgress], every_s: float) -> None:
    """Off a terminal: a plain line per step each stage logged since the last poll, and a held-out scoring's
    progress at most every `every_s` seconds (StageProgress.plain_lines), flushed at once."""
    for stage in stages.values():
        for line in stage.plain_lines(every_s):
            console.print(line, markup=False)
    console.file.flush()


def _show(
    progress: Progress, tasks_by_stage: dict[str, int], stages: dict[str, progress_mod.StageProgress], rec: dict
) -> None:
    stage = rec.get("stage", "?")
    if rec.get("event") == "alarm":
        progress.console.print(f"[yellow]alarm[/] ({stage}, step {rec.get('step')}): {escape(rec['message'])}")
        return
    if rec.get("event") == "restart":
        progress.console.print(restarts.restart_line(rec))
        return
    if rec.get("event") == "tracker_failed":
        progress.console.print(f"[yellow]warning[/] ({stage}): {escape(rec['message'])}")
        return
    if rec.get("event") == "reward_slow":
        progress.console.print(
            f"[yellow]slow reward[/] ({stage}): '{escape(rec['reward'])}' has run {rec['seconds']:g} s on one batch; "
            f"it is stopped at its timeout_s of {rec['timeout_s']:g} s."
        )
        return
    if stage not in tasks_by_stage:
        tasks_by_stage[stage] = progress.add_task(stage, total=rec.get("max_steps"), info="", eta="")
        stages[stage] = progress_mod.StageProgress(stage, plain=not progress.console.is_terminal)
    task, state = tasks_by_stage[stage], stages[stage]
    state.update(rec)
    if rec.get("event") == "data" and "dropped_too_long" in rec:
        progress.console.print(f"[yellow]{progress_mod.dropped_line(rec)}[/]")
    if rec.get("event") == "end":
        progress.update(task, completed=progress.tasks[task].total or 0, info=state.info(), eta="")
        return
    progress.update(task, completed=state.step, total=state.total, info=state.info(), eta=state.eta_text())

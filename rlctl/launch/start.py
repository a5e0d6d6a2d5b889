"""Start a prepared run through `accelerate launch` and wait for it: the run directory's lock, the processes'
environment, Ctrl-C and SIGTERM turned into a stop at the next checkpoint, and the paragraph that explains a launch
that failed (the stage, the cause found in the log, the checkpoint a resume continues from). What the console shows
meanwhile is `rlctl.launch.live`'s."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rlctl import atomic, checkpoint, processes, strictjson
from rlctl.errors import UserError
from rlctl.launch import import_model, live, logfile, restarts, tbevents
from rlctl.launch import progress as progress_mod
from rlctl.plan import engine, packages
from rlctl.plan import planner as plan_mod
from rlctl.rundir import RunDir, read_summary
from rlctl.scrub import scrub


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
LOG_TAIL_BYTES = 4 * 2**20  # the end of a failed launch's log searched for its cause


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
    atomic.write_text(lock, f"{os.getpid()}\n")
    return lock


@contextlib.contextmanager
def holding_lock(run_dir: Path) -> Iterator[Path]:
    """The run directory's lock, claimed (`acquire_lock`) and held open while the run runs, then removed: a pid in
    a lock proves nothing (a copied run directory names the original's), the open file proves which run it is."""
    lock = acquire_lock(run_dir)
    try:
        with lock.open("rb"):
            yield lock
    finally:
        lock.unlink(missing_ok=True)


def run(the_plan: plan_mod.Plan, console: Console, resuming: bool = False) -> int:
    """Run the launch command to completion; returns its exit code (130/143 when interrupted)."""
    run_dir = Path(the_plan.run_dir)
    with holding_lock(run_dir):
        return _run(the_plan, console, resuming)


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
            from rich.progress import Progress, TaskID

            tasks_by_stage: dict[str, TaskID] = {}
            stages: dict[str, progress_mod.StageProgress] = {}
            every_s = the_plan.config.logging.console_every_s
            events = tbevents.MetricsEvents(RunDir(run_dir).tensorboard)  # TensorBoard, live, no account needed
            columns = live.bar_columns()
            # Off a terminal the bars stay off (rich would print their last frame, cut to COLUMNS, on exit): plain
            # lines from live.plain_lines instead, one per logged step.
            with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as progress:
                while True:
                    try:
                        done = proc.poll() is not None
                        records, offset = live.read_new(metrics_path, offset)
                        for rec in records:
                            events.add(rec)
                            last_stage = str(rec.get("stage") or last_stage)
                            if rec.get("event") == "error":
                                errors.append(rec)
                            if rec.get("event") == "restart":
                                errors.clear()  # the failure the elastic agent restarted the processes after
                            if rec.get("event") == "alarm":
                                alarmed.append(rec)
                            live.show_record(progress, tasks_by_stage, stages, rec)
                        if not console.is_terminal:
                            live.plain_lines(console, stages, every_s)
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
    code = proc.returncode
    if stopped and not _finished(the_plan):
        console.print(f"[yellow]Interrupted.[/] Continue with: rlctl resume {run_dir}", soft_wrap=True)
        return 128 + stopped
    if stopped:  # the stop came as the last stage ended (its processes were exiting): nothing is left to resume
        console.print("[yellow]The stop came after the last stage had ended:[/] the run is complete.")
        code = 0
    if alarmed:
        names = ", ".join(a["alarm"] for a in alarmed)
        console.print(f"[yellow]{len(alarmed)} alarm(s)[/] ({names}): `rlctl report {run_dir}` lists their causes.")
    if code == 0 and RunDir(run_dir).summary.exists():
        live.show_summary(console, read_summary(run_dir))
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


def _finished(the_plan: plan_mod.Plan) -> bool:
    """Whether summary.json records every stage of the plan as completed."""
    return {s.name for s in the_plan.stages} <= set(read_summary(Path(the_plan.run_dir)).completed)


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

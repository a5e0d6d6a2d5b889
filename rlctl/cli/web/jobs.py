"""The rlctl commands the page starts (train, resume, export, eval): the real CLI in subprocesses the server owns,
one at a time per run directory, each in its own session (a Ctrl-C meant for the server does not reach it) with its
output in RUN_DIR/logs/ui-COMMAND.log. Closing the page stops nothing; stopping the server stops its runs the way
`kill -TERM` stops `rlctl train`: at a step with a checkpoint (exit 143)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from rlctl.errors import UserError
from rlctl.rundir import RunDir

STOP_WAIT_S = 120.0  # at server shutdown: how long a run may take to reach its checkpoint


@dataclass
class Job:
    """One rlctl command the page started."""

    command: str  # train, resume, export, eval
    run_dir: Path  # relative to the served folder
    proc: subprocess.Popen
    log: Path

    def running(self) -> bool:
        return self.proc.poll() is None

    def status(self) -> tuple[str, dict[str, object]]:
        """How the command stands, as a message key of `text` and its values: running, done, stopped or failed."""
        code = self.proc.poll()
        values: dict[str, object] = {"command": f"rlctl {self.command}", "pid": self.proc.pid, "code": code}
        if code is None:
            return "job_running", values
        if code == 0:
            return "job_done", values
        if code in (130, 143):
            return "job_stopped", values
        return "job_failed", values

    def state(self) -> str:
        """`rlctl train: running (pid N)`, or how it ended (in English; the page says it in its language)."""
        from rlctl.cli.web import text

        key, values = self.status()
        return text.say("en", key, **values)


class Jobs:
    """The commands started from the page, by run directory; every tab reads the same ones."""

    def __init__(self, root: Path):
        self.root = root
        self._jobs: dict[Path, Job] = {}  # the latest command per run directory
        self._by_command: dict[tuple[Path, str], Job] = {}  # the latest of each command per run directory
        self._lock = threading.Lock()
        self.latest: Path | None = None  # the run a newly opened tab shows

    def get(self, run_dir: Path, command: str | None = None) -> Job | None:
        """The latest command on `run_dir` (or the latest `command` on it)."""
        return self._jobs.get(run_dir) if command is None else self._by_command.get((run_dir, command))

    def start(self, command: str, args: list[str], run_dir: Path) -> Job:
        """Start `rlctl COMMAND ARGS` in the served folder; refused while another command runs on `run_dir`, and a
        `train` into a folder that already holds a run or other files is refused before anything is written (the
        CLI's own rule, checked first so that the refused start leaves that folder's files as they were)."""
        with self._lock:
            busy = self._jobs.get(run_dir)
            if busy is not None and busy.running():
                raise UserError(f"{run_dir} is busy: {busy.state()}. Wait for it, or stop it first.")
            if command == "train":
                refuse_occupied(self.root, run_dir)
            log = RunDir(self.root / run_dir).ui_log(command)
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("ab") as out:  # appended: an earlier command's output stays
                out.write(f"\n$ rlctl {command} {' '.join(args)}\n".encode())
                out.flush()
                proc = subprocess.Popen(
                    [sys.executable, "-m", "rlctl.cli", command, *args],
                    cwd=self.root,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
                )
            job = Job(command, run_dir, proc, log)
            self._jobs[run_dir] = job
            self._by_command[(run_dir, command)] = job
            if command in ("train", "resume"):
                self.latest = run_dir
            return job

    def training(self, run_dir: Path) -> int | None:
        """The pid of the rlctl training `run_dir` now: the page's train/resume, else the lock's holder."""
        job = self._jobs.get(run_dir)
        if job is not None and job.running() and job.command in ("train", "resume"):
            return job.proc.pid
        return lock_holder(RunDir(self.root / run_dir).lock)

    def stop(self, run_dir: Path) -> tuple[str, dict[str, object]]:
        """Ask the run's `rlctl train`/`resume` to stop at the next step with a checkpoint (SIGTERM, as kill does):
        the one this server started, else the rlctl that holds the run's lock open (a terminal's, an earlier
        server's). A pid in run.lock alone is not trusted: a copied run directory names the original's process.
        Returns what happened, as a message key of `text` and its values."""
        job = self._jobs.get(run_dir)
        if job is not None and job.running() and job.command in ("train", "resume"):
            job.proc.send_signal(signal.SIGTERM)
            return "stopping", {"run": run_dir}
        pid = lock_holder(RunDir(self.root / run_dir).lock)
        if pid is None:
            return "nothing_to_stop", {"run": run_dir}
        os.kill(pid, signal.SIGTERM)
        return "stopping_other", {"run": run_dir, "pid": pid}

    def shutdown(self) -> None:
        """The server stops: each command still running is stopped as `stop` does, and awaited."""
        live = [j for j in self._jobs.values() if j.running()]
        for job in live:
            job.proc.send_signal(signal.SIGTERM)
        for job in live:
            try:
                job.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                job.proc.kill()


def lock_holder(lock: Path) -> int | None:
    """The live process named in a run's lock, only if it holds that very file open (as `rlctl train` and `resume`
    do while they run, `launch.start.holding_lock`): a lock copied with its run directory, or a pid reused since,
    names a process that does not, and nothing is signalled."""
    import psutil

    try:
        mine = lock.stat()
        pid = int(lock.read_text(encoding="ascii").strip())
        held = psutil.Process(pid).open_files()
    except (OSError, ValueError, UnicodeError, psutil.Error):
        return None
    for f in held:
        try:
            st = os.stat(f"/proc/{pid}/fd/{f.fd}") if os.path.isdir("/proc") else os.stat(f.path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
            return pid if pid != os.getpid() else None
    return None


def refuse_occupied(root: Path, run_dir: Path) -> None:
    """`rlctl train`'s refusal of a run directory that holds a run or other files (its `logs/` aside), said before
    the page writes its log there."""
    base = root / run_dir
    if RunDir(base).config.exists():
        raise UserError(
            f"{run_dir} already holds a run; continue it with Resume (`rlctl resume {run_dir}`) or pick another run "
            "directory. Nothing was written."
        )
    if base.exists() and (not base.is_dir() or any(p != RunDir(base).logs for p in base.iterdir())):
        raise UserError(
            f"{run_dir} already holds files that are not an rlctl run; a run needs a new or empty folder. Nothing "
            "was written; pick another run directory."
        )

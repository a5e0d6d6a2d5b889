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

    def state(self) -> str:
        """`rlctl train: running (pid N)`, or how it ended."""
        code = self.proc.poll()
        head = f"rlctl {self.command}"
        if code is None:
            return f"{head}: running (pid {self.proc.pid})"
        if code == 0:
            return f"{head}: done (exit 0)"
        if code in (130, 143):
            return f"{head}: stopped at a checkpoint (exit {code}); Resume continues from it"
        return f"{head}: failed (exit {code}); the log below says why"


class Jobs:
    """The commands started from the page, by run directory; every tab reads the same ones."""

    def __init__(self, root: Path):
        self.root = root
        self._jobs: dict[Path, Job] = {}  # the latest command per run directory
        self._lock = threading.Lock()
        self.latest: Path | None = None  # the run a newly opened tab shows

    def get(self, run_dir: Path) -> Job | None:
        return self._jobs.get(run_dir)

    def start(self, command: str, args: list[str], run_dir: Path) -> Job:
        """Start `rlctl COMMAND ARGS` in the served folder; refused while another command runs on `run_dir`."""
        with self._lock:
            busy = self._jobs.get(run_dir)
            if busy is not None and busy.running():
                raise UserError(f"{run_dir} is busy: {busy.state()}. Wait for it, or stop it first.")
            log = RunDir(self.root / run_dir).ui_log(command)
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("wb") as out:
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
            if command in ("train", "resume"):
                self.latest = run_dir
            return job

    def stop(self, run_dir: Path) -> str:
        """Ask the run's `rlctl train`/`resume` to stop at the next step with a checkpoint (SIGTERM, as kill does):
        the one this server started, else the rlctl holding the run's lock (a terminal's, an earlier server's)."""
        job = self._jobs.get(run_dir)
        if job is not None and job.running() and job.command in ("train", "resume"):
            job.proc.send_signal(signal.SIGTERM)
            return f"Stopping {run_dir} at the next step with a checkpoint..."
        pid = self._lock_holder(run_dir)
        if pid is None:
            return f"Nothing to stop: no rlctl is training in {run_dir}."
        os.kill(pid, signal.SIGTERM)
        return f"Stopping {run_dir} (rlctl pid {pid}, not started from this page) at the next step with a checkpoint..."

    def _lock_holder(self, run_dir: Path) -> int | None:
        """The live rlctl process named in RUN_DIR/run.lock (the launcher's lock), if any."""
        import psutil

        lock = RunDir(self.root / run_dir).lock
        try:
            pid = int(lock.read_text().strip())
            alive = psutil.Process(pid)
            return pid if "rlctl" in " ".join(alive.cmdline()) else None
        except (OSError, ValueError, psutil.Error):
            return None

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

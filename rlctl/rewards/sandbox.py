"""Run model-written Python against tests in a separate, confined process.

Containment, each layer on its own:
- a fresh interpreter (`python -I`) in a temporary working directory that is deleted afterwards;
- rlimits: CPU seconds, address space (memory), file size, number of processes; a wall-time limit on top;
- no network: a new network namespace where the OS allows it (root or user namespaces), and in any case an
  audit hook that refuses sockets, subprocesses, ctypes and any write, rename or delete outside the
  working directory.
A failure of any kind (exception, timeout, limit, refused operation) scores as a failed test run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000

# Runs first in the child: installs the audit hook, then executes the solution and the tests.
_BOOTSTRAP = r"""
import os, sys
ROOT = os.path.realpath(os.getcwd())
DENY = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty",
        "ctypes.", "pty.", "os.kill", "os.killpg", "signal.pthread_kill", "sys.addaudithook", "os.chdir")
# event -> (indexes of path arguments, index of the dir_fd they are relative to, per path)
FS = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.rename": ((0, 2), (1, 3)), "os.mkdir": ((0, 2),),
      "os.symlink": ((1, 2),), "os.link": ((0, 2), (1, 3)), "os.chmod": ((0, 2),), "os.chown": ((0, 3),),
      "os.truncate": ((0, None),), "os.utime": ((0, 3),)}

def inside(path, dir_fd=None):
    if isinstance(path, int):
        return True
    path = os.fsdecode(path)
    if os.path.isabs(path):
        full = os.path.realpath(path)
    else:
        base = os.readlink(f"/proc/self/fd/{dir_fd}") if isinstance(dir_fd, int) else ROOT
        full = os.path.realpath(os.path.join(base, path))
    return full == ROOT or full.startswith(ROOT + os.sep)

def hook(event, args):
    if event.startswith(DENY) or (event == "import" and args[0] in ("ctypes", "_ctypes")):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and args[1] is not None:
        mode, flags = str(args[1]), args[2] or 0
        writing = any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        if writing and not inside(args[0]):
            raise PermissionError(f"sandbox: writing outside the working directory: {args[0]}")
    if event == "open" and args[1] is None and (args[2] or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
        # os.open does not report its dir_fd: only absolute paths inside the directory may be written
        if not (isinstance(args[0], (str, bytes)) and os.path.isabs(os.fsdecode(args[0])) and inside(args[0])):
            raise PermissionError(f"sandbox: low-level write to {args[0]!r} refused")
    if event in FS:
        for path_i, fd_i in FS[event]:
            fd = args[fd_i] if fd_i is not None and fd_i < len(args) else None
            if path_i < len(args) and not inside(args[path_i], fd):
                raise PermissionError(f"sandbox: {event} outside the working directory")

code = open("solution.py").read()
tests = open("tests.py").read()
sys.addaudithook(hook)
scope = {"__name__": "__main__"}
exec(compile(code, "solution.py", "exec"), scope)
exec(compile(tests, "tests.py", "exec"), scope)
print("SANDBOX-PASSED")
"""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512
    file_mb: int = 8
    processes: int = 64


@dataclass(frozen=True)
class Result:
    passed: bool
    reason: str
    output: str


def _confine(limits: Limits):
    """The child's pre-exec step: its own session, rlimits, and no network where possible."""

    def apply() -> None:
        os.setsid()
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * mb, limits.file_mb * mb))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        with contextlib.suppress(OSError, AttributeError):  # refused without privileges: the hook still blocks
            ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET)

    return apply


def run(code: str, tests: str, limits: Limits = Limits()) -> Result:
    """Run `code`, then `tests` (plain asserts) on it; passed only when every assert held within the limits."""
    with tempfile.TemporaryDirectory(prefix="rlctl-sandbox-") as tmp:
        Path(tmp, "solution.py").write_text(code)
        Path(tmp, "tests.py").write_text(tests)
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "HOME": tmp, "TMPDIR": tmp}
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-c", _BOOTSTRAP],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=limits.wall_s,
                preexec_fn=_confine(limits),
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:  # the child is killed; it could not fork, so nothing is left
            return Result(False, f"timeout after {limits.wall_s:g} s", "")
        output = (proc.stdout + proc.stderr)[-2000:]
        if proc.returncode == 0 and "SANDBOX-PASSED" in proc.stdout:
            return Result(True, "passed", output)
        if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and not proc.stderr.strip():
            return Result(False, f"timeout: over the {limits.cpu_s} s CPU time limit", output)
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit code {proc.returncode}"
        return Result(False, last, output)

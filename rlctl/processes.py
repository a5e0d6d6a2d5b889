"""Child processes that never outlive the process that started them."""

from __future__ import annotations

import contextlib
import signal
import socket

PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies


def die_with_parent() -> None:
    """Linux: this process is killed when the process that started it dies, even by kill -9 (a pre-exec step of
    `subprocess.Popen`, or the first call of a spawned process)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def exit_text(exitcode: int | None) -> str:
    """How a child process ended, from its exit code (-N for signal N, as subprocess and multiprocessing give it),
    as a predicate: 'was killed by signal 9 (SIGKILL: ...)', 'exited with code 3'."""
    if exitcode is None:
        return "stopped answering"
    if exitcode >= 0:
        return f"exited with code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        return f"was killed by signal {-exitcode}"
    why = ": a kill -9, or the system's out-of-memory killer" if name == "SIGKILL" else ""
    return f"was killed by signal {-exitcode} ({name}{why})"


def free_port() -> int:
    """A TCP port on this machine that nothing listens on now (closed again before it is returned)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]

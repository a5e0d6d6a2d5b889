"""Child processes that never outlive the process that started them."""

from __future__ import annotations

import contextlib
import signal

PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies


def die_with_parent() -> None:
    """Linux: this process is killed when the process that started it dies, even by kill -9 (a pre-exec step of
    `subprocess.Popen`, or the first call of a spawned process)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

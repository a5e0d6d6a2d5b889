"""The launch log (`logs/train.log`) as lines a person reads. The training processes write to a pipe that
`rlctl train` copies into the log line by line: a progress bar redraws itself with carriage returns (CR: tqdm's
tokenizing, loading and training bars, off a terminal too), which would fill the log with every frame of it, so a
bar becomes one line when it ends (its last frame) and, while it runs, at most one line every `every_s` seconds
(its latest complete frame). Everything else passes as written."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import IO, BinaryIO


class LogLines:
    """Writes what a process prints into `out`, each carriage-return-redrawn line as its last frame (see the module
    docstring)."""

    def __init__(self, out: BinaryIO, every_s: float, clock: Callable[[], float] = time.monotonic):
        self.out, self.every_s, self.clock = out, every_s, clock
        self.pending = b""  # the line being written: its frames so far
        self.shown = clock()  # when a frame of the running bar was last written

    def feed(self, data: bytes) -> None:
        """Take the next bytes the process printed."""
        *lines, self.pending = (self.pending + data).split(b"\n")
        for line in lines:
            self._write(_last_frame(line))
            self.shown = self.clock()
        if b"\r" in self.pending:
            done, _, drawing = self.pending.rpartition(b"\r")  # `drawing`: the frame still being written
            if self.clock() - self.shown >= self.every_s and (frame := _last_frame(done)):
                self._write(frame)
                self.shown = self.clock()
            self.pending = b"\r" + drawing  # the frames before it are gone from the screen too
        self.out.flush()

    def close(self) -> None:
        """The last line, when the process ended without a newline."""
        if frame := _last_frame(self.pending):
            self._write(frame)
        self.pending = b""
        self.out.flush()

    def _write(self, line: bytes) -> None:
        self.out.write(line + b"\n")


def _last_frame(line: bytes) -> bytes:
    """What a terminal shows of a line redrawn with carriage returns: its last non-empty frame."""
    frames = [f for f in line.split(b"\r") if f.strip()]
    return frames[-1] if frames else line.replace(b"\r", b"")


def copy(source: IO[bytes], lines: LogLines) -> threading.Thread:
    """A started thread that feeds `lines` whatever `source` (a pipe) delivers until it closes, then closes it."""

    def pump() -> None:
        fd = source.fileno()
        while chunk := os.read(fd, 1 << 16):
            # a log that cannot take it (a full disk; closed, when a process left holding the pipe outlives the
            # launch) loses the line, but the pipe keeps draining: a process blocked on a full pipe would hang
            with contextlib.suppress(OSError, ValueError):
                lines.feed(chunk)
        with contextlib.suppress(OSError, ValueError):
            lines.close()

    thread = threading.Thread(target=pump, name="rlctl-log", daemon=True)
    thread.start()
    return thread

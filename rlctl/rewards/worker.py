"""Rewards in a worker process, where a deadline can stop them (a Python thread that never returns cannot be).

One worker per reward name in a `Workers` pool (a Python process running `serve(NAME, ANSWER_FIELD)`; the pool's
owner, a run's stages or a dry run, stops them) resolves the reward itself and then answers batch calls over its
stdin/stdout (length-prefixed pickles); whatever the reward prints
goes to stderr, i.e. the run's log. A call that overruns its deadline kills the worker (SIGKILL: a reward stuck in
C code or a socket stops too) and raises RewardTimeout; the next call starts a fresh one. Halfway to the deadline
`on_slow` is told, so the console can say which reward is slow before anything is stopped. Workers die with the
process that started them.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import pickle
import select
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from rlctl import processes
from rlctl.errors import UserError

SERVE = "import sys; from rlctl.rewards.worker import serve; serve(sys.argv[1], sys.argv[2])"


class RewardTimeout(Exception):
    """A reward call overran its deadline; its worker was stopped."""

    def __init__(self, seconds: float, completions: int):
        super().__init__(f"stopped after {seconds:.1f} s on a batch of {completions} completions")
        self.seconds, self.completions = seconds, completions


class RemoteError(Exception):
    """An exception a reward raised in its worker (the class is named after the original one)."""


def remote_error(kind: str, message: str) -> Exception:
    """The worker's exception as one of the same name here: a built-in type when it is one (TypeError, ...),
    UserError for rlctl's own, else a RemoteError subclass of that name (OutOfMemoryError stays recognisable)."""
    if kind == "UserError":
        return UserError(message)
    base = getattr(builtins, kind, None)
    if isinstance(base, type) and issubclass(base, Exception):
        with contextlib.suppress(TypeError):
            return base(message)
    return type(kind, (RemoteError,), {})(message)


def _write(stream, data: bytes) -> None:
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _send(stream, obj: Any) -> None:
    _write(stream, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(stream) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError
    (length,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(length))


class Worker:
    """The worker process of one reward; started on the first call and again after a deadline stopped it."""

    def __init__(self, name: str, answer_field: str):
        self.name, self.answer_field = name, answer_field
        self.proc: subprocess.Popen | None = None

    def _start(self, timeout_s: float) -> None:
        cmd = [sys.executable, "-c", SERVE, self.name, self.answer_field]
        pipe, dies = subprocess.PIPE, processes.die_with_parent
        self.proc = subprocess.Popen(cmd, stdin=pipe, stdout=pipe, preexec_fn=dies)
        kind, payload = self._reply(time.monotonic(), max(timeout_s, 60.0), None, 0)  # importing a plugin may be slow
        if kind == "error":
            self.stop()
            raise remote_error(*payload)

    def _reply(self, start: float, timeout_s: float, on_slow: Callable[[float], None] | None, n: int) -> tuple:
        """The worker's next message, waiting at most until start + timeout_s."""
        warned = on_slow is None
        while True:
            elapsed = time.monotonic() - start
            until = timeout_s if warned else timeout_s / 2
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, until - elapsed))
            if ready:
                break
            elapsed = time.monotonic() - start
            if not warned and elapsed >= timeout_s / 2:
                on_slow(elapsed)
                warned = True
            elif elapsed >= timeout_s:
                self.stop()
                raise RewardTimeout(elapsed, n)
        try:
            return _recv(self.proc.stdout)
        except EOFError:
            return "error", ("WorkerDied", self._died())

    def call(self, args: tuple, timeout_s: float, on_slow: Callable[[float], None] | None) -> Any:
        """The reward's values for (prompts, completions, kwargs); raises what it raised, or RewardTimeout."""
        if self.proc is None or self.proc.poll() is not None:
            self._start(timeout_s)
        start = time.monotonic()
        try:
            _send(self.proc.stdin, args)
        except BrokenPipeError:
            raise remote_error("WorkerDied", self._died()) from None
        kind, payload = self._reply(start, timeout_s, on_slow, len(args[1]))
        if kind == "error":
            raise remote_error(*payload)
        return payload

    def _died(self) -> str:
        """How the worker process that closed its pipe ended (killed when it has not within seconds); forgotten then,
        so the next call starts a fresh one."""
        pid = self.proc.pid
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.stop()
            return f"its worker process (pid {pid}) closed its pipe without answering and was stopped"
        self.proc = None
        return f"its worker process (pid {pid}) {processes.exit_text(code)} before answering"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def _portable(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments that can be sent to a worker (callables and unpicklable values stay here)."""
    out = {}
    for key, value in kwargs.items():
        if callable(value):
            continue
        try:
            pickle.dumps(value)
        except Exception:
            continue
        out[key] = value
    return out


class Workers:
    """The worker processes of one owner (a run's stages, a dry run), one per (reward, answer field): a reward named
    twice, or scored again at a checkpoint, reuses its worker."""

    def __init__(self) -> None:
        self.by_reward: dict[tuple[str, str], Worker] = {}

    def remote(self, name: str, answer_field: str, timeout_s: float, on_slow: Callable[[float], None] | None = None):
        """The reward `name` as a function that runs it in its worker, with a deadline."""
        from rlctl.rewards.resolve import split_call

        worker = self.by_reward.setdefault((name, answer_field), Worker(name, answer_field))

        def call(prompts: list, completions: list, **kwargs: Any) -> Any:
            return worker.call((list(prompts), list(completions), _portable(kwargs)), timeout_s, on_slow)

        call.__name__ = split_call(name)[0].rpartition(":")[2]
        return call

    def stop_all(self) -> None:
        """Stop every worker (they are idle between calls; a later call starts them again)."""
        for worker in self.by_reward.values():
            worker.stop()


def serve(name: str, answer_field: str) -> None:
    """The worker's side: resolve the reward, then answer calls until stdin closes."""
    from rlctl.rewards.resolve import resolve

    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the reward prints goes to the log, not into the answers
    requests = sys.stdin.buffer
    try:
        fn = resolve(name, answer_field)
    except Exception as e:
        _send(answers, ("error", (type(e).__name__, str(e))))
        return
    _send(answers, ("ready", None))
    while True:
        try:
            prompts, completions, kwargs = _recv(requests)
        except EOFError:
            return
        try:
            data = pickle.dumps(("ok", fn(prompts=prompts, completions=completions, **kwargs)))
        except Exception as e:
            data = pickle.dumps(("error", (type(e).__name__, str(e))))
        _write(answers, data)

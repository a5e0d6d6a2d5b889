"""Model-written code, run confined by the kernel (see `jail`): `run` scores code against tests (the code_tests
reward), `run_program` runs a program and returns what it printed (the python tool).

`run` uses two jails that cannot see each other: the solution's (the model's code, then a loop answering
requests) and the tests' (the row's tests, which never share a process with the model's code). Names the tests
use resolve to proxies of the solution's functions and objects; results cross as plain data only. The verdict is
the tests process writing `passed` on a pipe only the parent reads, after the last statement of the tests ran:
whatever the model's code prints, patches, raises or exits with happens in a process that has no say in it.

May import: base, vision.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from rlctl.sandbox.jail import Limits, Output, SandboxUnavailable, collect, interpreter, jailed, problem

__all__ = ["Limits", "Result", "SandboxUnavailable", "problem", "run", "run_program"]
_CPU_KILLED = {-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU, 128 + signal.SIGKILL}


@dataclass(frozen=True)
class Result:
    """Whether the code passed (ran without error, for a program), why not, and what it printed."""

    passed: bool
    reason: str
    output: str


@cache
def _source(name: str) -> str:
    return (Path(__file__).parent / name).read_text()


def _why(out: Output, limits: Limits) -> str:
    """One line saying how a jailed program failed."""
    if out.killed:
        return out.killed
    last = out.stderr.decode(errors="replace").strip().splitlines()[-1:]
    if out.returncode in _CPU_KILLED and not last:
        return f"timeout: over the {limits.cpu_s} s CPU time limit"
    return last[0] if last else f"exit code {out.returncode}"


def _text(out: Output) -> str:
    return (out.stdout + out.stderr).decode(errors="replace")


def run_program(code: str, limits: Limits | None = None) -> Result:
    """Run `code` as a program in the jail: passed when it exits 0 within the limits; output is its stdout and
    stderr (at most `limits.output_kb`)."""
    limits = limits or Limits()
    argv = [interpreter(), "-I", "-c", _source("solution_side.py"), "run"]
    with jailed(argv, limits) as (proc, _):
        out = collect([(proc, code.encode())], limits, time.monotonic() + limits.wall_s)[0]
    ok = out.returncode == 0 and not out.killed
    return Result(ok, "passed" if ok else _why(out, limits), _text(out))


def run(code: str, tests: str, limits: Limits | None = None) -> Result:
    """Run `code`, then `tests` (plain asserts, in their own jail) against it; passed only when the tests process
    ran every statement and said so within the limits."""
    limits = limits or Limits()
    py = interpreter()
    requests, replies, verdict = os.pipe(), os.pipe(), os.pipe()
    ends = [*requests, *replies, *verdict]
    try:
        solution_argv = [py, "-I", "-c", _source("solution_side.py"), "serve", str(requests[0]), str(replies[1])]
        tests_argv = [py, "-I", "-c", _source("tests_side.py"), str(replies[0]), str(requests[1]), str(verdict[1])]
        deadline = time.monotonic() + limits.wall_s
        with (
            jailed(solution_argv, limits, (requests[0], replies[1])) as (solution, _),
            jailed(tests_argv, limits, (replies[0], requests[1], verdict[1])) as (tester, _),
        ):
            for fd in (*requests, *replies, verdict[1]):
                os.close(fd)
                ends.remove(fd)
            sol, tst = collect([(solution, code.encode()), (tester, tests.encode())], limits, deadline)
            said = os.read(verdict[0], 16)
    finally:
        for fd in ends:
            os.close(fd)
    output = _text(sol) + _text(tst)
    if tst.returncode == 0 and not tst.killed and said == b"passed":
        return Result(True, "passed", output)
    if sol.killed or tst.killed:
        return Result(False, sol.killed or tst.killed, output)
    if sol.returncode not in (0, None):
        return Result(False, _why(sol, limits), output)
    return Result(False, _why(tst, limits), output)

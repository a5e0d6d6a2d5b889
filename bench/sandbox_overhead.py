"""Per-call cost of running model-written code: the code_tests check (an honest `add` against two asserts) and the
python tool (`print(6 * 7)`), before (the rlimits + audit-hook sandbox of git ref `--before`, default 5502b79,
read with `git show`) and after (rlctl.sandbox: bubblewrap, two jails for code_tests). Calls interleave, so a
loaded machine shows up in both columns; `python -I -c pass` is timed alongside as the floor.

Usage: python bench/sandbox_overhead.py [--repeat 30] [--before 5502b79]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CODE, TESTS = "def add(a, b):\n    return a + b\n", "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"


def old_sandbox(ref: str):
    """The pre-bubblewrap module, loaded from git."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{ref}:rlctl/rewards/sandbox.py"], capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_sandbox.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_sandbox", path)
    module = sys.modules["old_sandbox"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--before", default="5502b79", help="git ref holding the old rlctl/rewards/sandbox.py")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from rlctl import sandbox

    old = old_sandbox(args.before)
    assert old.run(CODE, TESTS).passed and sandbox.run(CODE, TESTS).passed
    assert "42" in old.run("print(6 * 7)", "").output and sandbox.run_program("print(6 * 7)").output == "42\n"
    cases = {
        "python -I -c pass (floor)": lambda: subprocess.run([sys.executable, "-I", "-c", "pass"], check=True),
        "code_tests before": lambda: old.run(CODE, TESTS),
        "code_tests after": lambda: sandbox.run(CODE, TESTS),
        "python tool before": lambda: old.run("print(6 * 7)", ""),
        "python tool after": lambda: sandbox.run_program("print(6 * 7)"),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    load = os.getloadavg()[0]
    for _ in range(args.repeat):
        for name, fn in cases.items():
            times[name].append(ms(fn))
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}; load before {load:.1f}")
    print(f"{'case':<28} {'median ms':>10} {'p90 ms':>8} {'min ms':>8}  (n={args.repeat})")
    for name, values in times.items():
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"{name:<28} {statistics.median(values):>10.0f} {p90:>8.0f} {min(values):>8.0f}")


if __name__ == "__main__":
    main()

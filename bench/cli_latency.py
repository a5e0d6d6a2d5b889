"""CLI latency: wall time of `rlctl --help`, `rlctl plan --preset qwen7b-grpo --json`, `rlctl presets list` as a
user types them (a fresh process each time), best and median of N; target < 0.3 s. `python -c pass` is timed in the
same run, interleaved, so a loaded machine shows up in the baseline too. `--with-trl` adds `trl grpo --help` once for
comparison. Planning itself (`plan.build` in process, no CLI start-up) is timed too: target < 0.05 s.

Usage: python bench/cli_latency.py [--repeat 10] [--with-trl]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RLCTL, report

TARGET_S = 0.3
BUILD_TARGET_S = 0.05
COMMANDS = [["--help"], ["plan", "--preset", "qwen7b-grpo", "--json"], ["presets", "list"]]


def timed(argv: list[str], cwd: str) -> float:
    start = time.perf_counter()
    env = {"COLUMNS": "120", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-500:]}")
    return elapsed


def _plan_build(repeat: int) -> tuple[float, float, list[float]]:
    """CPU time of `plan.build` for qwen7b-grpo on 1xH100-80GB, in this process (config resolved once)."""
    from rlctl import config
    from rlctl.plan import planner

    cfg = config.resolve("qwen7b-grpo", None, None, "1xH100-80GB", [])
    planner.build(cfg, tempfile.gettempdir())  # the first call pays the imports
    ts = []
    for _ in range(repeat):
        start = time.process_time()
        planner.build(cfg, tempfile.gettempdir())
        ts.append(time.process_time() - start)
    return min(ts), statistics.median(ts), ts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--with-trl", action="store_true", help="also time `trl grpo --help` (slow, once)")
    opts = ap.parse_args()
    rows, results = [], []
    with tempfile.TemporaryDirectory() as cwd:  # no rlctl.yaml in the way
        timed([RLCTL, "--help"], cwd)  # warm the page cache
        argvs = [[sys.executable, "-c", "pass"]] + [[RLCTL, *args] for args in COMMANDS]
        times: list[list[float]] = [[] for _ in argvs]
        for _ in range(opts.repeat):  # interleaved: a load spike hits every command alike
            for i, argv in enumerate(argvs):
                times[i].append(timed(argv, cwd))
        for argv, ts in zip(argvs, times, strict=True):
            name = "python -c pass" if argv[0] == sys.executable else f"rlctl {' '.join(argv[1:])}"
            best, median = min(ts), statistics.median(ts)
            ok = "-" if argv[0] == sys.executable else "yes" if median < TARGET_S else "NO"
            rows.append([name, best, median, max(ts), ok])
            results.append({"command": name, "best_s": best, "median_s": median, "times_s": ts})
        best, median, ts = _plan_build(opts.repeat)
        ok = "yes" if median < BUILD_TARGET_S else "NO"
        rows.append([f"plan.build in process (target {BUILD_TARGET_S} s)", best, median, max(ts), ok])
        results.append({"command": "plan.build", "best_s": best, "median_s": median, "times_s": ts})
        trl = shutil.which("trl", path=str(Path(sys.executable).parent))
        if opts.with_trl and trl:
            t = timed([trl, "grpo", "--help"], cwd)
            rows.append(["trl grpo --help (once)", t, t, t, "-"])
            results.append({"command": "trl grpo --help", "best_s": t, "median_s": t, "times_s": [t]})
    report(
        "cli_latency",
        f"CLI latency, fresh process, {opts.repeat} runs each (target < {TARGET_S} s)",
        ["command", "best s", "median s", "max s", f"median < {TARGET_S} s"],
        rows,
        {"target_s": TARGET_S, "repeat": opts.repeat, "results": results},
    )


if __name__ == "__main__":
    main()

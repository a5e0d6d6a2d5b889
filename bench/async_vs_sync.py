"""Async RL against the synchronous loop on the tiny demo: rl's wall time per step and held-out accuracy.

Both runs are `rlctl train --preset tiny-demo` in rlctl's loop with the same seed and prompts: synchronous with
torch on every core (OMP_NUM_THREADS = cores), async with the plan's split (generator and trainer one core each
on 2 cores). Per step is the median gap between consecutive rl step records (the first step, which starts the
generator process, is reported apart).

Usage: python bench/async_vs_sync.py [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RLCTL, report


def _run(tmp: Path, name: str, sets: list[str], threads: int) -> dict:
    run = tmp / name
    argv = [RLCTL, "-q", "train", "--preset", "tiny-demo", "--run-dir", str(run)]
    for s in sets:
        argv += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if r.get("stage") == "rl" and "loss" in r]
    rl_start = next(r["time"] for r in records if r.get("stage") == "rl" and r.get("event") == "start")
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(steps)]
    summary = json.loads((run / "summary.json").read_text())["stages"]
    return {
        "wall_s": time.time() - start,
        "first_step_s": steps[0]["time"] - rl_start,
        "s_per_step": statistics.median(gaps),
        "rl_eval_accuracy": summary["rl"]["eval_accuracy"],
        "staleness_mean": statistics.mean(r.get("staleness_mean", 0.0) for r in steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", action="append", default=[], dest="sets")
    opts = ap.parse_args()
    cores = os.cpu_count() or 2
    with tempfile.TemporaryDirectory() as tmp:
        sync = _run(Path(tmp), "sync", opts.sets, cores)
        asyn = _run(Path(tmp), "async", [*opts.sets, "rl.async_rollout.enabled=true"], cores)
    rows = [
        [name, r["s_per_step"], r["first_step_s"], r["rl_eval_accuracy"], r["staleness_mean"], r["wall_s"]]
        for name, r in (("synchronous", sync), ("async (max_staleness 1)", asyn))
    ]
    rows.append(["async / sync", asyn["s_per_step"] / sync["s_per_step"], "", "", "", ""])
    report(
        "async_vs_sync",
        f"tiny demo rl in rlctl's loop, synchronous ({cores} threads) vs async (the plan's split)",
        ["loop", "s/step (median)", "first step s", "held-out rl accuracy", "staleness", "wall s"],
        rows,
        {"sets": opts.sets, "cores": cores, "sync": sync, "async": asyn},
    )


if __name__ == "__main__":
    main()

"""The tiny demo end to end (`rlctl train --preset tiny-demo`), with per-stage times from metrics.jsonl.

Usage: python bench/tiny_demo.py [--set KEY=VALUE ...]   (e.g. --set sft.max_steps=100 for a shorter run)
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RLCTL, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", action="append", default=[], dest="sets")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        argv = [RLCTL, "-q", "train", "--preset", "tiny-demo", "--run-dir", str(run)]
        for s in opts.sets:
            argv += ["--set", s]
        start = time.time()
        proc = subprocess.run(argv, capture_output=True, text=True)
        wall = time.time() - start
        if proc.returncode != 0:
            raise SystemExit(f"tiny demo failed ({proc.returncode}): {proc.stderr[-2000:]}")
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        summary = json.loads((run / "summary.json").read_text())
    rows, stages = [], {}
    first_time = min(r["time"] for r in records)
    for stage in summary["completed"]:
        mine = [r for r in records if r.get("stage") == stage]
        t0 = next(r["time"] for r in mine if r.get("event") == "start")
        t1 = next(r["time"] for r in mine if r.get("event") == "end")
        steps = [r for r in mine if "step" in r and "event" not in r]  # a step's metrics (not its memory record)
        step_times = [b["time"] - a["time"] for a, b in itertools.pairwise(steps)]
        per_step = sum(step_times) / len(step_times) if step_times else float("nan")
        metrics = summary["stages"].get(stage, {})
        stages[stage] = {"seconds": t1 - t0, "steps": len(steps), "s_per_step": per_step, "eval": metrics}
        shown = ", ".join(f"{k} {v:.3f}" for k, v in metrics.items())
        rows.append([stage, t1 - t0, len(steps), per_step, shown])
    setup = first_time - start
    rows.append(["start-up + base model + base eval", setup, "", "", ""])
    rows.append(["total (wall, CLI start to exit)", wall, "", "", ""])
    report(
        "tiny_demo",
        "Tiny demo end to end (rlctl train --preset tiny-demo), per stage",
        ["stage", "seconds", "steps", "s/step", "held-out eval after the stage"],
        rows,
        {"sets": opts.sets, "wall_s": wall, "startup_s": setup, "stages": stages},
    )


if __name__ == "__main__":
    main()

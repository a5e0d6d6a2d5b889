"""The planner's sharding arithmetic against measured memory, without GPUs: rlctl's RL loop on 2 CPU processes
(gloo), once replicated (ddp) and once sharded (fsdp2), on a random-init Qwen2 model large enough for its
training state to stand out of the process's baseline (default 16 layers x 512 hidden, ~42M parameters).

For each strategy it reads the plan's per-process training-phase components (run/plan.json) and each process's
measured peak resident set of the training phase (run/rl/memory/rankN.json, the memory probe every run has), then
compares what sharding saves per process: measured (ddp peak - fsdp2 peak) against planned (the same difference of
the plan's training-phase peaks: the state / N plus the gathered units, see docs/memory-planner.md).

Usage: python bench/fsdp2_memory.py [--layers 16] [--hidden 512] [--steps 2]
Writes bench/results/fsdp2_memory.json. About 3 minutes on 2 idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from _common import RLCTL, report

# glibc hands tensors over 1 MiB back to the OS when they are freed (no dynamic threshold, no kept heap top), so the
# resident set follows the live training state, not the high-water mark of model loading before sharding
MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2**20), "MALLOC_TRIM_THRESHOLD_": str(2**20)}


def run(strategy: str, run_dir: Path, args: argparse.Namespace) -> dict:
    """Train 2 processes with `strategy`; the plan's and the measured training-phase memory per process (GiB)."""
    sets = {
        "hardware.num_processes": 2,
        "hardware.strategy": strategy,
        "model.arch.layers": args.layers,
        "model.arch.hidden": args.hidden,
        "model.arch.intermediate": args.hidden * 2,
        "model.arch.heads": args.hidden // 64,
        "model.arch.kv_heads": args.hidden // 128,
        "rl.max_steps": args.steps,
        "rl.save_every": args.steps,
        "rl.prompts_per_step": 4,
        "rl.group_size": 2,
        "rl.eval_samples": 8,
        "rl.rewards": "[{name: exact_match}]",
    }
    cmd = [RLCTL, "train", "--preset", "tiny-demo", "--stages", "rl", "--algorithm", "reinforce-pp"]
    cmd += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")] + ["--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **MALLOC})
    if proc.returncode != 0:
        raise SystemExit(f"{strategy} run failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    plan = json.loads((run_dir / "plan.json").read_text())
    training = next(p for p in plan["memory"]["phases"] if p["stage"] == "rl" and p["phase"] == "training")
    ranks = sorted((run_dir / "rl" / "memory").glob("rank*.json"))
    measured = [json.loads(f.read_text())["phases"]["training"]["rss_gib"] for f in ranks]
    params = plan["model"].get("params")
    return {"planned": training["peak_gib"], "components": training["components_gib"], "measured": measured,
            "params": params}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlctl-fsdp2-mem-") as tmp:
        found = {s: run(s, Path(tmp) / s, args) for s in ("ddp", "fsdp2")}
    rows = []
    for strategy, r in found.items():
        per_rank = ", ".join(f"{m:.3f}" for m in r["measured"])
        rows.append([strategy, r["params"], r["planned"], per_rank, max(r["measured"])])
    saved_planned = found["ddp"]["planned"] - found["fsdp2"]["planned"]
    saved_measured = max(found["ddp"]["measured"]) - max(found["fsdp2"]["measured"])
    rows.append(["saved by fsdp2", "", saved_planned, "", saved_measured])
    ratio = saved_measured / saved_planned if saved_planned else None
    rows.append(["measured / planned saving", "", "", "", ratio])
    payload = {"runs": found, "saved_gib": {"planned": saved_planned, "measured": saved_measured}, "ratio": ratio}
    report(
        "fsdp2_memory",
        f"rlctl RL loop, 2 CPU processes, {args.layers} layers x {args.hidden} hidden: training-phase memory per "
        "process (GiB; measured = peak RSS)",
        ["strategy", "parameters", "planned peak", "measured peak per rank", "measured peak (max)"],
        rows,
        payload,
    )


if __name__ == "__main__":
    main()

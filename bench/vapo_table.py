"""VAPO side by side (docs/algorithms.md, VAPO): from one SFT checkpoint, same seeds, equal RL steps, held-out
accuracy and wall time of VAPO against PPO, DAPO and GRPO, and VAPO minus each of its parts in turn.

Usage:
    python bench/vapo_table.py compare  [--recipe tiny-demo] [--seeds 42 1 2] [--steps 20]
    python bench/vapo_table.py ablation [--recipe tiny-demo] [--seeds 42 1 2] [--steps 20]
    python bench/vapo_table.py compare --recipe smollm2-grpo-cpu --seeds 42 --steps 15 \
        --vapo-set rl.critic.pretrain_steps=20 --vapo-set rl.learning_rate=6.25e-7

Each table trains its SFT model once (`rlctl train --preset RECIPE --stages sft`, or --sft RUN_DIR to reuse one),
then every RL run starts from it with the same generated data (the SFT run's data files, so a seed changes the
sampling and the prompt order, never the task) and the recipe's correctness reward only. Runs are kept under --work
(default /tmp/rlctl-vapo-bench): a finished run is read, not trained again, an interrupted one resumed, so a table
continues where it stopped and both tables share their VAPO runs. Set OMP_NUM_THREADS=1 on a shared machine. Wall
time is the RL stage's, from metrics.jsonl (start to the last step's checkpoint, the final held-out scoring
excluded); the load average before and after each run is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RLCTL, report

ALGORITHMS = ("vapo", "ppo", "dapo", "grpo")
# VAPO minus each part: the --set that switches it off (docs/algorithms.md says what each means)
ABLATIONS: dict[str, list[str]] = {
    "vapo": [],
    "- value pretraining": ["rl.critic.pretrain_steps=0"],
    "- decoupled GAE": ["rl.returns.critic_lam=null"],
    "- length-adaptive GAE": ["rl.returns.lam_alpha=null"],
    "short answers at λ=0 (AReaL, NeMo-RL)": ["rl.returns.short_lam=0"],
    "- clip-higher": ["rl.loss.clip_high=0.2"],
    "- token-level loss": ["rl.loss.agg=seq-mean-token-mean"],
    "- positive-example LM loss": ["rl.loss.lm_coef=0"],
    "- group sampling": ["rl.group_size=1", "rl.batch_size=GROUPS"],  # same rollouts per step, one per prompt
    # not one of the seven parts: the paper's 16 updates per rollout batch against one at the recipe's own rate
    "1 update per batch (recipe's rate)": ["rl.ppo_mini_batches=1", "rl.learning_rate=RECIPE_LR"],
}
# the recipe's correctness reward alone (the tiny demo's 0.1 x reward model is left out, so no rm stage is needed)
REWARDS = {"tiny-demo": "[{name: exact_match}]"}


def _filled(setting: str, values: dict[str, str]) -> str:
    """`setting` with each placeholder of `values` (GROUPS, RECIPE_LR) replaced."""
    for name, value in values.items():
        setting = setting.replace(name, value)
    return setting


def finished(run: Path, stage: str) -> bool:
    """Whether `run` completed `stage` (summary.json lists it)."""
    return (run / "summary.json").exists() and stage in json.loads((run / "summary.json").read_text())["completed"]


def rlctl_train(run: Path, args: list[str], log: Path) -> None:
    """`rlctl train ARGS --run-dir RUN`, or `rlctl resume RUN` where an interrupted run left it."""
    command = ["resume", str(run)] if (run / "config.yaml").exists() else ["train", *args, "--run-dir", str(run)]
    with log.open("a") as out:
        proc = subprocess.run([RLCTL, "-q", *command], stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"rlctl {command[0]} failed ({proc.returncode}), see {log}")


def sft_run(recipe: str, work: Path, given: str | None) -> Path:
    """The SFT run every RL run starts from (trained here once unless given)."""
    if given:
        return Path(given)
    run = work / f"{recipe}-sft"
    if not finished(run, "sft"):
        rlctl_train(run, ["--preset", recipe, "--stages", "sft"], work / f"{recipe}-sft.log")
    return run


def rl_run(recipe: str, sft: Path, run: Path, algorithm: str, seed: int, steps: int, sets: list[str]) -> dict:
    """One RL run from the SFT model; its held-out accuracy before and after, wall seconds and the load around it."""
    if not finished(run, "rl"):
        data = sft / "data"
        base = [
            f"model.name_or_path={sft / 'sft' / 'final'}",
            "data.generate=null",
            f"data.rl={data / 'rl.jsonl'}",
            f"data.eval={data / 'eval.jsonl'}",
            f"seed={seed}",
            f"rl.max_steps={steps}",
            "rl.save_every=100000",  # one checkpoint, at the end (value pretraining's steps included)
        ]
        if recipe in REWARDS:
            base.append(f"rl.rewards={REWARDS[recipe]}")
        args = ["--preset", recipe, "--algorithm", algorithm, "--stages", "rl"]
        load = os.getloadavg()[0]
        rlctl_train(run, [*args, *[x for s in [*base, *sets] for x in ("--set", s)]], run.parent / f"{run.name}.log")
        (run / "bench_load.json").write_text(json.dumps({"before": load, "after": os.getloadavg()[0]}))
    summary = json.loads((run / "summary.json").read_text())
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rl = [r for r in records if r.get("stage") == "rl"]
    start = next(r["time"] for r in rl if r.get("event") == "start")
    trained = next(r["time"] for r in rl if r.get("event") == "trained")
    pretrain = [r for r in rl if "value_pretrain_step" in r]
    return {
        "seed": seed,
        "sft": summary["stages"]["base"]["eval_accuracy"],
        "rl": summary["stages"]["rl"]["eval_accuracy"],
        "wall_s": trained - start,
        "value_pretrain_s": (pretrain[-1]["time"] - start) if pretrain else 0.0,
        "load": json.loads((run / "bench_load.json").read_text()) if (run / "bench_load.json").exists() else None,
    }


def table(name: str, opts: argparse.Namespace, variants: dict[str, tuple[str, list[str]]]) -> None:
    variants = {
        k: (a, [*opts.sets, *opts.vapo_sets, *sets] if a == "vapo" else [*opts.sets, *sets])
        for k, (a, sets) in variants.items()
    }
    work = Path(opts.work)
    work.mkdir(parents=True, exist_ok=True)
    sft = sft_run(opts.recipe, work, opts.sft)
    results: dict[str, list[dict]] = {label: [] for label in variants}
    # the ablation trains VAPO itself last: the comparison's runs, which another invocation may be training now, are
    # read, not redone
    for label in sorted(variants, key=lambda k: name == "ablation" and k == "vapo"):
        algorithm, sets = variants[label]
        slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")  # shared by both tables: a run is trained once
        for seed in opts.seeds:
            run = work / f"{opts.recipe}-{slug}-s{seed}"
            results[label].append(rl_run(opts.recipe, sft, run, algorithm, seed, opts.steps, sets))
            r = results[label][-1]
            print(f"{label} seed {seed}: {r['sft']:.3f} -> {r['rl']:.3f} in {r['wall_s']:.0f} s", flush=True)
    rows = []
    for label, runs in results.items():
        accs = [r["rl"] for r in runs]
        spread = f" ± {statistics.stdev(accs):.3f}" if len(accs) > 1 else ""
        rows.append(
            [
                label,
                f"{statistics.mean(accs):.3f}{spread}",
                " / ".join(f"{a:.3f}" for a in accs),
                f"{statistics.mean(r['sft'] for r in runs):.3f}",
                f"{statistics.mean(r['wall_s'] for r in runs):.0f}",
                f"{statistics.mean(r['value_pretrain_s'] for r in runs):.0f}",
            ]
        )
    loads = [r["load"][k] for runs in results.values() for r in runs if r["load"] for k in ("before", "after")]
    report(
        f"vapo_{name}_{opts.recipe}",
        f"VAPO {name} on {opts.recipe}: {opts.steps} RL steps from one SFT model, seeds {opts.seeds}"
        f"{', ' + ' '.join(opts.sets) if opts.sets else ''} "
        f"(load average {min(loads, default=0):.1f}-{max(loads, default=0):.1f})",
        ["run", "held-out accuracy (mean ± sd)", "per seed", "SFT start", "RL wall s", "of it value pretraining s"],
        rows,
        {
            "recipe": opts.recipe,
            "steps": opts.steps,
            "seeds": opts.seeds,
            "sets": opts.sets,
            "vapo_sets": opts.vapo_sets,
            "sft_run": str(sft),
            "results": results,
        },
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("table", choices=["compare", "ablation"])
    ap.add_argument("--recipe", default="tiny-demo")
    ap.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), help="compare: these, in this order")
    ap.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    ap.add_argument("--steps", type=int, default=20, help="RL steps of every run (VAPO's value pretraining extra)")
    ap.add_argument("--sft", help="an SFT run directory to start from (default: trained once under --work)")
    ap.add_argument("--work", default="/tmp/rlctl-vapo-bench")
    ap.add_argument("--set", action="append", default=[], dest="sets", help="KEY=VALUE for every run")
    ap.add_argument("--vapo-set", action="append", default=[], dest="vapo_sets", help="KEY=VALUE for VAPO's runs")
    ap.add_argument("--rows", nargs="+", help="ablation: only the rows whose label contains one of these words")
    opts = ap.parse_args()
    started = time.time()
    if opts.table == "compare":
        table("compare", opts, {a: (a, []) for a in opts.algorithms})
    else:
        from rlctl import config

        recipe = config.resolve(preset=opts.recipe, algorithm="vapo").rl
        own_rate = config.resolve(preset=opts.recipe).rl.learning_rate  # before its for_algorithm divides it
        fill = {"GROUPS": str(recipe.batch_size), "RECIPE_LR": str(own_rate)}
        rows = {k: v for k, v in ABLATIONS.items() if not opts.rows or k == "vapo" or any(w in k for w in opts.rows)}
        variants = {k: ("vapo", [_filled(s, fill) for s in v]) for k, v in rows.items()}
        table("ablation", opts, variants)
    print(f"{time.time() - started:.0f} s in all")


if __name__ == "__main__":
    main()

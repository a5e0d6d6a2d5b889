"""rlctl against TRL used directly: the same tiny SFT and GRPO runs through `rlctl train` and through a plain
TRL script with identical settings (the tiny model folder and data rlctl built, same seed, batch, steps,
learning rate and schedule), alternating A/B so load drift on a shared machine hits both alike.

Per-step time comes from each trainer's own per-step log timestamps (rlctl: metrics.jsonl; TRL script: a
logging callback), steps 2..N, so process start-up and model loading are excluded; the end-to-end wall time
(start-up, rlctl's base/final held-out evals included) is reported separately. Target: ratio <= 1.05 per step.

Usage: python bench/overhead_vs_trl.py [--rounds 3] [--sft-steps 40] [--grpo-steps 8]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PYTHON, RLCTL, report

TARGET = 1.05
TRL_LOSS_TYPE = {"seq-mean-token-mean": "grpo", "token-mean": "dapo", "seq-mean-token-sum-norm": "dr_grpo"}

TRL_SCRIPT = """
import json, sys, time
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

S = json.loads(sys.argv[1])
stamps = []

class Stamp(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "train_runtime" not in logs:
            stamps.append((state.global_step, time.time()))

rows = [json.loads(line) for line in open(S["data"]) if line.strip()]
tok = AutoTokenizer.from_pretrained(S["model"])
model = AutoModelForCausalLM.from_pretrained(S["model"], dtype="float32")
common = dict(output_dir=S["out"], max_steps=S["max_steps"], per_device_train_batch_size=S["micro"],
              gradient_accumulation_steps=S["accum"], learning_rate=S["lr"], lr_scheduler_type=S["scheduler"],
              warmup_steps=S["warmup"], weight_decay=S["weight_decay"], max_grad_norm=S["max_grad_norm"],
              logging_steps=1, logging_first_step=True, save_strategy="no", seed=S["seed"], data_seed=S["seed"],
              use_cpu=True, report_to="none", disable_tqdm=True, dataloader_num_workers=0)
if S["kind"] == "sft":
    from trl import SFTConfig, SFTTrainer
    args = SFTConfig(**common, max_length=S["max_length"], packing=False)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                         callbacks=[Stamp()])
else:
    from trl import GRPOConfig, GRPOTrainer

    def exact_match(prompts, completions, answer, **kw):
        return [float(c.strip() == a.strip()) for c, a in zip(completions, answer)]

    args = GRPOConfig(**common, num_generations=S["group"], max_completion_length=S["max_new_tokens"],
                      temperature=S["temperature"], beta=S["beta"], epsilon=S["clip_low"],
                      epsilon_high=S["clip_high"], mask_truncated_completions=S["mask_truncated"],
                      steps_per_generation=S["steps_per_generation"], num_iterations=S["num_iterations"],
                      loss_type=S["loss_type"], scale_rewards=S["scale_rewards"],
                      importance_sampling_level=S["importance_sampling_level"])
    trainer = GRPOTrainer(model=model, reward_funcs=[exact_match], args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[Stamp()])
trainer.train()
json.dump(stamps, open(S["stamps"], "w"))
"""


def step_time(stamps: list[tuple[int, float]]) -> float:
    """Median seconds per optimizer step over steps 2..N (the first step carries warm-up)."""
    stamps = sorted(stamps)
    diffs = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in itertools.pairwise(stamps) if s1 > s0]
    return statistics.median(diffs)


def rlctl_args(kind: str, steps: int) -> list[str]:
    if kind == "sft":
        return ["--stages", "sft", "--set", f"sft.max_steps={steps}", "--set", "sft.save_every=100000"]
    return [
        "--stages", "rl", "--set", "rl.rewards=[{name: exact_match}]", "--set", f"rl.max_steps={steps}",
        "--set", "rl.save_every=100000",
    ]  # fmt: skip


def run_rlctl(kind: str, steps: int, tmp: Path, i: int) -> tuple[float, float, Path]:
    run = tmp / f"rlctl-{kind}-{i}"
    argv = [RLCTL, "-q", "train", "--preset", "tiny-demo", "--run-dir", str(run), "--set", "rl.eval_samples=16"]
    start = time.time()
    proc = subprocess.run([*argv, *rlctl_args(kind, steps)], capture_output=True, text=True)
    wall = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"rlctl {kind} failed: {proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    stamps = [(r["step"], r["time"]) for r in records if "step" in r and r.get("stage") in (kind, "rl")]
    return step_time(stamps), wall, run


def trl_settings(kind: str, run: Path, out: Path) -> dict:
    """The plain script's settings, read from the rlctl run's resolved config and plan (same numbers)."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    plan = json.loads((run / "plan.json").read_text())
    stage = plan["stages"][0]
    sc = cfg["sft" if kind == "sft" else "rl"]
    s = {
        "kind": kind,
        "model": str(run / "base"),
        "data": str(run / "data" / ("sft.jsonl" if kind == "sft" else "rl.jsonl")),
        "out": str(out),
        "stamps": str(out / "stamps.json"),
        "micro": stage["micro_batch_size"],
        "accum": stage["grad_accum"],
        "max_steps": stage["max_steps"],
        "lr": sc["learning_rate"],
        "scheduler": sc["lr_scheduler"],
        "warmup": sc["warmup_ratio"],
        "weight_decay": sc["weight_decay"],
        "max_grad_norm": sc["max_grad_norm"],
        "seed": cfg["seed"],
        "max_length": sc.get("max_length"),
    }
    if kind == "grpo":  # rlctl.stages.rl.trl_batching with ppo_mini_batches = ppo_epochs = 1 (the grpo preset)
        assert sc["ppo_mini_batches"] == 1 and sc["ppo_epochs"] == 1, "bench assumes one update per rollout batch"
        per_proc = stage["micro_batch_size"] * stage["grad_accum"]
        s |= {
            "micro": stage["micro_batch_size"],
            "accum": stage["grad_accum"],
            "steps_per_generation": per_proc // stage["micro_batch_size"],
            "num_iterations": 1,
            "group": sc["group_size"],
            "max_new_tokens": sc["max_new_tokens"],
            "temperature": sc["temperature"],
            "beta": sc["beta"],
            "clip_low": sc["clip_low"],
            "clip_high": sc["clip_high"],
            "mask_truncated": sc["mask_truncated"],
            "loss_type": "cispo" if sc["policy_loss"] == "cispo" else TRL_LOSS_TYPE[sc["loss_agg"]],
            "scale_rewards": "group" if sc["advantage"] == "grpo" else "none",
            "importance_sampling_level": "sequence" if sc["policy_loss"] == "gspo" else "token",
        }
    return s


def run_trl(settings: dict, script: Path) -> tuple[float, float]:
    Path(settings["out"]).mkdir(parents=True, exist_ok=True)
    start = time.time()
    proc = subprocess.run([PYTHON, str(script), json.dumps(settings)], capture_output=True, text=True)
    wall = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"TRL {settings['kind']} failed: {proc.stderr[-2000:]}")
    return step_time(json.loads(Path(settings["stamps"]).read_text())), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sft-steps", type=int, default=40)
    ap.add_argument("--grpo-steps", type=int, default=8)
    opts = ap.parse_args()
    rows, payload = [], {"target_ratio": TARGET, "rounds": opts.rounds, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "plain_trl.py"
        script.write_text(TRL_SCRIPT)
        for kind, steps in (("sft", opts.sft_steps), ("grpo", opts.grpo_steps)):
            runs = []
            for i in range(opts.rounds):
                order = ("rlctl", "trl") if i % 2 == 0 else ("trl", "rlctl")  # ABBA: drift cancels
                got: dict = {}
                for who in order:
                    if who == "rlctl":
                        got["rlctl_step"], got["rlctl_wall"], run = run_rlctl(kind, steps, tmp, i)
                        got["settings"] = trl_settings(kind, run, tmp / f"trl-{kind}-{i}")
                    else:
                        ref = _reference(kind, steps, tmp)
                        settings = got.get("settings") or trl_settings(kind, ref, tmp / f"trl-{kind}-{i}")
                        got["trl_step"], got["trl_wall"] = run_trl(settings, script)
                got["ratio"] = got["rlctl_step"] / got["trl_step"]
                runs.append(got)
                print(f"{kind} round {i + 1}: rlctl {got['rlctl_step']:.4f} s/step, TRL {got['trl_step']:.4f} s/step, "
                      f"ratio {got['ratio']:.3f}", flush=True)  # fmt: skip
            rs = [r["ratio"] for r in runs]
            med = statistics.median(rs)
            rows.append([
                kind, steps, statistics.median(r["rlctl_step"] for r in runs),
                statistics.median(r["trl_step"] for r in runs), med, f"{min(rs):.3f}-{max(rs):.3f}",
                statistics.median(r["rlctl_wall"] for r in runs), statistics.median(r["trl_wall"] for r in runs),
                "yes" if med <= TARGET else "NO",
            ])  # fmt: skip
            payload["runs"][kind] = {"steps": steps, "median_ratio": med, "rounds": runs}
    report(
        "overhead_vs_trl",
        f"rlctl vs plain TRL, tiny model on CPU, {opts.rounds} alternating rounds (target ratio <= {TARGET})",
        ["run", "steps", "rlctl s/step", "TRL s/step", "ratio", "ratio range", "rlctl wall s", "TRL wall s",
         f"<= {TARGET}"],
        rows,
        payload,
    )  # fmt: skip


_REFERENCE: dict = {}


def _reference(kind: str, steps: int, tmp: Path) -> Path:
    """A run directory prepared by rlctl (tiny model folder + data) for a TRL run that goes first in its round."""
    if kind not in _REFERENCE:
        run = tmp / f"ref-{kind}"
        proc = subprocess.run(
            [RLCTL, "-q", "train", "--preset", "tiny-demo", "--run-dir", str(run), "--set", "rl.eval_samples=16",
             *rlctl_args(kind, 1)],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"preparing the tiny model failed: {proc.stderr[-2000:]}")
        plan = json.loads((run / "plan.json").read_text())
        plan["stages"][0]["max_steps"] = steps
        (run / "plan.json").write_text(json.dumps(plan))
        _REFERENCE[kind] = run
    return _REFERENCE[kind]


if __name__ == "__main__":
    main()

"""rlctl against TRL used directly: the same tiny SFT and GRPO runs through `rlctl train` and through a plain
TRL script with identical settings (the tiny model folder and data rlctl built, same seed, batch, steps,
learning rate and schedule), alternating A/B so load drift on a shared machine hits both alike.

Identical means every TrainingArguments field, defaults included: TRL's SFTConfig and GRPOConfig default to
bf16=True and gradient_checkpointing=True, while rlctl's CPU plan trains in fp32 without checkpointing; a script
that leaves them out runs bf16 autocast and recomputes activations on CPU, several times slower per step. So
before measuring, the bench diffs the config rlctl built (training_args.bin of a 1-step run's checkpoint) against
the plain script's, field by field, and stops on any difference but the checkpoint schedule and output folder.
The plain script also gets the torch thread count rlctl gives its trainer (OMP_NUM_THREADS).

Per-step time comes from each trainer's own per-step log timestamps (rlctl: metrics.jsonl; TRL script: a
logging callback), steps 2..N, so process start-up and model loading are excluded; the end-to-end wall time
(start-up, rlctl's base/final held-out evals included) is reported separately. Target: ratio <= 1.05 per step.
Beside wall time, the bench samples the CPU seconds of every process in each side's tree (every 50 ms) and
reports CPU per step over the same steps: the trainer's, and for rlctl also its other processes' (the CLI
tailing metrics.jsonl into the progress display and TensorBoard, accelerate's launcher). CPU time barely moves
with other load on a shared machine, so the CPU ratio is the steadier estimate of the work rlctl adds.

Usage: python bench/overhead_vs_trl.py [--rounds 3] [--sft-steps 40] [--grpo-steps 8]
       [--preset tiny-demo] [--set key=value ...] [--kinds sft,grpo]
A real model: --preset smollm2-grpo-cpu --kinds grpo (the plain script loads the same converted folder and data;
its reward reads a chat completion's text as rlctl's does)
On a shared machine, OMP_NUM_THREADS=1 (both sides honour it) keeps other processes from stalling torch's
thread barriers, which otherwise costs seconds per step at random on 2 cores.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PYTHON, RLCTL, report

TARGET = 1.05
TRL_LOSS_TYPE = {"seq-mean-token-mean": "grpo", "token-mean": "dapo", "seq-mean-token-sum-norm": "dr_grpo"}
# TrainingArguments fields allowed to differ: rlctl's side checkpoints only after the measured steps.
NOT_COMPARED = {"output_dir", "save_strategy", "save_steps", "save_total_limit"}

TRL_SCRIPT = """
import json, sys, time
import torch
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
if tok.pad_token is None:
    tok.pad_token = tok.eos_token
model = AutoModelForCausalLM.from_pretrained(S["model"], dtype=S["dtype"])
common = dict(output_dir=S["out"], max_steps=S["max_steps"], per_device_train_batch_size=S["micro"],
              gradient_accumulation_steps=S["accum"], learning_rate=S["lr"], lr_scheduler_type=S["scheduler"],
              warmup_steps=S["warmup"], weight_decay=S["weight_decay"], max_grad_norm=S["max_grad_norm"],
              logging_steps=1, logging_first_step=True, save_strategy="no", seed=S["seed"], data_seed=S["seed"],
              bf16=S["bf16"], gradient_checkpointing=S["gradient_checkpointing"], use_cpu=True, report_to="none",
              disable_tqdm=True, dataloader_num_workers=0)
if S["kind"] == "sft":
    from trl import SFTConfig, SFTTrainer
    args = SFTConfig(**common, max_length=S["max_length"], packing=False)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                         callbacks=[Stamp()])
else:
    from trl import GRPOConfig, GRPOTrainer

    def exact_match(prompts, completions, answer, **kw):
        text = [c[-1]["content"] if isinstance(c, list) else c for c in completions]  # chat: the reply's text
        return [float(c.strip() == a.strip()) for c, a in zip(text, answer)]

    args = GRPOConfig(**common, num_generations=S["group"], max_completion_length=S["max_new_tokens"],
                      temperature=S["temperature"], beta=S["beta"], epsilon=S["clip_low"],
                      epsilon_high=S["clip_high"], mask_truncated_completions=S["mask_truncated"],
                      reward_weights=[1.0], steps_per_generation=S["steps_per_generation"],
                      num_iterations=S["num_iterations"], loss_type=S["loss_type"],
                      scale_rewards=S["scale_rewards"], importance_sampling_level=S["importance_sampling_level"])
    trainer = GRPOTrainer(model=model, reward_funcs=[exact_match], args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[Stamp()])
json.dump({"args": trainer.args.to_dict(), "torch_threads": torch.get_num_threads()}, open(S["args"], "w"),
          default=str)
if not S.get("args_only"):
    trainer.train()
    json.dump(stamps, open(S["stamps"], "w"))
"""


SAMPLE_EVERY_S = 0.05


@dataclass
class Measured:
    """One side of one round: per step over steps 2..N, and the whole command."""

    step_s: float  # median wall seconds per step
    cpu_step_s: float  # the trainer process's CPU seconds per step (mean over the same steps)
    side_cpu_step_s: float  # CPU seconds per step of the other processes in the tree (rlctl's CLI, accelerate)
    wall_s: float  # the command, start to exit


def step_time(stamps: list[tuple[int, float]]) -> float:
    """Median seconds per optimizer step over steps 2..N (the first step carries warm-up)."""
    stamps = sorted(stamps)
    diffs = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in itertools.pairwise(stamps) if s1 > s0]
    return statistics.median(diffs)


def run_sampled(
    argv: list[str], log: Path, trainer_module: str | None, env: dict | None = None
) -> tuple[float, list[tuple[float, float, float]]]:
    """Run `argv` (output to `log`), sampling (time, trainer CPU s, other CPU s) of its process tree; the trainer
    is the process running `python -m trainer_module` (None: the started process itself)."""
    samples: list[tuple[float, float, float]] = []
    start = time.time()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        root = psutil.Process(proc.pid)
        tree: list[tuple[psutil.Process, bool]] = []
        last_scan = 0.0
        while proc.poll() is None:
            now = time.time()
            if now - last_scan > 1.0:  # processes appear at start-up only; rescanning costs CPU
                tree, last_scan = _tree(root, trainer_module), now
            cpu = [0.0, 0.0]  # trainer, others
            for p, is_trainer in tree:
                try:
                    t = p.cpu_times()
                except psutil.Error:
                    continue
                cpu[0 if is_trainer else 1] += t.user + t.system
            samples.append((now, cpu[0], cpu[1]))
            time.sleep(SAMPLE_EVERY_S)
    wall = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)[:200]} failed: {log.read_text(errors='replace')[-2000:]}")
    return wall, samples


def _tree(root: psutil.Process, trainer_module: str | None) -> list[tuple[psutil.Process, bool]]:
    """The processes under `root` (itself included), each with whether it is the trainer (accelerate's launcher
    names the module too, after its own)."""
    if trainer_module is None:
        return [(root, True)]
    found = []
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    for p in procs:
        try:
            found.append((p, p.cmdline()[1:3] == ["-m", trainer_module]))
        except psutil.Error:
            continue
    return found


def measure(stamps: list[tuple[int, float]], samples: list[tuple[float, float, float]], wall: float) -> Measured:
    """Wall and CPU per step between the first and the last logged step (CPU interpolated at those moments)."""
    stamps = sorted(stamps)
    (s0, t0), (s1, t1) = stamps[0], stamps[-1]
    times = [t for t, _, _ in samples]

    def cpu_at(t: float) -> tuple[float, float]:
        i = min(max(bisect.bisect_left(times, t), 1), len(samples) - 1)
        (ta, ca, oa), (tb, cb, ob) = samples[i - 1], samples[i]
        f = (t - ta) / (tb - ta) if tb > ta else 0.0
        return ca + f * (cb - ca), oa + f * (ob - oa)

    (c0, o0), (c1, o1) = cpu_at(t0), cpu_at(t1)
    return Measured(step_time(stamps), (c1 - c0) / (s1 - s0), (o1 - o0) / (s1 - s0), wall)


def rlctl_args(kind: str, steps: int, save_every: int = 100000) -> list[str]:
    """`rlctl train` arguments for one stage; the default save_every keeps checkpoints out of the measured steps."""
    if kind == "sft":
        return ["--stages", "sft", "--set", f"sft.max_steps={steps}", "--set", f"sft.save_every={save_every}"]
    return [
        "--stages", "rl", "--set", "rl.rewards=[{name: exact_match}]", "--set", f"rl.max_steps={steps}",
        "--set", f"rl.save_every={save_every}",
    ]  # fmt: skip


def rlctl_train(run: Path, extra: list[str], preset: list[str]) -> tuple[float, list]:
    """`rlctl train` of the bench's preset (the tiny demo unless --preset) into `run`; returns the wall time and
    the CPU samples. `preset`: the preset's name, then key=value overrides."""
    argv = [RLCTL, "-q", "train", "--preset", preset[0], "--run-dir", str(run), "--set", "rl.eval_samples=16"]
    argv += [arg for kv in preset[1:] for arg in ("--set", kv)]
    return run_sampled([*argv, *extra], run.with_name(run.name + ".log"), "rlctl.launch.runner")


def run_rlctl(kind: str, steps: int, tmp: Path, i: int, preset: list[str]) -> Measured:
    """One measured `rlctl train` of the stage (no checkpoint before its last step)."""
    run = tmp / f"rlctl-{kind}-{i}"
    wall, samples = rlctl_train(run, rlctl_args(kind, steps), preset)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    stage = "sft" if kind == "sft" else "rl"
    # training records only: a checkpoint record (the save at the last step, scored for keep_best) carries a step
    stamps = [(r["step"], r["time"]) for r in records if "step" in r and "event" not in r and r["stage"] == stage]
    return measure(stamps, samples, wall)


def _model_folder(run: Path, cfg: dict, plan: dict) -> str:
    """What the plain script loads: the run's built base model, the folder a GGUF was converted into, or the name."""
    if (run / "base").exists():
        return str(run / "base")
    imported = plan.get("model_import")
    return imported["folder"] if imported else cfg["model"]["name_or_path"]


def trl_settings(kind: str, run: Path, out: Path, steps: int) -> dict:
    """The plain script's settings, read from an rlctl run's resolved config and plan (same numbers)."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    plan = json.loads((run / "plan.json").read_text())
    stage = plan["stages"][0]
    sc = cfg["sft" if kind == "sft" else "rl"]
    assert cfg["model"]["dtype"] != "auto", "bench assumes the preset names the model dtype (tiny: float32)"
    s = {
        "kind": kind,
        "model": _model_folder(run, cfg, plan),
        "data": str(run / "data" / ("sft.jsonl" if kind == "sft" else "rl.jsonl")),
        "out": str(out),
        "stamps": str(out / "stamps.json"),
        "args": str(out / "args.json"),
        "dtype": cfg["model"]["dtype"],
        "bf16": plan["mixed_precision"] == "bf16",
        "gradient_checkpointing": plan["gradient_checkpointing"],
        "threads": os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // plan["num_processes"])),
        "micro": stage["micro_batch_size"],
        "accum": stage["grad_accum"],
        "max_steps": steps,
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
        s |= {
            "steps_per_generation": stage["grad_accum"],
            "num_iterations": 1,
            "group": sc["group_size"],
            "max_new_tokens": sc["max_new_tokens"],
            "temperature": sc["temperature"],
            "beta": sc["beta"],
            "clip_low": sc["loss"]["clip_low"],
            "clip_high": sc["loss"]["clip_high"],
            "mask_truncated": sc["filters"]["mask_truncated"],
            "loss_type": "cispo" if sc["loss"]["policy"] == "cispo" else TRL_LOSS_TYPE[sc["loss"]["agg"]],
            "scale_rewards": "group" if sc["advantage"] == "grpo" else "none",
            "importance_sampling_level": "sequence" if sc["loss"]["policy"] == "gspo" else "token",
        }
    return s


def run_trl(settings: dict, script: Path) -> Measured | None:
    """The plain TRL script with rlctl's launcher environment (threads); None when it only wrote its config."""
    out = Path(settings["out"])
    out.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"OMP_NUM_THREADS": settings["threads"], "TOKENIZERS_PARALLELISM": "false"}
    argv = [PYTHON, str(script), json.dumps(settings)]
    wall, samples = run_sampled(argv, out / "plain_trl.log", None, env)
    if settings.get("args_only"):
        return None
    return measure(json.loads(Path(settings["stamps"]).read_text()), samples, wall)


def check_same_settings(kind: str, tmp: Path, script: Path, preset: list[str]) -> tuple[Path, int]:
    """A 1-step rlctl run that saves its checkpoint, diffed field by field against the plain script's config;
    returns the run (its model folder and data serve every TRL run) and the plain script's torch thread count."""
    import torch

    ref = tmp / f"ref-{kind}"
    rlctl_train(ref, rlctl_args(kind, 1, save_every=1), preset)
    saved = next((ref / ("sft" if kind == "sft" else "rl")).rglob("checkpoint-1/training_args.bin"))
    ours = torch.load(saved, weights_only=False)
    ours = json.loads(json.dumps(ours.to_dict(), default=str))
    settings = trl_settings(kind, ref, tmp / f"args-{kind}", 1) | {"args_only": True}
    run_trl(settings, script)
    got = json.loads(Path(settings["args"]).read_text())
    theirs = got["args"]
    fields = sorted((set(ours) | set(theirs)) - NOT_COMPARED)
    diff = {k: (ours.get(k), theirs.get(k)) for k in fields if ours.get(k) != theirs.get(k)}
    if diff:
        raise SystemExit(f"{kind}: the plain script's config differs from rlctl's (rlctl, plain): {diff}")
    skipped = ", ".join(sorted(NOT_COMPARED))
    print(f"{kind}: configs identical ({len(fields)} fields compared, not: {skipped}); plain script torch threads "
          f"{got['torch_threads']}", flush=True)  # fmt: skip
    return ref, got["torch_threads"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sft-steps", type=int, default=40)
    ap.add_argument("--grpo-steps", type=int, default=8)
    ap.add_argument("--preset", default="tiny-demo", help="The rlctl preset both sides run (model, data, settings).")
    ap.add_argument("--set", action="append", default=[], help="rlctl --set key=value for both sides (repeatable).")
    ap.add_argument("--kinds", default="sft,grpo", help="Which runs to compare: sft, grpo or both.")
    opts = ap.parse_args()
    preset = [opts.preset, *opts.set]
    threads = os.environ.get("OMP_NUM_THREADS", "rlctl's default (CPU cores / processes)")
    rows, payload = [], {"target_ratio": TARGET, "rounds": opts.rounds, "omp_num_threads": threads, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "plain_trl.py"
        script.write_text(TRL_SCRIPT)
        kinds = opts.kinds.split(",")
        for kind, steps in (k for k in (("sft", opts.sft_steps), ("grpo", opts.grpo_steps)) if k[0] in kinds):
            ref, torch_threads = check_same_settings(kind, tmp, script, preset)
            runs = []
            for i in range(opts.rounds):
                order = ("rlctl", "trl") if i % 2 == 0 else ("trl", "rlctl")  # ABBA: drift cancels
                got: dict = {"order": "/".join(order), "load_avg_1m": round(os.getloadavg()[0], 2)}
                for who in order:
                    if who == "rlctl":
                        got["rlctl"] = asdict(run_rlctl(kind, steps, tmp, i, preset))
                    else:
                        settings = trl_settings(kind, ref, tmp / f"trl-{kind}-{i}", steps)
                        got["trl"] = asdict(run_trl(settings, script))
                a, b = got["rlctl"], got["trl"]
                got["ratio"] = a["step_s"] / b["step_s"]
                got["cpu_ratio"] = (a["cpu_step_s"] + a["side_cpu_step_s"]) / b["cpu_step_s"]
                runs.append(got)
                print(f"{kind} round {i + 1} ({got['order']}, load {got['load_avg_1m']}): rlctl {a['step_s']:.4f} "
                      f"s/step, TRL {b['step_s']:.4f} s/step, ratio {got['ratio']:.3f}; CPU s/step rlctl "
                      f"{a['cpu_step_s']:.4f} + {a['side_cpu_step_s']:.4f}, TRL {b['cpu_step_s']:.4f}, "
                      f"ratio {got['cpu_ratio']:.3f}", flush=True)  # fmt: skip
            rs, cs = [r["ratio"] for r in runs], [r["cpu_ratio"] for r in runs]
            med = statistics.median(rs)

            def mid(who: str, key: str, runs: list = runs) -> float:
                return statistics.median(r[who][key] for r in runs)

            rows.append([
                kind, steps, mid("rlctl", "step_s"), mid("trl", "step_s"), med, f"{min(rs):.3f}-{max(rs):.3f}",
                mid("rlctl", "cpu_step_s"), mid("rlctl", "side_cpu_step_s"), mid("trl", "cpu_step_s"),
                statistics.median(cs), f"{min(cs):.3f}-{max(cs):.3f}", mid("rlctl", "wall_s"), mid("trl", "wall_s"),
                "yes" if med <= TARGET else "NO",
            ])  # fmt: skip
            payload["runs"][kind] = {
                "steps": steps,
                "median_ratio": med,
                "median_cpu_ratio": statistics.median(cs),
                "plain_torch_threads": torch_threads,
                "rounds": runs,
            }
    report(
        "overhead_vs_trl",
        f"rlctl vs plain TRL, {opts.preset} on CPU, {opts.rounds} alternating rounds, torch threads {torch_threads} "
        f"(target ratio <= {TARGET})",
        ["run", "steps", "rlctl s/step", "TRL s/step", "ratio", "ratio range", "rlctl CPU s/step",
         "rlctl other procs CPU s/step", "TRL CPU s/step", "CPU ratio", "CPU ratio range", "rlctl wall s",
         "TRL wall s", f"ratio <= {TARGET}"],
        rows,
        payload,
    )  # fmt: skip


if __name__ == "__main__":
    main()

"""GPU RL and SFT throughput and memory (GPU machines only): random-init Qwen2.5-0.5B / 1.5B real-shape models
(shapes from presets/models/*.yaml, so no download), a few steps through `rlctl train` with `--hardware auto` in
bf16 like the GPU recipes, reported as step time and tokens/s per GPU, the generation / scoring / update split, the
training-phase MFU, the decode roofline (weights bytes / HBM bandwidth per generated token, batch 1) beside the
measured generation rate, and the plan's peak memory beside the measured one (summary.json's `memory`: per phase
`planned_peak_gib`, `measured_peak_gib`, `error_pct`).

The split comes from rlctl's RL loop, which logs each phase's seconds (`time_generate`, ...): use a loop algorithm
(`--algorithm reinforce-pp`, GRPO-like outcome advantages; or ppo, remax, dapo, pf-ppo). GRPO itself runs in TRL's
trainer, whose logs carry no per-phase times; its rows show the step time only.

Usage: python bench/gpu_grpo.py [--stage rl|sft] [--algorithm grpo] [--models qwen2.5-0.5b,qwen2.5-1.5b] [--steps 5]
[--hbm-gbs 3350] [--peak-tflops 989] (defaults: H100 SXM, bf16 dense). On a machine without an NVIDIA GPU it
says so and exits 3.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RLCTL, report

REPO = Path(__file__).resolve().parent.parent


def params(arch: dict) -> int:
    h, i, layers, v = arch["hidden"], arch["intermediate"], arch["layers"], arch["vocab"]
    kv = h // arch["heads"] * arch["kv_heads"]
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h  # q, o, k, v, MLP, norms
    return layers * per_layer + v * h * (1 if arch.get("tie_embeddings") else 2)


def build_random(arch: dict, out: Path) -> None:
    """A random-init bf16 Qwen2 folder of the real shape (the tiny run's tokenizer is copied in later: its ids
    fall inside the real vocabulary, and random weights make the timing independent of the text)."""
    code = f"""
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, AutoTokenizer
a = {arch!r}
cfg = Qwen2Config(hidden_size=a["hidden"], intermediate_size=a["intermediate"], num_hidden_layers=a["layers"],
    num_attention_heads=a["heads"], num_key_value_heads=a["kv_heads"], vocab_size=a["vocab"],
    max_position_embeddings=a["max_position"], tie_word_embeddings=a["tie_embeddings"], torch_dtype="bfloat16")
torch.manual_seed(0)
Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained({str(out)!r})
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def median(values: list) -> float:
    """The median of the numbers present (NaN when none)."""
    xs = sorted(v for v in values if isinstance(v, int | float))
    return xs[len(xs) // 2] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", default="rl", choices=["rl", "sft"], help="the stage to run (the tiny demo's data)")
    ap.add_argument("--algorithm", default="grpo", help="grpo (TRL) or a loop algorithm: reinforce-pp, ppo, ...")
    ap.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-1.5b")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--hbm-gbs", type=float, default=3350.0, help="HBM bandwidth GB/s (H100 SXM 3350)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 TFLOP/s (H100 SXM 989)")
    opts = ap.parse_args()
    if not shutil.which("nvidia-smi"):
        print("bench/gpu_grpo.py needs an NVIDIA GPU (nvidia-smi not found): not measured on this machine.")
        raise SystemExit(3)
    rows, results = [], {}
    for name in opts.models.split(","):
        arch = yaml.safe_load((REPO / "presets" / "models" / f"{name}.yaml").read_text())["model"]["arch"]
        n = params(arch)
        with tempfile.TemporaryDirectory() as tmp:
            model = Path(tmp) / "model"
            build_random(arch, model)
            # the tiny run's tokenizer is copied in so prompts tokenize; ids stay inside the real vocab
            prep = Path(tmp) / "prep"
            subprocess.run([RLCTL, "-q", "train", "--preset", "tiny-demo", "--stages", "sft", "--set",
                            "sft.max_steps=1", "--hardware", "cpu", "--run-dir", str(prep)], check=True)  # fmt: skip
            for f in (prep / "base").glob("*token*"):
                shutil.copy(f, model / f.name)
            run = Path(tmp) / "run"
            argv = [RLCTL, "-q", "train", "--preset", "tiny-demo", "--algorithm", opts.algorithm,
                    "--stages", opts.stage, "--hardware", "auto", "--set", "model.dtype=auto",  # bf16 on a GPU
                    "--set", f"model.name_or_path={model}", "--set", "rl.rewards=[{name: exact_match}]",
                    "--set", f"{opts.stage}.max_steps={opts.steps}", "--set", "rl.max_new_tokens=256",
                    "--set", f"{opts.stage}.save_every=100000", "--set", "rl.eval_samples=8",
                    "--run-dir", str(run)]  # fmt: skip
            start = time.time()
            subprocess.run(argv, check=True)
            wall = time.time() - start
            recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
            steps = [r for r in recs if r.get("stage") == opts.stage and "step" in r and "event" not in r]
            plan = json.loads((run / "plan.json").read_text())
            memory = json.loads((run / "summary.json").read_text()).get("memory", {}).get(opts.stage, {})
        gpus = max(plan["layout"]["world_size"], 1)
        step_s = median([b["time"] - a["time"] for a, b in itertools.pairwise(steps)])
        cfg = plan["config"][opts.stage]
        if opts.stage == "sft":  # every sequence up to sft.max_length tokens
            completions, length = cfg["batch_size"], float(cfg["max_length"])
        else:
            completions = cfg["prompts_per_step"] * cfg["group_size"]
            # completion tokens per step: the loop logs the mean length, TRL its completions/mean_length
            length = median([r.get("response_length", r.get("completions/mean_length")) for r in steps])
        tokens = completions * (cfg.get("max_new_tokens", 0) if length != length else length)
        tok_s_gpu = tokens / step_s / gpus
        mfu = 6 * n * tokens / step_s / gpus / (opts.peak_tflops * 1e12)  # training FLOPs only, upper bound
        roofline = opts.hbm_gbs * 1e9 / (2 * n)  # bf16 weights read once per decoded token (batch 1)
        split = {p: median([r.get(f"time_{p}") for r in steps]) for p in ("generate", "score", "update")}
        split_text = " / ".join(f"{v:.2f}" for v in split.values()) if all(v == v for v in split.values()) else "-"
        gen_rate = completions * length / split["generate"] / gpus if split["generate"] == split["generate"] else None
        peak = [memory.get("planned_peak_gib"), memory.get("measured_peak_gib"), memory.get("error_pct")]
        row = [name, f"{n / 1e9:.2f}B", gpus, step_s, tok_s_gpu, mfu, split_text, gen_rate or "-", roofline]
        rows.append(row + [v if v is not None else "-" for v in peak])
        results[name] = {"algorithm": opts.algorithm, "params": n, "gpus": gpus, "wall_s": wall, "step_s": step_s,
                         "tokens_per_step": tokens, "tokens_per_s_per_gpu": tok_s_gpu, "mfu_upper_bound": mfu,
                         "split_s": split, "generated_tok_s_per_gpu": gen_rate,
                         "decode_roofline_tok_s_batch1": roofline, "memory": memory, "steps": steps}  # fmt: skip
    report(
        "gpu_grpo",
        f"{opts.stage} ({opts.algorithm}) on GPU, random-init real-shape models",
        ["model", "params", "GPUs", "s/step", "tokens/s/GPU", "MFU (train, upper bound)", "gen/score/update s",
         "generated tok/s/GPU", "decode roofline tok/s (batch 1)", "planned peak GiB", "measured peak GiB",
         "plan error %"],
        rows,
        {"hbm_gbs": opts.hbm_gbs, "peak_tflops": opts.peak_tflops, "results": results},
    )  # fmt: skip


if __name__ == "__main__":
    main()

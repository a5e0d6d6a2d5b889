"""rlctl's vLLM engine against the raw engine it wraps (vLLM's CPU build; a CPU proxy of issue 37's GPU ratio).

One process, one engine: rlctl's colocated engine (`rlctl.rollout.vllm.colocated`, as the RL loop builds it) and
raw `LLM.generate` on that same `vllm.LLM`, the same prompt token ids and sampling (temperature 1, the same stop
ids, `ignore_eos`, max new tokens), rounds alternating so load drift on a shared machine hits every side alike:

* rlctl generate: `VLLMGenerator.generate` with the sampled tokens' log-probs (what the loop reads by default);
* raw, what rlctl needs: `LLM.generate(..., SamplingParams(logprobs=0, detokenize=False))`, and the same with
  `flat_logprobs=True` (the form rlctl asks for);
* rlctl generate, no log-probs (rl.mismatch.correction=off, sync_tolerance=0) and the bare raw engine (no
  log-probs, vLLM's defaults otherwise: detokenized).

Beside the ratios, the share of each rlctl call's seconds spent inside `LLM.generate` (measured within the same
call, so load changes cancel): 1 minus it is rlctl's own overhead.

Target: rlctl / raw (what rlctl needs) >= 0.9, as the median over rounds of each round's ratio (the two sides of a
round run back to back, so a load change on a shared machine hits both). The model is the tiny demo's SFT model
with --model (`rlctl train --preset tiny-demo --stages sft --run-dir X` makes one: X/sft/final), else a
random-init tiny Qwen2 built here.
With --loop-steps N it also runs N steps of the loop (`rlctl train --stages rl`, vLLM generating) on that model
and reports the median seconds of each phase (metrics.jsonl `time_*`); `--rounds 0 --loop-steps N` with
PYTHONPATH at another tree (e.g. `git archive` of an older commit) times that tree's loop: a before / after.

Usage: python bench/vllm_overhead.py [--model DIR] [--rounds 5] [--prompts 512] [--new-tokens 32] [--loop-steps 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PYTHON, report

TARGET = 0.9
PHASES = ("time_sync", "time_generate", "time_score", "time_prepare", "time_update")


def random_model(folder: Path) -> Path:
    """A random-init tiny Qwen2 (the tiny demo's shape) and its tokenizer, saved to `folder`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlctl.stages.tiny import train_tokenizer

    tok = train_tokenizer([f"{a} + {b} = {a + b}" for a in range(60) for b in range(60)], 512)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def settings(model: Path, args: argparse.Namespace) -> list[str]:
    """The tiny demo's RL settings on `model`, one step's rollouts = the bench's prompts, vLLM generating."""
    return [
        f"model.name_or_path={model}",
        "rl.use_vllm=true",
        f"rl.max_new_tokens={args.new_tokens}",
        f"rl.prompts_per_step={args.prompts // 8}",
        "rl.group_size=8",
        "data.max_prompt_length=32",
    ]


def engine_sides(model: Path, args: argparse.Namespace, run_dir: Path) -> dict:
    """Seconds and tokens of each side over the rounds."""
    import dataclasses

    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams

    from rlctl import config
    from rlctl.plan import planner as plan
    from rlctl.rollout import vllm

    cfg = config.resolve("tiny-demo", None, "reinforce-pp", "cpu", settings(model, args))
    the_plan = plan.build(cfg, run_dir)
    acc = Accelerator(cpu=True)
    tok = AutoTokenizer.from_pretrained(model)
    policy = AutoModelForCausalLM.from_pretrained(model)
    engine = vllm.colocated(the_plan, policy, acc, tok)
    engine.sync(policy)
    prompts = [tok(f"{i} + {i * 7 % 50} =", add_special_tokens=False)["input_ids"] for i in range(args.prompts)]
    token_prompts = [{"prompt_token_ids": p} for p in prompts]
    sampling = engine.sampling
    raw = {"temperature": 1.0, "max_tokens": args.new_tokens, "stop_token_ids": list(sampling.stops)}
    raw |= {"ignore_eos": True, "top_k": 0, "top_p": 1.0}
    needs = SamplingParams(**raw, logprobs=0, detokenize=False)
    flat = SamplingParams(**raw, logprobs=0, flat_logprobs=True, detokenize=False)
    bare = SamplingParams(**raw)

    inside: dict[str, list[float]] = {}  # per rlctl call: the seconds spent inside LLM.generate
    llm_generate = engine.llm.generate

    def rlctl_side(logprobs: bool, name: str):
        def timed(*a, **kw):
            start = time.perf_counter()
            out = llm_generate(*a, **kw)
            inside.setdefault(name, []).append(time.perf_counter() - start)
            return out

        def run() -> int:
            engine.sampling = dataclasses.replace(sampling, logprobs=logprobs)
            engine.llm.generate = timed
            try:
                return sum(map(len, engine.generate(prompts)))
            finally:
                engine.llm.generate = llm_generate

        return run

    def raw_side(params):
        def run() -> int:
            outs = engine.llm.generate(token_prompts, params, use_tqdm=False)
            return sum(len(o.outputs[0].token_ids) for o in outs)

        return run

    sides = {
        "rlctl generate (log-probs)": rlctl_side(True, "rlctl generate (log-probs)"),
        "raw: logprobs=0, detokenize=False": raw_side(needs),
        "raw: logprobs=0, flat, detokenize=False": raw_side(flat),
        "rlctl generate (no log-probs)": rlctl_side(False, "rlctl generate (no log-probs)"),
        "raw bare": raw_side(bare),
    }
    for fn in sides.values():  # warm-up: every side once
        fn()
    times: dict[str, list[float]] = {k: [] for k in sides}
    tokens: dict[str, list[int]] = {k: [] for k in sides}
    for r in range(args.rounds):
        for name in sides if r % 2 == 0 else reversed(list(sides)):
            start = time.perf_counter()
            tokens[name].append(sides[name]())
            times[name].append(time.perf_counter() - start)
    rounds = {k: v[-args.rounds :] for k, v in inside.items()}  # the warm-up's call left out
    return {"seconds": times, "tokens": tokens, "inside_llm_generate": rounds}


def paired_ratio(found: dict, ours: str, theirs: str) -> tuple[float, float, float]:
    """Tokens/s of `ours` over `theirs` per round (the two ran back to back, so a load change hits both), as the
    median, min and max over the rounds."""
    rates = {
        side: [t / s for t, s in zip(found["tokens"][side], found["seconds"][side], strict=True)]
        for side in (ours, theirs)
    }
    per_round = [a / b for a, b in zip(rates[ours], rates[theirs], strict=True)]
    return statistics.median(per_round), min(per_round), max(per_round)


def loop_split(model: Path, args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    """Median seconds of each phase over `--loop-steps` steps of the loop with vLLM generating."""
    sets = [x for s in settings(model, args) for x in ("--set", s)]
    sets += ["--set", f"rl.max_steps={args.loop_steps}", "--set", "rl.save_every=100000", "--set", "rl.eval_samples=8"]
    sets += ["--set", "rl.rewards=[{name: exact_match}]"]
    if args.loop_set:
        sets += [x for s in args.loop_set for x in ("--set", s)]
    argv = [PYTHON, "-m", "rlctl.cli", "-q", "train", "--preset", "tiny-demo", "--algorithm", "reinforce-pp"]
    argv += ["--stages", "rl", "--run-dir", str(run_dir), *sets]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ})
    if proc.returncode != 0:
        raise SystemExit(f"the loop run failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if r.get("stage") == "rl" and "step" in r and "event" not in r]
    return {k: statistics.median(s[k] for s in steps) for k in PHASES if all(k in s for s in steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a model folder (default: a random-init tiny Qwen2)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every engine side (0: the loop run only)")
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--loop-steps", type=int, default=0, help="also time N steps of the loop (0: no)")
    ap.add_argument("--loop-set", action="append", help="another --set for the loop run (repeatable)")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    with tempfile.TemporaryDirectory(prefix="rlctl-vllm-overhead-") as tmp:
        model = args.model or random_model(Path(tmp) / "model")
        found = engine_sides(model, args, Path(tmp) / "plan") if args.rounds else {}
        split = loop_split(model, args, Path(tmp) / "loop") if args.loop_steps else {}
    rows, ratio = [], None
    if args.rounds:
        med = {k: statistics.median(v) for k, v in found["seconds"].items()}
        rate = {k: statistics.median(found["tokens"][k]) / med[k] for k in med}
        names = list(med)
        rows = [[k, med[k], min(found["seconds"][k]), statistics.median(found["tokens"][k]), rate[k]] for k in names]
        pairs = [("what rlctl needs", 0, 1), ("flat log-probs", 0, 2), ("bare, no log-probs", 3, 4)]
        ratios = {what: paired_ratio(found, names[a], names[b]) for what, a, b in pairs}
        ratio = ratios["what rlctl needs"][0]
        for what, (mid, low, high) in ratios.items():
            target = f"target >= {TARGET}" if what == "what rlctl needs" else ""
            rows.append(
                [
                    f"rlctl / raw ({what}): per-round ratio, median [min, max]",
                    mid,
                    f"[{low:.3g}, {high:.3g}]",
                    "",
                    target,
                ]
            )
        for side, inner in found["inside_llm_generate"].items():
            share = [i / t for i, t in zip(inner, found["seconds"][side], strict=True)]
            rows.append([f"{side}: share of its time inside LLM.generate", statistics.median(share), "", "", ""])
    rows += [[f"loop {k} (median s/step)", v, "", "", ""] for k, v in split.items()]
    report(
        "vllm_overhead",
        f"vLLM CPU build: rlctl's engine vs raw LLM.generate, {args.prompts} prompts x {args.new_tokens} new tokens",
        ["side", "median s", "best s", "tokens", "tokens/s"],
        rows,
        {"args": {k: str(v) for k, v in vars(args).items()}, **found, "ratio": ratio, "target": TARGET}
        | {"loop_split": split},
    )


if __name__ == "__main__":
    main()

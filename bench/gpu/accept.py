"""The hybrid engine's acceptance numbers in one run (< 9 minutes on an H100): a random-init real-shape model
(Qwen2.5-0.5B by default; shapes from presets/models, nothing downloaded) in rlctl's colocated vLLM engine next to
the policy in training, measured in one process:

* sleep and wake seconds per phase switch (level-2 sleep, wake weights, wake KV cache), 3 rounds;
* weight sync: seconds per push of the policy into vLLM, and the weight-sync check (trainer vs vLLM log-probs of
  the tokens vLLM sampled; greedy completions of vLLM vs transformers with the same weights);
* generated tokens/s of rlctl's engine against raw `LLM.generate` on the same `vllm.LLM`, prompts and sampling,
  with the sampled tokens' log-probs and without (the ratios rlctl / raw), and against transformers `generate`
  (rlctl's HFGenerator) at the same batch (the first --hf-rollouts prompts, one batch each);
* GPU memory per phase (torch allocator peaks, and nvidia-smi's used memory) beside the plan's phases;
* the step-time split (sync / generate / score / prepare / update) of a few steps of `rlctl train` with the loop;
* with 2+ GPUs, the same steps with `rl.async_rollout` (the generator on GPUs of its own): seconds per step
  against the synchronous run's, and the staleness;
* with --flagship, `rlctl train --preset qwen7b-grpo` for 2 steps on a random-init Qwen2.5-7B shape built on the
  GPU in bf16 (16 prompts x 8 x 256 new tokens by default, planned as set): exit code, seconds per phase and
  memory per phase against the plan.

Writes bench/results/gpu_accept.json and bench/results/gpu_accept.md. Runs on CPU too (vLLM's CPU build, the tiny
demo's model via --model): sleep mode does not exist there and memory is the process's, which is how the script
itself is tested. Usage: bash bench/gpu/accept.sh [--model DIR] [--rollouts 256] [--new-tokens 256] [--flagship]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
BENCH = Path(__file__).resolve().parent.parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
from _common import PYTHON, RESULTS, machine  # noqa: E402


def build_model(shape: str, out: Path) -> Path:
    """A random-init bf16 Qwen2 folder of a preset's real shape, with a small locally trained tokenizer (its ids
    fall inside the real vocabulary; random weights make the timings independent of the text)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlctl.stages.tiny import train_tokenizer

    a = yaml.safe_load((REPO / "presets" / "models" / f"{shape}.yaml").read_text())["model"]["arch"]
    tok = train_tokenizer([f"{x} + {y} = {x + y}" for x in range(100) for y in range(100)], 1024)
    cfg = Qwen2Config(
        hidden_size=a["hidden"],
        intermediate_size=a["intermediate"],
        num_hidden_layers=a["layers"],
        num_attention_heads=a["heads"],
        num_key_value_heads=a["kv_heads"],
        vocab_size=a["vocab"],
        max_position_embeddings=a["max_position"],
        tie_word_embeddings=a["tie_embeddings"],
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):  # a 7B shape is initialised on the GPU in bf16 (on CPU in fp32 it takes minutes)
        model = Qwen2ForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


class Memory:
    """Peak memory per phase: torch's allocator on a GPU (reset at each phase), nvidia-smi's used memory, or the
    process's RSS on CPU."""

    def __init__(self, cuda: bool):
        self.cuda, self.phases = cuda, {}

    def start(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def record(self, phase: str) -> None:
        gib = 2**30
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            used = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                capture_output=True,
                text=True,
            ).stdout.split()
            self.phases[phase] = {
                "allocated_gib": round(torch.cuda.max_memory_allocated() / gib, 2),
                "reserved_gib": round(torch.cuda.max_memory_reserved() / gib, 2),
                "device_used_gib": round(float(used[0]) / 1024, 2) if used else None,
            }
        else:
            import psutil

            self.phases[phase] = {"rss_gib": round(psutil.Process().memory_info().rss / gib, 2)}


def seconds(fn, cuda: bool) -> float:
    import torch

    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def engine_numbers(model_dir: Path, opts: argparse.Namespace, run_dir: Path) -> dict:
    """Everything measured in this process around rlctl's colocated vLLM engine and the policy it serves."""
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlctl import config
    from rlctl.plan import planner as plan
    from rlctl.rollout import vllm
    from rlctl.rollout.generate import HFGenerator
    from rlctl.rollout.samples import Sample, collate, token_logprobs

    cuda = torch.cuda.is_available()
    sets = [f"model.name_or_path={model_dir}", "rl.use_vllm=true", f"rl.max_new_tokens={opts.new_tokens}"]
    sets += [f"rl.prompts_per_step={opts.rollouts // 8}", "rl.group_size=8", "data.max_prompt_length=32"]
    cfg = config.resolve(opts.preset, None, "reinforce-pp", "auto", sets)
    the_plan = plan.build(cfg, run_dir)
    acc = Accelerator(cpu=not cuda, mixed_precision=the_plan.mixed_precision)
    tok = AutoTokenizer.from_pretrained(model_dir)
    dtype = torch.bfloat16 if cuda else torch.float32
    policy = acc.prepare(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype))
    mem = Memory(cuda)
    mem.start()
    vllm_gen = vllm.colocated(the_plan, policy, acc, tok)
    mem.record("engine built (asleep on GPU)")
    llm = vllm_gen.llm
    switches: dict[str, list[float]] = {}
    if vllm.sleep_mode(the_plan):
        for _ in range(3):
            for name, fn in (
                ("wake weights", lambda: llm.wake_up(tags=["weights"])),
                ("wake kv_cache", lambda: llm.wake_up(tags=["kv_cache"])),
                ("sleep level 2", lambda: llm.sleep(level=2)),
            ):
                switches.setdefault(name, []).append(seconds(fn, cuda))
    syncs = [seconds(lambda: vllm_gen.sync(policy), cuda) for _ in range(3)]
    prompts = [tok(f"{i} + {i * 7 % 97} =", add_special_tokens=False)["input_ids"] for i in range(opts.rollouts)]
    mem.start()
    with vllm_gen.awake():
        t_vllm, n_vllm = timed_tokens(lambda: vllm_gen.generate(prompts), cuda)
        mem.record("generation (vLLM)")
        raw = raw_engine(vllm_gen, prompts, cuda)
        sampled = vllm_gen.generate(prompts[:64])
        rollout_lp = vllm_gen.logprobs
        n_hf = min(opts.rollouts, opts.hf_rollouts)
        t_vllm_hf_batch, n_vllm_hf_batch = timed_tokens(lambda: vllm_gen.generate(prompts[:n_hf]), cuda)
    hf = HFGenerator(tok, opts.new_tokens, cfg.rl.temperature, batch_size=n_hf)  # the same batch as vLLM's
    hf.sync(policy)
    t_hf, n_hf_tokens = timed_tokens(lambda: hf.generate(prompts[:n_hf]), cuda)
    # the weight-sync check, as the loop does it: trainer log-probs of the tokens vLLM just sampled
    samples = [Sample(0, {}, p, c) for p, c in zip(prompts[:64], sampled, strict=True)]
    batch = collate(samples, tok.pad_token_id, acc.device)
    with torch.no_grad():
        train_lp = token_logprobs(policy, batch, cfg.rl.temperature)
    gaps = [
        abs(train_lp[i, t].item() - lp)
        for i, lps in enumerate(rollout_lp or [])
        for t, lp in enumerate(lps)
        if math.isfinite(lp) and batch.mask[i, t] > 0
    ]
    short = [p[:32] for p in prompts[:16]]
    greedy = (vllm_gen.generate(short, greedy=True), hf.generate(short, greedy=True))
    # one training step on a micro-batch of rollouts: forward, backward, AdamW
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    mem.start()
    micro = batch[: min(8, len(samples))]
    policy.train()
    loss = -token_logprobs(policy, micro, cfg.rl.temperature).mean()
    acc.backward(loss)
    opt.step()
    opt.zero_grad(set_to_none=True)
    mem.record("training step (micro-batch 8)")
    rlctl_rate = n_vllm / t_vllm
    return {
        "plan": {
            "vllm": the_plan.vllm.to_json() if the_plan.vllm else None,
            "memory": the_plan.memory.to_json()["phases"] if the_plan.memory else None,
        },
        "sleep_wake_s": {k: round(statistics.median(v), 3) for k, v in switches.items()} or "n/a (no sleep on CPU)",
        "sync_s": round(statistics.median(syncs), 3),
        "sync_check": {
            "mean_abs_logprob_diff": round(statistics.fmean(gaps), 5) if gaps else None,
            "max_abs_logprob_diff": round(max(gaps), 5) if gaps else None,
            "greedy_equal": sum(a == b for a, b in zip(*greedy, strict=True)),
            "greedy_prompts": len(short),
        },
        "tokens_per_s": {
            "vllm": round(rlctl_rate),
            **{f"raw {name}": round(rate) for name, rate in raw.items()},
            f"vllm, {n_hf} rollouts": round(n_vllm_hf_batch / t_vllm_hf_batch),
            f"transformers, {n_hf} rollouts": round(n_hf_tokens / t_hf),
        },
        "ratios": {
            **{f"rlctl / raw {name}": round(rlctl_rate / rate, 3) for name, rate in raw.items()},
            "vLLM / transformers, same batch": round((n_vllm_hf_batch / t_vllm_hf_batch) / (n_hf_tokens / t_hf), 2),
        },
        "generation_s": {"vllm": round(t_vllm, 2), "transformers": round(t_hf, 2), "transformers_rollouts": n_hf},
        "memory": mem.phases,
    }


def timed_tokens(generate, cuda: bool) -> tuple[float, int]:
    """Seconds of one `generate()` call and the tokens it generated (completion token-id lists)."""
    out: list = []
    t = seconds(lambda: out.extend(generate()), cuda)
    return t, sum(map(len, out))


def raw_engine(gen, prompts: list[list[int]], cuda: bool) -> dict[str, float]:
    """Tokens/s of raw `LLM.generate` on rlctl's own `vllm.LLM` with the same prompts and sampling: asked for the
    sampled tokens' log-probs in the form rlctl asks (flat), and with none (the bare engine)."""
    with_lp = gen.sampling.params(greedy=False)
    if with_lp.logprobs is None:
        with_lp = with_lp.clone()
        with_lp.logprobs, with_lp.flat_logprobs = 0, True
    bare = with_lp.clone()
    bare.logprobs, bare.flat_logprobs = None, False
    rates = {}
    for name, params in (("with log-probs", with_lp), ("without log-probs", bare)):

        def call(params=params) -> list[list[int]]:
            with gen.rng.swapped():
                outs = gen.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]

        t, n = timed_tokens(call, cuda)
        rates[name] = n / t
    return rates


def _train(model_dir: Path, opts: argparse.Namespace, run_dir: Path, setting: str) -> subprocess.CompletedProcess:
    """A few steps of `rlctl train` in rlctl's loop (reinforce-pp) on the model, with one extra `--set`."""
    argv = [PYTHON, "-m", "rlctl.cli", "-q", "train", "--preset", opts.preset, "--algorithm", "reinforce-pp",
            "--stages", "rl", "--hardware", "auto", "--run-dir", str(run_dir),
            "--set", f"model.name_or_path={model_dir}", "--set", setting,
            "--set", "rl.rewards=[{name: exact_match}]", "--set", f"rl.max_steps={opts.steps}",
            "--set", f"rl.max_new_tokens={opts.new_tokens}", "--set", "rl.save_every=100000",
            "--set", "rl.eval_samples=8", "--set", "data.generate=arithmetic",
            "--set", "data.max_prompt_length=32"]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=opts.train_timeout)


def step_split(model_dir: Path, opts: argparse.Namespace, run_dir: Path) -> dict:
    """A few steps of `rlctl train` with the loop generating through vLLM: the median seconds of each phase."""
    proc = _train(model_dir, opts, run_dir, "rl.use_vllm=true")
    if proc.returncode != 0:
        log = run_dir / "logs" / "train.log"
        tail = log.read_text()[-1500:] if log.exists() else (proc.stdout + proc.stderr)[-1500:]
        return {"error": f"exit {proc.returncode}: {tail}"}
    return read_steps(run_dir)


def async_row(model_dir: Path, opts: argparse.Namespace, run_dir: Path, sync: dict) -> dict:
    """With 2+ GPUs: the same steps with rl.async_rollout (the generator on GPUs of its own): the median seconds
    per step against the synchronous run's, and the staleness."""
    import torch

    if torch.cuda.device_count() < 2:
        return {"skipped": f"{torch.cuda.device_count()} GPU(s): async RL needs 2 or more"}
    proc = _train(model_dir, opts, run_dir, "rl.async_rollout.enabled=true")
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}"}
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in recs if r.get("stage") == "rl" and "staleness_mean" in r]
    per_step = statistics.median(sum(v for k, v in r.items() if k.startswith("time_")) for r in steps[1:])
    sync_step = sum(v for k, v in sync.items() if k.startswith("time_"))
    return {
        "s_per_step": round(per_step, 3),
        "sync_s_per_step": round(sync_step, 3),
        "staleness_mean": round(statistics.mean(r["staleness_mean"] for r in steps), 2),
    }


def flagship(opts: argparse.Namespace, run_dir: Path) -> dict:
    """`rlctl train --preset qwen7b-grpo` for 2 steps on a random-init Qwen2.5-7B shape built on the GPU (bf16):
    whether it runs on this GPU as planned, its step split and its memory per phase against the plan."""
    model = build_model(opts.flagship_shape, run_dir.parent / "flagship-model")
    argv = [PYTHON, "-m", "rlctl.cli", "-q", "train", "--preset", "qwen7b-grpo", "--stages", "rl",
            "--hardware", "auto", "--run-dir", str(run_dir), "--set", f"model.name_or_path={model}",
            "--set", "rl.max_steps=2", "--set", "rl.save_every=100000", "--set", "rl.eval_samples=8",
            "--set", "rl.rewards=[{name: exact_match}]", "--set", "data.generate=arithmetic",
            "--set", "data.max_prompt_length=64", "--set", f"rl.prompts_per_step={opts.flagship_prompts}",
            "--set", f"rl.max_new_tokens={opts.flagship_new_tokens}"]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=opts.flagship_timeout)
    out: dict = {"exit": proc.returncode, "wall_s": round(time.perf_counter() - start, 1)}
    if proc.returncode != 0:
        log = run_dir / "logs" / "train.log"
        out["error"] = (log.read_text() if log.exists() else proc.stdout + proc.stderr)[-1500:]
        return out
    return out | read_steps(run_dir)


def read_steps(run_dir: Path) -> dict:
    """A finished run's median seconds per loop phase and its memory per phase, planned against measured."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in recs if r.get("stage") == "rl" and "time_generate" in r]
    keys = ("time_sync", "time_generate", "time_score", "time_prepare", "time_update", "sync_logp_diff_mean")
    out = {k: round(statistics.median(r[k] for r in steps), 4) for k in keys if all(k in r for r in steps)}
    memory = json.loads((run_dir / "summary.json").read_text()).get("memory", {}).get("rl", {})
    out["memory"] = {p: planned_vs_measured(r) for p, r in memory.get("phases", {}).items()}
    return out


def planned_vs_measured(row: dict) -> str:
    """One phase of summary.json's measured memory: planned, measured (GiB) and the plan's error."""
    error = f"{row['error_pct']:+.0f}%" if row.get("error_pct") is not None else "-"
    return f"planned {row.get('planned_peak_gib') or '-'} / measured {row.get('measured_peak_gib')} GiB ({error})"


def markdown(doc: dict) -> str:
    """The results as the table docs/performance.md takes."""
    e, split, m = doc["engine"], doc["step_split"], doc["machine"]
    check, rate = e["sync_check"], e["tokens_per_s"]
    rows = [
        ("machine", f"{m['gpu']}; {doc['versions']}"),
        ("model", f"{doc['model']}, {doc['rollouts']} rollouts x {doc['new_tokens']} new tokens"),
        ("sleep / wake s (median of 3)", json.dumps(e["sleep_wake_s"])),
        ("weight sync s per push", e["sync_s"]),
        ("sync check: mean / max abs log-prob diff", f"{check['mean_abs_logprob_diff']} / "
                                                      f"{check['max_abs_logprob_diff']}"),
        ("sync check: greedy vLLM == transformers", f"{check['greedy_equal']}/{check['greedy_prompts']}"),
        ("generated tokens/s", json.dumps(rate)),
        ("ratios", json.dumps(e["ratios"])),
        ("step split s (sync/generate/score/prepare/update)", json.dumps({k: v for k, v in split.items()
                                                                            if k != "memory"})),
    ]  # fmt: skip
    rows.append(("async RL, 2+ GPUs: s/step (median phases) async / sync, staleness", json.dumps(doc["async"])))
    if "flagship" in doc:
        f = doc["flagship"]
        rows.append(("flagship qwen7b-grpo, 2 steps", json.dumps({k: v for k, v in f.items() if k != "memory"})))
        rows += [(f"flagship memory: rl/{phase}", text) for phase, text in f.get("memory", {}).items()]
    rows += [(f"rlctl train memory: rl/{phase}", text) for phase, text in split.get("memory", {}).items()]
    rows += [(f"memory: {phase}", json.dumps(v)) for phase, v in e["memory"].items()]
    rows += [(f"plan: {p['stage']}/{p['phase']} peak GiB", p["peak_gib"]) for p in e["plan"]["memory"] or []]
    return "| measure | value |\n| --- | --- |\n" + "\n".join(f"| {k} | {v} |" for k, v in rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen2.5-0.5b", help="a presets/models shape, built random-init")
    ap.add_argument("--model", help="a model folder to use instead of building --shape (CPU smoke runs)")
    ap.add_argument("--preset", default="qwen0.5b-grpo")
    ap.add_argument("--rollouts", type=int, default=256)
    ap.add_argument("--hf-rollouts", type=int, default=64, help="rollouts timed through transformers generate")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--train-timeout", type=int, default=240)
    ap.add_argument("--out", default=str(RESULTS), help="folder for gpu_accept.json / gpu_accept.md")
    ap.add_argument("--flagship", action="store_true", help="also 2 steps of qwen7b-grpo on a random-init 7B shape")
    ap.add_argument("--flagship-timeout", type=int, default=330)
    ap.add_argument("--flagship-shape", default="qwen2.5-7b", help="the flagship's shape (tiny: a CPU smoke run)")
    # the preset's 64 prompts x 8 x 1024 new tokens take minutes a step on random weights (no EOS): smaller here
    ap.add_argument("--flagship-prompts", type=int, default=16, help="rl.prompts_per_step of the flagship run")
    ap.add_argument("--flagship-new-tokens", type=int, default=256, help="rl.max_new_tokens of the flagship run")
    opts = ap.parse_args()
    import torch
    import transformers
    import vllm

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(opts.model) if opts.model else build_model(opts.shape, Path(tmp) / "model")
        doc = {
            "model": opts.model or f"{opts.shape} shape, random init",
            "rollouts": opts.rollouts,
            "new_tokens": opts.new_tokens,
            "versions": f"torch {torch.__version__}, vllm {vllm.__version__}, transformers {transformers.__version__}",
            # the training run first: this process's own engine would hold the GPU (and the rendezvous port)
            "step_split": step_split(model, opts, Path(tmp) / "run"),
        }
        if opts.flagship:  # a subprocess too, before this process builds its own engine
            doc["flagship"] = flagship(opts, Path(tmp) / "flagship")
        doc |= {
            "engine": engine_numbers(model, opts, Path(tmp) / "plan"),
            "machine": machine(),
        }
        doc["async"] = async_row(model, opts, Path(tmp) / "async", doc["step_split"])
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_accept.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "gpu_accept.md").write_text(markdown(doc))
    print(markdown(doc))
    print(f"wrote {out / 'gpu_accept.json'} and {out / 'gpu_accept.md'}")


if __name__ == "__main__":
    main()

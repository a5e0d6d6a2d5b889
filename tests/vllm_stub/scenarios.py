"""rlctl's vLLM path driven against the stand-in (this folder on PYTHONPATH, so `import vllm` finds it):
`python scenarios.py boundary MODEL_DIR` or `python scenarios.py loop MODEL_DIR RUN_DIR ALGO [KEY=VALUE ...]`
prints one JSON object of what happened; tests/test_engine.py asserts on it."""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path


def _as_on_a_gpu() -> None:
    """The stand-in is vLLM's GPU API (sleep mode, the model's batched load_weights): take the GPU branches of the
    engine on this CPU machine. The CPU build's own branches are tested against the real vLLM CPU build."""
    from rlctl.plan import engine as choice

    choice.sleep_mode_for = lambda hardware: True


def _calls() -> list[dict]:
    """The stand-in's calls, consecutive load_weights merged into one entry with every name pushed."""
    import vllm

    out: list[dict] = []
    for name, details in vllm.CALLS:
        if name == "load_weights" and out and out[-1]["call"] == "load_weights":
            out[-1]["names"] += details["names"]
            continue
        entry = {"call": name}
        if name == "load_weights":
            entry["names"] = list(details["names"])
        elif name == "generate":
            entry.update(prompts=details["prompts"], temperature=details["temperature"])
            entry["ignore_eos"] = details["params"].ignore_eos
            entry["stop_token_ids"] = details["params"].stop_token_ids
            entry["detokenize"] = details["params"].detokenize
            entry["logprobs"] = details["params"].logprobs
        elif name in ("init", "sleep", "wake_up"):
            entry.update(details)
        out.append(entry)
    return out


def boundary(model_dir: str) -> dict:
    """The colocated engine next to the transformers generator on the same policy (MODEL_DIR is RUN/sft/final of a tiny
    demo run, whose RUN/data/eval.jsonl gives the prompts): engine arguments, greedy outputs, weights pushed after
    the policy changes, the sleep cycle."""
    import torch
    import vllm
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlctl import config
    from rlctl.evaluation import evaluate
    from rlctl.plan import planner as plan
    from rlctl.rollout import vllm as engine
    from rlctl.rollout.generate import HFGenerator

    _as_on_a_gpu()
    cfg = config.resolve("tiny-demo", None, "ppo", None, [f"model.name_or_path={model_dir}"])
    the_plan = dataclasses.replace(plan.build(cfg, tempfile.mkdtemp()), generation_engine="vllm")
    acc = Accelerator(cpu=True)
    tok = AutoTokenizer.from_pretrained(model_dir)
    policy = acc.prepare(AutoModelForCausalLM.from_pretrained(model_dir))
    gen = engine.colocated(the_plan, policy, acc, tok)
    hf = HFGenerator(tok, cfg.rl.max_new_tokens, cfg.rl.temperature)
    rows = [json.loads(line) for line in (Path(model_dir).parents[1] / "data" / "eval.jsonl").open()][:4]
    texts = [evaluate.prompt_text(row["prompt"], tok) for row in rows]  # the run's held-out prompts
    prompts = [tok(text, add_special_tokens=False)["input_ids"] for text in texts]
    gen.sync(policy)
    hf.sync(policy)
    greedy_vllm, greedy_hf = gen.generate(prompts, greedy=True), hf.generate(prompts, greedy=True)
    sampled = gen.generate(prompts)
    with torch.no_grad():  # an optimizer step, as far as vLLM can tell
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    gen.sync(policy)
    engine_weights = dict(gen.llm.model.named_parameters())
    return {
        "llm_init": vllm.CALLS[0][1],
        "llm_kwargs": engine.llm_kwargs(the_plan, model=model_dir),
        "greedy_vllm": greedy_vllm,
        "greedy_hf": greedy_hf,
        "sampled": sampled,
        "eos": tok.eos_token_id,
        "max_new_tokens": cfg.rl.max_new_tokens,
        "pushed_equal": all(torch.equal(engine_weights[n], p) for n, p in policy.named_parameters()),
        "policy_params": [n for n, _ in policy.named_parameters()],
        "calls": _calls(),
    }


def loop(model_dir: str, run_dir: str, algorithm: str, *extra: str) -> dict:
    """Two steps of rlctl's RL loop with a plan whose generation engine is vLLM (CPU plans never choose it);
    `extra` are more --set overrides (e.g. model.adapter=lora)."""
    from rlctl import config, launch
    from rlctl.launch import runner
    from rlctl.plan import engine as choice
    from rlctl.plan.parts import Noted

    _as_on_a_gpu()
    choice.choose = lambda cfg, hardware, detected=False: Noted("vllm" if "rl" in cfg.stages else "none")
    sets = [
        f"model.name_or_path={model_dir}",
        "stages=[rl]",
        "rl.max_steps=2",
        "rl.save_every=2",
        "rl.rewards=[{name: exact_match}]",
        *extra,
    ]
    cfg = config.resolve("tiny-demo", None, algorithm, None, sets)
    the_plan = launch.prepare(cfg, Path(run_dir)).plan
    runner.main(Path(run_dir))
    rl = next(s for s in the_plan.stages if s.name == "rl")
    return {
        "generation_engine": the_plan.generation_engine,
        "rollouts_per_step": cfg.rl.prompts_per_step * cfg.rl.group_size,
        "prompts_per_step": cfg.rl.prompts_per_step,
        "temperature": cfg.rl.temperature,
        "max_num_seqs": rl.micro_batch_size * rl.grad_accum,
        "summary": json.loads((Path(run_dir) / "summary.json").read_text()),
        "calls": _calls(),
    }


if __name__ == "__main__":
    scenario = {"boundary": boundary, "loop": loop}[sys.argv[1]]
    print("RESULT " + json.dumps(scenario(*sys.argv[2:])))

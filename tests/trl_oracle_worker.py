"""TRL's GRPOTrainer as the oracle of rlctl's RL loop (tests/test_trl_oracle.py runs this in a process of its own).

One tiny random-init model, 4 prompts x 4 completions a step, 3 steps, the same settings on both sides. TRL trains
first and samples; each step's completions, rewards, advantages, loss and gradient norm are recorded. rlctl's loop
then trains from the same weights on the same completions: its engine replays TRL's samples of each prompt (the
only stand-in; rewards, advantages, log-probs, KL, loss, clipping and the optimizer are the loop's own). A reward
that varies on a random model (the share of digits in the completion) keeps the advantages from all being zero.

Usage: python tests/trl_oracle_worker.py OUT_DIR  (prints one line `RESULT <json>`)
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
import yaml

STEPS, PROMPTS, GROUP, NEW_TOKENS, LR, BETA, SEED = 3, 4, 4, 6, 5e-3, 0.04, 7
REWARD = '''
def digits(prompts, completions, **kwargs):
    """The share of digits in the completion (0 for an empty one)."""
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]
'''


def main(out: Path) -> None:
    from rlctl import config
    from rlctl.data import tasks
    from rlctl.launch.runner import build_base

    out.mkdir(parents=True, exist_ok=True)
    reward_file = out / "oracle_reward.py"
    reward_file.write_text(REWARD)
    generated = tasks.arithmetic(out / "tiny" / "data", SEED)  # the tiny demo's data (its model is built from it)
    rows = [json.loads(line) for line in generated["rl"].read_text().splitlines()]
    rows = rows[:PROMPTS]
    data = out / "rl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    body = {
        "defaults": ["tiny-demo"],
        "seed": SEED,
        "stages": ["rl"],
        "data": {"generate": None, "rl": str(data), "eval": None},
        "checkpoint": {"keep_best": False},
        "rl": {
            "max_steps": STEPS, "save_every": STEPS, "prompts_per_step": PROMPTS, "group_size": GROUP,
            "micro_batch_size": PROMPTS * GROUP, "max_new_tokens": NEW_TOKENS, "learning_rate": LR,
            "lr_scheduler": "constant", "warmup_ratio": 0.0, "weight_decay": 0.0, "max_grad_norm": 1.0, "beta": BETA,
            "temperature": 1.0, "use_vllm": False,
            "rewards": [{"name": f"{reward_file}:digits", "timeout_s": 0}],
        },
    }  # fmt: skip
    config_file = out / "rlctl.yaml"
    config_file.write_text(yaml.safe_dump(body))
    cfg = config.resolve(config_file=config_file)
    # the demo's random-init model and tokenizer, built from the demo's own data
    build_base(config.resolve(preset="tiny-demo", sets=[f"seed={SEED}"]), out / "tiny")
    model_dir = out / "tiny" / "base"
    trl_steps = run_trl(model_dir, rows, reward_file)
    cfg.model.name_or_path = str(model_dir)
    loop_steps = run_loop(cfg, out / "run", trl_steps)
    print("RESULT " + json.dumps({"trl": trl_steps, "loop": loop_steps}))


def _digits(path: Path):
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["digits"]


def run_trl(model_dir: Path, rows: list[dict], reward_file: Path) -> list[dict]:
    """TRL's GRPOTrainer for STEPS steps; per step the prompts' completions and advantages, the loss and the
    gradient norm it logged."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    args = GRPOConfig(
        output_dir=str(model_dir.parent / "trl"), use_cpu=True, bf16=False, seed=SEED, max_steps=STEPS,
        per_device_train_batch_size=PROMPTS * GROUP, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=GROUP, max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        beta=BETA, epsilon=0.2, epsilon_high=0.2, loss_type="grpo", scale_rewards="group",
        importance_sampling_level="token", num_iterations=1, logging_steps=1, save_strategy="no", report_to=[],
        gradient_checkpointing=False, optim="adamw_torch", log_completions=False,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, reward_funcs=[_digits(reward_file)], args=args, train_dataset=Dataset.from_list(rows),
        processing_class=tok,
    )  # fmt: skip
    sampled: list[dict] = []
    generate = trainer._generate_and_score_completions  # the oracle's own step, recorded as it runs

    def recorded(inputs):
        result = generate(inputs)
        groups: dict[str, list] = defaultdict(list)
        prompt_texts = tok.batch_decode(result["prompt_ids"], skip_special_tokens=True)
        for i, text in enumerate(prompt_texts):
            ids = result["completion_ids"][i][result["completion_mask"][i].bool()].tolist()
            groups[text].append([ids, float(result["advantages"][i])])
        sampled.append(dict(groups))
        return result

    trainer._generate_and_score_completions = recorded
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h and "grad_norm" in h]
    return [
        {"samples": s, "loss": float(h["loss"]), "grad_norm": float(h["grad_norm"])}
        for s, h in zip(sampled, logs, strict=True)
    ]


class Replay:
    """The loop's engine for this oracle: each prompt's completions as TRL sampled them at that step, in order."""

    logprobs = None

    def __init__(self, tok, steps: list[dict]):
        self.tok, self.steps, self.step = tok, steps, -1

    def sync(self, model) -> None:
        self.step += 1

    def awake(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def generate(self, prompts: list[list[int]], greedy: bool = False, vision=None) -> list[list[int]]:
        queues = {text: [ids for ids, _ in group] for text, group in self.steps[self.step]["samples"].items()}
        return [queues[self.tok.decode(p, skip_special_tokens=True)].pop(0) for p in prompts]


def run_loop(cfg, run_dir: Path, trl_steps: list[dict]) -> list[dict]:
    """rlctl's loop on TRL's completions; per step each prompt's completions and advantages, loss and grad norm."""
    from rlctl.plan import planner
    from rlctl.runtime.context import MetricsLog
    from rlctl.stages import rl
    from rlctl.stages.context import StageContext
    from rlctl.trainer import loop

    run_dir.mkdir(parents=True)
    the_plan = planner.build(cfg, run_dir)
    (run_dir / "config.yaml").write_text(config_yaml(cfg))
    ctx = StageContext(
        cfg, the_plan, the_plan.stages[-1], run_dir, planner.data_paths(cfg, run_dir), MetricsLog(run_dir, True), True
    )
    for_plan = rl.generate.for_plan
    rl.generate.for_plan = lambda plan, tok, *a, **k: Replay(tok, trl_steps)
    seen: list[dict] = []
    advantages = loop.advantages

    def recorded(lp, samples, prepared, step):
        train = advantages(lp, samples, prepared, step)
        groups: dict[str, list] = defaultdict(list)
        adv = train.local["adv"]
        for i, s in enumerate(samples):
            groups[lp.tok.decode(s.prompt_ids, skip_special_tokens=True)].append([s.completion_ids, float(adv[i, 0])])
        seen.append(dict(groups))
        return train

    loop.advantages = recorded
    try:
        loop.train(rl.parts(ctx), rl.settings(ctx), rl.hooks(ctx))
    finally:
        rl.generate.for_plan, loop.advantages = for_plan, advantages
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("stage") == "rl" and "step" in r and "loss" in r]
    return [{"samples": s, "loss": r["loss"], "grad_norm": r["grad_norm"]} for s, r in zip(seen, steps, strict=True)]


def config_yaml(cfg) -> str:
    from rlctl import config

    return config.dump(cfg)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Held-out evaluation: greedy generation scored by the run's rewards, and pairwise reward-model accuracy."""

from __future__ import annotations

from typing import Any

import torch

from rlctl.rewards import RewardFn, exact_match


def prompt_text(prompt: Any, tokenizer) -> str:
    """A prompt as text: plain strings as they are, message lists through the chat template."""
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return prompt


@torch.no_grad()
def generate(model, tokenizer, prompts: list[Any], max_new_tokens: int, batch_size: int = 64) -> list[str]:
    """Greedy completions of `prompts` (left-padded batches), special tokens stripped."""
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    out: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
            texts = [prompt_text(p, tokenizer) for p in prompts[i : i + batch_size]]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            ids = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    return out


def score_policy(
    model,
    tokenizer,
    rows: list[dict[str, Any]],
    rewards: list[tuple[RewardFn, float]],
    answer_field: str,
    max_new_tokens: int,
) -> dict[str, float]:
    """eval_accuracy (exact match against the ground truth) and eval_reward (the weighted reward sum)."""
    prompts = [r["prompt"] for r in rows]
    completions = generate(model, tokenizer, prompts, max_new_tokens)
    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
    correct = exact_match(prompts, completions, answer=columns[answer_field])
    total = [0.0] * len(rows)
    for fn, weight in rewards:
        for i, value in enumerate(fn(prompts=prompts, completions=completions, **columns)):
            total[i] += weight * float(value if value is not None else 0.0)
    n = len(rows)
    return {"eval_accuracy": sum(correct) / n, "eval_reward": sum(total) / n}


@torch.no_grad()
def reward_scores(model, tokenizer, texts: list[str], batch_size: int = 64) -> list[float]:
    """Scalar reward-model scores of full texts (scored as the RL stage scores completions)."""
    model.eval()
    scores: list[float] = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[i : i + batch_size], return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
        ).to(model.device)
        scores += model(**enc).logits[:, 0].float().tolist()
    return scores


def score_reward_model(model, tokenizer, pairs: list[dict[str, Any]]) -> dict[str, float]:
    """eval_accuracy: the fraction of held-out pairs where chosen outscores rejected."""
    prefix = [prompt_text(p.get("prompt", ""), tokenizer) for p in pairs]
    chosen = reward_scores(model, tokenizer, [a + p["chosen"] for a, p in zip(prefix, pairs, strict=True)])
    rejected = reward_scores(model, tokenizer, [a + p["rejected"] for a, p in zip(prefix, pairs, strict=True)])
    wins = [c > r for c, r in zip(chosen, rejected, strict=True)]
    margin = sum(c - r for c, r in zip(chosen, rejected, strict=True)) / len(pairs)
    return {"eval_accuracy": sum(wins) / len(pairs), "eval_margin": margin}

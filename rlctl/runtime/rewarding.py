"""The RL stage's reward sources for rlctl's loop (rlctl.trainer.loop): rl.rewards resolved to functions (in worker
processes with deadlines, guarded by their on_error: `RewardSetup`) or the trained reward model, DAPO's overlong
buffer in tokens, and the loop's `Scorer` that sums them per completion."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlctl import rewards
from rlctl.algorithms import overlong_penalty
from rlctl.config.rl import RewardSpec, RLConfig
from rlctl.data.tokens import prompt_text
from rlctl.evaluation import evaluate
from rlctl.rewards import scoring
from rlctl.rewards.worker import Workers
from rlctl.rollout import multiturn
from rlctl.rollout.samples import Sample
from rlctl.runtime import models
from rlctl.runtime.models import ModelSource


@dataclass(frozen=True)
class RewardSetup:
    """What the run's rewards are built from: rl.rewards, the data's answer field, the worker processes the
    functions run in (the runner's, shared by every stage), where their events go (`notify(event, **fields)`: a
    reward running slow) and the reward model (the rm stage's final folder, loaded as the stage loads models)."""

    specs: list[RewardSpec]
    answer_field: str
    workers: Workers
    notify: Callable[..., None]
    reward_model: ModelSource

    def guarded(self, errors: dict[str, int]) -> list:
        """rl.rewards as the stages call them, in order (None for the reward model): each function in its worker
        with its deadline, its failures following its `on_error`, counted per reward name in `errors`."""
        return rewards.stage_rewards(self.specs, self.answer_field, errors, self.workers, self.notify)


def reward_sources(setup: RewardSetup, errors: dict[str, int]) -> tuple[list, list, list[float]]:
    """(reward functions or models, their tokenizers, weights) in the order of rl.rewards; each function runs
    in its worker with its deadline, its failures follow its `on_error`, counted per reward name in `errors`."""
    funcs, tokenizers, weights = [], [], []
    for spec, fn in zip(setup.specs, setup.guarded(errors), strict=True):
        if fn is None:
            tok = models.tokenizer(setup.reward_model)
            funcs.append(models.reward_model(setup.reward_model, tok.pad_token_id, trainable=False))
            tokenizers.append(tok)
        else:
            funcs.append(fn)
            tokenizers.append(None)
        weights.append(spec.weight)
    return funcs, tokenizers, weights


def overlong_buffer_tokens(rl: RLConfig) -> int:
    """DAPO's soft-overlong buffer in tokens (rl.filters.overlong_buffer is a fraction of max_new_tokens); 0 = off."""
    return round(rl.filters.overlong_buffer * rl.max_new_tokens) if rl.filters.overlong_buffer else 0


class Scorer:
    """The run's weighted reward sum (rules, plugins, reward model) plus DAPO's soft overlong punishment; and whether
    the run's correctness reward (the first of rl.rewards, `rlctl.rewards.scoring`) scored each completion above
    0.5, which VAPO's positive-example LM loss trains on. `rl`: the rl section (max_new_tokens, DAPO's overlong
    filter); `tokenizer`: the policy's."""

    def __init__(self, rl: RLConfig, setup: RewardSetup, tokenizer, device):
        self.errors: dict[str, int] = {}  # completions scored 0 by rewards with on_error=zero, per reward
        self.funcs, self.tokenizers, self.weights = reward_sources(setup, self.errors)
        self.funcs = [f.to(device).eval() if isinstance(f, torch.nn.Module) else f for f in self.funcs]
        self.tok, self.rl, self.buffer = tokenizer, rl, overlong_buffer_tokens(rl)
        self.correctness = scoring.correctness_index(setup.specs)

    def __call__(self, samples: list[Sample], state: Any = None) -> None:
        """Each sample's score and correctness; `state` (rlctl.rewards.state.TrainerState: the optimizer steps so
        far and the stage's total) reaches rewards as `trainer_state`, under TRL's field names."""
        prompts = [s.row["prompt"] for s in samples]
        texts = self.tok.batch_decode([s.completion_ids for s in samples], skip_special_tokens=True)
        chat = isinstance(prompts[0], list)
        columns = {k: [s.row.get(k) for s in samples] for k in samples[0].row if k != "prompt"}
        if samples[0].messages is not None:  # multi-turn: rules score the final answer, and see the trajectory
            texts = [multiturn.final_answer(s) for s in samples]
            columns["trajectory"] = [s.messages for s in samples]
        completions = [[{"role": "assistant", "content": t}] for t in texts] if chat else texts
        total = torch.zeros(len(samples))
        for at, (fn, rm_tok, weight) in enumerate(zip(self.funcs, self.tokenizers, self.weights, strict=True)):
            if isinstance(fn, torch.nn.Module):
                full = [prompt_text(p, self.tok) + t for p, t in zip(prompts, texts, strict=True)]
                values = evaluate.reward_scores(fn, rm_tok, full)
            else:
                ids = [s.completion_ids for s in samples]
                trainer = {"completion_ids": ids, "trainer_state": state}
                values = fn(prompts=prompts, completions=completions, **trainer, **columns)
            scores = [float(v) if v is not None else 0.0 for v in values]
            total += weight * torch.tensor(scores)
            if at == self.correctness:
                for s, value in zip(samples, scores, strict=True):
                    s.correct = value > scoring.THRESHOLD
        if self.buffer:
            lengths = torch.tensor([len(s.completion_ids) for s in samples])
            total += overlong_penalty(lengths, self.rl.max_new_tokens, self.buffer, self.rl.filters.overlong_penalty)
        for s, value in zip(samples, total.tolist(), strict=True):
            s.score = value

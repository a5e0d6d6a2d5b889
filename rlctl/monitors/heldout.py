"""Held-out metrics of a stage's model: scored after each stage (summary.json) and at every checkpoint, where
`eval_accuracy` picks the best checkpoint that `checkpoint.keep_best` keeps besides the last ones.

Held-out scoring at checkpoints is bounded to about a tenth of the stage's time: a checkpoint scores a fixed subset
(the first `checkpoint_rows` held-out rows, the same at every save so scores compare), the base model and the final
model score the first `eval_samples`. Each scoring reports its progress (`scoring` events) and `eval_rows`. What
scores a stage is its `HeldOut`; the stage's monitors (`rlctl.monitors.hooks`) score each checkpoint with it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from rlctl import data
from rlctl.config.rl import RLConfig
from rlctl.config.sections import TrainConfig
from rlctl.errors import DataRowError, RewardError, RowFailure
from rlctl.evaluation import evaluate
from rlctl.rewards import scoring
from rlctl.rollout import multiturn
from rlctl.runtime import models
from rlctl.runtime.context import MetricsLog
from rlctl.runtime.models import ModelSource
from rlctl.runtime.rewarding import RewardSetup
from rlctl.runtime.rows import HOLDOUT, StageData, eval_rows, preference, preference_split

CHECKPOINT_SHARE = 0.1  # held-out rows scored at a checkpoint per sequence the stage trained on since the last one
CHECKPOINT_MIN_ROWS = 16

Scope = Literal["base", "checkpoint", "final"]


def checkpoint_rows(save_every: int, batch_size: int, eval_samples: int) -> int:
    """Rows scored at an intermediate checkpoint: a tenth of the sequences trained on between two saves (a greedy
    held-out completion costs less than a training sequence's sampled completion, scoring and update), at least
    CHECKPOINT_MIN_ROWS, at most eval_samples."""
    return min(eval_samples, max(CHECKPOINT_MIN_ROWS, math.ceil(CHECKPOINT_SHARE * save_every * batch_size)))


@dataclass(frozen=True)
class HeldOut:
    """What scores a stage's models on held-out data: the stage's data (`rows`: the rm stage's held-out tenth of
    data.preference, a policy's held-out prompts data.eval), its settings (eval_samples, save_every, batch_size),
    the rl section (a policy of any stage is scored on rl.eval_samples prompts, completions up to
    rl.max_new_tokens, rolled out with rl.tools when the run has an rl stage: `as_rl`), the rewards that score a
    policy, the stage's starting model (`source`: how models load, and a vision-language model's processor), the
    metrics log and whether this is the main process (the scoring's progress), and the device a saved model is
    scored on."""

    rows: StageData
    settings: TrainConfig
    rl: RLConfig
    as_rl: bool
    rewards: RewardSetup
    source: ModelSource
    log: MetricsLog
    is_main: bool
    device: Any = "cpu"

    @property
    def stage(self) -> str:
        return self.rows.name

    @property
    def can_score(self) -> bool:
        """Reward models always have held-out pairs; policies need the run's eval data."""
        return self.stage == "rm" or "eval" in self.rows.files

    def score(self, model: Any, tokenizer: Any, synced: bool = False, scope: Scope = "final") -> dict[str, float]:
        """eval_accuracy (and eval_reward or eval_margin) of a live model, and eval_rows (the rows scored): a policy
        on the run's held-out prompts, a reward model on the held-out preference pairs. `scope` "checkpoint" scores
        the checkpoint subset. `synced` keeps sharded (FSDP) ranks generating in step."""
        try:
            return self._score(model, tokenizer, synced, scope)
        except RowFailure as e:
            raise self._row_failed(e) from e.cause

    def score_saved(self, path: str, scope: Scope = "final") -> dict[str, float]:
        """Held-out metrics of the model saved at `path` (the stage's final folder, or the base model)."""
        saved = self.source.at(path)
        tok = models.tokenizer(saved)
        if self.stage == "rm":
            model = models.reward_model(saved, tok.pad_token_id, trainable=False)
        else:
            model = models.causal_lm(saved, trainable=False)
        return self.score(model.to(self.device), tok, scope=scope)

    def _row_failed(self, failure: RowFailure) -> Exception:
        """A held-out row's failure, named by its file and line: a RewardError stays one (its resume advice
        holds)."""
        if self.stage == "rm":
            rows, info = preference(self.rows)
            place = info.row(data.held_out(len(rows), HOLDOUT, self.rows.seed)[failure.index])
        else:
            place = eval_rows(self.rows)[1].row(failure.index)
        cause = failure.cause
        if isinstance(cause, RewardError):
            return RewardError(f"{cause} The held-out row is {place}.")
        return DataRowError(
            f"Scoring stage {self.stage} on held-out data failed on the row at {place} "
            f"({type(cause).__name__}: {cause})."
        )

    def _progress(self, scope: Scope, rows: int):
        """Logs the scoring's start, then returns the callback that logs rows done after each batch."""
        done = [0]

        def advance(k: int) -> None:
            done[0] += k
            self.log.write(stage=self.stage, event="scoring", scope=scope, done=done[0], rows=rows)

        self.log.write(stage=self.stage, event="scoring", scope=scope, done=0, rows=rows)
        return advance

    def _score(self, model: Any, tokenizer: Any, synced: bool, scope: Scope) -> dict[str, float]:
        was_training = model.training
        settings = self.settings  # a policy of any stage is scored on rl.eval_samples rows: base and final compare
        limit = settings.eval_samples if self.stage == "rm" else self.rl.eval_samples
        if scope == "checkpoint":
            limit = checkpoint_rows(settings.save_every, settings.batch_size, limit)
        try:
            if self.stage == "rm":
                _, held = preference_split(self.rows)
                held = held[:limit]
                return {**evaluate.score_reward_model(model, tokenizer, held), "eval_rows": len(held)}
            rl, answer_field = self.rl, self.rows.data.answer_field
            rows, info = eval_rows(self.rows)
            rows = rows[:limit]
            guarded = self.rewards.guarded({})
            fns = [(fn, r.weight) for fn, r in zip(guarded, rl.rewards, strict=True) if fn is not None]
            accuracy = scoring.accuracy_name(rl.rewards, info.format)
            agent = multiturn.agent_for(rl, tokenizer) if self.as_rl else None  # eval as RL will roll out
            on_batch = self._progress(scope, len(rows)) if self.is_main else None
            processor = models.processor(self.source)  # a vision-language model's (None: text only)
            scores = evaluate.score_policy(
                model, tokenizer, rows, fns, answer_field, rl.max_new_tokens, synced, accuracy, agent, on_batch,
                processor,
            )  # fmt: skip
            return {**scores, "eval_rows": len(rows)}
        finally:
            model.train(was_training)

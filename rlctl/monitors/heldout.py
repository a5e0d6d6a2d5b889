"""Held-out metrics of a stage's model: scored after each stage (summary.json) and at every checkpoint, where
`eval_accuracy` picks the best checkpoint that `checkpoint.keep_best` keeps besides the last ones.

Held-out scoring at checkpoints is bounded to about a tenth of the stage's time: a checkpoint scores a fixed subset
(the first `checkpoint_rows` held-out rows, the same at every save so scores compare), the base model and the final
model score the first `eval_samples`. Each scoring reports its progress (`scoring` events) and `eval_rows`."""

from __future__ import annotations

import math
from typing import Any, Literal

from rlctl import checkpoint, data, rewards
from rlctl.errors import DataRowError, RewardError, RowFailure
from rlctl.evaluation import evaluate
from rlctl.monitors import memory_probe
from rlctl.rewards import scoring
from rlctl.rollout import multiturn
from rlctl.runtime import models
from rlctl.runtime.context import StageContext
from rlctl.runtime.rows import HOLDOUT, anchored, preference, preference_split

CHECKPOINT_SHARE = 0.1  # held-out rows scored at a checkpoint per sequence the stage trained on since the last one
CHECKPOINT_MIN_ROWS = 16


def checkpoint_rows(save_every: int, batch_size: int, eval_samples: int) -> int:
    """Rows scored at an intermediate checkpoint: a tenth of the sequences trained on between two saves (a greedy
    held-out completion costs less than a training sequence's sampled completion, scoring and update), at least
    CHECKPOINT_MIN_ROWS, at most eval_samples."""
    return min(eval_samples, max(CHECKPOINT_MIN_ROWS, math.ceil(CHECKPOINT_SHARE * save_every * batch_size)))


def _eval(ctx: StageContext) -> tuple[list[dict], data.DataInfo]:
    cfg = ctx.cfg
    columns = data.stage_columns(cfg, "eval")
    rows, info = data.load(ctx.data["eval"], "eval", cfg.data.answer_field, columns, cfg.data.encoding)
    return anchored(rows, ctx.data["eval"]), info


def _row_failed(ctx: StageContext, failure: RowFailure) -> Exception:
    """A held-out row's failure, named by its file and line: a RewardError stays one (its resume advice holds)."""
    if ctx.stage.name == "rm":
        rows, info = preference(ctx)
        place = info.row(data.held_out(len(rows), HOLDOUT, ctx.cfg.seed)[failure.index])
    else:
        place = _eval(ctx)[1].row(failure.index)
    cause = failure.cause
    if isinstance(cause, RewardError):
        return RewardError(f"{cause} The held-out row is {place}.")
    return DataRowError(
        f"Scoring stage {ctx.stage.name} on held-out data failed on the row at {place} "
        f"({type(cause).__name__}: {cause})."
    )


Scope = Literal["base", "checkpoint", "final"]


def score(
    ctx: StageContext, model: Any, tokenizer: Any, synced: bool = False, scope: Scope = "final"
) -> dict[str, float]:
    """eval_accuracy (and eval_reward or eval_margin) of a live model, and eval_rows (the rows scored): a policy on
    the run's held-out prompts, a reward model on the held-out preference pairs. `scope` "checkpoint" scores the
    checkpoint subset. `synced` keeps sharded (FSDP) ranks generating in step."""
    try:
        return _score(ctx, model, tokenizer, synced, scope)
    except RowFailure as e:
        raise _row_failed(ctx, e) from e.cause


def _progress(ctx: StageContext, scope: Scope, rows: int):
    """Logs the scoring's start, then returns the callback that logs rows done after each batch."""
    done = [0]

    def advance(k: int) -> None:
        done[0] += k
        ctx.log.write(stage=ctx.stage.name, event="scoring", scope=scope, done=done[0], rows=rows)

    ctx.log.write(stage=ctx.stage.name, event="scoring", scope=scope, done=0, rows=rows)
    return advance


def _score(ctx: StageContext, model: Any, tokenizer: Any, synced: bool, scope: Scope) -> dict[str, float]:
    was_training = model.training
    settings = ctx.settings  # a policy of any stage is scored on rl.eval_samples rows: base and final compare
    limit = settings.eval_samples if ctx.stage.name == "rm" else ctx.cfg.rl.eval_samples
    if scope == "checkpoint":
        limit = checkpoint_rows(settings.save_every, settings.batch_size, limit)
    try:
        if ctx.stage.name == "rm":
            _, held = preference_split(ctx)
            held = held[:limit]
            return {**evaluate.score_reward_model(model, tokenizer, held), "eval_rows": len(held)}
        cfg = ctx.cfg
        rows, info = _eval(ctx)
        rows = rows[:limit]
        guarded = rewards.stage_rewards(cfg.rl.rewards, cfg.data.answer_field, {}, ctx.workers, ctx.notify)
        fns = [(fn, r.weight) for fn, r in zip(guarded, cfg.rl.rewards, strict=True) if fn is not None]
        accuracy = scoring.accuracy_name(cfg.rl.rewards, info.format)
        agent = multiturn.agent_for(cfg.rl, tokenizer) if "rl" in cfg.stages else None  # eval as RL will roll out
        on_batch = _progress(ctx, scope, len(rows)) if ctx.is_main else None
        processor = models.processor(ctx, ctx.stage.init_from)  # a vision-language model's (None: text only)
        scores = evaluate.score_policy(
            model, tokenizer, rows, fns, cfg.data.answer_field, cfg.rl.max_new_tokens, synced, accuracy, agent,
            on_batch, processor,
        )  # fmt: skip
        return {**scores, "eval_rows": len(rows)}
    finally:
        model.train(was_training)


def can_score(ctx: StageContext) -> bool:
    """Reward models always have held-out pairs; policies need the run's eval data."""
    return ctx.stage.name == "rm" or "eval" in ctx.data


def score_saved(ctx: StageContext, path: str, scope: Scope = "final") -> dict[str, float]:
    """Held-out metrics of the model saved at `path` (the stage's final folder, or the base model)."""
    tok = models.tokenizer(ctx, path)
    if ctx.stage.name == "rm":
        model = models.reward_model(ctx, path, tok.pad_token_id, trainable=False)
    else:
        model = models.causal_lm(ctx, path, trainable=False)
    return score(ctx, model.to(ctx.device), tok, scope=scope)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def publish_checkpoint(ctx: StageContext, step: int, model: Any, tokenizer: Any) -> None:
    """Once every process has written `.incoming/checkpoint-STEP`: score the model on held-out data (when
    `checkpoint.keep_best`), log the score, mark the checkpoint complete and rename it into place (main process).
    Called at each save by the TRL stages' callback and by the rlctl RL loop."""
    _barrier()
    keep_best = ctx.cfg.checkpoint.keep_best and can_score(ctx)
    sharded = ctx.stage.strategy == "fsdp2"  # every rank holds a shard: all must take part in generation
    value = None
    if keep_best and (ctx.is_main or sharded):
        scores = score(ctx, model, tokenizer, synced=sharded, scope="checkpoint")
        value = scores[checkpoint.METRIC]
        ctx.log.write(stage=ctx.stage.name, step=step, event="checkpoint", **scores)
    if ctx.is_main:
        checkpoint.publish(ctx.checkpoints, step, value, ctx.cfg.checkpoint.keep_last, keep_best)
    _barrier()
    memory_probe.lap(ctx, "checkpoint")  # the save and its held-out scoring

"""Held-out metrics of a stage's model: scored after each stage (summary.json) and at every checkpoint, where
`eval_accuracy` picks the best checkpoint that `checkpoint.keep_best` keeps besides the last ones."""

from __future__ import annotations

from typing import Any

from rlctl import checkpoint, data, rewards
from rlctl.errors import DataRowError, RewardError, RowFailure
from rlctl.rewards import scoring
from rlctl.rollout import evaluate, multiturn
from rlctl.stages import memory_probe, models
from rlctl.stages.context import StageContext

HOLDOUT = data.PREFERENCE_HOLDOUT  # the fraction of preference pairs held out to score reward models


def preference_split(ctx: StageContext, role: str = "preference") -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows of data.preference, read as `role` (preference pairs, or kto rows); the held-out
    tenth measures the reward model's accuracy."""
    rows, _ = _preference(ctx, role)
    return data.holdout(rows, HOLDOUT, ctx.cfg.seed)


def _preference(ctx: StageContext, role: str = "preference") -> tuple[list[dict], data.DataInfo]:
    stage = ctx.stage.name if ctx.stage.name in ("rm", "dpo", "kto") else "rm"
    columns = data.stage_columns(ctx.cfg, stage)
    return data.load(ctx.data["preference"], role, columns=columns, encoding=ctx.cfg.data.encoding)


def _eval(ctx: StageContext) -> tuple[list[dict], data.DataInfo]:
    cfg = ctx.cfg
    columns = data.stage_columns(cfg, "eval")
    return data.load(ctx.data["eval"], "eval", cfg.data.answer_field, columns, cfg.data.encoding)


def _row_failed(ctx: StageContext, failure: RowFailure) -> Exception:
    """A held-out row's failure, named by its file and line: a RewardError stays one (its resume advice holds)."""
    if ctx.stage.name == "rm":
        rows, info = _preference(ctx)
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


def score(ctx: StageContext, model: Any, tokenizer: Any, synced: bool = False) -> dict[str, float]:
    """eval_accuracy (and eval_reward or eval_margin) of a live model: a policy on the run's held-out prompts, a
    reward model on the held-out preference pairs. `synced` keeps sharded (FSDP) ranks generating in step."""
    try:
        return _score(ctx, model, tokenizer, synced)
    except RowFailure as e:
        raise _row_failed(ctx, e) from e.cause


def _score(ctx: StageContext, model: Any, tokenizer: Any, synced: bool) -> dict[str, float]:
    was_training = model.training
    try:
        if ctx.stage.name == "rm":
            _, held = preference_split(ctx)
            return evaluate.score_reward_model(model, tokenizer, held[: ctx.settings.eval_samples])
        cfg = ctx.cfg
        rows, info = _eval(ctx)
        rows = rows[: cfg.rl.eval_samples]
        guarded = rewards.stage_rewards(cfg.rl.rewards, cfg.data.answer_field, {}, ctx.notify)
        fns = [(fn, r.weight) for fn, r in zip(guarded, cfg.rl.rewards, strict=True) if fn is not None]
        accuracy = scoring.accuracy_name(cfg.rl.rewards, info.format)
        agent = multiturn.agent_for(cfg.rl, tokenizer) if "rl" in cfg.stages else None  # eval as RL will roll out
        return evaluate.score_policy(
            model, tokenizer, rows, fns, cfg.data.answer_field, cfg.rl.max_new_tokens, synced, accuracy, agent
        )
    finally:
        model.train(was_training)


def can_score(ctx: StageContext) -> bool:
    """Reward models always have held-out pairs; policies need the run's eval data."""
    return ctx.stage.name == "rm" or "eval" in ctx.data


def score_saved(ctx: StageContext, path: str) -> dict[str, float]:
    """Held-out metrics of the model saved at `path` (the stage's final folder, or the base model)."""
    tok = models.tokenizer(ctx, path)
    if ctx.stage.name == "rm":
        model = models.reward_model(ctx, path, tok.pad_token_id, trainable=False)
    else:
        model = models.causal_lm(ctx, path, trainable=False)
    return score(ctx, model.to(ctx.device), tok)


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
    metric = None
    if keep_best and (ctx.is_main or sharded):
        scores = score(ctx, model, tokenizer, synced=sharded)
        metric = {"metric": "eval_accuracy", "value": scores["eval_accuracy"]}
        ctx.log.write(stage=ctx.stage.name, step=step, event="checkpoint", **scores)
    if ctx.is_main:
        checkpoint.publish(ctx.checkpoints, step, metric, ctx.cfg.checkpoint.keep_last, keep_best)
    _barrier()
    memory_probe.lap("checkpoint")  # the save and its held-out scoring

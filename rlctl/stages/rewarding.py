"""The RL stage's reward sources, shared by TRL's trainers (rlctl.stages.rl) and rlctl's loop
(rlctl.stages.rl_loop): rl.rewards resolved to functions (in worker processes with deadlines, guarded by their
on_error) or the trained reward model, and DAPO's overlong buffer in tokens."""

from __future__ import annotations

from rlctl import rewards
from rlctl.plan import final_dir
from rlctl.stages import models
from rlctl.stages.context import StageContext


def reward_sources(ctx: StageContext, errors: dict[str, int]) -> tuple[list, list, list[float]]:
    """(reward functions or models, their tokenizers, weights) in the order of rl.rewards; each function runs
    in its worker with its deadline, its failures follow its `on_error`, counted per reward name in `errors`."""
    funcs, tokenizers, weights = [], [], []
    guarded = rewards.stage_rewards(ctx.cfg.rl.rewards, ctx.cfg.data.answer_field, errors, ctx.notify)
    for spec, fn in zip(ctx.cfg.rl.rewards, guarded, strict=True):
        if fn is None:
            path = str(final_dir(ctx.run_dir, "rm"))
            tok = models.tokenizer(ctx, path)
            funcs.append(models.reward_model(ctx, path, tok.pad_token_id, trainable=False))
            tokenizers.append(tok)
        else:
            funcs.append(fn)
            tokenizers.append(None)
        weights.append(spec.weight)
    return funcs, tokenizers, weights


def overlong_buffer_tokens(ctx: StageContext) -> int:
    """DAPO's soft-overlong buffer in tokens (rl.overlong_buffer is a fraction of max_new_tokens); 0 = off."""
    rl = ctx.cfg.rl
    return round(rl.overlong_buffer * rl.max_new_tokens) if rl.overlong_buffer else 0

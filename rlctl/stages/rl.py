"""The RL stage: the policy starts from the SFT output (or the base model) and is scored by rule-based rewards,
user plugins and, optionally, the reward model trained in the rm stage. rlctl's own loop (`rlctl.trainer.loop`)
trains every RL algorithm; the stage saves the policy it hands back to the stage's final folder."""

from __future__ import annotations

from rlctl.stages.common import StageContext, save_final


def run(ctx: StageContext) -> None:
    from rlctl.trainer import loop

    save_final(ctx, loop.train(ctx))

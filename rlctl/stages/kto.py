"""Offline unpaired preference optimisation through TRL's KTOTrainer (the reference is the starting policy).

KTO learns from single completions labelled desirable or undesirable. The data layer's `kto` role reads
data.preference either as KTO rows (`prompt`, `completion`, boolean `label`) or as preference pairs, each pair
becoming two rows: the chosen completion desirable, the rejected one undesirable. A tenth is held out, as in the
rm and dpo stages, and scored at the end (mean margin of desirable over undesirable implicit rewards).
"""

from __future__ import annotations

from rlctl.runtime import models
from rlctl.runtime.rows import preference_split
from rlctl.stages.common import kept_rows
from rlctl.stages.context import StageContext
from rlctl.stages.trl_common import score_held_out_pairs, train_causal_lm, training_args


def run(ctx: StageContext) -> None:
    from trl import KTOConfig, KTOTrainer

    tok = models.tokenizer(ctx.source())
    rows = kept_rows(ctx, tok)
    sc = ctx.settings
    args = training_args(
        ctx,
        KTOConfig,
        max_length=sc.max_length,
        beta=sc.beta,
        loss_type=sc.loss_type,
        desirable_weight=sc.desirable_weight,
        undesirable_weight=sc.undesirable_weight,
    )
    trainer = train_causal_lm(ctx, KTOTrainer, args, rows, tok)
    held = preference_split(ctx.stage_data(), "kto")[1][: sc.eval_samples]
    score_held_out_pairs(ctx, trainer, held, None)

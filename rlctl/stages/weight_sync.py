"""The weight-sync check of rlctl's loop: after every vLLM rollout, the trainer's and vLLM's log-probs of the tokens
vLLM sampled are compared over every process; a mean gap beyond rl.sync_tolerance stops the stage, naming the
likely causes. The math is `rlctl.algorithms.mismatch`."""

from __future__ import annotations

import torch
from torch import Tensor

from rlctl.algorithms.mismatch import logprob_gap
from rlctl.runtime.context import StageContext


def sync_check(ctx: StageContext, acc, train: Tensor, rollout: Tensor, mask: Tensor, step: int) -> dict:
    """The weight-sync check: trainer vs vLLM log-probs of the tokens vLLM just sampled, over every process;
    a mean gap beyond rl.sync_tolerance stops the stage."""
    mean, worst = logprob_gap(train, rollout, mask)
    both = acc.gather(torch.tensor([[mean, worst]], device=acc.device))
    mean, worst = float(both[:, 0].mean()), float(both[:, 1].max())
    tolerance = ctx.cfg.rl.sync_tolerance
    if tolerance and mean > tolerance:
        raise ctx.sync_stopped(step, mean, worst, untrained=True)
    return {"sync_logp_diff_mean": mean, "sync_logp_diff_max": worst}

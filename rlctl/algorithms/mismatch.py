"""Where the rollout engine and the trainer disagree: the weight-sync check and rollout-training mismatch
correction, as pure functions on [batch, tokens] tensors.

vLLM samples with its own kernels (and its own copy of the weights, pushed from the trainer before each rollout),
so its log-probability of a sampled token differs a little from the trainer's: rounding and kernel order. A
difference much larger than that means the engine generated with weights other than the policy's - a sync that
did not happen, a tensor pushed wrong, LoRA adapters pushed unmerged - and training on such rollouts corrupts the
policy silently. `logprob_gap` measures it after every sync; `correction_weights` turns the honest part of it into
importance weights on the loss (truncated importance sampling, Yao et al. 2025; TRL's and verl's rollout
correction), so the update stays on-policy for the trainer's own distribution. Async rounds, sampled by a policy
versions behind the trainer, take the PPO loss's ratio against that behaviour policy instead (`behaviour_ratio`).
"""

from __future__ import annotations

import torch
from torch import Tensor

CORRECTION_MODES = ("token_truncate", "sequence_mask", "off")


def logprob_gap(train: Tensor, rollout: Tensor, mask: Tensor) -> tuple[float, float]:
    """Mean and max |log π_train - log π_rollout| over the masked (sampled) tokens."""
    gap = (train - rollout).abs() * mask
    tokens = mask.sum()
    if tokens == 0:
        return 0.0, 0.0
    return float(gap.sum() / tokens), float(gap.max())


def correction_weights(
    train: Tensor, rollout: Tensor, mask: Tensor, mode: str, cap: float
) -> tuple[Tensor, dict[str, float]]:
    """Per-token weights on the policy loss and their metrics.

    token_truncate: w_t = min(exp(log π_train - log π_rollout), cap)   (TIS, token level)
    sequence_mask:  w = 1 if exp(sum_t (log π_train - log π_rollout)) lies in [1 / cap, cap] else 0, per sequence
    off:            w = 1
    """
    if mode == "off":
        return torch.ones_like(mask), {}
    log_ratio = (train - rollout) * mask
    if mode == "token_truncate":
        ratio = torch.exp(log_ratio)
        weights = ratio.clamp(max=cap) * mask
        clipped = ((ratio > cap) & (mask > 0)).float()
        share = float(clipped.sum() / mask.sum().clamp(min=1))
        tokens = ratio[mask > 0]
        metrics = {"is_ratio_mean": _mean(tokens), "is_ratio_min": _min(tokens), "is_ratio_max": _max(tokens)}
        return weights, {**metrics, "is_clipped_frac": share}
    if mode == "sequence_mask":
        seq = torch.exp(log_ratio.sum(-1))
        keep = ((seq >= 1 / cap) & (seq <= cap)).float()
        rows = mask.sum(-1) > 0
        share = float((1 - keep)[rows].mean()) if rows.any() else 0.0
        metrics = {"is_ratio_mean": _mean(seq[rows]), "is_ratio_min": _min(seq[rows]), "is_ratio_max": _max(seq[rows])}
        return keep[:, None] * mask, {**metrics, "is_masked_frac": share}
    raise ValueError(f"unknown rollout correction mode {mode!r}; valid: {', '.join(CORRECTION_MODES)}")


def behaviour_ratio(
    train: Tensor, rollout: Tensor, mask: Tensor, mode: str, cap: float, policy_loss: str
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """An async round's PPO reference log-probs, per-token weights and metrics (`correction_weights`' metrics).

    The round was sampled by the generator with a policy up to max_staleness versions behind the trainer's
    (`train`, before this update); `rollout` is that behaviour policy. With the token-level PPO loss (`ppo`) and
    a correction on, the ratio is π_θ / π_rollout, so its clip is a trust region around the policy that sampled: a
    token the updates since sampling already moved beyond 1 ± ε in its advantage's direction is pushed no further
    (standard off-policy PPO; against the trainer's policy with one update per step the clip never acts, and a
    stale round pushes again what the last update pushed). The ratio then carries the importance weight itself,
    so token_truncate adds none; sequence_mask still drops the sequences whose ratio lies outside [1 / cap, cap].
    Otherwise the ratio stays against `train` with `correction_weights`: off treats the round as on-policy; gspo's
    sequence clip (3e-4 wide) is sized for the drift between one batch's mini-batches and would clip most of a
    stale round; cispo's capped weight never stops a gradient, so there is no trust region to move.
    """
    weights, metrics = correction_weights(train, rollout, mask, mode, cap)
    if mode == "off" or policy_loss != "ppo":
        return train, weights, metrics
    if mode == "token_truncate":
        weights = torch.ones_like(mask)
    return rollout, weights, metrics


def _mean(x: Tensor) -> float:
    return float(x.mean()) if x.numel() else 1.0


def _min(x: Tensor) -> float:
    return float(x.min()) if x.numel() else 1.0


def _max(x: Tensor) -> float:
    return float(x.max()) if x.numel() else 1.0

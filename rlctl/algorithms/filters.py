"""Sample filters and reward shaping: DAPO dynamic sampling and overlong shaping, PF-PPO policy filtration.

All functions are pure and work on per-sample ``[B]`` tensors (sequence scores, lengths, group ids).
"""

from __future__ import annotations

import torch
from torch import Tensor

PF_PPO_MODES: tuple[str, ...] = ("pow", "max_min", "max_random")


def groups_with_variance(rewards: Tensor, index: Tensor) -> Tensor:
    """DAPO dynamic sampling (Yu et al. 2025, arXiv 2503.14476, eq. 8 constraint
    ``0 < |{o_i correct}| < G``): a bool ``[B]`` mask, True for samples whose group (same ``index``) has
    non-identical rewards. Groups whose rewards are all equal (all right, all wrong, or a single sample) give
    zero group-relative advantage, so they are dropped (and more prompts sampled) by the caller.
    """
    groups, inverse = torch.unique(index, return_inverse=True)
    n_groups = groups.numel()
    group_max = rewards.new_full((n_groups,), -torch.inf).scatter_reduce(0, inverse, rewards, reduce="amax")
    group_min = rewards.new_full((n_groups,), torch.inf).scatter_reduce(0, inverse, rewards, reduce="amin")
    return (group_max > group_min)[inverse]


def overlong_penalty(lengths: Tensor, max_len: int, buffer_len: int, penalty_factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13), to be *added* to the reward.

    With ``L_exp = max_len - buffer_len``: 0 if ``|y| ≤ L_exp``; ``(L_exp - |y|) / buffer_len`` inside the
    buffer (linear from 0 to -1); -1 beyond ``max_len``; all multiplied by ``penalty_factor`` (verl's
    ``overlong_buffer.penalty_factor``; verl does not clamp at -1 because it never sees ``|y| > max_len``).
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"need 0 < buffer_len <= max_len, got buffer_len={buffer_len}, max_len={max_len}")
    expected = max_len - buffer_len
    penalty = ((expected - lengths.to(torch.float32)) / buffer_len).clamp(min=-1.0, max=0.0)
    return penalty * penalty_factor


def pf_ppo_weights(scores: Tensor, mode: str, weight_pow: float = 2.0) -> Tensor:
    """PF-PPO sample weights (Shen et al. 2024, "Policy Filtration in RLHF to Fine-Tune LLM for Code
    Generation", arXiv 2409.06957), exactly as verl's ``compute_pf_ppo_reweight_data`` computes them from the
    per-sample scores of the *whole batch* (the paper filters per prompt; verl, and we, filter per batch):

    * ``pow``: ``w = |score| ** weight_pow``: favours samples with confident (large-magnitude) rewards.
    * ``max_min`` (paper's best-worst, BW): ``w = 1`` for samples whose score equals the batch max or the
      batch min, else 0: only the best and worst responses are kept.
    * ``max_random`` (paper's best-random, BR): ``w = 0.4`` for samples at the batch max, 0.1 for all others:
      the best responses are up-weighted, the rest are kept at random.
    """
    if mode == "pow":
        return scores.abs().pow(weight_pow)
    if mode == "max_min":
        return ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    if mode == "max_random":
        return torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    raise ValueError(f"unknown PF-PPO mode {mode!r}; expected one of {PF_PPO_MODES}")


def pf_ppo_resample(
    scores: Tensor, mode: str, *, weight_pow: float = 2.0, generator: torch.Generator | None = None
) -> Tensor:
    """PF-PPO policy filtration by resampling (as verl): draw ``B`` sample indices with replacement,
    ``P(i) ∝ pf_ppo_weights(scores)[i] + 1e-8`` (the floor keeps zero-weight samples drawable with negligible
    probability and avoids an all-zero distribution). Index the batch with the result.
    """
    weights = pf_ppo_weights(scores, mode, weight_pow) + 1e-8
    return torch.multinomial(weights, scores.shape[0], replacement=True, generator=generator)

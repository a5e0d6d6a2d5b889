"""Per-token KL estimators, KL-in-reward shaping and KL coefficient controllers.

Estimators are called as ``kl = fn(logp, ref_logp)`` on ``[B, T]`` log-probs of the *sampled* tokens and
estimate ``KL(π_θ ‖ π_ref)`` from samples of ``π_θ`` (Schulman 2020, "Approximating KL Divergence",
http://joschu.net/blog/kl-approx.html). With ``log r = ref_logp - logp``:

* ``k1 = -log r``: unbiased, high variance, can be negative (verl "kl"/"k1").
* ``k2 = ½ (log r)²``: biased, low variance, ≥ 0; its gradient is the true reverse-KL gradient (verl "mse").
* ``k3 = (r - 1) - log r``: unbiased, low variance, ≥ 0 (verl "low_var_kl"; the GRPO paper's KL term and
  TRL ``GRPOTrainer``'s ``beta`` term).
* ``abs = |log r|``.

The log-ratio is clamped to ``[-20, 20]`` before ``exp`` in ``k3`` (verl also clamps; it additionally clips
the result to ±10, which we do not).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

KLFn = Callable[[Tensor, Tensor], Tensor]
KL_ESTIMATORS: dict[str, KLFn] = {}


def register_kl(name: str) -> Callable[[KLFn], KLFn]:
    """Register a per-token KL estimator under ``name`` in ``KL_ESTIMATORS``."""

    def decorator(fn: KLFn) -> KLFn:
        if name in KL_ESTIMATORS:
            raise ValueError(f"KL estimator {name!r} is already registered")
        KL_ESTIMATORS[name] = fn
        return fn

    return decorator


@register_kl("k1")
def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``k1 = logp - ref_logp`` (Schulman 2020, k1)."""
    return logp - ref_logp


@register_kl("k2")
def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``k2 = ½ (logp - ref_logp)²`` (Schulman 2020, k2; a.k.a. "mse")."""
    return 0.5 * (logp - ref_logp) ** 2


@register_kl("k3")
def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1`` (Schulman 2020, k3; DeepSeekMath eq. 4)."""
    log_r = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.expm1(log_r) - log_r


@register_kl("abs")
def abs_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``|logp - ref_logp|`` (verl "abs")."""
    return (logp - ref_logp).abs()


def kl_penalty_rewards(token_rewards: Tensor, kl: Tensor, coef: float, mask: Tensor | None = None) -> Tensor:
    """Fold a per-token KL penalty into the rewards: ``r'_t = r_t - β · KL_t`` (Ziegler et al. 2019,
    arXiv 1909.08593, ``R = r - β log(π/ρ)``; Ouyang et al. 2022; REINFORCE++).

    If ``mask`` is given, the KL at masked positions is zeroed first, so padding never adds a penalty.
    """
    if mask is not None:
        kl = kl * mask.to(kl.dtype)
    return token_rewards - coef * kl


class FixedKLController:
    """Constant KL coefficient ``β``; ``update`` is a no-op (same interface as ``AdaptiveKLController``)."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Keep ``β`` unchanged."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences",
    arXiv 1909.08593):

    ``e = clip(KL / KL_target - 1, -0.2, 0.2)``, ``β ← β · (1 + K_β · e)`` with ``K_β = n_steps / horizon``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ValueError("target_kl and horizon must be positive")
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``β`` towards the value that keeps the observed KL at ``target_kl``."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

"""Policy losses, the PPO value loss, VAPO's positive-example LM loss and the one loss-aggregation function they
all use.

Every policy loss is called as::

    loss, metrics = fn(logp, old_logp, advantages, mask, cfg=cfg)

with ``[B, T]`` tensors (``logp`` carries the gradient; ``old_logp`` and ``advantages`` are constants) and
returns a scalar loss to *minimise* plus a ``dict[str, float]`` of metrics. Masked tokens never reach the loss
or the metrics. Log-ratios are clamped to ``[-20, 20]`` before ``exp`` for numerical safety (as verl).

Mapping to TRL 1.16 ``GRPOTrainer`` (``_compute_loss``), for deciding which variants TRL covers:

* ``ppo`` ≈ TRL ``loss_type`` in {grpo, bnpo, dr_grpo, dapo} (same two-sided clip with ``epsilon`` /
  ``epsilon_high``); they differ only in aggregation, see ``agg_loss``. TRL has no dual-clip; its ``delta``
  (INTELLECT-2) instead caps the unclipped ratio for *all* advantages.
* ``gspo`` = TRL ``importance_sampling_level="sequence"`` with ``loss_type="grpo"``: TRL differentiates
  through ``exp(mean_t log r_t)`` directly; for advantages that are constant over a sequence the gradient is
  identical to the GSPO-token form used here.
* ``cispo`` = TRL ``loss_type="cispo"`` when ``cispo_min=None``: TRL clamps the ratio at ``max=epsilon_high``
  (an absolute bound, recommended 5.0) which is our ``cispo_max``. verl instead clips to ``1 ± clip_ratio``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlctl.algorithms.advantages import masked_mean, zero_masked

AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)

PolicyLossFn = Callable[..., tuple[Tensor, dict[str, float]]]
POLICY_LOSSES: dict[str, PolicyLossFn] = {}

_LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class PolicyLossConfig:
    """Hyper-parameters shared by all policy losses (each reads only what it needs).

    clip_low / clip_high: ratio clipped to ``[1 - clip_low, 1 + clip_high]`` (``ppo``, ``gspo``); unequal
    values are DAPO's clip-higher (0.2 / 0.28). GSPO's paper uses 3e-4 / 4e-4 (sequence ratios are tight).
    dual_clip_c: dual-clip constant ``c > 1`` bounding the loss of negative-advantage tokens (``ppo``,
    ``gspo``); None disables it.
    cispo_min / cispo_max: absolute bounds on the CISPO importance weight (``1 - ε_low^IS`` and
    ``1 + ε_high^IS`` in MiniMax-M1); ``cispo_min=None`` means no lower bound, as in the paper.
    loss_agg_mode: one of ``AGG_MODES``. norm_len: the constant of ``seq-mean-token-sum-norm``.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    cispo_min: float | None = None
    cispo_max: float = 5.0
    loss_agg_mode: str = "token-mean"
    norm_len: int | None = None

    def __post_init__(self) -> None:
        if self.loss_agg_mode not in AGG_MODES:
            raise ValueError(f"loss_agg_mode must be one of {AGG_MODES}, got {self.loss_agg_mode!r}")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1.0:
            raise ValueError(f"dual_clip_c must be > 1, got {self.dual_clip_c}")
        if self.cispo_min is not None and self.cispo_min >= self.cispo_max:
            raise ValueError("cispo_min must be smaller than cispo_max")


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register a policy loss under ``name`` in ``POLICY_LOSSES``."""

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return decorator


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: str, *, norm_len: int | None = None) -> Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar over the valid tokens.

    * ``token-mean``: ``Σ_{i,t} m·l / Σ_{i,t} m`` (DAPO eq. 8 token-level loss; TRL ``dapo``/``bnpo``).
    * ``seq-mean-token-mean``: mean over sequences of the per-sequence token mean (GRPO, DeepSeekMath eq. 3;
      TRL ``grpo``).
    * ``seq-mean-token-sum``: mean over sequences of the per-sequence token sum.
    * ``seq-mean-token-sum-norm``: ``Σ_{i,t} m·l / (B · norm_len)`` with a constant ``norm_len`` (default
      ``T``; pass the max response length): Dr. GRPO (Liu et al. 2025, arXiv 2503.20783), same as TRL ``dr_grpo``
      (``/ (B · max_completion_length)``). verl divides by ``norm_len`` only, i.e. ``B`` times larger.

    The ``seq-mean-*`` modes average only over sequences with at least one valid token (as verl);
    ``seq-mean-token-sum-norm`` counts every row, fully masked ones included. An empty mask gives 0.
    """
    masked = zero_masked(loss_mat, mask)
    mask = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if mode == "seq-mean-token-sum-norm":
        return masked.sum() / (loss_mat.shape[0] * (norm_len or loss_mat.shape[-1]))
    tokens_per_seq = mask.sum(-1)
    seq_valid = (tokens_per_seq > 0).to(loss_mat.dtype)
    if mode == "seq-mean-token-mean":
        seq_loss = masked.sum(-1) / tokens_per_seq.clamp(min=1.0)
    elif mode == "seq-mean-token-sum":
        seq_loss = masked.sum(-1)
    else:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {AGG_MODES}")
    return (seq_loss * seq_valid).sum() / seq_valid.sum().clamp(min=1.0)


def loss_units(mask: Tensor, mode: str) -> Tensor:
    """What `agg_loss(mode)` divides by: tokens (token-mean), non-empty sequences (seq-mean-*), or rows
    (seq-mean-token-sum-norm). Weighting each micro-batch by units / total units makes the accumulated gradient
    that of the loss aggregated over the whole mini-batch, across processes."""
    if mode == "token-mean":
        return mask.sum()
    if mode == "seq-mean-token-sum-norm":
        return torch.tensor(float(mask.shape[0]), device=mask.device)
    return (mask.sum(-1) > 0).sum().float()


def _approx_kl(log_ratio: Tensor, mask: Tensor) -> float:
    """Schulman's k3 estimate of KL(π_old ‖ π_θ) from samples of π_old: ``mean((r - 1) - log r)``, ≥ 0."""
    return masked_mean(torch.expm1(log_ratio) - log_ratio, mask).item()


def _clipped_surrogate(
    ratio: Tensor, advantages: Tensor, mask: Tensor, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, float]]:
    """Per-token PPO-clip loss ``max(-A·r, -A·clip(r))``, then dual-clip ``min(·, -c·A)`` for A < 0 if set."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    metrics = {"clip_frac": masked_mean((clipped > unclipped).to(ratio.dtype), mask).item()}
    if cfg.dual_clip_c is not None:
        dual = -advantages * cfg.dual_clip_c
        dual_active = (advantages < 0) & (loss_mat > dual)
        loss_mat = torch.where(advantages < 0, torch.minimum(loss_mat, dual), loss_mat)
        metrics["dual_clip_frac"] = masked_mean(dual_active.to(ratio.dtype), mask).item()
    return loss_mat, metrics


@register_policy_loss("ppo")
def ppo(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017, "Proximal Policy Optimization", eq. 7).

    ``L = -min(r·A, clip(r, 1-ε_low, 1+ε_high)·A)`` with ``r = exp(logp - old_logp)``. Asymmetric
    ``clip_low``/``clip_high`` is DAPO's clip-higher (Yu et al. 2025, arXiv 2503.14476, eq. 8). With
    ``dual_clip_c`` the loss of ``A < 0`` tokens is additionally capped at ``-c·A``, i.e. the objective is
    ``max(min(r·A, clip(r)·A), c·A)`` (Ye et al. 2020, "Mastering Complex Control in MOBA Games",
    arXiv 1912.09729, dual-clip PPO), so a huge ratio cannot blow it up.
    Metrics: clip_frac, dual_clip_frac (only with dual-clip), approx_kl.
    """
    log_ratio = torch.clamp(logp - old_logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    loss_mat, metrics = _clipped_surrogate(torch.exp(log_ratio), advantages, mask, cfg)
    metrics["approx_kl"] = _approx_kl(log_ratio.detach(), mask)
    return agg_loss(loss_mat, mask, cfg.loss_agg_mode, norm_len=cfg.norm_len), metrics


@register_policy_loss("gspo")
def gspo(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, float]]:
    """GSPO-token (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071: GSPO
    objective and its GSPO-token variant).

    Sequence ratio ``s_i = exp(mean_t (logp - old_logp))`` (geometric mean of the token ratios) and the
    token-level form ``s_{i,t} = sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]``: its value is ``s_i`` at every token and
    ``∂ s_{i,t} / ∂ logp_{i,t} = s_i``, so an unclipped token's gradient is ``-s_i · A_{i,t} · w_{i,t}``
    (``w`` = the aggregation weight, ``1 / (n_seq · |y_i|)`` for the paper's ``seq-mean-token-mean``).
    Clipping acts on ``s_i``, hence on whole sequences.
    Metrics: clip_frac (token-weighted), dual_clip_frac (only with dual-clip), approx_kl (token level).
    """
    log_ratio = torch.clamp(logp - old_logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).detach()
    seq_log_ratio = zero_masked(log_ratio, mask).sum(-1) / mask.to(logp.dtype).sum(-1).clamp(min=1.0)
    token_ratio = torch.exp(seq_log_ratio.unsqueeze(-1) + logp - logp.detach())
    loss_mat, metrics = _clipped_surrogate(token_ratio, advantages, mask, cfg)
    metrics["approx_kl"] = _approx_kl(log_ratio, mask)
    return agg_loss(loss_mat, mask, cfg.loss_agg_mode, norm_len=cfg.norm_len), metrics


@register_policy_loss("cispo")
def cispo(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, float]]:
    """CISPO (MiniMax 2025, "MiniMax-M1", arXiv 2506.13585): clip the IS weight, not the update.

    ``L = -sg[clip(r, cispo_min, cispo_max)] · A · logp``: every token keeps a gradient
    ``-clip(r)·A`` w.r.t. its log-prob (no token is dropped, unlike PPO clipping). Metrics: clip_frac
    (fraction of tokens whose weight was clipped), approx_kl.
    """
    log_ratio = torch.clamp(logp - old_logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).detach()
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, min=cfg.cispo_min, max=cfg.cispo_max)
    loss_mat = -weight * advantages * logp
    metrics = {
        "clip_frac": masked_mean((weight != ratio).to(logp.dtype), mask).item(),
        "approx_kl": _approx_kl(log_ratio, mask),
    }
    return agg_loss(loss_mat, mask, cfg.loss_agg_mode, norm_len=cfg.norm_len), metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_range: float,
    loss_agg_mode: str = "token-mean",
    norm_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped value loss (OpenAI baselines ``ppo2``, Schulman et al. 2017; as verl / TRL ``PPOTrainer``).

    ``V_clip = old_V + clip(V - old_V, -ε_v, ε_v)``, ``L = 0.5 · agg(max((V - R)², (V_clip - R)²))``.
    Metrics: vf_clip_frac (tokens where the clipped error is the larger one).
    """
    values_clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    err = (values - returns) ** 2
    err_clipped = (values_clipped - returns) ** 2
    loss = 0.5 * agg_loss(torch.maximum(err, err_clipped), mask, loss_agg_mode, norm_len=norm_len)
    metrics = {"vf_clip_frac": masked_mean((err_clipped > err).to(values.dtype), mask).item()}
    return loss, metrics


def positive_lm_loss(logp: Tensor, mask: Tensor, correct: Tensor) -> Tensor:
    """VAPO's positive-example LM loss (Yue et al. 2025, arXiv 2504.05118, §3.4, eq. 9; Self-Imitation Learning,
    Oh et al. 2018): the next-token loss of the completions the verifier scored correct,
    ``L_NLL = −Σ_{i∈T} Σ_t m·logp / Σ_{i∈T} Σ_t m`` over the set ``T`` of correct samples (``correct``: ``[B]``,
    1 or True for those), a token mean as VAPO's policy loss; 0 when no sample is correct. The policy minimises
    ``L_PPO + μ·L_NLL`` (μ = ``rl.loss.lm_coef``, 0.1 in the paper). Incorrect samples get no gradient."""
    positive = mask * correct.to(mask.dtype).unsqueeze(-1)
    return agg_loss(-logp, positive, "token-mean")

"""Advantage estimators: one registry, one signature.

Every estimator is called as::

    advantages, returns = fn(token_rewards, mask, index=index, values=..., baseline=..., cfg=cfg)

with ``token_rewards``/``mask`` of shape ``[B, T]`` (response tokens only), ``index`` a ``[B]`` integer
tensor holding the group (prompt) id of each sample, ``values`` the critic's ``[B, T]`` predictions (``gae``
only) and ``baseline`` a ``[B]`` reward of a baseline response (``remax`` only). Both outputs are
``[B, T]`` and are exactly zero wherever ``mask`` is zero. ``gae`` takes its λ per sample (``gae_lambdas``:
one λ, or VAPO's length-adaptive λ from each sample's length) and may fit the critic to returns of another λ
(VAPO's decoupled GAE); ``returns_to_go`` is the Monte-Carlo return (the critic's target in value pretraining).

Conventions (as in verl's ``core_algos.py``):

* A sequence-level reward (outcome reward) is given as ``token_rewards`` that hold the score on the last valid
  token and zeros elsewhere. Outcome estimators use the masked row sum ``(token_rewards * mask).sum(-1)`` as
  the sample's score, so rewards sitting on padding never count.
* Masked positions inside a response (padding, or tool/observation tokens in multi-turn rollouts) are
  transparent for the recursive estimators (``gae``, ``reinforce_pp``, ``remax``): they add no reward, are not
  discounted over, and the recursion carries straight through them.
* Groups of size 1 get a zero group-centred advantage (``grpo``, ``dr_grpo``, ``rloo``,
  ``reinforce_pp_baseline`` before whitening): a lone sample has no peer to form a baseline from, so it
  carries no learning signal. This matches TRL (``num_generations=1`` gives ``r - mean = 0``) and differs from
  verl, which uses mean 0 / std 1 for singletons and so passes the raw reward through.

Estimators run under ``torch.no_grad()``: advantages and returns are regression/weighting targets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

AdvantageFn = Callable[..., tuple[Tensor, Tensor]]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}


@dataclass(frozen=True)
class AdvantageConfig:
    """Hyper-parameters shared by all advantage estimators (each reads only what it needs).

    gamma: discount factor (``gae``, ``reinforce_pp``). lam: GAE λ of the policy's advantages (``gae``).
    lam_alpha: VAPO's length-adaptive GAE, ``λ_i = 1 − 1/(α·l_i)`` per sample of length ``l_i`` instead of
    ``lam``; None = off. short_lam: the λ of responses too short for that formula (``l ≤ 1/α``, where it gives
    λ ≤ 0; see ``length_adaptive_lam``); None = ``lam``.
    critic_lam: VAPO's decoupled GAE, the λ of the critic's targets ``returns`` (1.0: Monte-Carlo returns);
    None = the policy's λ (coupled, as PPO).
    norm_by_std: divide the group-centred reward by the group std (``grpo`` only).
    whiten: masked batch whitening of the GAE advantages (``gae`` only; verl and TRL's PPO both do it).
    eps: added to the group std before dividing (``grpo``).
    """

    gamma: float = 1.0
    lam: float = 1.0
    lam_alpha: float | None = None
    short_lam: float | None = None
    critic_lam: float | None = None
    norm_by_std: bool = True
    whiten: bool = True
    eps: float = 1e-4


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an advantage estimator under ``name`` in ``ADVANTAGE_ESTIMATORS``."""

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return decorator


def zero_masked(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` where ``mask`` is non-zero, exact 0 elsewhere (even if the padding holds inf/NaN)."""
    return torch.where(mask.bool(), values, torch.zeros_like(values))


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over positions where ``mask`` is non-zero (0 if the mask is empty)."""
    return zero_masked(values, mask).sum() / mask.to(values.dtype).sum().clamp(min=1.0)


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` with mean and unbiased variance over the mask; zero where masked.

    Same statistics as verl's ``masked_whiten`` (Bessel-corrected variance); with a single valid element the
    variance is taken as 0 instead of raising.
    """
    mean = masked_mean(values, mask)
    return zero_masked((values - mean) * torch.rsqrt(masked_var(values, mask) + eps), mask)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 − Var(R − V) / Var(R)`` over the valid tokens: 1 when the critic predicts its targets exactly, 0 when it
    does no better than their mean, negative when worse (VAPO's value-pretraining gauge, with the value loss; verl's
    ``critic/vf_explained_var``). NaN when the targets do not vary."""
    var = masked_var(returns, mask)
    return float(1.0 - masked_var(returns - values, mask) / var) if var > 0 else float("nan")


def masked_var(values: Tensor, mask: Tensor) -> Tensor:
    """The masked, Bessel-corrected variance ``masked_whiten`` divides by."""
    n = mask.to(values.dtype).sum()
    return zero_masked((values - masked_mean(values, mask)) ** 2, mask).sum() / (n - 1).clamp(min=1.0)


def _scores(token_rewards: Tensor, mask: Tensor) -> Tensor:
    """Per-sample outcome score: the masked row sum of the token rewards, ``[B]``."""
    return zero_masked(token_rewards, mask).sum(-1)


def _group_stats(scores: Tensor, index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample (group size, group mean, unbiased group std) broadcast back to ``[B]``.

    A singleton group has mean equal to its only score and std 0.
    """
    groups, inverse = torch.unique(index, return_inverse=True)
    n_groups = groups.numel()
    zeros = scores.new_zeros(n_groups)
    count = zeros.index_add(0, inverse, torch.ones_like(scores))
    mean = zeros.index_add(0, inverse, scores) / count.clamp(min=1.0)
    sq_dev = zeros.index_add(0, inverse, (scores - mean[inverse]) ** 2)
    std = (sq_dev / (count - 1).clamp(min=1.0)).sqrt()
    return count[inverse], mean[inverse], std[inverse]


def returns_to_go(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """``G_t = r_t + γ G_{t+1}`` over valid tokens only (masked tokens are skipped, their output is 0): the
    Monte-Carlo return, which VAPO's value pretraining fits the critic to."""
    valid = mask.bool()
    running = token_rewards.new_zeros(token_rewards.shape[0])
    returns = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(valid[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return zero_masked(returns, mask)


def _broadcast(per_sample: Tensor, mask: Tensor) -> Tensor:
    """Spread a ``[B]`` value over the valid tokens of each row."""
    return zero_masked(per_sample.unsqueeze(-1).expand(mask.shape), mask)


def length_adaptive_lam(lengths: Tensor, alpha: float, short: float) -> Tensor:
    """VAPO's length-adaptive GAE λ (Yue et al. 2025, arXiv 2504.05118, §3.2): ``λ = 1 − 1/(α·l)`` for a response
    of ``l`` tokens, so that the TD errors a token's advantage sums over span an effective horizon
    ``1/(1 − λ) = α·l`` tokens, a fixed share of the response whatever its length.

    The formula gives a λ in (0, 1) only for ``l > 1/α`` (20 tokens at α = 0.05); a response of at most ``1/α``
    tokens (an empty one included) would get λ ≤ 0, a horizon under one token (and λ < 0 weighs the n-step
    estimates with alternating signs). Those responses get ``short`` instead: rlctl's ``rl.returns.short_lam``,
    by default the non-adaptive λ_policy (``rl.returns.lam``); 0 is AReaL's and NeMo-RL's clamp (TD(0)).
    """
    formula = 1.0 - 1.0 / (alpha * lengths.to(torch.float32).clamp(min=1.0))
    return torch.where(formula > 0, formula, torch.full_like(formula, float(short)))


def gae_lambdas(mask: Tensor, cfg: AdvantageConfig) -> Tensor:
    """The policy's GAE λ of each sample, ``[B]``: length-adaptive from the tokens the model wrote (``mask``'s row
    sums) when ``cfg.lam_alpha`` is set (responses too short for the formula at ``cfg.short_lam``, None:
    ``cfg.lam``), else ``cfg.lam`` for every sample."""
    if cfg.lam_alpha is not None:
        short = cfg.lam if cfg.short_lam is None else cfg.short_lam
        return length_adaptive_lam(mask.sum(-1), cfg.lam_alpha, short)
    return torch.full((mask.shape[0],), float(cfg.lam), dtype=torch.float32, device=mask.device)


def gae_recursion(token_rewards: Tensor, mask: Tensor, values: Tensor, gamma: float, lam: Tensor) -> Tensor:
    """GAE advantages with one λ per sample (``lam``: ``[B]``): ``δ_t = r_t + γV_{t+1} − V_t``,
    ``A_t = δ_t + γλ_i A_{t+1}`` over the valid tokens of row ``i`` (masked tokens are transparent), ``V`` after
    the last valid token = 0; zero where ``mask`` is."""
    valid = mask.bool()
    batch, length = token_rewards.shape
    lam = lam.to(token_rewards.dtype)
    next_value = token_rewards.new_zeros(batch)
    last_adv = token_rewards.new_zeros(batch)
    advantages = torch.zeros_like(token_rewards)
    for t in reversed(range(length)):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        last_adv = torch.where(valid[:, t], delta + gamma * lam * last_adv, last_adv)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        advantages[:, t] = last_adv
    return zero_masked(advantages, mask)


@register_advantage("gae")
@torch.no_grad()
def gae(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    index: Tensor,
    values: Tensor | None = None,
    baseline: Tensor | None = None,
    cfg: AdvantageConfig,
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation", eq. 16), with VAPO's per-sample and decoupled λ (Yue et al. 2025,
    arXiv 2504.05118, §3.1-3.2).

    ``δ_t = r_t + γ V_{t+1} - V_t``, ``A_t = δ_t + γλ_i A_{t+1}`` with ``λ_i = gae_lambdas(mask, cfg)[i]`` and
    ``V`` after the last valid token = 0. ``returns`` (the critic target, before whitening) is ``A + V`` of the same
    λ, or with ``cfg.critic_lam`` set, ``A' + V`` of a second recursion at that λ (decoupled GAE; at 1.0 the
    Monte-Carlo return ``returns_to_go``). Advantages are then masked-whitened over the batch if ``cfg.whiten``.
    ``index`` and ``baseline`` are unused.
    """
    if values is None:
        raise ValueError("gae needs `values` from the critic")
    lam = gae_lambdas(mask, cfg)
    advantages = gae_recursion(token_rewards, mask, values, cfg.gamma, lam)
    critic_adv = advantages
    if cfg.critic_lam is not None:
        critic_lam = torch.full_like(lam, float(cfg.critic_lam))
        critic_adv = gae_recursion(token_rewards, mask, values, cfg.gamma, critic_lam)
    returns = zero_masked(critic_adv + values, mask)
    if cfg.whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


@register_advantage("grpo")
@torch.no_grad()
def grpo(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    index: Tensor,
    values: Tensor | None = None,
    baseline: Tensor | None = None,
    cfg: AdvantageConfig,
) -> tuple[Tensor, Tensor]:
    """GRPO group-relative advantage (Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300, §4.1.2 outcome
    supervision: ``Â_{i,t} = r̃_i = (r_i - mean(r)) / std(r)``).

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` (std unbiased, as verl and TRL; dropped if
    ``not cfg.norm_by_std``), broadcast to every valid token; returns = advantages. eps=1e-4 as TRL's
    GRPOTrainer, the loop's test oracle (tests/test_trl_oracle.py); verl uses 1e-6.
    """
    scores = _scores(token_rewards, mask)
    _, mean, std = _group_stats(scores, index)
    adv = scores - mean
    if cfg.norm_by_std:
        adv = adv / (std + cfg.eps)
    advantages = _broadcast(adv, mask)
    return advantages, advantages


@register_advantage("dr_grpo")
@torch.no_grad()
def dr_grpo(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    index: Tensor,
    values: Tensor | None = None,
    baseline: Tensor | None = None,
    cfg: AdvantageConfig,
) -> tuple[Tensor, Tensor]:
    """Dr. GRPO advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783).

    ``A_i = r_i - mean_g(r)``: GRPO without the std division (which biases towards too easy/hard
    questions); ``cfg.norm_by_std`` is ignored. Pair with ``seq-mean-token-sum-norm`` aggregation.
    """
    scores = _scores(token_rewards, mask)
    _, mean, _ = _group_stats(scores, index)
    advantages = _broadcast(scores - mean, mask)
    return advantages, advantages


@register_advantage("rloo")
@torch.no_grad()
def rloo(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    index: Tensor,
    values: Tensor | None = None,
    baseline: Tensor | None = None,
    cfg: AdvantageConfig,
) -> tuple[Tensor, Tensor]:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740;
    Kool et al. 2019).

    ``A_i = r_i - mean_{j≠i} r_j = n/(n-1) · (r_i - mean_g(r))``; singleton groups get 0.
    """
    scores = _scores(token_rewards, mask)
    count, mean, _ = _group_stats(scores, index)
    adv = torch.where(count > 1, (scores - mean) * count / (count - 1).clamp(min=1.0), 0.0)
    advantages = _broadcast(adv, mask)
    return advantages, advantages


@register_advantage("reinforce_pp")
@torch.no_grad()
def reinforce_pp(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    index: Tensor,
    values: Tensor | None = None,
    baseline: Tensor | None = None,
    cfg: AdvantageConfig,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025, "REINFORCE++", arXiv 2501.03262: token-level KL in the reward,
    global advantage normalisation).

    ``G_t = Σ_{s≥t} γ^{s-t} r_s`` over valid tokens, where the caller has already folded the per-token KL
    penalty into ``token_rewards`` (see ``kl_penalty_rewards``); ``A = whiten_batch(G)``; returns = ``G``.
    """
    returns = returns_to_go(token_rewards, mask, cfg.gamma)
    return masked_whiten(returns, mask), returns


@register_advantage("reinforce_pp_baseline")
@torch.no_grad()
def reinforce_pp_baseline(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    index: Tensor,
    values: Tensor | None = None,
    baseline: Tensor | None = None,
    cfg: AdvantageConfig,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (Hu 2025, arXiv 2501.03262: group-mean baseline, then
    global normalisation).

    ``A_i = whiten_batch(r_i - mean_g(r))`` over all valid tokens of the batch; returns = advantages
    (as verl). Singleton groups enter the whitening with a centred reward of 0.
    """
    scores = _scores(token_rewards, mask)
    _, mean, _ = _group_stats(scores, index)
    advantages = masked_whiten(_broadcast(scores - mean, mask), mask)
    return advantages, advantages


@register_advantage("remax")
@torch.no_grad()
def remax(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    index: Tensor,
    values: Tensor | None = None,
    baseline: Tensor | None = None,
    cfg: AdvantageConfig,
) -> tuple[Tensor, Tensor]:
    """ReMax (Li et al. 2024, "ReMax", arXiv 2310.10505, Algorithm 1): reward minus greedy-response reward.

    ``G_t = Σ_{s≥t} r_s`` (undiscounted, as the paper and verl; ``cfg.gamma`` is not used),
    ``A_t = G_t - b`` with ``b = baseline[i]`` the reward of the greedy decode of the same prompt;
    returns = ``G``.
    """
    if baseline is None:
        raise ValueError("remax needs `baseline`: the reward of the greedy response, shape [B]")
    returns = returns_to_go(token_rewards, mask, 1.0)
    return returns - _broadcast(baseline.to(returns.dtype), mask), returns

"""Hand-checked tests for rlctl.algorithms: every expected number is worked out in the comment next to it."""

import math

import pytest
import torch

from rlctl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_NAMES,
    AGG_MODES,
    KL_ESTIMATORS,
    KL_NAMES,
    POLICY_LOSS_NAMES,
    POLICY_LOSSES,
    AdaptiveKLController,
    AdvantageConfig,
    FixedKLController,
    PolicyLossConfig,
    agg_loss,
    groups_with_variance,
    kl_penalty_rewards,
    masked_whiten,
    overlong_penalty,
    pf_ppo_resample,
    pf_ppo_weights,
    value_loss,
)

T = torch.tensor
GARBAGE = 1e4  # value written into padding: it must never reach a result


def close(actual: torch.Tensor, expected, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


def outcome_rewards(scores: list[float], lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rewards with each score on the last valid token and GARBAGE on padding, plus the mask."""
    mask = torch.zeros(len(scores), width)
    rewards = torch.full((len(scores), width), GARBAGE)
    for i, (score, n) in enumerate(zip(scores, lengths, strict=True)):
        mask[i, :n] = 1
        rewards[i, :n] = 0.0
        rewards[i, n - 1] = score
    return rewards, mask


def advantage(name: str, rewards, mask, index, cfg: AdvantageConfig | None = None, **kw):
    return ADVANTAGE_ESTIMATORS[name](rewards, mask, index=index, cfg=cfg or AdvantageConfig(), **kw)


# ----------------------------------------------------------------------------------------------- registries
def test_registries_and_name_tuples() -> None:
    advantages = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax")
    assert advantages == ADVANTAGE_NAMES
    assert POLICY_LOSS_NAMES == ("ppo", "gspo", "cispo")
    assert KL_NAMES == ("k1", "k2", "k3", "abs")
    assert AGG_MODES == ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


# -------------------------------------------------------------------------------------- outcome estimators
# Six samples, index [0, 1, 0, 2, 1, 0]: group 0 = samples 0, 2, 5 with scores 1, 2, 6; group 1 = samples 1, 4
# with scores 5, 5 (identical); group 2 = sample 3 alone (score 4). Lengths differ, padding holds GARBAGE.
SCORES, LENGTHS, INDEX = [1.0, 5.0, 2.0, 4.0, 5.0, 6.0], [4, 2, 3, 1, 4, 3], T([0, 1, 0, 2, 1, 0])


def per_sample(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Check the advantage is constant over each row's valid tokens and 0 on padding; return the constants."""
    first = adv[:, 0]
    close(adv, first.unsqueeze(-1) * mask)
    return first


def test_grpo_group_mean_and_std() -> None:
    rewards, mask = outcome_rewards(SCORES, LENGTHS, 4)
    adv, ret = advantage("grpo", rewards, mask, INDEX)
    # group 0: mean 3, deviations -2, -1, 3, unbiased var (4 + 1 + 9) / 2 = 7 -> A = dev / (sqrt(7) + 1e-4)
    # group 1: identical scores -> 0 / (0 + eps) = 0; group 2 (singleton) -> 0 by convention
    s7 = math.sqrt(7) + 1e-4
    close(per_sample(adv, mask), [-2 / s7, 0.0, -1 / s7, 0.0, 0.0, 3 / s7])
    assert torch.equal(adv, ret)


def test_grpo_without_std_equals_dr_grpo() -> None:
    rewards, mask = outcome_rewards(SCORES, LENGTHS, 4)
    adv, _ = advantage("dr_grpo", rewards, mask, INDEX)
    close(per_sample(adv, mask), [-2.0, 0.0, -1.0, 0.0, 0.0, 3.0])  # score - group mean, no std
    no_std, _ = advantage("grpo", rewards, mask, INDEX, AdvantageConfig(norm_by_std=False))
    assert torch.equal(no_std, adv)
    # dr_grpo ignores norm_by_std
    assert torch.equal(advantage("dr_grpo", rewards, mask, INDEX, AdvantageConfig(norm_by_std=True))[0], adv)


def test_rloo_leave_one_out() -> None:
    rewards, mask = outcome_rewards(SCORES, LENGTHS, 4)
    adv, ret = advantage("rloo", rewards, mask, INDEX)
    # group 0: 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5; group 1: 5 - 5 = 0; singleton: 0
    close(per_sample(adv, mask), [-3.0, 0.0, -1.5, 0.0, 0.0, 4.5])
    assert torch.equal(adv, ret)


def test_group_ids_need_not_be_contiguous() -> None:
    rewards, mask = outcome_rewards([1.0, 3.0, 10.0, 20.0], [1, 1, 1, 1], 2)
    adv, _ = advantage("dr_grpo", rewards, mask, T([42, 7, 42, 7]))
    close(per_sample(adv, mask), [-4.5, -8.5, 4.5, 8.5])  # group 42: {1, 10} mean 5.5; group 7: {3, 20} 11.5


def test_reinforce_pp_baseline_centres_then_whitens() -> None:
    # group 0 = {1, 3} (lengths 2, 1), group 1 = {4} alone (length 1); T = 3
    rewards, mask = outcome_rewards([1.0, 3.0, 4.0], [2, 1, 1], 3)
    adv, ret = advantage("reinforce_pp_baseline", rewards, mask, T([0, 0, 1]))
    # centred: -1 on 2 tokens, +1 on 1 token, 0 (singleton) on 1 token -> 4 values: -1, -1, 1, 0
    # mean -1/4; squared deviations 9/16, 9/16, 25/16, 1/16 = 44/16, unbiased var = 44/48 = 11/12
    sd = math.sqrt(11 / 12 + 1e-8)
    close(adv, [[-0.75 / sd, -0.75 / sd, 0.0], [1.25 / sd, 0.0, 0.0], [0.25 / sd, 0.0, 0.0]])
    assert torch.equal(adv, ret)


def test_masked_whiten() -> None:
    x = T([[1.0, 2.0, GARBAGE], [3.0, float("nan"), float("inf")]])
    mask = T([[1, 1, 0], [1, 0, 0]])
    # valid 1, 2, 3: mean 2, unbiased var (1 + 0 + 1) / 2 = 1
    close(masked_whiten(x, mask), [[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    close(masked_whiten(T([[5.0, 0.0]]), T([[1, 0]])), [[0.0, 0.0]])  # one element: var taken as 0


# ---------------------------------------------------------------------------------- return-based estimators
def test_reinforce_pp_discounted_returns_then_whitening() -> None:
    rewards = T([[1.0, 0.0, 2.0, GARBAGE], [0.0, 4.0, GARBAGE, GARBAGE]])
    mask = T([[1, 1, 1, 0], [1, 1, 0, 0]])
    adv, ret = advantage("reinforce_pp", rewards, mask, T([0, 1]), AdvantageConfig(gamma=0.5))
    # row 0: G2 = 2, G1 = 0 + .5*2 = 1, G0 = 1 + .5*1 = 1.5; row 1: G1 = 4, G0 = 0 + .5*4 = 2
    close(ret, [[1.5, 1.0, 2.0, 0.0], [2.0, 4.0, 0.0, 0.0]])
    # valid returns 1.5, 1, 2, 2, 4: mean 2.1, squared deviations .36+1.21+.01+.01+3.61 = 5.2, var 5.2/4 = 1.3
    sd = math.sqrt(1.3 + 1e-8)
    close(adv, [[-0.6 / sd, -1.1 / sd, -0.1 / sd, 0.0], [-0.1 / sd, 1.9 / sd, 0.0, 0.0]])
    # a masked tool-output token inside a response (position 1): no reward, no discount step, output 0
    _, ret = advantage("reinforce_pp", T([[1.0, 5.0, 2.0]]), T([[1, 0, 1]]), T([0]), AdvantageConfig(gamma=0.5))
    close(ret, [[2.0, 0.0, 2.0]])  # G2 = 2, G0 = 1 + .5 * 2 = 2


def test_remax_subtracts_greedy_baseline() -> None:
    rewards, mask = outcome_rewards([1.0, 3.0], [3, 2], 4)
    adv, ret = advantage("remax", rewards, mask, T([0, 1]), baseline=T([0.5, 4.0]))
    close(ret, [[1.0, 1.0, 1.0, 0.0], [3.0, 3.0, 0.0, 0.0]])  # undiscounted return-to-go
    close(adv, [[0.5, 0.5, 0.5, 0.0], [-1.0, -1.0, 0.0, 0.0]])  # 1 - 0.5, 3 - 4
    discounted = advantage("remax", rewards, mask, T([0, 1]), AdvantageConfig(gamma=0.5), baseline=T([0.5, 4.0]))
    assert torch.equal(discounted[0], adv)  # ReMax ignores gamma
    with pytest.raises(ValueError, match="baseline"):
        advantage("remax", rewards, mask, T([0, 1]))


def test_gae_hand_computed() -> None:
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, GARBAGE]])
    values = T([[0.5, 0.6, 0.7], [1.0, 0.5, GARBAGE]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    cfg = AdvantageConfig(gamma=0.9, lam=0.8, whiten=False)
    adv, ret = advantage("gae", rewards, mask, T([0, 1]), cfg, values=values)
    # row 0: d2 = 1 - .7 = .3;  d1 = .9*.7 - .6 = .03;  d0 = .9*.6 - .5 = .04;  γλ = .72
    #        A2 = .3, A1 = .03 + .72*.3 = .246, A0 = .04 + .72*.246 = .21712
    # row 1: d1 = 2 - .5 = 1.5; d0 = .9*.5 - 1 = -.55; A1 = 1.5, A0 = -.55 + .72*1.5 = .53
    close(adv, [[0.21712, 0.246, 0.3], [0.53, 1.5, 0.0]])
    close(ret, [[0.71712, 0.846, 1.0], [1.53, 2.0, 0.0]])  # A + V
    whitened, ret_w = advantage("gae", rewards, mask, T([0, 1]), AdvantageConfig(gamma=0.9, lam=0.8), values=values)
    close(whitened, masked_whiten(adv, mask))
    assert torch.equal(ret_w, ret)  # returns are taken before whitening
    with pytest.raises(ValueError, match="values"):
        advantage("gae", rewards, mask, T([0, 1]))


def gae_reference(rewards, values, mask, gamma, lam):
    """Plain-Python GAE over the valid positions of each row (masked positions skipped, outputs 0)."""
    adv = [[0.0] * len(row) for row in rewards]
    for i, row in enumerate(rewards):
        valid = [t for t in range(len(row)) if mask[i][t]]
        running, next_value = 0.0, 0.0
        for t in reversed(valid):
            delta = row[t] + gamma * next_value - values[i][t]
            running = delta + gamma * lam * running
            adv[i][t], next_value = running, values[i][t]
    return adv


def test_gae_matches_python_reference_with_holes() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(5, 9, generator=gen), torch.randn(5, 9, generator=gen)
    mask = (torch.rand(5, 9, generator=gen) > 0.3).float()
    mask[:, 0] = 1
    cfg = AdvantageConfig(gamma=0.95, lam=0.9, whiten=False)
    adv, ret = advantage("gae", rewards, mask, torch.arange(5), cfg, values=values)
    expected = T(gae_reference(rewards.tolist(), values.tolist(), mask.tolist(), 0.95, 0.9))
    close(adv, expected)
    close(ret, (expected + values) * mask)


def test_gae_gamma_lambda_one_is_monte_carlo() -> None:
    rewards, values, mask = T([[0.5, -1.0, 2.0]]), T([[0.3, 0.1, 0.9]]), T([[1, 1, 1]])
    adv, _ = advantage("gae", rewards, mask, T([0]), AdvantageConfig(whiten=False), values=values)
    close(adv, [[1.5 - 0.3, 1.0 - 0.1, 2.0 - 0.9]])  # A_t = sum_{s>=t} r_s - V_t


@pytest.mark.parametrize("name", ADVANTAGE_NAMES)
def test_estimators_ignore_padding(name: str) -> None:
    gen = torch.Generator().manual_seed(1)
    rewards, values = torch.randn(4, 5, generator=gen), torch.randn(4, 5, generator=gen)
    mask = T([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]])
    kw = {"values": values, "baseline": torch.randn(4, generator=gen)}
    adv, ret = advantage(name, rewards, mask, T([0, 0, 1, 1]), **kw)
    pad = mask == 0
    dirty_rewards = rewards.masked_fill(pad, GARBAGE)
    adv2, ret2 = advantage(
        name, dirty_rewards, mask, T([0, 0, 1, 1]), **{**kw, "values": values.masked_fill(pad, -GARBAGE)}
    )
    assert adv.shape == ret.shape == (4, 5)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    assert not adv[pad].any() and not ret[pad].any()
    assert not adv.requires_grad


# ------------------------------------------------------------------------------------------- aggregation
LOSS = T([[1.0, 2.0, 3.0, float("nan")], [4.0, 5.0, GARBAGE, float("inf")], [GARBAGE] * 4])
LOSS_MASK = T([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 3.0),  # (1+2+3+4+5) / 5
        ("seq-mean-token-mean", 3.25),  # (mean(1,2,3) + mean(4,5)) / 2 = (2 + 4.5) / 2, empty row skipped
        ("seq-mean-token-sum", 7.5),  # (6 + 9) / 2
        ("seq-mean-token-sum-norm", 1.25),  # 15 / (B=3 * T=4)
    ],
)
def test_agg_loss_modes(mode: str, expected: float) -> None:
    close(agg_loss(LOSS, LOSS_MASK, mode), expected)
    close(agg_loss(LOSS, torch.zeros(3, 4), mode), 0.0)  # empty mask: 0, not NaN


def test_agg_loss_norm_len_and_unknown_mode() -> None:
    close(agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum-norm", norm_len=10), 0.5)  # 15 / (3 * 10)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(LOSS, LOSS_MASK, "seq-sum")


# -------------------------------------------------------------------------------------------------- PPO
def ppo_case(ratios: list[float], advs: list[float], cfg: PolicyLossConfig, name: str = "ppo"):
    """One row with the given ratios (old_logp = 0) plus one padded token holding garbage."""
    logp = T([[*(math.log(r) for r in ratios), 50.0]], requires_grad=True)
    mask = T([[1.0] * len(ratios) + [0.0]])
    loss, metrics = POLICY_LOSSES[name](logp, torch.zeros_like(logp), T([[*advs, 100.0]]), mask, cfg=cfg)
    loss.backward()
    return loss, metrics, logp.grad


def test_ppo_clip_hand_computed() -> None:
    loss, metrics, grad = ppo_case([1.5, 0.5, 1.1, 0.7], [1.0, 1.0, -1.0, -1.0], PolicyLossConfig())
    # t0: r 1.5, A +1: max(-1.5, -1.2) = -1.2 (clipped) | t1: r .5, A +1: max(-.5, -.8) = -.5
    # t2: r 1.1, A -1: max(1.1, 1.1) = 1.1 (inside)     | t3: r .7, A -1: max(.7, .8) = .8 (clipped)
    close(loss, (-1.2 - 0.5 + 1.1 + 0.8) / 4)  # = 0.05
    # d(-A r)/dlogp = -A r on unclipped tokens, 0 on clipped ones; token-mean weight 1/4; padding 0
    close(grad, [[0.0, -0.5 / 4, 1.1 / 4, 0.0, 0.0]])
    assert metrics["clip_frac"] == pytest.approx(0.5)
    # approx_kl = mean(r - 1 - log r) over the 4 valid tokens
    kl = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 1.1, 0.7)) / 4
    assert metrics["approx_kl"] == pytest.approx(kl, rel=1e-5)
    assert "dual_clip_frac" not in metrics


def test_ppo_clip_higher_dapo() -> None:
    # r 1.25, A +1: symmetric 0.2 clips at 1.2 (loss -1.2, no gradient); clip_high 0.28 lets it through
    sym, _, sym_grad = ppo_case([1.25], [1.0], PolicyLossConfig())
    dapo, _, dapo_grad = ppo_case([1.25], [1.0], PolicyLossConfig(clip_low=0.2, clip_high=0.28))
    close(sym, -1.2)
    close(sym_grad, [[0.0, 0.0]])
    close(dapo, -1.25)
    close(dapo_grad, [[-1.25, 0.0]])
    # the low side still clips at 0.8: r .7, A -1 -> max(.7, .8) = .8
    close(ppo_case([0.7], [-1.0], PolicyLossConfig(clip_low=0.2, clip_high=0.28))[0], 0.8)


def test_ppo_dual_clip_bounds_negative_advantage_loss() -> None:
    cfg = PolicyLossConfig(dual_clip_c=3.0)
    loss, metrics, grad = ppo_case([5.0, 2.0, 5.0], [-1.0, -1.0, 1.0], cfg)
    # t0: r 5, A -1: standard max(5, 1.2) = 5 -> min(5, c*|A| = 3) = 3, zero gradient
    # t1: r 2, A -1: standard 2 < 3 -> 2, gradient -A r = 2 | t2: A +1 untouched: max(-5, -1.2) = -1.2
    close(loss, (3.0 + 2.0 - 1.2) / 3)
    close(grad, [[0.0, 2.0 / 3, 0.0, 0.0]])
    assert metrics["dual_clip_frac"] == pytest.approx(1 / 3)
    # without dual clip the same token costs r * |A| = 5, unbounded in r
    close(ppo_case([5.0], [-1.0], PolicyLossConfig())[0], 5.0)
    for log_r in (1.0, 5.0, 10.0, 30.0):  # any ratio: loss <= c * |A| = 6
        assert ppo_case([math.exp(log_r)], [-2.0], cfg)[0].item() <= 6.0 + 1e-4


def test_policy_loss_config_validation() -> None:
    for bad in ({"loss_agg_mode": "sum"}, {"dual_clip_c": 1.0}, {"cispo_min": 5.0, "cispo_max": 5.0}):
        with pytest.raises(ValueError):
            PolicyLossConfig(**bad)


# ------------------------------------------------------------------------------------------------- GSPO
def gspo_run(logp_rows, advs, mask, cfg):
    logp = T(logp_rows, requires_grad=True)
    loss, metrics = POLICY_LOSSES["gspo"](logp, torch.zeros_like(logp), T(advs), T(mask), cfg=cfg)
    loss.backward()
    return loss, metrics, logp.grad


def test_gspo_sequence_ratio_and_gradient() -> None:
    l11, l12, l2 = math.log(1.1), math.log(1.2), math.log(2.0)
    cfg = PolicyLossConfig(loss_agg_mode="seq-mean-token-mean")
    loss, metrics, grad = gspo_run([[l11, l12, 9.0], [l2, l2, l2]], [[1.0, 1.0, 5.0], [1.0, 1.0, 1.0]],
                                   [[1, 1, 0], [1, 1, 1]], cfg)  # fmt: skip
    s1 = math.sqrt(1.1 * 1.2)  # geometric mean of the token ratios = 1.148913 (inside [0.8, 1.2])
    # row 0: every token's loss is -s1 * A = -s1; row 1: s2 = 2 > 1.2 -> clipped to -1.2 on all tokens
    close(loss, (-s1 - 1.2) / 2)
    # documented gradient: -s_i * A_it / (n_seq * |y_i|) = -s1 / (2 * 2) on row 0; clipped row 1 gets 0
    close(grad, [[-s1 / 4, -s1 / 4, 0.0], [0.0, 0.0, 0.0]])
    assert metrics["clip_frac"] == pytest.approx(3 / 5)  # the 3 valid tokens of row 1


def test_gspo_clips_sequences_not_tokens() -> None:
    # token ratios 2 and 0.5 are far outside a GSPO-sized clip range, but their geometric mean is 1
    cfg = PolicyLossConfig(clip_low=3e-4, clip_high=4e-4, loss_agg_mode="seq-mean-token-mean")
    _, metrics, grad = gspo_run([[math.log(2.0), math.log(0.5)]], [[1.0, -3.0]], [[1, 1]], cfg)
    close(grad, [[-1.0 * 1.0 / 2, -1.0 * -3.0 / 2]])  # -s * A_t / |y| with s = 1
    assert metrics["clip_frac"] == 0.0
    # token-level PPO clips both (r 2 > 1 + ε with A > 0, r .5 < 1 - ε with A < 0): no gradient at all
    _, _, ppo_grad = ppo_case([2.0, 0.5], [1.0, -3.0], cfg)
    close(ppo_grad, [[0.0, 0.0, 0.0]])


def test_gspo_token_gradient_equals_trl_sequence_form() -> None:
    # TRL (importance_sampling_level="sequence") differentiates exp(mean log r) directly; with per-sequence
    # constant advantages the gradient must equal ours.
    gen = torch.Generator().manual_seed(2)
    logp0, old = -torch.rand(3, 4, generator=gen), -torch.rand(3, 4, generator=gen)
    adv = torch.randn(3, 1, generator=gen).expand(3, 4)
    mask = T([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    cfg = PolicyLossConfig(clip_low=0.05, clip_high=0.05, loss_agg_mode="seq-mean-token-mean")
    ours = logp0.clone().requires_grad_()
    POLICY_LOSSES["gspo"](ours, old, adv, mask, cfg=cfg)[0].backward()
    trl = logp0.clone().requires_grad_()
    coef = torch.exp(((trl - old) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True))
    per_token = -torch.min(coef * adv, torch.clamp(coef, 0.95, 1.05) * adv)
    ((per_token * mask).sum(-1) / mask.sum(-1)).mean().backward()
    close(ours.grad, trl.grad)


# ------------------------------------------------------------------------------------------------ CISPO
def test_cispo_hand_computed() -> None:
    loss, metrics, grad = ppo_case([0.5, 1.0, 8.0], [2.0, -1.0, 1.0], PolicyLossConfig(), name="cispo")
    # weights sg[clip(r, max=5)] = .5, 1, 5; per-token loss -w * A * logp:
    #   -.5*2*log .5 = log 2 = .693147 | -1*(-1)*0 = 0 | -5*1*log 8 = -10.397208
    close(loss, (math.log(2) - 5 * math.log(8)) / 3)
    close(grad, [[-1.0 / 3, 1.0 / 3, -5.0 / 3, 0.0]])  # -w * A / 3: the clipped token keeps a gradient
    assert metrics["clip_frac"] == pytest.approx(1 / 3)
    _, _, grad_min = ppo_case([0.5], [2.0], PolicyLossConfig(cispo_min=0.8), name="cispo")
    close(grad_min, [[-0.8 * 2.0, 0.0]])  # lower bound lifts the weight .5 -> .8


@pytest.mark.parametrize("name", POLICY_LOSS_NAMES)
@pytest.mark.parametrize("mode", AGG_MODES)
def test_policy_losses_ignore_padding(name: str, mode: str) -> None:
    gen = torch.Generator().manual_seed(3)
    logp0, old = -torch.rand(3, 5, generator=gen), -torch.rand(3, 5, generator=gen)
    adv = torch.randn(3, 5, generator=gen)
    mask = T([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    cfg = PolicyLossConfig(loss_agg_mode=mode, dual_clip_c=3.0)
    results = []
    for fill in (0.0, 30.0):
        logp = logp0.masked_fill(mask == 0, -fill).requires_grad_()
        loss, metrics = POLICY_LOSSES[name](
            logp, old.masked_fill(mask == 0, fill), adv.masked_fill(mask == 0, fill), mask, cfg=cfg
        )
        loss.backward()
        assert not logp.grad[mask == 0].any()
        results.append((loss.detach(), logp.grad[mask == 1], metrics))
    close(results[0][0], results[1][0])
    close(results[0][1], results[1][1])
    assert results[0][2] == pytest.approx(results[1][2])


# ------------------------------------------------------------------------------------------- value loss
def test_value_loss_hand_computed() -> None:
    values = T([[1.0, 2.0, 0.0, GARBAGE]], requires_grad=True)
    old, returns, mask = T([[0.5, 1.0, 0.0, 0.0]]), T([[2.0, 1.0, 1.0, -GARBAGE]]), T([[1, 1, 1, 0]])
    loss, metrics = value_loss(values, old, returns, mask, clip_range=0.2)
    # t0: V_clip = .5 + .2 = .7; (1-2)^2 = 1 vs (.7-2)^2 = 1.69 -> 1.69 (clipped branch, no gradient)
    # t1: V_clip = 1 + .2 = 1.2; (2-1)^2 = 1 vs (1.2-1)^2 = .04 -> 1 | t2: both (0-1)^2 = 1
    close(loss, 0.5 * (1.69 + 1.0 + 1.0) / 3)
    loss.backward()
    close(values.grad, [[0.0, (2.0 - 1.0) / 3, (0.0 - 1.0) / 3, 0.0]])  # 0.5 * 2 (V - R) / 3
    assert metrics["vf_clip_frac"] == pytest.approx(1 / 3)


# --------------------------------------------------------------------------------------------------- KL
def test_kl_estimators_hand_computed() -> None:
    logp, ref = torch.zeros(1, 3), T([[math.log(2.0), 0.0, math.log(0.5)]])  # log r = ref - logp
    ln2 = math.log(2.0)
    close(KL_ESTIMATORS["k1"](logp, ref), [[-ln2, 0.0, ln2]])  # -log r
    close(KL_ESTIMATORS["k2"](logp, ref), [[0.5 * ln2**2, 0.0, 0.5 * ln2**2]])  # 0.24023
    close(KL_ESTIMATORS["k3"](logp, ref), [[1 - ln2, 0.0, -0.5 + ln2]])  # r - 1 - log r: .30685, 0, .19315
    close(KL_ESTIMATORS["abs"](logp, ref), [[ln2, 0.0, ln2]])
    assert torch.isfinite(KL_ESTIMATORS["k3"](torch.zeros(1), T([1000.0]))).all()  # clamped, no overflow


def test_k1_and_k3_are_unbiased_under_exact_expectation() -> None:
    p, q = T([0.5, 0.3, 0.2]), T([0.2, 0.5, 0.3])
    kl = float((p * (p / q).log()).sum())  # KL(p || q) = 0.5 ln 2.5 + 0.3 ln 0.6 + 0.2 ln(2/3) = 0.224
    for name in ("k1", "k3"):
        assert float((p * KL_ESTIMATORS[name](p.log(), q.log())).sum()) == pytest.approx(kl, rel=1e-5)


def test_kl_penalty_rewards() -> None:
    rewards, kl = T([[0.0, 0.0, 1.0]]), T([[0.1, 0.2, 0.3]])
    close(kl_penalty_rewards(rewards, kl, 0.5), [[-0.05, -0.1, 0.85]])  # r - .5 * kl
    padded = kl_penalty_rewards(rewards, T([[0.1, 0.2, GARBAGE]]), 0.5, mask=T([[1, 1, 0]]))
    close(padded, [[-0.05, -0.1, 1.0]])


def test_kl_controllers() -> None:
    fixed = FixedKLController(0.1)
    fixed.update(current_kl=100.0, n_steps=64)
    assert fixed.value == 0.1
    ctl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctl.update(current_kl=9.0, n_steps=256)  # e = clip(9/6 - 1 = .5) = .2; β = .1 * (1 + .2*256/10000)
    assert ctl.value == pytest.approx(0.100512)
    ctl.update(current_kl=3.0, n_steps=100)  # e = clip(-.5) = -.2; β *= 1 - .2*100/10000 = .998
    assert ctl.value == pytest.approx(0.100512 * 0.998)
    ctl.update(current_kl=6.6, n_steps=1000)  # e = .1 (inside the clip); β *= 1.01
    assert ctl.value == pytest.approx(0.100512 * 0.998 * 1.01)
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=10)


# ---------------------------------------------------------------------------------------------- filters
def test_groups_with_variance() -> None:
    rewards = T([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 2.0, 0.0, 3.0])
    index = T([0, 0, 1, 1, 2, 2, 3, 9, 9])
    # group 0 {1, 0} mixed; group 1 {1, 1} and 2 {.5, .5} identical; group 3 single; group 9 {0, 3} mixed
    expected = [True, True, False, False, False, False, False, True, True]
    assert groups_with_variance(rewards, index).tolist() == expected


def test_overlong_penalty_eq13() -> None:
    lengths = T([10, 16, 17, 18, 20, 25])
    # L_max 20, L_cache 4 -> free up to 16; (16 - |y|) / 4 inside (16, 20]; -1 beyond 20
    close(overlong_penalty(lengths, max_len=20, buffer_len=4), [0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    close(overlong_penalty(lengths, 20, 4, penalty_factor=0.5), [0.0, 0.0, -0.125, -0.25, -0.5, -0.5])
    with pytest.raises(ValueError):
        overlong_penalty(lengths, max_len=20, buffer_len=0)


def test_pf_ppo_weights() -> None:
    scores = T([1.0, -2.0, 0.5, -2.0, 1.0])
    close(pf_ppo_weights(scores, "pow", 2.0), [1.0, 4.0, 0.25, 4.0, 1.0])  # |s|^2
    close(pf_ppo_weights(scores, "max_min"), [1.0, 1.0, 0.0, 1.0, 1.0])  # max 1, min -2 kept
    close(pf_ppo_weights(scores, "max_random"), [0.4, 0.1, 0.1, 0.1, 0.4])  # max 0.4, others 0.1
    with pytest.raises(ValueError, match="mode"):
        pf_ppo_weights(scores, "best_of_n")


def test_pf_ppo_resample() -> None:
    scores = T([3.0, 1.0, 2.0, 0.0, 1.5, 2.5])
    idx = pf_ppo_resample(scores, "max_min", generator=torch.Generator().manual_seed(0))
    assert idx.shape == (6,) and idx.dtype == torch.int64
    assert set(idx.tolist()) <= {0, 3}  # only the max (index 0) and min (index 3) can be drawn (p ~ 1 - 4e-8)
    again = pf_ppo_resample(scores, "max_min", generator=torch.Generator().manual_seed(0))
    assert torch.equal(idx, again)

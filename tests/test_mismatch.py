"""The weight-sync check's gap, the rollout correction's weights and an async round's PPO reference, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlctl.algorithms import POLICY_LOSSES, PolicyLossConfig
from rlctl.algorithms.mismatch import behaviour_ratio, correction_weights, logprob_gap

TRAIN = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]])
ROLLOUT = torch.tensor([[-1.5, -2.0, -0.4], [-0.1, -1.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the last token of row 2 is padding


def test_gap_is_over_sampled_tokens_only():
    mean, worst = logprob_gap(TRAIN, ROLLOUT, MASK)
    assert mean == pytest.approx((0.5 + 0 + 0.1 + 0 + 2.0) / 5) and worst == pytest.approx(2.0)
    assert logprob_gap(TRAIN, ROLLOUT, torch.zeros_like(MASK)) == (0.0, 0.0)


def test_token_truncate_caps_each_ratio():
    w, m = correction_weights(TRAIN, ROLLOUT, MASK, "token_truncate", cap=2.0)
    ratios = [math.exp(0.5), 1.0, math.exp(-0.1), 1.0, math.exp(-2.0)]
    expected = torch.tensor([[min(ratios[0], 2.0), 1.0, ratios[2]], [1.0, ratios[4], 0.0]])
    assert torch.allclose(w, expected)
    assert m["is_clipped_frac"] == 0.0 and m["is_ratio_max"] == pytest.approx(math.exp(0.5))
    w, m = correction_weights(TRAIN, ROLLOUT, MASK, "token_truncate", cap=1.5)
    assert w[0, 0] == pytest.approx(1.5) and m["is_clipped_frac"] == pytest.approx(1 / 5)


def test_sequence_mask_drops_whole_sequences_outside_the_band():
    w, m = correction_weights(TRAIN, ROLLOUT, MASK, "sequence_mask", cap=3.0)
    # row 1: exp(0.5 - 0.1) = 1.49 kept; row 2: exp(-2.0) = 0.135 < 1/3 dropped
    assert torch.equal(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert m["is_masked_frac"] == 0.5 and m["is_ratio_min"] == pytest.approx(math.exp(-2.0))


def test_off_changes_nothing():
    w, m = correction_weights(TRAIN, ROLLOUT, MASK, "off", cap=2.0)
    assert torch.equal(w, torch.ones_like(MASK)) and m == {}
    with pytest.raises(ValueError, match="unknown rollout correction mode"):
        correction_weights(TRAIN, ROLLOUT, MASK, "sequence_truncate", cap=2.0)


def test_an_async_round_takes_the_ppo_ratio_against_the_policy_that_sampled():
    ref, w, m = behaviour_ratio(TRAIN, ROLLOUT, MASK, "token_truncate", cap=2.0, policy_loss="ppo")
    assert ref is ROLLOUT and torch.equal(w, torch.ones_like(MASK))  # the ratio is the importance weight: no second
    assert m == correction_weights(TRAIN, ROLLOUT, MASK, "token_truncate", cap=2.0)[1]  # the same metrics logged
    ref, w, _ = behaviour_ratio(TRAIN, ROLLOUT, MASK, "sequence_mask", cap=3.0, policy_loss="ppo")
    assert ref is ROLLOUT and torch.equal(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))  # still masked
    ref, w, m = behaviour_ratio(TRAIN, ROLLOUT, MASK, "off", cap=2.0, policy_loss="ppo")
    assert ref is TRAIN and torch.equal(w, torch.ones_like(MASK)) and m == {}  # treated as on-policy
    for loss in ("gspo", "cispo"):  # no token-level trust region: the trainer's ratio with the correction's weights
        ref, w, m = behaviour_ratio(TRAIN, ROLLOUT, MASK, "token_truncate", cap=2.0, policy_loss=loss)
        expected, metrics = correction_weights(TRAIN, ROLLOUT, MASK, "token_truncate", cap=2.0)
        assert ref is TRAIN and torch.equal(w, expected) and m == metrics


def _ppo_gradient(logp: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """d loss / d logp of the PPO loss (advantage 1 on every token) with the ratio against `reference`."""
    logp = logp.clone().requires_grad_()
    ones = torch.ones_like(logp)
    loss, _ = POLICY_LOSSES["ppo"](logp, reference, ones, ones, cfg=PolicyLossConfig())
    loss.backward()
    return logp.grad


def test_a_token_the_updates_since_sampling_moved_past_the_clip_is_pushed_no_further():
    """The cause of async's lost accuracy (issue 37): with one update per step a ratio against the trainer's own
    log-probs never clips, so a stale round pushes again what the last update already pushed."""
    sampled = torch.log(torch.tensor([[0.2, 0.5]]))  # the generator's policy, one version back
    trainer = torch.log(torch.tensor([[0.4, 0.5]]))  # the last update doubled the first token's probability
    mask = torch.ones_like(trainer)
    reference, _, _ = behaviour_ratio(trainer, sampled, mask, "token_truncate", cap=2.0, policy_loss="ppo")
    grad = _ppo_gradient(trainer, reference)
    assert grad[0, 0] == 0 and grad[0, 1] < 0  # ratio 2 > 1.2: clipped; the unmoved token still learns
    assert (_ppo_gradient(trainer, trainer) < 0).all()  # against the trainer's policy: pushed up again

"""The weight-sync check's gap and the rollout correction's weights, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlctl.algorithms.mismatch import correction_weights, logprob_gap

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

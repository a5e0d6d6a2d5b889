"""RL math for rlctl's stages: advantage estimators, policy/value losses, KL, filters.

Small pure torch functions behind one registry per kind, each kind with one shared signature (see the module
docstrings and ``docs/algorithms.md``). Imports torch: only stage code may import this package, never the CLI.
May import: base, vision, config, sandbox, rundir, data.
"""

from rlctl.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    explained_variance,
    gae_lambdas,
    length_adaptive_lam,
    masked_mean,
    masked_whiten,
    register_advantage,
    returns_to_go,
    zero_masked,
)
from rlctl.algorithms.filters import (
    PF_PPO_MODES,
    groups_with_variance,
    overlong_penalty,
    pf_ppo_resample,
    pf_ppo_weights,
)
from rlctl.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_penalty_rewards,
    register_kl,
)
from rlctl.algorithms.losses import (
    AGG_MODES,
    POLICY_LOSSES,
    PolicyLossConfig,
    agg_loss,
    loss_units,
    positive_lm_loss,
    register_policy_loss,
    value_loss,
)

ADVANTAGE_NAMES: tuple[str, ...] = tuple(ADVANTAGE_ESTIMATORS)
POLICY_LOSS_NAMES: tuple[str, ...] = tuple(POLICY_LOSSES)
KL_NAMES: tuple[str, ...] = tuple(KL_ESTIMATORS)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_NAMES",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "KL_NAMES",
    "PF_PPO_MODES",
    "POLICY_LOSSES",
    "POLICY_LOSS_NAMES",
    "AdaptiveKLController",
    "AdvantageConfig",
    "FixedKLController",
    "PolicyLossConfig",
    "agg_loss",
    "explained_variance",
    "gae_lambdas",
    "groups_with_variance",
    "kl_penalty_rewards",
    "length_adaptive_lam",
    "loss_units",
    "masked_mean",
    "masked_whiten",
    "overlong_penalty",
    "pf_ppo_resample",
    "pf_ppo_weights",
    "positive_lm_loss",
    "register_advantage",
    "register_kl",
    "register_policy_loss",
    "returns_to_go",
    "value_loss",
    "zero_masked",
]

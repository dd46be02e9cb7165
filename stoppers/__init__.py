"""Optimal-stopping policies for Best-of-N sampling (numpy and scipy only).

Every policy is a :class:`StoppingPolicy`: feed rewards with ``observe`` and stop when it
returns True. The adaptive policies' decision math lives in :mod:`stoppers.adaptive_math`
(elementwise over floats or numpy arrays, shared with the replay engine).
"""

from stoppers.adaptive import (
    DEFAULT_ALPHA,
    DEFAULT_DELTA,
    DEFAULT_EMPTY_TAIL,
    DEFAULT_MIN_SAMPLES,
    AdaptiveBestOfN,
    TargetAcceptance,
    default_cost_policy,
    default_target_policy,
)
from stoppers.base import PolicyStoppedError, StoppingPolicy
from stoppers.beacon import Beacon, beacon_index_table
from stoppers.classic import FixedN, Patience
from stoppers.deployment import DeploymentPrior, new_deployment_prior
from stoppers.faircap import (
    acceptance_rate,
    bt_expected_excess,
    bt_fair_cap,
    exponential_fair_cap,
    fair_cap,
)
from stoppers.tail_stats import MedianTailStats
from stoppers.weitzman import UCBExponential, Weitzman, ucb_exponential_tau_plus

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_DELTA",
    "DEFAULT_EMPTY_TAIL",
    "DEFAULT_MIN_SAMPLES",
    "AdaptiveBestOfN",
    "Beacon",
    "DeploymentPrior",
    "FixedN",
    "MedianTailStats",
    "Patience",
    "PolicyStoppedError",
    "StoppingPolicy",
    "TargetAcceptance",
    "UCBExponential",
    "Weitzman",
    "acceptance_rate",
    "beacon_index_table",
    "bt_expected_excess",
    "bt_fair_cap",
    "default_cost_policy",
    "default_target_policy",
    "exponential_fair_cap",
    "fair_cap",
    "new_deployment_prior",
    "ucb_exponential_tau_plus",
]

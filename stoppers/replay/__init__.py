"""Offline replay of stopping policies on recorded rewards (`pandora replay`, `pandora synth`).

Reproduces the paper's Section 5 experiments (profit vs the best fixed N, win rate at a matched
budget, savings at a target acceptance rate) on any prompts x samples reward matrix, with all
orderings of a prompt advanced together in numpy. numpy/scipy only at import time (matplotlib
and tqdm are imported by the figures and the CLI progress bar, when used).

>>> from stoppers.replay import ReplayConfig, pool_from_matrix, run_replay
>>> import numpy as np
>>> pool = pool_from_matrix(np.random.default_rng(0).gumbel(size=(3, 50)))
>>> s = run_replay(pool, ReplayConfig(profit_costs=(0.01,), permutations=5), jobs=1)
>>> s.policy_samples.shape, s.fixed_acceptance.shape
((1, 3), (3, 50))
"""

from stoppers.replay.engine import PromptSummaries, ReplayConfig, run_replay
from stoppers.replay.experiments import profit_rows, savings_rows, winrate_rows
from stoppers.replay.loaders import ReplayInputError, RewardPool, load_rewards, pool_from_matrix
from stoppers.replay.synth import FAMILIES, SynthSpec, generate

__all__ = [
    "FAMILIES",
    "PromptSummaries",
    "ReplayConfig",
    "ReplayInputError",
    "RewardPool",
    "SynthSpec",
    "generate",
    "load_rewards",
    "pool_from_matrix",
    "profit_rows",
    "run_replay",
    "savings_rows",
    "winrate_rows",
]

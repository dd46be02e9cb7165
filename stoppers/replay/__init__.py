"""Offline replay of stopping policies on recorded rewards (`pandora replay`, `pandora synth`).

Reproduces the paper's Section 5 experiments (profit vs the best fixed N, win rate at a matched
budget, savings at a target acceptance rate) on any prompts x samples reward matrix, with all
orderings of a prompt advanced together in numpy. numpy/scipy only at import time.
"""

from stoppers.replay.loaders import ReplayInputError, RewardPool, load_rewards, pool_from_matrix

__all__ = ["ReplayInputError", "RewardPool", "load_rewards", "pool_from_matrix"]

"""Replay on the real AlpacaEval judge pool in ../shared/data (skipped when it is absent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stoppers.replay import ReplayConfig, load_rewards, run_replay

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
POOL = SHARED / "data" / "alpacaeval_pool.npz"

pytestmark = [
    pytest.mark.shared_data,
    pytest.mark.skipif(not POOL.exists(), reason=f"evaluation data not found at {POOL}"),
]


def test_real_pool_loads_and_replays() -> None:
    pool = load_rewards(POOL, key="rewards")
    assert pool.prompts == 805 and pool.max_samples == 49 and pool.missing == 0
    head = pool.head(6)
    config = ReplayConfig(profit_costs=(0.001,), targets=(0.9,), permutations=5, max_samples=49)
    s = run_replay(head, config, jobs=1)
    # kappa (the 0.99-quantile of 49 samples) is the pool's max: drawing all 49 always accepts.
    np.testing.assert_allclose(s.fixed_acceptance[:, -1], 1.0)
    assert (np.diff(s.fixed_acceptance, axis=1) >= 0).all()
    assert ((s.policy_samples >= 1) & (s.policy_samples <= 49)).all()
    assert ((s.target_acceptance >= 0) & (s.target_acceptance <= 1)).all()

"""Target mode on a floor that cuts one latent shape (stoppers.robust.cut_interior), and the plain
table kept off a floor the rewards pile up at."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scipy import special, stats

from stoppers import default_cost_policy
from stoppers.replay.synth import SynthSpec, generate
from stoppers.robust.cost_prior import CostShapePrior
from stoppers.robust.cut_interior import CutInterior
from stoppers.robust.floor_table import CUT_SHARE_MIN, FLOOR_SHARE_MIN, FloorTable, floor_share
from stoppers.robust.likelihood_cost import EDGES
from stoppers.robust.pooled_target import COLD_START, PooledTargetAcceptance
from stoppers.robust.shape_prior import ShapePrior
from stoppers.robust.stop_table import Z_EDGES, StopTable

NORMAL = CutInterior(np.diff(special.ndtr(EDGES)), scale_mu=0.0, scale_precision=100.0)
Z_CENTRES = 0.5 * (Z_EDGES[1:] + Z_EDGES[:-1])


@pytest.mark.parametrize("p_above", [1.0, 0.5, 0.1, 0.02])
def test_the_interior_a_cut_leaves_is_the_latent_upper_tail_standardised(p_above: float):
    w = NORMAL.shape(p_above)
    mean = w @ Z_CENTRES
    sd = np.sqrt(w @ (Z_CENTRES - mean) ** 2)
    skew = w @ (Z_CENTRES - mean) ** 3 / sd**3
    truth = stats.truncnorm(special.ndtri(1.0 - p_above), np.inf)
    assert w.sum() == pytest.approx(1.0, abs=1e-6)  # past 12 sds: the tail beyond the grid
    assert mean == pytest.approx(0.0, abs=1e-3) and sd == pytest.approx(1.0, abs=3e-3)
    assert skew == pytest.approx(float(truth.stats(moments="s")), abs=0.02)


def test_simulated_streams_draw_above_the_cut_and_keep_the_latent_benchmark():
    p = np.array([0.9, 0.3, 0.05])
    x, kappa = NORMAL.draws(p, 4000, 0.99, np.random.default_rng(0))
    for alpha in (0.1, 0.5, 0.99):  # the CDF linear within bins of 0.05
        assert NORMAL.quantile(alpha) == pytest.approx(special.ndtri(alpha), abs=2e-3)
    s = kappa / NORMAL.quantile(0.99)  # each stream's latent scale
    assert np.all(np.abs(np.log(s)) < 0.5)  # log s ~ N(0, 0.1^2)
    # each stream's floor, the latent located at 0
    cut = s * np.array([NORMAL.quantile(1.0 - v) for v in p])
    assert np.all(x.min(axis=1) >= cut - 1e-9)
    # a tenth of what is left above the cut lies past its 0.9-quantile
    upper = s * np.array([NORMAL.quantile(1.0 - 0.1 * v) for v in p])
    share = (x > upper[:, None]).mean(axis=1)
    assert share == pytest.approx(np.full(3, 0.1), abs=0.02)


def _learned(rewards: np.ndarray, draws: int = 96) -> ShapePrior:
    prior = ShapePrior()
    for row in rewards:
        prior.update(row[:draws])
    return prior


def _floored(prompts: int, seed: int) -> np.ndarray:
    """A normal cut at a floor (`pandora synth --family floored --loc-mean -2`): half the
    rewards at the floor, the floor-heavy prompts' interiors skewed upper tails."""
    spec = SynthSpec(family="floored", prompts=prompts, samples=120, seed=seed)
    return generate(replace(spec, loc_mean=-2.0))["rewards"]


def _judge(prompts: int, seed: int) -> np.ndarray:
    """A judge's floor far below interiors the prompts share (`--family judge`)."""
    spec = SynthSpec(family="judge", prompts=prompts, samples=120, seed=seed)
    return generate(replace(spec, scale_median=3.0))["rewards"]


def test_a_floor_that_cuts_one_shape_builds_the_cut_table_and_a_judges_floor_does_not():
    cut = _learned(_floored(30, seed=0)).table(0.9, min_samples=8, horizon=480)
    assert isinstance(cut, FloorTable) and cut.cut
    assert abs(cut.simulated_acceptance - 0.9) < 0.01
    judge = _learned(_judge(30, seed=0)).table(0.9, min_samples=8, horizon=480)
    assert isinstance(judge, FloorTable) and not judge.cut


def test_the_cut_tables_thresholds_fall_as_the_floor_takes_more():
    """A cut leaves a floor-heavy prompt a short upper tail: its benchmark sits fewer of its
    interior sds above the interior's mean than where the floor takes little."""
    table = _learned(_floored(30, seed=1)).table(0.9, min_samples=8, horizon=480)
    assert isinstance(table, FloorTable) and table.cut
    z = np.asarray(table.z_star)
    middle = z.shape[1] // 2
    p = np.asarray(table.p_grid)
    assert z[np.searchsorted(p, 0.1), middle] < z[-1, middle] - 0.5


def test_a_floor_piling_up_before_its_interiors_are_learned_runs_the_cold_start():
    """Before the censored table can be built (too few interiors above the floor) the plain
    table's shape holds the pile: prompts with few rewards at the floor ran to the budget on it
    (`floored --loc-mean -2`, requests 10-22 of a deployment). The cold start decides there,
    and the plain table built then is stale once the censored one can be built."""
    rewards = _floored(40, seed=3)
    prior, rows = ShapePrior(), iter(rewards)
    while prior.requests < COLD_START:  # all-floor requests teach no shape
        prior.update(next(rows)[:24])  # short requests: few interiors of 4 rewards above it
    assert prior.piled_floor() is not None and prior.censoring_floor() is None
    plain = prior.table(0.9, min_samples=8, horizon=480)
    assert isinstance(plain, StopTable)
    policy = PooledTargetAcceptance(0.9, prior=prior, max_samples=480)
    assert policy.cold
    key = prior.table_key(0.9, min_samples=8, horizon=480)
    for row in rows:
        prior.update(row[:24])
        if prior.censoring_floor() is not None:
            break
    assert prior.censoring_floor() is not None and prior.requests < 2 * plain.requests
    assert prior.is_stale(key)  # not only after rebuild_growth
    assert isinstance(prior.table(0.9, min_samples=8, horizon=480), FloorTable)
    assert not PooledTargetAcceptance(0.9, prior=prior, max_samples=480).cold


def test_a_cut_is_read_where_the_floor_holds_less_than_the_censored_readings_share():
    """A Tobit with a sixth of its rewards at the floor (`floored`, sd 1) is under the share the
    censored reading needs (FLOOR_SHARE_MIN) but reads as a cut, and cost mode decides on it
    (24 x 20: 0.9979 -> 1.0119 of the best fixed N at 1e-3). Target mode keeps its plain table
    there: a cut table ran Best-of-N where the plain rule drew fewer. A judge-like floor at that
    share is not read at all."""
    rewards = generate(SynthSpec(family="floored", prompts=30, samples=120, seed=0))["rewards"]
    target = _learned(rewards)
    share = floor_share(target.streams, target.floor.clip)
    assert CUT_SHARE_MIN <= share < FLOOR_SHARE_MIN
    assert target.piled_floor() is None and target.censoring_floor(CUT_SHARE_MIN) is not None
    assert isinstance(target.table(0.9, min_samples=8, horizon=480), StopTable)
    assert not PooledTargetAcceptance(0.9, prior=target, max_samples=480).cold
    cost = CostShapePrior()
    for row in rewards:
        cost.update(row[:96])
    reading = cost.censored_shape()
    assert reading is not None and reading.cut and not reading.shared
    assert default_cost_policy(1e-3, max_samples=480, prior=cost).floor_cuts

    judge = _judge(30, seed=1)
    floor = judge.min()
    lifted = (judge == floor) & (np.arange(120) % 3 != 0)  # two in three floor rewards lifted
    judge[lifted] = np.random.default_rng(5).normal(0.0, 3.0, int(lifted.sum()))
    few = _learned(judge)
    assert CUT_SHARE_MIN <= floor_share(few.streams, floor) < FLOOR_SHARE_MIN
    cost = CostShapePrior()
    for row in judge:
        cost.update(row[:96])
    reading = cost.censored_shape()
    assert reading is not None and not reading.cut and not reading.shared
    assert reading.cut_evidence is not None and reading.cut_evidence < 0.0
    assert not default_cost_policy(1e-3, max_samples=480, prior=cost).censored

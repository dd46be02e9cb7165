"""ShapePrior + PooledTargetAcceptance: learning across prompts, calibration, cold start."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stoppers.replay.metrics import acceptance_rate
from stoppers.robust.pooled_target import PooledTargetAcceptance
from stoppers.robust.shape_prior import ShapePrior
from stoppers.robust.target import TailTargetAcceptance
from tests.learned_priors import served


def _learned(prompts=40, samples=200, seed=0, df=None):
    rng = np.random.default_rng(seed)
    prior = ShapePrior()
    for _ in range(prompts):
        z = rng.standard_normal(samples) if df is None else rng.standard_t(df, samples)
        prior.update(rng.normal(0, 2) + math.exp(rng.normal(0, 0.3)) * z)
    return prior


def test_update_learns_only_from_usable_requests():
    prior = ShapePrior()
    assert prior.update([1.0, 2.0]) is False  # too few
    assert prior.update([1.0] * 10) is False  # no spread: no shape, no scale
    assert prior.update([1.0, float("nan"), 2.0, 3.0, 4.0]) is False
    assert prior.requests == 0 and prior.table(0.9, min_samples=8, horizon=50) is None
    assert prior.update([0.1, 0.5, 0.2, 0.9, 0.3]) is True
    # predictable standardisation: only draws after the first min_rewards - 1 = 3 count
    assert prior.requests == 1 and prior.z_counts.sum() == 1 and prior.s_counts.sum() == 1


def test_round_trip_is_json_safe_and_equivalent():
    prior = _learned(prompts=5, samples=30)
    data = json.loads(json.dumps(prior.to_dict()))
    back = ShapePrior.from_dict(data)
    np.testing.assert_array_equal(back.z_counts, prior.z_counts)
    np.testing.assert_array_equal(back.s_counts, prior.s_counts)
    assert back.requests == prior.requests
    a = prior.table(0.9, min_samples=8, horizon=100)
    b = back.table(0.9, min_samples=8, horizon=100)
    assert a == b  # same evidence, same seeded calibration


def test_table_matches_the_known_normal_threshold():
    """With a learned normal shape, z_star at scale 1 is where E[AR | Z >= z] = t."""
    prior = _learned(prompts=60, samples=400)
    table = prior.table(0.9, min_samples=8, horizon=200)
    from scipy import integrate, optimize, stats

    q = stats.norm.ppf(0.99)

    def h(z):
        num = integrate.quad(lambda x: acceptance_rate(x - q, 0.0) * stats.norm.pdf(x), z, np.inf)[
            0
        ]
        return num / stats.norm.sf(z)

    exact = optimize.brentq(lambda z: h(z) - 0.9, 0.0, 4.0)
    i = int(np.argmin(np.abs(np.asarray(table.log_s_grid))))
    assert abs(table.log_s_grid[i]) < 0.2
    assert table.z_star[i] == pytest.approx(exact, abs=0.15)
    # the calibration hits the target in its own simulation
    assert table.simulated_acceptance == pytest.approx(0.9, abs=0.01)


def test_tables_are_cached_and_rebuilt_as_evidence_grows():
    prior = _learned(prompts=20, samples=50)
    first = prior.table(0.8, min_samples=8, horizon=100)
    assert prior.table(0.8, min_samples=8, horizon=100) is first
    rng = np.random.default_rng(9)
    for _ in range(15):
        prior.update(rng.standard_normal(50))
    assert prior.table(0.8, min_samples=8, horizon=100) is first  # 35 < 2 x 20
    for _ in range(5):
        prior.update(rng.standard_normal(50))
    assert prior.table(0.8, min_samples=8, horizon=100) is not first


def test_cold_start_delegates_then_hands_over():
    prior = _learned(prompts=3, samples=50)
    cold = PooledTargetAcceptance(0.9, prior=prior, max_samples=100, cold_start=5)
    assert cold.cold
    warm = PooledTargetAcceptance(0.9, prior=_learned(prompts=6), max_samples=100, cold_start=5)
    assert not warm.cold
    assert PooledTargetAcceptance(0.9, prior=None, max_samples=100).cold


def test_delivers_the_target_on_fresh_prompts():
    """Learned on one set of normal prompts, the policy delivers ~t on new ones, and fewer
    samples at a lower target."""
    prior = _learned(prompts=60, samples=300)
    rng = np.random.default_rng(5)
    results = {}
    for target in (0.8, 0.95):
        acc, used = [], []
        for _ in range(300):
            loc, scale = rng.normal(0, 2), math.exp(rng.normal(0, 0.3))
            policy = PooledTargetAcceptance(target, prior=prior, max_samples=960)
            acceptance, n = served(policy, loc + scale * rng.standard_normal(960))
            acc.append(acceptance)
            used.append(n)
        results[target] = (np.mean(acc), np.mean(used))
    assert results[0.8][0] == pytest.approx(0.8, abs=0.03)
    assert results[0.95][0] == pytest.approx(0.95, abs=0.03)
    assert results[0.8][1] < results[0.95][1]


def test_validation_and_min_samples():
    with pytest.raises(ValueError):
        PooledTargetAcceptance(0.0)
    with pytest.raises(ValueError):
        PooledTargetAcceptance(0.9, alpha=1.0)
    policy = PooledTargetAcceptance(0.5, prior=_learned(prompts=25), min_samples=6, max_samples=50)
    stops = [policy.observe(v) for v in [0.0, 0.1, 0.2, 0.3, 100.0]]
    assert not any(stops) and policy.n == 5  # never before min_samples
    assert policy.observe(0.0) and policy.stop_reason == "target"
    assert policy.threshold is not None


@pytest.mark.parametrize(
    "state",
    [
        {"z_counts": {"5000": 1.0}},
        {"z_counts": {"3": -1.0}},
        {"s_counts": [1, 2]},
        {"z_counts": {"x": 1.0}},
    ],
)
def test_from_dict_refuses_states_it_could_not_have_written(state):
    with pytest.raises(ValueError):
        ShapePrior.from_dict({"requests": 1, **state})


def test_default_target_policy_uses_the_deployment_prior():
    import stoppers

    prior = stoppers.new_deployment_prior("target")
    assert isinstance(prior, ShapePrior)
    cold = stoppers.default_target_policy(0.9, max_samples=64, prior=prior)
    assert isinstance(cold, PooledTargetAcceptance) and cold.cold
    rng = np.random.default_rng(2)
    for _ in range(12):
        assert prior.update(rng.normal(size=40).tolist())
    warm = stoppers.default_target_policy(0.9, max_samples=64, prior=prior)
    assert not warm.cold and warm.min_samples == 8
    restored = ShapePrior.from_dict(json.loads(json.dumps(prior.to_dict())))
    again = stoppers.default_target_policy(0.9, max_samples=64, prior=restored)
    assert again._table == warm._table


def test_target_report_runs_and_renders(tmp_path):
    from stoppers.robust import target_report

    rng = np.random.default_rng(4)
    rewards = rng.normal(size=(14, 60)) * np.exp(rng.normal(0, 0.3, size=(14, 1)))
    np.savez(tmp_path / "p.npz", rewards=rewards)
    out = tmp_path / "rep"
    for policy in ("pooled", "paper"):
        args = ["run", str(tmp_path / "p.npz"), "--name", "p", "--policy", policy]
        assert target_report.main([*args, "--orderings", "2", "--out", str(out)]) == 0
    data = json.loads((out / "p-pooled.json").read_text())
    assert set(data["rows"]["0.9"]) == {"all", "warm", "cold", "reasons"}
    table = target_report.render_table(out, ["p"])
    assert table.count("| p |") == 4  # pooled all / warm / cold start + paper
    warm = data["rows"]["0.9"]["warm"]
    assert 0.0 < warm["mean_acceptance"] <= 1.0 and len(warm["by_spread"]) == 3
    spread = target_report.render_spread_table(out, ["p"])
    assert spread.count("| p |") == 2  # pooled (warm) + paper
    # per-prompt values behind the medians, and their errors
    cell = data["rows"]["0.9"]["all"]
    assert len(cell["prompt_achieved"]) == len(cell["prompt_save"]) == 14
    assert np.nanmedian(cell["prompt_achieved"]) == pytest.approx(cell["achieved_acceptance"])
    assert np.nanmedian(cell["prompt_save"]) == pytest.approx(cell["save_ratio"])
    errors = target_report.render_errors(out, ["p"])
    assert errors.count("| p |") == 4  # pooled all / warm / cold + paper
    assert target_report.main(["table", "--errors", "--out", str(out), "p"]) == 0


def test_median_error_is_the_bootstrap_spread_of_the_median():
    from stoppers.robust import target_report

    x = np.random.default_rng(5).normal(size=400)
    # the median of n normal draws has sd sqrt(pi / 2) / sqrt(n)
    assert target_report.median_error(x) == pytest.approx(np.sqrt(np.pi / 2 / 400), rel=0.2)
    assert target_report.median_error(np.full(30, 0.7)) == pytest.approx(0.0, abs=1e-12)
    assert np.isnan(target_report.median_error([0.5, np.nan]))
    with_nan = np.append(x, [np.nan] * 50)
    assert target_report.median_error(with_nan) == target_report.median_error(x)


def test_target_report_thirds_split_prompts_by_spread():
    """The narrow third holds the prompts of smallest sd; its acceptance is theirs alone."""
    from stoppers.robust import target_report

    rng = np.random.default_rng(8)
    scales = np.array([0.2, 3.0, 0.2, 3.0, 1.0, 1.0])  # narrow: 0, 2; middle: 4, 5; wide: 1, 3
    rewards = rng.normal(size=(6, 80)) * scales[:, None]
    rows = target_report.run_one(rewards, "paper", orderings=3, targets=(0.8,))["0.8"]["all"]
    narrow, middle, wide = rows["by_spread"]
    assert rows["mean_acceptance"] == pytest.approx((narrow + middle + wide) / 3)
    assert narrow != wide


def test_pool_shape_oracle_builds_from_the_pool_not_from_what_it_learned():
    """The ablation prior's tables are the pool's: identical whatever streams it was shown."""
    from stoppers.robust import target_report

    rng = np.random.default_rng(9)
    rewards = rng.gumbel(size=(30, 200)) * np.exp(rng.normal(0, 0.4, size=(30, 1)))
    make = target_report.PoolShapeOracle.of_pool(rewards)
    a, b = make(), make()
    for _ in range(12):
        a.update(rng.normal(size=20))
        b.update(rng.exponential(size=50))
    key = (0.9, 8, 200, 0.99)
    ta, tb = a.prepare(key)(), b.prepare(key)()
    assert ta.z_star == tb.z_star and ta.scale_mu == tb.scale_mu
    plain = ShapePrior()
    for _ in range(12):
        plain.update(rng.normal(size=20))
    assert plain.prepare(key)().z_star != ta.z_star  # what it recorded differs from the pool
    with pytest.raises(ValueError, match="no prompt with spread"):
        target_report.PoolShapeOracle.of_pool(np.ones((3, 10)))


def test_target_report_min_samples_reaches_the_policies(tmp_path):
    from stoppers.robust import target_report

    rng = np.random.default_rng(5)
    rewards = rng.normal(size=(12, 40))
    for policy in ("pooled", "paper"):
        rows = {
            floor: target_report.run_one(
                rewards, policy, orderings=2, min_samples=floor, targets=(0.7,)
            )["0.7"]["all"]
            for floor in (2, 20)
        }
        assert rows[20]["mean_samples"] >= 20  # nobody stops before the floor
        assert rows[2]["mean_samples"] < rows[20]["mean_samples"]
    np.savez(tmp_path / "p.npz", rewards=rewards)
    args = ["run", str(tmp_path / "p.npz"), "--name", "p", "--policy", "paper", "--orderings", "1"]
    assert target_report.main([*args, "--min-samples", "3", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "p-paper.json").read_text())["min_samples"] == 3


def test_target_report_per_prompt_policy_is_the_default_rule_with_less_scale_shrinkage():
    from stoppers.robust import target_report

    make, new_prior = target_report._maker("pooled-per-prompt", 0.9, 60)
    prior = new_prior()
    assert isinstance(prior, ShapePrior) and prior.likelihood
    assert prior.scale_shrink == target_report.PER_PROMPT_SHRINK == 0.25
    assert isinstance(make(prior), PooledTargetAcceptance)
    assert target_report._maker("pooled", 0.9, 60)[1]().scale_shrink == 1.0


def test_acceptance_floor_bounds_every_policy_that_keeps_its_best(tmp_path, capsys):
    """Best-of-m on the replayed streams is what any policy with min_samples = m delivers at
    least, stream by stream; a target below the floor's median by more than 0.03 is out of
    reach."""
    from stoppers.replay.deployment import deployment_summaries, replay_deployment
    from stoppers.robust import target_report

    rng = np.random.default_rng(4)
    rewards = rng.normal(rng.normal(0, 2, (12, 1)), 1.0, (12, 200))
    rewards[:6, :] = np.where(rng.random((6, 200)) < 0.4, 3.0, rewards[:6, :])  # a frequent top
    floor = target_report.acceptance_floor(rewards, 8, orderings=5)
    assert floor.shape == (12,) and np.all((floor > 0) & (floor <= 1))
    assert np.all(target_report.acceptance_floor(rewards, 2, orderings=5) < floor)
    run = replay_deployment(
        rewards,
        lambda _p: TailTargetAcceptance(0.5, min_samples=8, max_samples=200),
        None,
        orderings=5,
        seed=0,
    )
    achieved = deployment_summaries(rewards, targets={0.5: run}).target_acceptance[0]
    assert np.all(achieved >= floor - 1e-12)
    with pytest.raises(ValueError):
        target_report.acceptance_floor(rewards, 0, orderings=5)
    path = tmp_path / "pool.npz"
    np.savez(path, rewards=rewards)
    assert target_report.main(["floor", str(path), "--min-samples", "1,8", "--orderings", "5"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| min samples") and len(lines) == 4
    median = float(np.median(floor))
    expected = [f"{t:g}" for t in target_report.TARGETS if median > t + 0.03]
    assert lines[3] == f"| 8 | {median:.3f} | {', '.join(expected) or 'none'} |"

"""The deployment's learned distribution of the tail shape xi (stoppers.robust.xi_prior) and the
cost-mode cold start that reads it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from stoppers.replay.synth import SynthSpec, generate
from stoppers.robust import TailPandora, xi_prior
from stoppers.robust.cost_prior import CostShapePrior
from stoppers.robust.gpd_tail import (
    TailPosterior,
    acceptance,
    fit_tail,
    posterior_sigma,
    tail_exceedances,
)
from stoppers.robust.pooled_target import COLD_START, PooledTargetAcceptance
from stoppers.robust.shape_cost import ShapePandora
from stoppers.robust.shape_prior import ShapePrior
from stoppers.robust.xi_prior import (
    BOUNDED_XI,
    MAX_ROWS,
    MIN_REQUESTS,
    ROW_FLOOR,
    SHAPE_MIN_WEIGHT,
    SHARE_MIN_REQUESTS,
    SIGMA_NODES,
    XI_GRID,
    XiPrior,
    xi_log_likelihood,
)


def _gpd(xi: float, size: int, seed: int) -> np.ndarray:
    return np.sort(stats.genpareto(xi).rvs(size=size, random_state=seed))


def _exceedances(rewards: np.ndarray) -> np.ndarray:
    return tail_exceedances(np.sort(rewards))[1]


@pytest.mark.parametrize("xi", [-0.5, 0.0, 0.4])
def test_likelihood_peaks_at_the_true_shape_and_ignores_the_scale(xi):
    y = _gpd(xi, 3000, seed=1)
    row = xi_log_likelihood(y)
    assert abs(XI_GRID[np.argmax(row)] - xi) <= 0.1 + 1e-9
    assert row.max() == 0.0 and np.all(np.isfinite(row))
    assert np.allclose(xi_log_likelihood(7.5 * y), row, atol=1e-9)


def test_a_shape_whose_support_cannot_hold_the_data_gets_the_floor():
    y = np.array([0.01] * 20 + [10.0])  # far beyond any short bounded tail's endpoint
    row = xi_log_likelihood(y)
    assert row[0] == ROW_FLOOR and np.all(np.isfinite(row))  # JSON-safe


def _learn(prior: XiPrior, make, requests: int, seed: int) -> XiPrior:
    rng = np.random.default_rng(seed)
    for _ in range(requests):
        prior.update(rng.normal(0.0, 2.0) + rng.lognormal(0.0, 0.4) * make(rng))
    return prior


def _bounded(rng):  # uniform rewards: a bounded tail (xi = -1)
    return rng.uniform(size=60)


def _heavy(rng):  # Student-t(2) rewards: xi = 0.5
    return rng.standard_t(2.0, size=60)


def _mean(prior: XiPrior) -> float:
    return float(np.asarray(prior.g) @ XI_GRID)


def test_one_shape_per_deployment_concentrates_g_on_its_side():
    bounded = _learn(XiPrior(), _bounded, 60, seed=0)
    heavy = _learn(XiPrior(), _heavy, 60, seed=1)
    assert _mean(bounded) < -0.4 and _mean(heavy) > 0.15
    y = _exceedances(np.random.default_rng(5).normal(size=40))  # a short, uninformative tail
    assert bounded.posterior_xi(y) < 0.0 < heavy.posterior_xi(y)


def test_a_mixed_deployment_keeps_each_request_near_its_own_kind():
    """The scalar pooled xi0 pulls a heavy prompt towards the deployment's light average; the
    learned distribution leaves it with the heavy cluster its own exceedances point to."""
    rng = np.random.default_rng(2)
    mixed = XiPrior()
    for i in range(80):
        make = _bounded if i % 2 else _heavy
        mixed.update(rng.normal(0.0, 2.0) + make(rng))
    heavy_y = _exceedances(np.random.default_rng(7).standard_t(2.0, size=300))
    bounded_y = _exceedances(np.random.default_rng(8).uniform(size=300))
    assert mixed.posterior_xi(heavy_y) > 0.2
    assert mixed.posterior_xi(bounded_y) < -0.4


def test_the_shape_is_the_posterior_mean_plus_one_posterior_sd():
    rng = np.random.default_rng(2)
    mixed = XiPrior()
    for i in range(80):
        mixed.update(rng.normal(0.0, 2.0) + (_bounded if i % 2 else _heavy)(rng))
    short = _exceedances(np.random.default_rng(3).normal(size=16))  # says little on its own
    post = np.asarray(mixed.g) * np.exp(xi_log_likelihood(short))
    post /= post.sum()
    mean = post @ XI_GRID
    sd = np.sqrt(post @ (XI_GRID - mean) ** 2)
    assert sd > 0.2  # the request cannot tell which kind of tail it has
    assert mixed.posterior_xi(short) == pytest.approx(mean + sd, abs=1e-12)


def test_margin_share_is_the_posterior_mass_of_open_tails():
    """Bounded deployments drop the confidence margins, heavy ones keep them all."""
    bounded = _learn(XiPrior(), _bounded, 30, seed=0)
    heavy = _learn(XiPrior(), _heavy, 30, seed=1)
    y = _exceedances(np.random.default_rng(5).normal(size=40))
    # 0.236 here since the likelihood integrates each bounded xi on its own sigma grid
    # (2026-11-29; 0.2 was the bar before it): most of the margins go, not all
    assert bounded.margin_share(y) < 0.25 and heavy.margin_share(y) > 0.9
    post = np.asarray(bounded.g) * np.exp(xi_log_likelihood(y))
    post /= post.sum()
    assert bounded.margin_share(y) == pytest.approx(post[XI_GRID >= BOUNDED_XI].sum(), abs=1e-12)
    # a learned prior hands fit_tail everything from one posterior
    told = bounded.tail_posterior(y)
    assert (told.xi, told.share) == (bounded.posterior_xi(y), bounded.margin_share(y))


def _log_sigma_sd(y: np.ndarray, xi: float) -> float:
    """The posterior sd of log sigma given an open shape xi (flat in log sigma), by brute force:
    scipy's GPD density on a fine grid of sigma reaching well past both ends of the likelihood."""
    log_sigma = np.log(y.mean()) + np.linspace(-9.0, 5.0, 20_001)  # an open shape's: xi >= 0
    log_lik = stats.genpareto.logpdf(y[None, :], xi, scale=np.exp(log_sigma)[:, None]).sum(axis=1)
    w = np.gradient(log_sigma) * np.exp(log_lik - log_lik.max())
    w = w / w.sum()
    mean = (w * log_sigma).sum()
    return float(np.sqrt((w * (log_sigma - mean) ** 2).sum()))


def test_the_posterior_shapes_are_what_fit_tail_would_fit_spread_over_the_scale():
    """TailPosterior.shapes: the posterior's weights over the shapes it keeps, each with the
    sigma fit_tail takes for that xi (the mean's match if open, the posterior if bounded), an
    open shape's spread over three nodes at 0 and +-sqrt(3) posterior sds of log sigma."""
    prior = _learn(_learn(XiPrior(), _bounded, 15, seed=3), _heavy, 15, seed=4)
    y = _exceedances(np.random.default_rng(7).normal(size=40))
    told = prior.tail_posterior(y)
    by_xi: dict[float, list[tuple[float, float]]] = {}
    for weight, xi, sigma in told.shapes:
        by_xi.setdefault(xi, []).append((weight, sigma))
    xis = np.array(list(by_xi))
    post = prior._posterior(y)
    kept = post >= SHAPE_MIN_WEIGHT
    assert np.allclose(xis, XI_GRID[kept])
    assert sum(w for w, _, _ in told.shapes) == pytest.approx(1.0)
    weights = np.array([sum(w for w, _ in nodes) for nodes in by_xi.values()])
    assert np.allclose(weights, post[kept] / post[kept].sum())
    assert np.count_nonzero(xis < 0) >= 3 and np.count_nonzero(xis >= 0) >= 3  # both kinds
    for xi, nodes in by_xi.items():
        if xi < 0:  # a bounded shape keeps the one sigma of its posterior
            assert len(nodes) == 1 and nodes[0][1] == pytest.approx(posterior_sigma(y, xi))
            continue
        w, (low, centre, high) = zip(*nodes, strict=True)
        assert np.allclose(np.array(w) / sum(w), [w for _, w in SIGMA_NODES])
        assert centre == pytest.approx(y.mean() * (1 - xi), rel=1e-12)
        assert low * high == pytest.approx(centre**2, rel=1e-12)  # symmetric in log sigma
        # sqrt(3) sds: the grid's sd within 0.5% of the brute-force integral's
        assert np.log(high / centre) / np.sqrt(3.0) == pytest.approx(
            _log_sigma_sd(y, xi), rel=0.005
        )
    fit = fit_tail(np.sort(np.concatenate([np.zeros(60), y])), posterior=prior.tail_posterior)
    assert fit.shapes and sum(w for w, _ in fit.shape_fits()) == pytest.approx(1.0)
    assert all(f.u == fit.u and f.k == fit.k and not f.shapes for _, f in fit.shape_fits())


def test_the_share_starts_before_the_learned_shape_does():
    """From SHARE_MIN_REQUESTS requests the share applies; the shape keeps the fixed shrinkage
    (None) until MIN_REQUESTS, as before."""
    assert SHARE_MIN_REQUESTS < MIN_REQUESTS
    rng = np.random.default_rng(6)
    prior = XiPrior()
    y = _exceedances(rng.uniform(size=48))
    for i in range(MIN_REQUESTS + 1):
        told = prior.tail_posterior(y)
        xi, share = told.xi, told.share
        if i < SHARE_MIN_REQUESTS:
            assert (xi, share, told.shapes) == (None, 1.0, ())
        elif i < MIN_REQUESTS:
            assert xi is None and 0.0 < share < 1.0
        else:
            assert xi == prior.posterior_xi(y) and share == prior.margin_share(y)
        prior.update(_bounded(rng))


def test_learned_only_after_enough_requests_and_only_from_usable_ones():
    prior = XiPrior()
    assert prior.update([1.0, 2.0, 3.0]) is False  # fewer than 8 rewards
    assert prior.update([1.0, 2.0, np.nan] * 4) is False
    assert prior.update([0.0] * 6 + [2.0] * 6) is False  # every exceedance tied (a clip)
    rng = np.random.default_rng(0)
    for _ in range(MIN_REQUESTS):
        assert not prior.learned
        assert prior.update(rng.normal(size=30)) is True
    assert prior.learned and prior.requests == len(prior.rows) == MIN_REQUESTS
    assert abs(sum(prior.g) - 1.0) < 1e-9


def test_rows_are_bounded():
    prior = XiPrior()
    rng = np.random.default_rng(3)
    for _ in range(MAX_ROWS + 20):
        prior.update(rng.normal(size=12))
    assert len(prior.rows) == MAX_ROWS and prior.requests == MAX_ROWS + 20


def test_json_round_trip_is_exact_and_decides_the_same():
    prior = _learn(XiPrior(), _heavy, 20, seed=4)
    restored = XiPrior.from_dict(json.loads(json.dumps(prior.to_dict(), allow_nan=False)))
    assert restored.to_dict() == prior.to_dict()
    y = _gpd(0.2, 30, seed=9)
    assert restored.posterior_xi(y) == prior.posterior_xi(y)
    assert XiPrior.from_dict(None).to_dict() == XiPrior().to_dict()


@pytest.mark.parametrize(
    "change",
    [
        {"rows": [[0.0] * 5]},
        {"rows": [[-1.0] * XI_GRID.size]},  # no maximum of 0
        {"rows": [[0.0] + [ROW_FLOOR - 1.0] * (XI_GRID.size - 1)]},
        {"rows": [[0.0] * XI_GRID.size] * (MAX_ROWS + 1), "requests": MAX_ROWS + 1},
        {"g": [float("nan")] * XI_GRID.size},
        {"g": [0.5] * XI_GRID.size},
        {"g": [1.0]},
        {"g": ["0.5"] + [0.5] + [0.0] * (XI_GRID.size - 2)},
        {"rows": [[0.0] * (XI_GRID.size - 1) + [{}]]},
        {"requests": -1},
        {"requests": "3"},
        {"requests": True},
    ],
)
def test_hostile_snapshots_are_refused(change):
    good = _learn(XiPrior(), _heavy, 3, seed=0).to_dict()
    with pytest.raises(ValueError):
        XiPrior.from_dict({**good, **change})
    with pytest.raises(ValueError):
        XiPrior.from_dict([1, 2])  # type: ignore[arg-type]


def test_fit_tail_takes_the_posterior_shape_when_given():
    values = np.sort(np.random.default_rng(1).normal(size=50))
    fit = fit_tail(values, posterior=lambda y: TailPosterior(0.2, 0.4, ((1.0, 0.2, 1.0),)))
    top = values[-fit.k :] - fit.u
    # an open tail: sigma matches the mean exceedance, sigma / (1 - xi)
    assert fit.xi == 0.2 and fit.sigma == pytest.approx(top.mean() * 0.8)
    assert fit.margin_share == 0.4 and fit.shapes == ((1.0, 0.2, 1.0),)
    bounded = fit_tail(values, posterior=lambda y: TailPosterior(-0.3, 0.4))
    # a bounded one: sigma's posterior mean given xi, which reads where the tail ends
    assert bounded.xi == -0.3 and bounded.sigma == pytest.approx(posterior_sigma(top, -0.3))


def _mixture_rows(prompts: int, seed: int) -> np.ndarray:
    return generate(SynthSpec(family="mixture", prompts=prompts, samples=400, seed=seed))["rewards"]


def test_cold_start_reads_the_cost_priors_learned_shapes():
    """Bimodal prompts (a better mode of per-prompt weight) do not share a standardised shape,
    so ShapePandora without its likelihood path stays on its cold start; the learned tail
    shapes still end its search sooner than the fixed shrinkage to xi = 0, which reads the gap
    as a long tail."""
    prior = CostShapePrior()
    for row in _mixture_rows(30, seed=1):
        prior.update(row[:120])
    assert prior.xi.learned and _mean(prior.xi) < -0.2
    learned, fixed = [], []
    for row in _mixture_rows(16, seed=2):
        mine = ShapePandora(1e-3, max_samples=400, prior=prior, likelihood=False)
        ref = TailPandora(1e-3, max_samples=400)
        for policy, out in ((mine, learned), (ref, fixed)):
            for reward in row:
                if policy.observe(float(reward)):
                    break
            out.append(policy.n)
        assert not mine.warm  # the shape tests refuse the pooled shape: this is the cold start
    assert np.mean(learned) < 0.85 * np.mean(fixed)


def test_early_cold_starts_drop_their_margins_on_bimodal_prompts_only():
    """Between SHARE_MIN_REQUESTS and MIN_REQUESTS learned requests the cold start still shrinks
    xi to 0, but bimodal prompts (a better-mode cluster: a bounded tail) lose its confidence margins
    and stop sooner; heavy-tailed ones keep them (docs/robust-stopping.md "Bounded tails need no
    margin"). The margins alone: the gain averaged over the shape posterior, which can only add
    draws, is left out (TailPandora._averaged, tested on its own below)."""

    def draws(family: str, prior: XiPrior | None, seed: int) -> tuple[list[int], list[float]]:
        rows = generate(SynthSpec(family=family, prompts=12, samples=400, seed=seed))["rewards"]
        samples, shares = [], []
        for row in rows:
            policy = TailPandora(1e-3, max_samples=400, prior=prior)
            policy._averaged = lambda m_offset: 0.0  # the point fit's gain, with its margins
            for reward in row:
                if policy.observe(float(reward)):
                    break
            samples.append(policy.n)
            shares.append(policy._tracker.fit.margin_share)
        return samples, shares

    for family, seed in (("mixture", 4), ("student-t", 5)):
        prior = XiPrior()
        for row in generate(SynthSpec(family=family, prompts=4, samples=120, seed=seed))["rewards"]:
            prior.update(row)
        assert SHARE_MIN_REQUESTS <= prior.requests < MIN_REQUESTS
        learned, shares = draws(family, prior, seed + 10)
        fixed, _ = draws(family, None, seed + 10)
        if family == "mixture":  # 114 against 142 samples per request (shares ~0.2-0.6)
            assert np.median(shares) < 0.6 and np.mean(learned) < 0.85 * np.mean(fixed)
        else:  # the same requests, the same samples
            assert np.median(shares) > 0.9 and np.mean(learned) > 0.9 * np.mean(fixed)


def test_cost_prior_persists_its_xi_prior_and_old_snapshots_start_afresh():
    prior = CostShapePrior()
    for row in _mixture_rows(12, seed=3):
        prior.update(row[:60])
    restored = CostShapePrior.from_dict(json.loads(json.dumps(prior.to_dict(), allow_nan=False)))
    assert restored.xi.to_dict() == prior.xi.to_dict() and restored.xi.learned
    old = {k: v for k, v in prior.to_dict().items() if k != "xi"}
    assert CostShapePrior.from_dict(old).xi.requests == 0
    with pytest.raises(ValueError):
        CostShapePrior.from_dict({**prior.to_dict(), "xi": {"g": [1.0]}})


def test_target_prior_learns_and_persists_the_tail_shape_distribution():
    """The target default's prior keeps the same XiPrior as the cost prior (one per model), and a
    snapshot from before it restores a fresh one."""
    prior = ShapePrior()
    for row in _mixture_rows(12, seed=3):
        assert prior.update(row[:60])
    assert prior.xi.requests == 12 and prior.xi.learned
    restored = ShapePrior.from_dict(json.loads(json.dumps(prior.to_dict(), allow_nan=False)))
    assert restored.xi.to_dict() == prior.xi.to_dict()
    old = {k: v for k, v in prior.to_dict().items() if k != "xi"}
    assert ShapePrior.from_dict(old).xi.requests == 0
    with pytest.raises(ValueError):
        ShapePrior.from_dict({**prior.to_dict(), "xi": {"g": [1.0]}})


def test_target_cold_start_reads_the_deployments_tail_shapes():
    """Before the target prior's table is trusted (10 requests) the request runs
    TailTargetAcceptance with the prior's learned xi distribution: on bimodal prompts (the better
    mode a bounded tail) it drops the benchmark's confidence margin and delivers less of the
    over-delivered acceptance, at fewer samples; on Student-t prompts it keeps the margin."""

    def run(family: str, prior: ShapePrior | None, seed: int) -> tuple[float, list[float]]:
        rows = generate(SynthSpec(family=family, prompts=12, samples=400, seed=seed))["rewards"]
        samples, shares = [], []
        for row in rows:
            policy = PooledTargetAcceptance(0.8, prior=prior, max_samples=400)
            assert policy.cold
            for reward in row:
                if policy.observe(float(reward)):
                    break
            samples.append(policy.n)
            shares.append(policy._fallback._tracker.fit.margin_share)
        return float(np.mean(samples)), shares

    for family, seed in (("mixture", 4), ("student-t", 5)):
        prior = ShapePrior()
        for row in generate(SynthSpec(family=family, prompts=8, samples=120, seed=seed))["rewards"]:
            prior.update(row)
        assert prior.requests < COLD_START and prior.xi.learned
        learned, shares = run(family, prior, seed + 10)
        fixed, _ = run(family, None, seed + 10)
        if family == "mixture":
            assert np.median(shares) < 0.6 and learned < 0.9 * fixed
        else:
            assert np.median(shares) > 0.9 and learned > 0.9 * fixed


def _end_of_fit(y: np.ndarray, xi: float, sigma: float) -> float:
    return -sigma / xi  # a bounded GPD's end, relative to the threshold


def test_a_bounded_tails_sigma_reads_where_the_rewards_end():
    """Uniform exceedances (xi = -1, end 1): the posterior mean of sigma places the end from
    the largest exceedance, the mean-exceedance match from their average - far noisier."""
    rng = np.random.default_rng(11)
    post, moment = [], []
    for _ in range(400):
        y = np.sort(rng.uniform(size=15))
        post.append(_end_of_fit(y, -0.9, posterior_sigma(y, -0.9)) - 1.0)
        moment.append(_end_of_fit(y, -0.9, y.mean() * 1.9) - 1.0)
    rmse = [float(np.sqrt(np.mean(np.square(e)))) for e in (post, moment)]
    assert rmse[0] < 0.5 * rmse[1]


def test_an_open_tail_misread_as_bounded_keeps_its_reach():
    """Exponential exceedances fitted with xi = -0.5: the posterior mean keeps the spread of
    sigma, so the tail's 0.95-quantile is not cut short (the mean's match cuts it by ~0.67)."""
    rng = np.random.default_rng(12)

    def q95(sigma: float, xi: float) -> float:
        return sigma * (0.05**-xi - 1.0) / xi

    post, moment = [], []
    for _ in range(400):
        y = np.sort(rng.exponential(size=15))
        post.append(q95(posterior_sigma(y, -0.5), -0.5) - np.log(20.0))
        moment.append(q95(y.mean() * 1.5, -0.5) - np.log(20.0))
    assert np.mean(post) > -0.05 and np.mean(moment) < -0.5


def test_uniform_exceedances_reach_the_grids_end():
    """The grid goes down to xi = -1 and each bounded xi integrates sigma from its support's
    edge: averaged over samples, uniform exceedances favour their own -1 (the grid used to end
    at -0.9)."""
    rng = np.random.default_rng(13)
    mean_lik = np.mean([np.exp(xi_log_likelihood(rng.uniform(size=15))) for _ in range(300)], 0)
    assert XI_GRID[0] == -1.0 and XI_GRID[np.argmax(mean_lik)] == -1.0


def test_a_snapshot_on_the_old_grid_restarts():
    """A prior saved on the grid -0.9 .. 0.8 (18 points) has rows integrated another way:
    it restores as a fresh prior, which re-learns within MIN_REQUESTS requests."""
    old = {"rows": [[0.0] * 18], "g": [1.0 / 18] * 18, "requests": 1}
    restored = XiPrior.from_dict(old)
    assert restored.requests == 0 and len(restored.g) == XI_GRID.size
    for bad in ([0.5, 0.5], 7, "g"):  # any other size or type is refused, as before
        with pytest.raises(ValueError):
            XiPrior.from_dict({"rows": [], "g": bad, "requests": 0})


def test_the_cold_start_averages_its_gain_over_the_shape_posterior():
    """Two-mode prompts read as bounded tails; the few open shapes the posterior keeps pay
    for draws at c = 1e-4, hardly ever at 1e-3 (TailPandora._averaged; 15 and 0 of these 30
    requests with the open shapes' sigma spread, 2026-11-29)."""
    rows = generate(SynthSpec(family="mixture", prompts=40, samples=960, seed=2))["rewards"]
    prior = XiPrior()
    for row in rows[:10]:
        prior.update(row[:120])  # what earlier requests of the deployment left
    for cost, least_later in ((1e-4, 8), (1e-3, 0)):
        later, gained = 0, []
        for row in rows[10:]:
            kappa = np.quantile(row, 0.99)
            drawn = []
            for averaged in (True, False):
                policy = TailPandora(cost, prior=prior, max_samples=960)
                if not averaged:
                    policy._averaged = lambda m_offset: 0.0  # the point fit's gain alone
                n = next(i for i, x in enumerate(row, 1) if policy.observe(float(x)))
                drawn.append(n)
                gained.append(acceptance(row[:n].max() - kappa) * (1 if averaged else -1))
            assert drawn[0] >= drawn[1]  # the average only adds to the gain
            later += drawn[0] > drawn[1]
        assert later >= least_later and later <= (30 if cost < 1e-3 else 2)
        if cost < 1e-3:  # the later stops found better rewards
            assert sum(gained) > 0.0


def test_the_cold_start_weighs_how_little_the_tails_scale_is_known(monkeypatch):
    """Power-law tails (GPD, xi = 0.3) at c = 1e-4: with each shape's sigma spread over its
    posterior (SIGMA_NODES) the cold start stops later, never sooner, and earns more than with
    one sigma per shape - the stops it moves are those whose exceedances happened to be small
    (the one-sigma rule's benchmark lay under their best)."""
    rows = generate(SynthSpec(family="pareto", prompts=60, samples=960, seed=3))["rewards"]
    prior = XiPrior()
    for row in rows[:10]:
        prior.update(row[:120])  # what earlier requests of the deployment left
    rng = np.random.default_rng(0)
    requests = [rng.permutation(row) for row in rows[10:] for _ in range(3)]
    drawn, profit = {}, {}
    for name, nodes in (("spread", SIGMA_NODES), ("one sigma", ((0.0, 1.0),))):
        monkeypatch.setattr(xi_prior, "SIGMA_NODES", nodes)
        drawn[name], profit[name] = [], 0.0
        for row in requests:
            policy = TailPandora(1e-4, prior=prior, max_samples=960)
            n = next(i for i, x in enumerate(row, 1) if policy.observe(float(x)))
            drawn[name].append(n)
            profit[name] += acceptance(row[:n].max() - np.quantile(row, 0.99)) - 1e-4 * n
    later = np.array(drawn["spread"]) - np.array(drawn["one sigma"])
    assert np.all(later >= 0) and np.count_nonzero(later) >= 50  # 83 of 150 when written
    assert profit["spread"] > profit["one sigma"] + 0.3  # +0.86 (0.9662 vs 0.9605 per request)

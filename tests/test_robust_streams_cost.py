"""Cost mode's Best-of-N read from a deployment's kept streams - lumpy ones, or smooth ones on a
floor the rewards pile up at: ``n_for_cost``, ``CostShapePrior.streams_best_of_n`` and the
ShapePandora requests it decides."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from scipy.stats import norm

from stoppers.faircap import acceptance_rate
from stoppers.robust.cost_prior import (
    STREAMS_N_FLOOR_MIN,
    STREAMS_N_KEY,
    STREAMS_N_MIN_STREAMS,
    STREAMS_N_XI_REQUESTS,
    CostShapePrior,
)
from stoppers.robust.shape_cost import ShapePandora
from stoppers.robust.stream_bootstrap import (
    BOOTSTRAP_MIN_STREAMS,
    _mean_acceptance,
    n_for_cost,
    pseudo_prompts,
)

ALPHA = 0.99
FLOOR = -9.0


def _lumps(rng: np.random.Generator, size: int, centres: np.ndarray) -> np.ndarray:
    """``size`` answers in lumps scored alike around ``centres``."""
    return rng.choice(centres, size) + rng.normal(0.0, 0.3, size)


def _lumps_prompt(rng: np.random.Generator, size: int = 20_000) -> np.ndarray:
    """3-7 lumps of answers scored alike, nothing at a floor."""
    return _lumps(rng, size, rng.normal(0.0, 3.0, rng.integers(3, 8)))


def _judge_prompt(rng: np.random.Generator, size: int = 20_000) -> np.ndarray:
    """A judge's prompt: its own share at the floor and 3-7 lumps of answers scored alike."""
    centres = rng.normal(0.0, 3.0, rng.integers(3, 8))
    at_floor = rng.random(size) < rng.uniform(0.2, 0.7)
    return np.where(at_floor, FLOOR, np.maximum(_lumps(rng, size, centres), FLOOR))


def _full(prompts: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The prompts' own (log F, AR) on their sorted draws: what the bootstrap estimates."""
    out = []
    for p in prompts:
        x = np.sort(p)
        out.append(
            (np.log(np.arange(1, x.size + 1) / x.size), acceptance_rate(x, np.quantile(p, ALPHA)))
        )
    return out


def _deployment(
    seed: int,
    prompts: int = 30,
    make: Callable[[np.random.Generator], np.ndarray] = _judge_prompt,
) -> tuple[list[np.ndarray], CostShapePrior]:
    """``prompts`` prompts from ``make``, one stream of 96 each kept."""
    rng = np.random.default_rng(seed)
    rows = [make(rng) for _ in range(prompts)]
    prior = CostShapePrior()
    for row in rows:
        prior.update(rng.choice(row, 96, replace=False).tolist())
    return rows, prior


def _profits(truth: list[tuple[np.ndarray, np.ndarray]], cost: float, *ns: int) -> np.ndarray:
    """Best-of-n's mean acceptance - cost n on the prompts' full distributions, for each n."""
    n = np.array(ns, dtype=np.float64)
    return _mean_acceptance(truth, n) - cost * n


def _assert_reads_the_prompts_best_n(
    seed: int, rows: list[np.ndarray], prior: CostShapePrior, n_share: float, profit_share: float
) -> None:
    """At c = 1e-3 and 1e-4 the prior's N is within ``n_share`` of the prompts' own best and
    earns within ``profit_share`` of its profit on their full distributions."""
    truth = _full(rows)
    for cost in (1e-3, 1e-4):
        got = prior.streams_best_of_n(cost, min_samples=8, horizon=960)
        want = n_for_cost(truth, cost, horizon=960, min_samples=8)
        assert got is not None and want is not None
        assert abs(got - want) <= n_share * want, (seed, cost, got, want)
        profit = _profits(truth, cost, got, want)
        assert profit[0] >= profit[1] - profit_share * abs(profit[1])


@pytest.mark.parametrize("cost", [3e-2, 1e-3, 1e-4, 1e-5])
def test_the_n_for_a_cost_is_the_one_that_earns_most(cost: float) -> None:
    """Bisection on the marginal draw finds the argmax of mean acceptance - cost n that a scan
    of every n in [8, 960] finds (the marginal gain falls with n on every prompt)."""
    rng = np.random.default_rng(4)
    streams = [rng.choice(_judge_prompt(rng), 96, replace=False) for _ in range(20)]
    prompts = pseudo_prompts(streams, alpha=ALPHA).prompts
    ns = np.arange(8, 961, dtype=np.float64)
    scanned = int(ns[np.argmax(_mean_acceptance(prompts, ns) - cost * ns)])
    assert n_for_cost(prompts, cost, horizon=960, min_samples=8) == scanned


def test_the_n_for_a_cost_at_its_bounds() -> None:
    rng = np.random.default_rng(5)
    streams = [rng.choice(_judge_prompt(rng), 96, replace=False) for _ in range(12)]
    prompts = pseudo_prompts(streams, alpha=ALPHA).prompts
    assert n_for_cost(prompts, 1.0, horizon=960, min_samples=8) == 8  # no draw pays
    assert n_for_cost(prompts, 1e-12, horizon=40, min_samples=8) == 40  # every draw does
    assert n_for_cost(prompts, 1e-3, horizon=8, min_samples=8) == 8
    assert n_for_cost(prompts[: BOOTSTRAP_MIN_STREAMS - 1], 1e-3, horizon=960) is None


def test_a_judge_deployment_reads_the_best_of_n_that_earns_most() -> None:
    """30 judge prompts, one stream of 96 each kept: the N read is within 15% of the prompts'
    own best (read 67 / 63 / 72 against 63 / 62 / 68 at c = 1e-3, 176 / 165 / 182 against
    170 / 167 / 173 at 1e-4), and Best-of-that-N earns within 0.5% of the best fixed N's
    profit on the prompts' full distributions."""
    for seed in range(3):
        rows, prior = _deployment(seed)
        _assert_reads_the_prompts_best_n(seed, rows, prior, 0.15, 0.005)


def test_smooth_or_rounded_deployments_keep_their_rules() -> None:
    """Normal prompts: the streams read smooth, no N (the cost policy's paths decide as
    before). Integer scores: a lattice's streams hold only the levels they drew, no N."""
    rng = np.random.default_rng(6)
    normal, rounded = CostShapePrior(), CostShapePrior()
    for _ in range(30):
        normal.update((rng.normal(0.0, 2.0) + rng.normal(0.0, 1.0, 96)).tolist())
        rounded.update(np.round(rng.normal(5.0, 2.0) + rng.normal(0.0, 1.5, 96)).tolist())
    for prior in (normal, rounded):
        assert prior.streams_best_of_n(1e-3, min_samples=8, horizon=960) is None
        assert ShapePandora(1e-3, prior=prior, max_samples=960).streams_n is None


def _winner_prompt(rng: np.random.Generator, size: int = 20_000) -> np.ndarray:
    """A judge's prompt whose rewards read smooth: its own share at the floor, and above it one
    normal bulk with a winning cluster of its own weight three sds up (the real pool's two-mode
    interiors, smoothed)."""
    at_floor = rng.random(size) < rng.uniform(0.2, 0.6)
    winning = rng.random(size) < rng.uniform(0.05, 0.3)
    inner = rng.normal(rng.normal(-3.0, 1.0), 1.0, size) + 3.0 * winning
    return np.where(at_floor, FLOOR, np.maximum(inner, FLOOR))


def test_smooth_streams_on_a_piled_floor_read_their_best_of_n() -> None:
    """Where the rewards pile up at a floor, cost mode reads the streams' Best-of-N from smooth
    streams too (the target tables do not: there a fitted shape decides instead). On 30 such
    prompts, one stream of 96 each kept: the streams read smooth, the N read is within 10% of
    the prompts' own best (107 / 113 / 114 against 113 / 109 / 112 at c = 1e-3) and earns
    within 0.1% of its profit on the prompts' full distributions."""
    for seed in range(3):
        rows, prior = _deployment(seed, make=_winner_prompt)
        assert prior.piled_floor() is not None
        assert prior.lumpy_streams(ALPHA, STREAMS_N_MIN_STREAMS, STREAMS_N_XI_REQUESTS)() is None
        _assert_reads_the_prompts_best_n(seed, rows, prior, 0.1, 0.001)


def test_the_cold_start_on_a_piled_floor_gives_way_to_the_streams_best_of_n() -> None:
    """Where the floor is not read as censoring (the interiors are not one shape), the request
    that would run the cold start runs the streams' N; where it is read so (a normal cut at
    the floor), the censored rule decides as before and no N is read in its place."""
    _, prior = _deployment(1, make=_winner_prompt)
    policy = ShapePandora(1e-3, prior=prior, max_samples=960)
    n = prior.streams_best_of_n(1e-3, min_samples=8, horizon=960)
    assert not policy.warm and not policy.censored and n is not None and policy.streams_n == n
    rng = np.random.default_rng(1)
    cut = CostShapePrior()
    for _ in range(30):
        share = rng.uniform(0.2, 0.6)  # the prompt's share at the floor
        latent = rng.normal(0.0, 1.0, 96) - float(norm.ppf(share))
        cut.update(np.maximum(latent + FLOOR, FLOOR).tolist())
    policy = ShapePandora(1e-3, prior=cut, max_samples=960)
    assert cut.piled_floor() is not None and policy.censored and policy.streams_n is None


def test_the_cold_start_gives_way_to_the_streams_best_of_n() -> None:
    """On the judge deployment the cold start would decide; the request runs the N read from
    the streams instead and stops there (reason "fixed"); rewards all at the floor stop
    sooner where the floor's bound says one more draw gains less than it costs."""
    rows, prior = _deployment(0)
    policy = ShapePandora(1e-3, prior=prior, max_samples=960)
    n = prior.streams_best_of_n(1e-3, min_samples=8, horizon=960)
    assert not policy.warm and n is not None and policy.streams_n == n
    stream = np.random.default_rng(1).permutation(rows[0])
    stream[0] = 5.0  # one reward above the floor: Best-of-N runs to its N
    for reward in stream:
        if policy.observe(float(reward)):
            break
    assert (policy.n, policy.stop_reason) == (n, "fixed")
    at_floor = ShapePandora(1e-3, prior=prior, max_samples=960)
    while not at_floor.observe(FLOOR):
        pass
    assert (at_floor.n, at_floor.stop_reason) == (n, "fixed")  # its bound: 222 at the floor
    # a third of the prompts all at the floor: the bound learned from them stops such a request
    rng = np.random.default_rng(2)
    floored = CostShapePrior()
    for i in range(30):
        row = np.full(2_000, FLOOR) if i % 3 == 0 else _judge_prompt(rng)
        floored.update(rng.choice(row, 96, replace=False).tolist())
    policy = ShapePandora(1e-3, prior=floored, max_samples=960)
    assert policy.streams_n is not None
    while not policy.observe(FLOOR):
        pass
    assert policy.stop_reason == "floor" and 8 <= policy.n < policy.streams_n / 2


def test_the_n_is_built_by_the_hook_where_the_gateway_sets_one() -> None:
    """With ``schedule_build`` set the request never builds: it gets the cached N (None before
    the first build) and the hook is asked for the key; once installed, the N is read."""
    _, prior = _deployment(1)
    asked = []
    prior.schedule_build = lambda p, key: asked.append(key)
    assert prior.streams_best_of_n(1e-3, min_samples=8, horizon=960) is None
    assert ShapePandora(1e-3, prior=prior, max_samples=960).streams_n is None
    (key,) = {key for key in asked if key[0] == STREAMS_N_KEY}  # (and the likelihood fits)
    prior.install(key, prior.prepare(key)())
    n = prior.streams_best_of_n(1e-3, min_samples=8, horizon=960)
    assert n is not None and ShapePandora(1e-3, prior=prior, max_samples=960).streams_n == n
    # a client's cost is keyed to three significant digits: 0.0010004 reads the same build
    assert prior.streams_best_of_n(0.0010004, min_samples=8, horizon=960) == n


def test_the_n_is_read_from_four_requests_streams() -> None:
    """With no floor the rewards pile up at, the cost path reads its N from
    ``STREAMS_N_MIN_STREAMS`` kept streams, once the xi distribution learned from
    ``STREAMS_N_XI_REQUESTS`` requests reads light tails: on lumpy prompts, none after three
    requests, an N after four (the target tables still wait for ``BOOTSTRAP_MIN_STREAMS``). The
    N read from four streams is within 15% of the one read from thirty (58 / 49 / 55 against
    54 / 56 / 57 at c = 1e-3)."""
    assert STREAMS_N_MIN_STREAMS == STREAMS_N_XI_REQUESTS == 4 < BOOTSTRAP_MIN_STREAMS
    for seed in range(3):
        rows, full = _deployment(seed, make=_lumps_prompt)
        rng = np.random.default_rng(seed + 10)
        prior = CostShapePrior()
        for k, row in enumerate(rows[:STREAMS_N_MIN_STREAMS], start=1):
            assert prior.streams_best_of_n(1e-3, min_samples=8, horizon=960) is None, k
            prior.update(rng.choice(row, 96, replace=False).tolist())
        assert prior.piled_floor() is None
        assert prior.streams_readable(STREAMS_N_MIN_STREAMS, STREAMS_N_XI_REQUESTS)
        assert not prior.streams_readable()  # the target tables' bar
        early = prior.streams_best_of_n(1e-3, min_samples=8, horizon=960)
        late = full.streams_best_of_n(1e-3, min_samples=8, horizon=960)
        assert early is not None and late is not None
        assert abs(early - late) <= 0.15 * late, (seed, early, late)


def test_on_a_piled_floor_the_n_is_read_from_fewer_streams() -> None:
    """Where the rewards pile up at a floor the N is read from ``STREAMS_N_FLOOR_MIN`` streams
    and requests: on the judge deployment, as soon as the floor is established (after three
    requests, one before the four the bar is elsewhere), and Best-of-that-N earns within 0.5%
    of the prompts' own best fixed N on their full distributions (55 / 63 / 74 against
    63 / 62 / 68 at c = 1e-3; 0.9986 / 1.0000 / 0.9995 of its profit)."""
    assert STREAMS_N_FLOOR_MIN == 2 < STREAMS_N_MIN_STREAMS
    for seed in range(3):
        rows, _ = _deployment(seed)
        rng = np.random.default_rng(seed + 10)
        prior = CostShapePrior()
        n = None
        for k, row in enumerate(rows[:STREAMS_N_MIN_STREAMS], start=1):
            prior.update(rng.choice(row, 96, replace=False).tolist())
            n = prior.streams_best_of_n(1e-3, min_samples=8, horizon=960)
            if n is not None:
                break
            if k >= STREAMS_N_FLOOR_MIN:
                assert prior.piled_floor() is None, (seed, k)  # it waits for the floor only
        assert n is not None and k < STREAMS_N_MIN_STREAMS, (seed, k)
        assert prior.piled_floor() is not None
        truth = _full(rows)
        want = n_for_cost(truth, 1e-3, horizon=960, min_samples=8)
        assert want is not None
        profit = _profits(truth, 1e-3, n, want)
        assert profit[0] >= 0.995 * profit[1], (seed, n, want)


def test_a_read_short_of_streams_is_retried_at_the_next_request() -> None:
    """A kept stream nearly all at the floor has no interior to read: counted as readable, it
    gives no pseudo-prompt. The N that read too few streams so is read again at the next
    request, not once the requests have doubled: here at the fourth request, the first with two
    streams to read (the cache would have kept the third request's miss until the sixth)."""
    rng = np.random.default_rng(0)

    def at_floor() -> list[float]:
        stream = np.full(96, FLOOR)
        stream[:2] = rng.normal(0.0, 1.0, 2)
        return stream.tolist()

    prior = CostShapePrior()
    for k, kind in enumerate(("judge", "floor", "floor", "judge"), start=1):
        row = _judge_prompt(rng)
        prior.update(rng.choice(row, 96, replace=False).tolist() if kind == "judge" else at_floor())
        n = prior.streams_best_of_n(1e-3, min_samples=8, horizon=960)
        readable = len(pseudo_prompts(prior.streams, alpha=ALPHA, floor=FLOOR).prompts)
        if k == 3:
            floor_bar = (STREAMS_N_FLOOR_MIN, STREAMS_N_FLOOR_MIN)
            assert prior.piled_floor() is not None and prior.streams_readable(*floor_bar)
            assert readable == 1 and n is None
        if k == 4:
            assert readable == 2 and n is not None


def test_four_requests_tell_open_tails_from_bounded_ones() -> None:
    """The light-tail read from four requests: the xi distribution's base measure (two
    requests' worth at xi = 0) keeps open tails from passing as light by chance. Of 20
    deployments of four exponential streams (xi = 0) at most two read light (one does); of
    20 of uniform ones (xi = -1) every one does."""

    def light(draw) -> int:
        count = 0
        for seed in range(20):
            rng = np.random.default_rng(seed)
            prior = CostShapePrior()
            for _ in range(STREAMS_N_XI_REQUESTS):
                prior.update((rng.normal(0.0, 2.0) + draw(rng)).tolist())
            count += prior.streams_readable(STREAMS_N_MIN_STREAMS, STREAMS_N_XI_REQUESTS)
        return count

    assert light(lambda rng: rng.exponential(1.0, 96)) <= 2
    assert light(lambda rng: rng.uniform(0.0, 1.0, 96)) == 20

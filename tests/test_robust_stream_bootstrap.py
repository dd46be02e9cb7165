"""The Best-of-N a target needs, read from kept streams (stoppers.robust.stream_bootstrap)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from scipy.stats import norm

from stoppers.faircap import acceptance_rate
from stoppers.robust.shape_prior import streams_best_of_n
from stoppers.robust.stream_bootstrap import (
    BOOTSTRAP_MIN_STREAMS,
    CLUSTER_FLOOR,
    LUMPY_WIDTH_RATIO,
    TOP_CLUSTER_SHARE,
    TOP_GAP_RATIO,
    _distribution,
    _kernels,
    _widths,
    best_of_n_acceptance,
    bootstrap_n,
    cluster_widths,
    loo_bandwidth,
    pseudo_prompts,
    top_cluster_ratio,
)

ALPHA = 0.99


def _lumpy_prompt(rng: np.random.Generator, floor: float = -9.0) -> np.ndarray:
    """A judge-like prompt: its own share at the floor and a handful of narrow lumps above."""
    size = 20_000
    centres = rng.normal(0.0, 3.0, rng.integers(3, 8))
    at_floor = rng.random(size) < rng.uniform(0.2, 0.7)
    lumps = rng.choice(centres, size) + rng.normal(0.0, 0.3, size)
    return np.where(at_floor, floor, np.maximum(lumps, floor))


def _n_for(prompts: list[np.ndarray], target: float) -> int:
    """The least N whose Best-of-N reaches ``target`` on the prompts' full distributions
    (E[AR(max of N - kappa)] on each one's empirical CDF; bisection: it rises with N)."""
    log_cdf = np.log(np.arange(1, prompts[0].size + 1) / prompts[0].size)
    ars = [acceptance_rate(np.sort(p), float(np.quantile(p, ALPHA))) for p in prompts]

    def reaches(n: int) -> bool:
        return np.mean([np.diff(np.exp(n * log_cdf), prepend=0.0) @ ar for ar in ars]) >= target

    lo, hi = 0, 960
    assert reaches(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return hi


def test_lumpy_rewards_get_narrower_kernels_than_smooth_ones() -> None:
    """Normal samples of 96 mostly get Silverman's width or more (the likelihood asks for at
    least 0.7 of it in the median of 10); three lumps of sd 0.05 get kernels of their own
    size, where Silverman's rule would smear them together (~0.5)."""
    ratios, lumps = [], []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        smooth = rng.normal(0.0, 1.0, 96)
        iqr = np.subtract(*np.percentile(smooth, [75, 25]))
        silverman = 0.9 * min(smooth.std(ddof=1), iqr / 1.34) * 96**-0.2
        ratios.append(loo_bandwidth(smooth) / silverman)
        lumps.append(loo_bandwidth(rng.choice([-2.0, 0.0, 2.0], 96) + rng.normal(0.0, 0.05, 96)))
    assert np.median(ratios) >= 0.7
    assert max(lumps) < 0.1
    assert loo_bandwidth(np.array([1.0, 1.0, 2.0])) == 0.0  # two distinct values: no kernel


def test_normal_streams_give_the_normal_best_of_n_curve() -> None:
    rng = np.random.default_rng(1)
    streams = [list(rng.normal(loc, 1.0, 96)) for loc in rng.normal(0.0, 2.0, 40)]
    ns = np.array([4, 16, 64, 256])
    got = best_of_n_acceptance(streams, ns, alpha=ALPHA)
    assert got is not None
    kappa = norm.ppf(ALPHA)
    x = np.linspace(-6.0, 8.0, 20_001)
    want = [float(np.diff(norm.cdf(x) ** n, prepend=0.0) @ acceptance_rate(x, kappa)) for n in ns]
    assert np.max(np.abs(got - np.array(want))) < 0.04


def test_lumpy_prompts_recover_their_true_best_of_n() -> None:
    """Prompts each with their own lumps (sd 0.3) and floor share: the N read from one stream
    of 96 per prompt is never under the N their full distributions need by more than 10%, and
    over it by at most 35% (the kernels widen the top lump: 38 -> 44 at 0.9 here, 46 with one
    width per stream)."""
    rng = np.random.default_rng(2)
    prompts = [_lumpy_prompt(rng) for _ in range(40)]
    streams = [list(rng.choice(p, 96, replace=False)) for p in prompts]
    for target in (0.7, 0.9):
        want = _n_for(prompts, target)
        got = bootstrap_n(streams, target, alpha=ALPHA, horizon=960, floor=-9.0)
        assert got is not None
        assert 0.9 * want - 1 <= got <= 1.35 * want + 1, (target, got, want)


def test_a_short_stream_loses_the_reward_that_stopped_it() -> None:
    """A stream cut short ends on its stopping reward; with ``kept_length`` that reward is left
    out, so an outlier at the end of every short stream does not shrink N."""
    rng = np.random.default_rng(3)
    base = [list(rng.normal(0.0, 1.0, 60)) for _ in range(30)]
    plain = bootstrap_n(base, 0.9, alpha=ALPHA, horizon=960)
    ended = [[*s, 6.0] for s in base]
    assert bootstrap_n(ended, 0.9, alpha=ALPHA, horizon=960, kept_length=96) == plain
    assert bootstrap_n(ended, 0.9, alpha=ALPHA, horizon=960) != plain


def test_too_few_streams_or_an_unreachable_target_give_none() -> None:
    rng = np.random.default_rng(4)
    few = [list(rng.normal(0.0, 1.0, 96)) for _ in range(BOOTSTRAP_MIN_STREAMS - 1)]
    assert bootstrap_n(few, 0.9, alpha=ALPHA, horizon=960) is None
    short = [list(rng.normal(0.0, 1.0, 12)) for _ in range(40)]  # under STREAM_MIN_REWARDS
    assert bootstrap_n(short, 0.9, alpha=ALPHA, horizon=960) is None
    many = few + [list(rng.normal(0.0, 1.0, 96)) for _ in range(20)]
    assert bootstrap_n(many, 0.9, alpha=ALPHA, horizon=4) is None  # Best-of-4 falls short


@dataclass(frozen=True)
class _Table:
    target: float
    fixed_n: int | None
    cap: int | None = None
    cap_factor: float = 1.0  # a floor table's; the plain table's rule ends at twice its N


@pytest.mark.parametrize(
    "fixed_n, cap, cap_factor",
    [(400, None, 1.0), (None, 400, 1.0), (400, 500, 1.0), (None, 900, 2.0), (400, 900, 2.0)],
)
def test_the_tables_best_of_n_is_lowered_where_the_streams_say_fewer(
    fixed_n, cap, cap_factor
) -> None:
    rng = np.random.default_rng(5)
    prompts = [_lumpy_prompt(rng) for _ in range(30)]
    streams = [list(rng.choice(p, 96, replace=False)) for p in prompts]
    n = bootstrap_n(streams, 0.9, alpha=ALPHA, horizon=960, min_samples=8, floor=-9.0)
    assert n is not None and n < 400
    prompts = pseudo_prompts(streams, alpha=ALPHA, floor=-9.0).prompts
    table = streams_best_of_n(_Table(0.9, fixed_n, cap, cap_factor), prompts, 8, 960)
    assert table.fixed_n == (None if fixed_n is None else n)
    assert table.cap == (None if cap is None else math.ceil(cap_factor * n))


def test_the_tables_best_of_n_is_never_raised_and_a_rule_is_left_alone() -> None:
    rng = np.random.default_rng(6)
    streams = [list(rng.normal(0.0, 1.0, 96)) for _ in range(30)]
    prompts = pseudo_prompts(streams, alpha=ALPHA).prompts
    small = _Table(0.9, fixed_n=5)
    assert streams_best_of_n(small, prompts, 8, 960) is small
    rule = _Table(0.9, fixed_n=None)
    assert streams_best_of_n(rule, prompts, 8, 960) is rule


def test_lumpy_streams_are_told_from_smooth_ones() -> None:
    """The tables read the streams' N only where the streams are lumpy: a judge's few lumps per
    prompt are, normal prompts and a Tobit of them are not."""
    rng = np.random.default_rng(7)
    lumpy = [list(rng.choice(_lumpy_prompt(rng), 96, replace=False)) for _ in range(30)]
    normal = [list(rng.normal(loc, 1.0, 96)) for loc in rng.normal(0.0, 2.0, 30)]
    tobit = [list(np.maximum(rng.normal(loc, 1.0, 96), -1.0)) for loc in rng.normal(0.0, 1.0, 30)]
    assert pseudo_prompts(lumpy, alpha=ALPHA, floor=-9.0).lumpy
    assert not pseudo_prompts(normal, alpha=ALPHA).lumpy
    assert not pseudo_prompts(tobit, alpha=ALPHA, floor=-1.0).lumpy
    assert not pseudo_prompts([], alpha=ALPHA).lumpy


def test_the_gate_reads_widths_only_and_the_prompts_match_each_stream_read_alone() -> None:
    """Telling smooth streams from lumpy ones computes no stream's F nor its values' own
    widths (on a smooth deployment they would be discarded); read later, the pseudo-prompts
    are each stream's own."""
    rng = np.random.default_rng(8)
    normal = [rng.normal(loc, 1.0, 96) for loc in rng.normal(0.0, 2.0, 30)]
    read = pseudo_prompts(normal, alpha=ALPHA)
    assert not read.lumpy
    assert "prompts" not in vars(read)  # cached_property: not computed by the gate
    assert not any("widths" in vars(k) for k in read.kernels)  # nor each value's own width
    assert len(read.prompts) == len(normal)
    for stream, (log_f, ar) in zip(normal, read.prompts, strict=True):
        grid, cdf, kappa = _distribution(_kernels(stream, None, None), None, None, ALPHA)
        with np.errstate(divide="ignore"):
            assert np.array_equal(log_f, np.log(cdf))
        assert np.array_equal(ar, acceptance_rate(grid, kappa))


def test_a_judge_like_deployment_builds_its_table_with_the_streams_n(monkeypatch) -> None:
    """End to end through ShapePrior's build: 30 requests of judge-like prompts (light tails,
    lumpy streams) give a censored table whose Best-of-N is the streams' N, below the one the
    table's smooth shape sizes (read with the lumpiness gate closed)."""
    import stoppers.robust.stream_bootstrap as stream_bootstrap
    from stoppers.robust.shape_prior import STREAM_REWARDS, ShapePrior

    rng = np.random.default_rng(8)
    prior = ShapePrior()
    for _ in range(30):
        prior.update(rng.choice(_lumpy_prompt(rng), 96, replace=False))
    key = prior.table_key(0.9, min_samples=8, horizon=960)
    assert prior.xi.mean_xi <= stream_bootstrap.LIGHT_TAIL_XI
    read = prior.prepare(key)()
    want = bootstrap_n(
        prior.streams,
        0.9,
        alpha=ALPHA,
        horizon=960,
        min_samples=8,
        floor=prior.floor.bound,
        kept_length=STREAM_REWARDS,
    )
    monkeypatch.setattr(stream_bootstrap, "LUMPY_WIDTH_RATIO", 0.0)
    monkeypatch.setattr(stream_bootstrap, "TOP_CLUSTER_SHARE", 2.0)
    prior._pseudo_prompts.clear()
    smooth = prior.prepare(key)()
    assert smooth.cap is not None and want is not None and want < smooth.cap
    assert read.cap == want
    assert read.fixed_n in (None, want)


@pytest.mark.parametrize("clipped", [1, 3])
def test_values_at_a_far_ceiling_keep_their_atom(clipped: int) -> None:
    """A lone best at the judge's clip, far above the stream's next value: F jumps to 1 at the
    ceiling by the share clipped there (the grid once stopped 5 kernel widths above the next
    value, dropping that mass; over 1% of the stream it lost the whole pseudo-prompt)."""
    rng = np.random.default_rng(5)
    ceiling = 10.0
    stream = np.append(rng.normal(0.0, 1.0, 120), [ceiling] * clipped)
    prompts = pseudo_prompts([stream], alpha=ALPHA, ceiling=ceiling).prompts
    assert len(prompts) == 1
    log_f, ar = prompts[0]
    f = np.exp(log_f)
    assert f[-1] == pytest.approx(1.0)
    assert f[-1] - f[-2] == pytest.approx(clipped / stream.size, abs=1e-6)
    # three at the clip (2.4%) put the 0.99-quantile there: the ceiling's acceptance is 1
    assert ar[-1] == pytest.approx(1.0)
    assert (ar[-1] > ar[-2]) if clipped == 3 else (ar[-2] > 0.5)
    # ... at the ceiling itself, not at a point of the gap below its atom
    grid, _, kappa = _distribution(_kernels(stream, None, ceiling), None, ceiling, ALPHA)
    assert (kappa == ceiling) if clipped == 3 else (kappa < grid[-2])


def test_streams_drawn_from_the_pseudo_prompts_are_their_smoothed_bootstrap() -> None:
    """Draws keep a stream's floor share and its lumps, stay within the ends, and carry each
    pseudo-prompt's own kappa; the pseudo-prompts are used in turn."""
    rng = np.random.default_rng(9)
    streams = [rng.choice(_lumpy_prompt(rng), 96, replace=False) for _ in range(3)]
    read = pseudo_prompts(streams, alpha=ALPHA, floor=-9.0)
    x, kappa = read.draw(300, 400, np.random.default_rng(1))
    assert x.shape == (300, 400) and kappa.shape == (300,)
    assert x.min() >= -9.0
    for i, stream in enumerate(streams):
        drawn = x[i::3]
        _, _, want = _distribution(_kernels(stream, -9.0, None), -9.0, None, ALPHA)
        assert np.all(kappa[i::3] == want)
        # the floor's atom at the stream's share, the rest near the stream's own values
        assert np.mean(drawn == -9.0) == pytest.approx(np.mean(stream == -9.0), abs=0.02)
        inner = drawn[drawn > -9.0]
        width = _kernels(stream, -9.0, None).width
        gaps = np.abs(inner[:, None] - stream[stream > -9.0][None, :]).min(axis=1)
        assert np.quantile(gaps, 0.99) < 3.0 * width
        assert inner.mean() == pytest.approx(stream[stream > -9.0].mean(), abs=0.25)


def _lumps(rng: np.random.Generator, size: int = 96) -> np.ndarray:
    """A prompt whose responses agree on a few answers: 3-7 tight lumps, no floor."""
    centres = rng.normal(0.0, 1.0, rng.integers(3, 8))
    weights = rng.dirichlet(np.ones(centres.size))
    return rng.choice(centres, size, p=weights) + rng.normal(0.0, 0.03, size)


def test_a_lumpy_deployment_calibrates_its_table_on_the_streams() -> None:
    """Through ShapePrior's build: prompts of a few tight lumps each give a plain table
    calibrated on the streams' pseudo-prompts (``on_streams``), whose cap is twice the
    streams' own Best-of-N and ends the request's run; normal prompts keep the table
    calibrated on their shape."""
    from stoppers.robust.pooled_target import PooledTargetAcceptance
    from stoppers.robust.shape_prior import STREAM_REWARDS, ShapePrior
    from stoppers.robust.stop_table import TABLE_CAP_FACTOR, StopTable

    rng = np.random.default_rng(10)
    lumpy, normal = ShapePrior(), ShapePrior()
    for _ in range(30):
        lumpy.update(rng.normal(0.0, 2.0) + _lumps(rng))
        normal.update(rng.normal(0.0, 2.0) + rng.normal(0.0, 1.0, 96))
    table = lumpy.table(0.9, min_samples=8, horizon=960)
    assert isinstance(table, StopTable) and table.on_streams
    want = bootstrap_n(
        lumpy.streams, 0.9, alpha=ALPHA, horizon=960, min_samples=8, kept_length=STREAM_REWARDS
    )
    assert want is not None
    assert table.cap == pytest.approx(TABLE_CAP_FACTOR * want, abs=TABLE_CAP_FACTOR * 2)
    assert table.fixed_n in (None, *range(want - 2, want + 3))
    policy = PooledTargetAcceptance(0.9, prior=lumpy, max_samples=960)
    assert policy.uses_learned_prior and policy.cap == table.cap
    smooth = normal.table(0.9, min_samples=8, horizon=960)
    assert isinstance(smooth, StopTable) and not smooth.on_streams


def _top_answer(rng: np.random.Generator, size: int = 20_000) -> np.ndarray:
    """A prompt with one correct answer, drawn in 2-8% of its responses and scored alike (3 sds
    up, noise sd 0.05), above a smooth normal bulk."""
    weight = rng.uniform(0.02, 0.08)
    return np.where(rng.random(size) < weight, rng.normal(3.0, 0.05, size), rng.normal(size=size))


def test_a_lump_of_answers_scored_alike_gets_kernels_of_its_own_size() -> None:
    """Six values 0.02 apart at the top of 90 normal ones: the one likelihood width fits the
    bulk; the lump's own kernels are narrowed to a fraction of it (median under a quarter in
    18 of 20 draws). Values that repeat exactly keep a width."""
    narrowed = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        x = np.concatenate([rng.normal(0.0, 1.0, 90), rng.normal(3.0, 0.02, 6)])
        h, silverman = _widths(x)
        widths = cluster_widths(x, h, silverman)
        assert np.all(widths <= h) and np.all(widths > 0.0)
        narrowed.append(np.median(widths[-6:]) / h < 0.25)
    assert sum(narrowed) >= 18
    tied = np.array([0.0, 0.0, 0.0, 1.0, 2.0, 2.5, 3.0])
    h, silverman = _widths(tied)
    assert cluster_widths(tied, h, silverman).min() >= CLUSTER_FLOOR * silverman


def test_a_top_cluster_is_told_from_a_smooth_tail() -> None:
    """The top normalised spacing under a tenth of the next ones' mean: in about a tenth of
    smooth streams (exponential, normal), in every stream whose top three values agree."""
    exponential = [
        top_cluster_ratio(np.random.default_rng(i).exponential(1.0, 96)) for i in range(400)
    ]
    normal = [top_cluster_ratio(np.random.default_rng(i).normal(0.0, 1.0, 48)) for i in range(400)]
    assert 0.04 < np.mean(np.array(exponential) < TOP_GAP_RATIO) < 0.2
    assert 0.04 < np.mean(np.array(normal) < TOP_GAP_RATIO) < 0.2
    rng = np.random.default_rng(3)
    for _ in range(20):
        topped = np.append(rng.normal(0.0, 1.0, 60), 3.5 + rng.normal(0.0, 0.01, 3))
        assert top_cluster_ratio(topped) < TOP_GAP_RATIO
    assert math.isnan(top_cluster_ratio(np.arange(7.0)))  # a quarter of 7: one spacing
    assert math.isnan(top_cluster_ratio(np.ones(40)))


def test_streams_topped_by_an_answer_scored_alike_read_lumpy() -> None:
    """Prompts whose correct answer comes back now and then: the bulk sets the widths (the
    width gate alone reads them smooth in half the draws), the tops cluster in most streams, so
    the kernels read them; normal prompts stay with the table's shape."""
    opened_by_tops = 0
    for seed in range(4):
        rng = np.random.default_rng(seed)
        streams = [rng.choice(_top_answer(rng), 96, replace=False) for _ in range(40)]
        read = pseudo_prompts(streams, alpha=ALPHA)
        assert read.top_clustered_share >= TOP_CLUSTER_SHARE and read.lumpy
        opened_by_tops += read.width_ratio > LUMPY_WIDTH_RATIO
        normal = pseudo_prompts([rng.normal(0.0, 1.0, 96) for _ in range(40)], alpha=ALPHA)
        assert normal.top_clustered_share < TOP_CLUSTER_SHARE and not normal.lumpy
    assert opened_by_tops >= 2


def test_top_answer_prompts_recover_their_true_best_of_n(monkeypatch) -> None:
    """One stream of 96 per prompt: the N read for 0.7 / 0.9 is within 25% over the prompts'
    own (here 14-15 / 37-42 against 13-14 / 31-36; one kernel width per stream read 17-19 /
    49-54: its lump smeared above itself put kappa where Best-of-N must draw the lump's top)."""
    import stoppers.robust.stream_bootstrap as stream_bootstrap

    for seed in range(2):
        rng = np.random.default_rng(seed)
        prompts = [_top_answer(rng) for _ in range(40)]
        streams = [rng.choice(p, 96, replace=False) for p in prompts]
        for target in (0.7, 0.9):
            want = _n_for(prompts, target)
            got = bootstrap_n(streams, target, alpha=ALPHA, horizon=960)
            assert got is not None and want <= got <= 1.25 * want + 1, (target, got, want)
            with monkeypatch.context() as m:
                m.setattr(stream_bootstrap, "cluster_widths", lambda x, h, _: np.full(len(x), h))
                one_width = bootstrap_n(streams, target, alpha=ALPHA, horizon=960)
            assert one_width is not None and one_width > got


def test_a_deployment_whose_requests_stop_early_reads_its_few_long_streams() -> None:
    """At a low target the warm requests stop after 8-25 rewards, too few to read
    (``STREAM_MIN_REWARDS``): the long streams are mostly the cold start's. Thirty requests, the
    first five of 96 rewards and the rest of 12: a lumpy deployment calibrates its table on
    the five (10 of 10 seeds; none with four), a normal one keeps its shape's table (1 of 10
    read lumpy by chance) and a Gumbel one too (0 of 10)."""
    from stoppers.robust.shape_prior import ShapePrior
    from stoppers.robust.stop_table import StopTable

    assert BOOTSTRAP_MIN_STREAMS == 5

    def on_streams(draw, long: int) -> int:
        count = 0
        for seed in range(10):
            rng = np.random.default_rng(seed)
            prior = ShapePrior()
            for i in range(30):
                rewards = rng.normal(0.0, 2.0) + draw(rng)
                prior.update(rewards if i < long else rewards[:12])
            table = prior.table(0.7, min_samples=8, horizon=960)
            count += isinstance(table, StopTable) and table.on_streams
        return count

    assert on_streams(_lumps, 5) == 10
    assert on_streams(_lumps, 4) == 0
    assert on_streams(lambda rng: rng.normal(0.0, 1.0, 96), 5) <= 2
    assert on_streams(lambda rng: rng.gumbel(0.0, 1.0, 96), 5) <= 2

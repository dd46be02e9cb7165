"""Per-observe cost of the GPD-tail policies: ``python -m stoppers.robust.bench``.

For each n in (10, 100, 960) a policy is fed n - 1 Student-t(3) rewards with a cost / target
it cannot reach (kappa_z = 50; ShapePandora: warm on 40 learned Student-t requests at c =
1e-12, inflation 50, and on its likelihood path - the moment path held off - with a cost
below any gain;
TailPandora+XiPrior: the xi distribution those requests taught; PooledTargetAcceptance also on
a bimodal deployment, where its multiplier rule decides, and on a judge-like one, where its
censored table rule does; ShapePandora there too, on its censored reading, and on a Tobit
deployment on its cut reading), then each of
``--repeats`` copies of that state observes a fresh stream of max(1, n // 16) more rewards,
each ``observe`` timed. Why a window and not one reward per copy: a policy that re-evaluates
on a schedule (ShapePandora every n/32 rewards, the GPD policies' refits after 1/8 growth) does
so at the same position in every copy, so one reward per copy timed either always or never the
evaluation; a window covers the schedule as a real stream does.
Prints median, p99 and mean in microseconds (the mean is what the schedule costs per reward).
Timings on a shared machine are noisy: compare figures from one run, not across runs.
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np

from stoppers.robust.cost import TailPandora
from stoppers.robust.cost_prior import cost_shape_prior
from stoppers.robust.shape_cost import ShapePandora
from stoppers.robust.target import TailTargetAcceptance

__all__ = ["main", "observe_latency"]


def observe_latency(
    make,
    n: int,
    repeats: int,
    seed: int = 0,
    step: float | None = None,
    floor: float | None = None,
) -> np.ndarray:
    """Seconds per ``observe`` of rewards n, n + 1, ..., n + max(1, n // 16) - 1: one window
    per repeat, each on a copy of the state after n - 1 rewards (all windows concatenated).
    Rewards are Student-t(3), rounded to multiples of ``step`` if given (a judge's ratings),
    raised to ``floor`` if given (a floor the rewards pile up at)."""
    rng = np.random.default_rng(seed)

    def draws(shape):
        x = rng.standard_t(3.0, shape)
        x = x if step is None else step * np.round(x / step)
        return (x if floor is None else np.maximum(x, floor)).tolist()

    for _attempt in range(20):
        policy = make()
        if not any(policy.observe(r) for r in draws(n - 1)):
            break
    else:
        raise RuntimeError(f"{type(policy).__name__} kept stopping before n={n}; cannot time")
    window = max(1, n // 16)
    fresh = draws((repeats, window))
    out = np.empty(repeats * window)
    clock = time.perf_counter
    k = 0
    for rewards in fresh:
        state = copy.deepcopy(policy)
        for reward in rewards:
            start = clock()
            stopped = state.observe(reward)
            out[k] = clock() - start
            k += 1
            if stopped:
                raise RuntimeError(f"{type(policy).__name__} stopped at n={state.n}; cannot time")
    return out


def _repeats_unreachable(policy):
    """The repeats rule's target raised to 1 (:class:`~stoppers.robust.tracker.SeenValues`): it
    still reads its chance at every observe, but on continuous rewards it would stop the
    request at 229 draws for a target of 0.9 (1 - 0.99^n), before the n timed here."""
    seen = policy._ties.seen
    assert seen is not None
    seen.target = 1.0
    return policy


def _pooled_unreachable():
    """PooledTargetAcceptance with a learned prior and its offset raised out of reach."""
    import dataclasses

    from stoppers.robust.pooled_target import PooledTargetAcceptance
    from stoppers.robust.shape_prior import ShapePrior

    rng = np.random.default_rng(1)
    prior = ShapePrior()
    for _ in range(30):
        prior.update(rng.standard_t(3.0, 200))

    def make():
        policy = PooledTargetAcceptance(0.9, prior=prior, max_samples=10_000, cold_start=1)
        policy._table = dataclasses.replace(policy._table, offset=1e6)
        policy._fixed_n = None  # time the table rule itself, not the Best-of-N it may name
        policy._cap = None  # ... nor the Best-of-N that ends its run
        return _repeats_unreachable(policy)

    return make


def _floor_unreachable():
    """PooledTargetAcceptance on a judge-like deployment (30 requests of ``pandora synth --family
    judge``): its censored table rule, the offset raised out of reach and no Best-of-N cap."""
    import dataclasses

    from stoppers.replay.synth import SynthSpec, generate
    from stoppers.robust.pooled_target import PooledTargetAcceptance
    from stoppers.robust.shape_prior import ShapePrior

    prior = ShapePrior()
    for row in generate(SynthSpec(family="judge", prompts=30, samples=120, seed=1))["rewards"]:
        prior.update(row)

    def make():
        policy = PooledTargetAcceptance(0.9, prior=prior, max_samples=10_000, cold_start=1)
        assert policy._censored is not None
        policy._censored = dataclasses.replace(policy._censored, offset=1e6, cap=None, fixed_n=None)
        policy._fixed_n = policy._cap = None
        return _repeats_unreachable(policy)

    return make


def _multiplier_unreachable():
    """PooledTargetAcceptance on a bimodal deployment (30 requests sharing a bulk and a better
    mode), where its multiplier rule decides; the rule's answer is turned to "go on" after
    its full evaluation, so every observe pays what it pays in service."""
    from stoppers.robust.multiplier_target import MultiplierTargetRule
    from stoppers.robust.pooled_target import PooledTargetAcceptance
    from stoppers.robust.shape_prior import ShapePrior

    class GoOn(MultiplierTargetRule):
        def evaluate(self, rewards, best):
            margin, accepted = super().evaluate(rewards, best)
            return abs(margin) + 1.0, accepted

    rng = np.random.default_rng(2)
    prior = ShapePrior()
    for _ in range(30):
        z = np.where(rng.random(96) < 0.25, rng.normal(2.5, 0.5, 96), rng.normal(0.0, 1.0, 96))
        prior.update(rng.normal(0.0, 2.0) + z)

    def make():
        policy = PooledTargetAcceptance(0.9, prior=prior, max_samples=10_000, cold_start=1)
        assert policy.multimodal
        policy._multiplier.__class__ = GoOn
        policy._cap = None  # the table's Best-of-N would end the rule's run
        return _repeats_unreachable(policy)

    return make


def _bayes_unreachable(learned):
    """BayesShapePandora warm on ``learned`` whose table never says stop (one lookup per
    observe is all it ever does; the table's values do not change its cost)."""
    import dataclasses

    from stoppers.robust.bayes_cost import BayesShapePandora

    table = BayesShapePandora(1e-3, max_samples=10_000, prior=learned, horizon=40).table
    never = dataclasses.replace(table, margin=np.full_like(table.margin, -1.0))
    return lambda: BayesShapePandora(1e-3, max_samples=10_000, table=never)


def _unreachable_tail(xi_prior=None):
    """TailPandora whose benchmark margin of 50 standard errors keeps kappa_hat out of reach:
    no early stop (``xi_prior``: the deployment's learned tail-shape distribution)."""
    return TailPandora(1e-12, max_samples=10_000, kappa_z=50.0, scale_z=50.0, prior=xi_prior)


def _never_stopping_cold_start(policy, learned):
    """Swap the cold start a warm ShapePandora runs alongside (its cap, ``BLEND_CAP``) for one
    that never stops: it keeps observing, as it does until its own stop in service."""
    assert policy._shadow is not None
    policy._shadow = _unreachable_tail(learned.xi)
    return policy


def _shape_unreachable(learned):
    """ShapePandora warm on ``learned`` (trusted: the moment path); parameter uncertainty x50
    keeps the gain above c = 1e-12."""
    return lambda: _never_stopping_cold_start(
        ShapePandora(1e-12, max_samples=10_000, prior=learned, inflation=50.0), learned
    )


def _likelihood_unreachable(learned):
    """ShapePandora on its likelihood path (``warm_requests`` out of reach keeps the moment
    path off) whose cost is set below any gain after construction: every observe takes the path
    it takes in service."""

    def make():
        policy = ShapePandora(1e-3, max_samples=10_000, prior=learned, warm_requests=10**9)
        assert policy.fitted_shape is not None
        policy.cost = -1.0
        return _never_stopping_cold_start(_pile_unreachable(policy), learned)

    return make


def _pile_unreachable(policy):
    """The learned pile's stop (:mod:`stoppers.robust.pile`) set below any gain, like the
    policy's own cost: on rounded rewards it still reads its posterior whenever the best comes
    back, as in service, but never ends the timed request."""
    if policy._pile is not None:
        policy._pile.cost = -1.0
    return policy


def _censored_unreachable():
    """ShapePandora on its censored path (a judge-like deployment: 30 requests of ``pandora
    synth --family judge``, the floor moved far below the Student-t rewards timed) whose cost is
    set below any gain after construction."""
    from stoppers.replay.synth import SynthSpec, generate

    prior = cost_shape_prior()
    for row in generate(SynthSpec(family="judge", prompts=30, samples=120, seed=1))["rewards"]:
        prior.update(np.where(row > row.min(), row, -1e3))
    return _floor_path_unreachable(prior, lambda policy: policy.censored)


CUT_FLOOR = -1.0  # where the cut row's deployment and timed rewards pile up (a fifth of t(3))


def _cut_unreachable():
    """ShapePandora on its cut reading (30 requests of ``pandora synth --family floored
    --loc-mean -2``, moved so that their floor is ``CUT_FLOOR``, where the timed Student-t
    rewards are raised to) whose cost is set below any gain after construction."""
    from stoppers.replay.synth import SynthSpec, generate

    prior = cost_shape_prior()
    spec = SynthSpec(family="floored", prompts=30, samples=120, seed=1, loc_mean=-2.0)
    rewards = generate(spec)["rewards"]
    for row in rewards - rewards.min() + CUT_FLOOR:
        prior.update(row)
    return _floor_path_unreachable(prior, lambda policy: policy.floor_cuts)


def _floor_path_unreachable(prior, on_path):
    """ShapePandora on ``prior`` (asserted ``on_path``), its cost set below any gain after
    construction: every observe takes the path it takes in service."""

    def make():
        policy = ShapePandora(1e-3, max_samples=10_000, prior=prior)
        assert on_path(policy)
        policy.cost = -1.0
        return _never_stopping_cold_start(_pile_unreachable(policy), prior)

    return make


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--sizes", default="10,100,960")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    learned = cost_shape_prior()  # a warm cost prior: 40 finished Student-t(3) requests
    rng = np.random.default_rng(1)
    for _ in range(40):
        learned.update((rng.normal(0, 2) + rng.standard_t(3.0, 100)).tolist())
    rounded = cost_shape_prior()  # 40 finished requests of integer-rounded normal rewards
    for _ in range(40):
        rounded.update(np.round(rng.normal(0, 2) + 2.0 * rng.standard_normal(100)).tolist())
    makers = {
        "TailPandora": _unreachable_tail,
        # the default's cold start on a deployment: the tail shape from the learned xi prior
        "TailPandora+XiPrior": lambda: _unreachable_tail(learned.xi),
        "TailTargetAcceptance": lambda: TailTargetAcceptance(1.0, max_samples=10_000, kappa_z=50.0),
        # warm (learned shape, trusted: the moment path)
        "ShapePandora": _shape_unreachable(learned),
        # its likelihood path (where the shape is not trusted)
        "ShapePandora(likelihood)": _likelihood_unreachable(learned),
        # the same path on rounded scores (fed rounded rewards below)
        "ShapePandora(lattice)": _likelihood_unreachable(rounded),
        # on a judge-like deployment (a floor the rewards pile up at): the censored reading
        "ShapePandora(censored)": _censored_unreachable(),
        # on a Tobit deployment (one shape cut at a floor): the cut reading
        "ShapePandora(cut)": _cut_unreachable(),
        "PooledTargetAcceptance": _pooled_unreachable(),
        # on a bimodal deployment: its multiplier rule
        "PooledTarget(multimodal)": _multiplier_unreachable(),
        # on a judge-like deployment (a floor the rewards pile up at): the censored table rule
        "PooledTarget(floor)": _floor_unreachable(),
        "BayesShapePandora": _bayes_unreachable(learned),
    }
    print(f"{'policy':24s} {'n':>5s} {'median_us':>10s} {'p99_us':>9s} {'mean_us':>9s}")
    for name, make in makers.items():
        for n in sizes:
            step = 1.0 if name == "ShapePandora(lattice)" else None
            floor = CUT_FLOOR if name == "ShapePandora(cut)" else None
            t = observe_latency(make, n, args.repeats, step=step, floor=floor) * 1e6
            print(
                f"{name:24s} {n:5d} {np.median(t):10.2f} {np.percentile(t, 99):9.2f} "
                f"{t.mean():9.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

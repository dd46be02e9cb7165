"""The vectorised replay equals the per-object ``observe`` loop, exactly, for every policy with a
fast path: same samples drawn and same reward kept on every ordering."""

from __future__ import annotations

import numpy as np
import pytest

from stoppers.replay.baselines import empirical_fair_cap, fixed_best, oracle_outcome
from stoppers.replay.batch import PromptBatch
from stoppers.replay.engine import ReplayConfig, run_policy
from stoppers.replay.loop import loop_outcome
from stoppers.replay.metrics import acceptance_rate
from stoppers.replay.policies import resolve_policy
from stoppers.replay.synth import SynthSpec, generate


def _pools(family: str, prompts: int = 4, samples: int = 90, seed: int = 0) -> list[np.ndarray]:
    rewards = generate(SynthSpec(family=family, prompts=prompts, samples=samples, seed=seed))
    return list(rewards["rewards"])


def _batch(pools, permutations=12, max_samples=None) -> PromptBatch:
    return PromptBatch.build(
        pools,
        range(len(pools)),
        permutations=permutations,
        seed=11,
        alpha=0.99,
        max_samples=max_samples,
    )


def _assert_same(fast, slow) -> None:
    np.testing.assert_array_equal(fast.n, slow.n)
    np.testing.assert_array_equal(fast.best, slow.best)


@pytest.mark.parametrize("family", ["gumbel", "clipped", "mixture", "student-t"])
@pytest.mark.parametrize(
    ("policy", "values"),
    [("adaptive", (0.02, 0.002, 0.0002)), ("target", (0.6, 0.85, 1.0)), ("patience", (0.001,))],
)
def test_fast_path_equals_observe_loop(family: str, policy: str, values) -> None:
    batch = _batch(_pools(family), max_samples=70)
    choice = resolve_policy(policy)
    config = ReplayConfig(policy=policy)
    fast = run_policy(batch, choice, values, config)
    slow = run_policy(batch, choice, values, ReplayConfig(policy=policy, use_loop=True))
    for f, s in zip(fast, slow, strict=True):
        _assert_same(f, s)
    # Not a degenerate comparison: the policies stop at different points.
    assert len({int(n) for out in fast for n in out.n}) > 3


@pytest.mark.parametrize("delta", [0.05, 0.5, 0.9])
@pytest.mark.parametrize("min_samples", [2, 10])
def test_adaptive_parameters_reach_both_paths(delta: float, min_samples: int) -> None:
    batch = _batch(_pools("skew-normal", prompts=3, samples=60, seed=4), permutations=10)
    config = ReplayConfig(policy="adaptive", delta=delta, min_samples=min_samples)
    choice = resolve_policy("adaptive")
    (fast,) = run_policy(batch, choice, (0.001,), config)
    (slow,) = run_policy(
        batch, choice, (0.001,), ReplayConfig(**{**config.__dict__, "use_loop": True})
    )
    _assert_same(fast, slow)
    assert fast.n.min() >= min_samples


def test_oracle_equals_weitzman_policy_on_utilities() -> None:
    # The oracle is Weitzman's rule on the prompt's empirical utility distribution: feeding the
    # utilities of the stream to stoppers' Weitzman policy must stop at the same samples.
    from stoppers.weitzman import Weitzman

    pools = _pools("gumbel", prompts=3, samples=80, seed=2)
    batch = _batch(pools, permutations=15)
    ar = batch.stream_acceptance
    for cost in (0.01, 0.001):
        oracle = oracle_outcome(batch, cost, fixed_best(batch))
        for row in range(batch.rows):
            prompt = int(batch.prompt[row])
            utilities = acceptance_rate(pools[prompt], batch.kappa[row])
            policy = Weitzman(utilities, cost, max_samples=int(batch.budget[row]))
            assert policy.tau == pytest.approx(empirical_fair_cap(utilities, cost), abs=1e-12)
            for u in ar[row]:
                if policy.observe(float(u)):
                    break
            assert policy.n == oracle.n[row]


def test_loop_runs_policies_without_fast_path() -> None:
    batch = _batch(_pools("normal", prompts=2, samples=40), permutations=5)
    for name in ("ucb-exp", "beacon"):
        choice = resolve_policy(name)
        assert not choice.has_fast_path
        (out,) = run_policy(batch, choice, (0.01,), ReplayConfig(policy=name))
        assert ((out.n >= 1) & (out.n <= batch.budget)).all()
        # The kept reward is the max of the samples drawn.
        prefix = fixed_best(batch)
        np.testing.assert_array_equal(out.best, prefix[np.arange(batch.rows), out.n - 1])


def test_loop_driver_matches_a_hand_run() -> None:
    from stoppers.classic import Patience

    batch = _batch([np.array([3.0, 1.0, 2.0, 5.0, 4.0, 0.0])], permutations=4)
    out = loop_outcome(batch, lambda prompt, budget: Patience(2, max_samples=budget))
    for row in range(batch.rows):
        policy = Patience(2)
        for value in batch.values[row]:
            if policy.observe(value):
                break
        assert (out.n[row], out.best[row]) == (policy.n, policy.best)


@pytest.mark.parametrize(
    "options",
    [
        (("empty_tail", "stop"),),
        (("percentile", "whole"), ("delta_schedule", "anytime")),
        (("utility", "bradley_terry"),),
    ],
)
def test_policy_options_reach_both_paths(options) -> None:
    batch = _batch(_pools("clipped", prompts=3, samples=70, seed=5), permutations=10)
    choice = resolve_policy("adaptive")
    config = ReplayConfig(policy="adaptive", policy_options=options)
    kwargs = choice.kernel_kwargs(0.001, config)
    assert all(kwargs[name] == value for name, value in options)
    (fast,) = run_policy(batch, choice, (0.001,), config)
    (slow,) = run_policy(
        batch, choice, (0.001,), ReplayConfig(**{**config.__dict__, "use_loop": True})
    )
    _assert_same(fast, slow)


def test_unknown_policy_option_is_an_error() -> None:
    with pytest.raises(ValueError, match="has no option 'colour'"):
        resolve_policy("adaptive").constructor_kwargs(
            0.01, ReplayConfig(policy_options=(("colour", "red"),)), None
        )

"""Sequential (deployment) replay: same streams as the engine, prior sees only observed rewards."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stoppers import AdaptiveBestOfN, TargetAcceptance
from stoppers.replay.batch import PromptBatch
from stoppers.replay.deployment import deployment_summaries, replay_deployment
from stoppers.replay.engine import ReplayConfig, replay_chunk
from stoppers.replay.experiments import profit_rows, savings_rows
from stoppers.replay.loop import loop_outcome


def _rewards(prompts=6, samples=40, seed=3):
    rng = np.random.default_rng(seed)
    r = rng.gumbel(size=(prompts, samples)) * rng.uniform(0.5, 2, size=(prompts, 1))
    r[1, 30:] = np.nan  # a prompt with missing samples
    return r


def _without_prior(rewards, orderings: int, *, in_order: bool = False):
    """A policy that learns nothing (TargetAcceptance 0.8, at most 25 samples), seed 11."""
    return replay_deployment(
        rewards,
        lambda prior: TargetAcceptance(0.8, max_samples=25, min_samples=3),
        None,
        orderings=orderings,
        seed=11,
        max_samples=25,
        in_order=in_order,
    )


def test_no_prior_matches_the_engine_loop():
    rewards = _rewards()
    pools = [row[np.isfinite(row)] for row in rewards]
    run = _without_prior(rewards, 5)
    batch = PromptBatch.build(
        pools, range(len(pools)), permutations=5, seed=11, alpha=0.99, max_samples=25
    )
    ref = loop_outcome(
        batch, lambda _p, budget: TargetAcceptance(0.8, max_samples=budget, min_samples=3)
    )
    out = run.outcome()
    np.testing.assert_array_equal(out.n, ref.n)
    np.testing.assert_array_equal(out.best, ref.best)
    assert not run.updates.any()
    # every deployment serves every prompt exactly once
    assert all(sorted(row) == list(range(len(pools))) for row in run.prompt)


def test_in_order_serves_the_rows_in_order_on_the_same_streams():
    """``in_order`` (a drifting deployment, drift_report): every deployment serves the prompts
    in row order, each prompt on the stream the shuffled replay gives it."""
    rewards = _rewards()
    shuffled, ordered = _without_prior(rewards, 4), _without_prior(rewards, 4, in_order=True)
    assert (ordered.prompt == np.arange(rewards.shape[0])).all()
    assert not (shuffled.prompt == np.arange(rewards.shape[0])).all()
    np.testing.assert_array_equal(ordered.outcome().n, shuffled.outcome().n)
    np.testing.assert_array_equal(ordered.outcome().best, shuffled.outcome().best)


def test_savings_and_profit_match_the_engine():
    rewards = _rewards()
    pools = [row[np.isfinite(row)] for row in rewards]
    config = ReplayConfig(
        targets=(0.8,), profit_costs=(0.01,), permutations=4, seed=2, policy="adaptive"
    )
    chunk = replay_chunk(pools, list(range(len(pools))), config)
    runs_t = {
        0.8: replay_deployment(rewards, lambda _: TargetAcceptance(0.8), None, orderings=4, seed=2)
    }
    runs_c = {
        0.01: replay_deployment(rewards, lambda _: AdaptiveBestOfN(0.01), None, orderings=4, seed=2)
    }
    s = deployment_summaries(rewards, targets=runs_t, costs=runs_c)
    np.testing.assert_allclose(s.target_acceptance[0], chunk.target_acceptance[0])
    np.testing.assert_allclose(s.target_samples[0], chunk.target_samples[0])
    np.testing.assert_allclose(s.policy_acceptance[0], chunk.policy_acceptance[0])
    np.testing.assert_allclose(s.oracle_samples[0], chunk.oracle_samples[0])
    assert savings_rows(s)[0]["save_ratio"] is not None
    assert profit_rows(s, (0.01,))[0]["ratio"] is not None


class SpyPrior:
    def __init__(self):
        self.seen: list[list[float]] = []

    def update(self, rewards):
        self.seen.append(list(rewards))
        return len(rewards) >= 5

    def to_dict(self):
        return {"requests": len(self.seen)}


def test_prior_sees_only_observed_rewards_in_order():
    rewards = _rewards()
    priors: list[SpyPrior] = []
    handed: list[object] = []

    def new_prior():
        priors.append(SpyPrior())
        return priors[-1]

    def make(prior):
        handed.append(prior)
        return TargetAcceptance(0.7, min_samples=3)

    run = replay_deployment(rewards, make, new_prior, orderings=3, seed=5)
    assert len(priors) == 3  # a fresh prior per deployment
    assert handed[0] is priors[0] and handed[-1] is priors[-1]
    batch = PromptBatch.build(
        [row[np.isfinite(row)] for row in rewards],
        range(rewards.shape[0]),
        permutations=3,
        seed=5,
        alpha=0.99,
    )
    for o, prior in enumerate(priors):
        assert len(prior.seen) == rewards.shape[0]
        for pos, seen in enumerate(prior.seen):
            i = run.prompt[o, pos]
            assert len(seen) == run.samples[o, pos]
            stream = batch.values[i * 3 + o, : len(seen)]
            np.testing.assert_array_equal(seen, stream)  # observed prefix, in order
            assert run.updates[o, pos] == (len(seen) >= 5)


def test_deterministic_by_seed_and_warm_mask():
    rewards = _rewards()

    def run(seed):
        return replay_deployment(
            rewards, lambda _: TargetAcceptance(0.9), SpyPrior, orderings=3, seed=seed
        )

    a, b, c = run(1), run(1), run(2)
    np.testing.assert_array_equal(a.prompt, b.prompt)
    np.testing.assert_array_equal(a.kept, b.kept)
    np.testing.assert_array_equal(a.samples, b.samples)
    assert not np.array_equal(a.prompt, c.prompt)
    warm = a.warm(2)
    counted_before = np.cumsum(a.updates, axis=1) - a.updates
    np.testing.assert_array_equal(warm, counted_before >= 2)
    s = deployment_summaries(rewards, targets={0.9: a}, mask=lambda r: r.warm(10**6))
    assert np.isnan(s.target_acceptance).all()


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        replay_deployment(np.zeros(5), lambda _: TargetAcceptance(0.9), None, orderings=1, seed=0)
    with pytest.raises(ValueError):
        replay_deployment(
            np.zeros((2, 3)), lambda _: TargetAcceptance(0.9), None, orderings=0, seed=0
        )


def test_cli_deployment_switch_matches_the_engine_for_a_policy_that_learns_nothing(tmp_path):
    from server.cli import main

    pool = tmp_path / "p.npz"
    assert main(["synth", str(pool), "--prompts", "8", "--samples", "60", "--seed", "1"]) == 0
    common = ["--experiment", "savings", "--targets", "0.8", "--permutations", "3", "--quiet"]
    common += ["--no-figures", "--jobs", "1", "--target-policy", "target"]
    assert main(["replay", str(pool), *common, "--out", str(tmp_path / "a")]) == 0
    assert main(["replay", str(pool), *common, "--deployment", "--out", str(tmp_path / "b")]) == 0
    a = json.loads((tmp_path / "a" / "results.json").read_text())["savings"][0]
    b = json.loads((tmp_path / "b" / "results.json").read_text())
    assert b["meta"]["engine"] == "deployment"
    assert b["savings"][0]["achieved_acceptance"] == pytest.approx(a["achieved_acceptance"])
    assert b["savings"][0]["save_ratio"] == pytest.approx(a["save_ratio"])
    # a learning policy gets its prior, and the warm-only rows are reported
    args = [*common[:-1], "pooled-target", "--deployment", "--warm-after", "4"]
    assert main(["replay", str(pool), *args, "--out", str(tmp_path / "c")]) == 0
    c = json.loads((tmp_path / "c" / "results.json").read_text())
    assert c["savings_warm"][0]["achieved_acceptance"] is not None


def test_task_labels_give_each_task_its_own_prior_and_warm_count():
    """As the gateway's X-Pandora-Task: one prior per label per deployment, a prompt learns from
    and teaches only its own label's prior, and "warm" counts that prior's updates."""
    rewards = _rewards(prompts=6)
    tasks = ["a", "b", "a", "b", "b", "a"]
    made: list[tuple[int, SpyPrior]] = []
    handed: list[SpyPrior] = []

    def new_prior():
        made.append((len(handed), SpyPrior()))
        return made[-1][1]

    def make(prior):
        handed.append(prior)
        return TargetAcceptance(0.7, min_samples=3)

    run = replay_deployment(rewards, make, new_prior, orderings=3, seed=5, tasks=tasks)
    assert len(made) == 6  # two tasks x three deployments
    for o in range(3):
        served = handed[o * 6 : (o + 1) * 6]
        by_task: dict[str, SpyPrior] = {}
        for pos in range(6):
            task = tasks[run.prompt[o, pos]]
            assert by_task.setdefault(task, served[pos]) is served[pos]
        assert by_task["a"] is not by_task["b"]
        assert len(by_task["a"].seen) == 3 and len(by_task["b"].seen) == 3
        counted: dict[str, int] = {}
        for pos in range(6):
            task = tasks[run.prompt[o, pos]]
            assert run.learned_before[o, pos] == counted.get(task, 0)
            counted[task] = counted.get(task, 0) + int(run.updates[o, pos])
    np.testing.assert_array_equal(run.warm(1), run.learned_before >= 1)
    # one label for every prompt is the untasked replay, stream for stream
    one = replay_deployment(rewards, make, SpyPrior, orderings=3, seed=5, tasks=["x"] * 6)
    none = replay_deployment(rewards, make, SpyPrior, orderings=3, seed=5)
    np.testing.assert_array_equal(one.kept, none.kept)
    np.testing.assert_array_equal(one.learned_before, none.learned_before)
    with pytest.raises(ValueError, match="labels"):
        replay_deployment(rewards, make, SpyPrior, orderings=1, seed=0, tasks=["a"])


def test_cli_task_key_reads_the_labels_and_keys_the_priors(tmp_path):
    from server.cli import main

    pool = tmp_path / "p.npz"
    synth = ["synth", str(pool), "--family", "mixed", "--prompts", "10", "--samples", "60"]
    assert main(synth) == 0
    common = ["--experiment", "profit", "--costs", "0.01", "--permutations", "3", "--quiet"]
    common += ["--no-figures", "--policy", "shape-cost", "--deployment"]
    out = tmp_path / "a"
    assert main(["replay", str(pool), *common, "--task-key", "family", "--out", str(out)]) == 0
    meta = json.loads((out / "results.json").read_text())["meta"]
    families = set(np.load(pool)["family"].tolist())
    assert meta["task_key"] == "family" and meta["tasks"] == len(families)
    # a missing label array, or a task key without --deployment, is a clear error
    assert main(["replay", str(pool), *common, "--task-key", "colour", "--out", str(out)]) == 2
    assert main(["replay", str(pool), *common[:-1], "--task-key", "family", "--out", str(out)]) == 2

"""The cost-mode loss breakdown: its split adds up and agrees with the profit engine."""

from __future__ import annotations

import numpy as np
import pytest

from stoppers import default_cost_policy, new_deployment_prior
from stoppers.replay.deployment import deployment_summaries, replay_deployment
from stoppers.replay.experiments import profit_rows
from stoppers.replay.synth import SynthSpec, generate
from stoppers.robust.cost import TailPandora
from stoppers.robust.loss_report import decision_path, loss_breakdown, main, position_bins

COST = 1e-3
ORDERINGS = 4


@pytest.fixture(scope="module")
def pool() -> np.ndarray:
    return generate(SynthSpec(family="mixture", prompts=6, samples=240, seed=3))["rewards"]


@pytest.fixture(scope="module")
def breakdown(pool):
    return loss_breakdown(pool, COST, orderings=ORDERINGS, seed=1)


def test_reasons_partition_every_request_and_the_gap(pool, breakdown):
    prompts = pool.shape[0]
    assert sum(r.requests for r in breakdown.reasons) == prompts * ORDERINGS
    gap = (breakdown.oracle_profit - breakdown.profit) * prompts  # per deployment
    assert sum(r.loss_vs_oracle for r in breakdown.reasons) == pytest.approx(gap, abs=1e-9)
    vs_fixed = (breakdown.fixed_profit - breakdown.profit) * prompts
    assert sum(r.loss_vs_fixed for r in breakdown.reasons) == pytest.approx(vs_fixed, abs=1e-9)
    for r in breakdown.reasons:
        assert r.sampling_part + r.acceptance_part == pytest.approx(r.loss_vs_oracle, abs=1e-9)
    samples = sum(r.samples * r.requests for r in breakdown.reasons) / (prompts * ORDERINGS)
    assert samples == pytest.approx(breakdown.samples)


def test_agrees_with_the_deployment_profit_engine(pool, breakdown):
    """Same streams, same policy: the mean profits and best fixed N of `pandora replay`."""
    width = pool.shape[1]
    replay = replay_deployment(
        pool,
        lambda prior: default_cost_policy(COST, max_samples=width, prior=prior),
        lambda: new_deployment_prior("cost"),
        orderings=ORDERINGS,
        seed=1,
    )
    summaries = deployment_summaries(pool, costs={COST: replay})
    (row,) = profit_rows(summaries, (COST,))
    assert breakdown.best_fixed_n == row["best_fixed_n"]
    assert breakdown.profit == pytest.approx(row["mean_adaptive_profit"], rel=1e-9)
    assert breakdown.fixed_profit == pytest.approx(row["mean_best_fixed_profit"], rel=1e-9)
    assert breakdown.oracle_profit == pytest.approx(row["mean_oracle_profit"], rel=1e-9)
    # the spread over prompts from the engine's per-prompt means
    n = row["best_fixed_n"]
    adaptive = summaries.policy_acceptance[0] - COST * summaries.policy_samples[0]
    fixed = summaries.fixed_acceptance[:, n - 1] - COST * np.minimum(n, summaries.budget)
    se = np.std(adaptive - fixed, ddof=1) / np.sqrt(pool.shape[0]) / fixed.mean()
    assert breakdown.se_prompts == pytest.approx(se, rel=1e-9)
    assert 0.0 < breakdown.se_deployments < 1.0


def test_paths_partition_the_same_gap_and_the_first_requests_run_the_cold_start(pool, breakdown):
    """Grouped by what decided each request: the same requests and gap as by stop reason, and
    each group's profit ratio is its own requests' profit over the best fixed N's on them."""
    by_path = loss_breakdown(pool, COST, orderings=ORDERINGS, seed=1, by="path")
    assert (by_path.profit, by_path.fixed_profit) == (breakdown.profit, breakdown.fixed_profit)
    groups = {g.reason: g for g in by_path.reasons}
    # 6 prompts per deployment: too few for the likelihood path (8 streams); the cold start,
    # or from the fifth request on the streams' Best-of-N (4 kept streams)
    assert set(groups) <= {"cold start", "streams"}
    assert groups["cold start"].requests >= 4 * ORDERINGS
    assert sum(g.requests for g in by_path.reasons) == pool.shape[0] * ORDERINGS
    vs_fixed = sum(g.loss_vs_fixed for g in by_path.reasons)
    assert vs_fixed == pytest.approx(sum(r.loss_vs_fixed for r in breakdown.reasons), abs=1e-9)
    assert decision_path(TailPandora(COST)) == "TailPandora"
    with pytest.raises(ValueError, match="by must be one of"):
        loss_breakdown(pool, COST, orderings=1, by="nope")


def test_paths_name_the_likelihood_path_once_streams_are_kept():
    rows = generate(SynthSpec(family="mixture", prompts=12, samples=120, seed=4))["rewards"]
    b = loss_breakdown(rows, COST, orderings=2, seed=0, by="path")
    groups = {g.reason: g.requests for g in b.reasons}
    # the first 8 requests of each deployment: the cold start, or from the fifth on the
    # streams' Best-of-N where 4 kept streams read lumpy (as this mixture's do)
    assert groups["cold start"] + groups.get("streams", 0) == 2 * 8
    assert groups["cold start"] >= 2 * 4
    assert groups["likelihood"] == 2 * 4


def test_known_answer_point_masses():
    """Every prompt one repeated reward: the oracle stops at 1 sample, TailPandora calls the
    point mass after 32 ("tied"), so all of its gap is sampling cost, 31 c per request."""
    pool = np.repeat(np.arange(5.0)[:, None], 100, axis=1)
    b = loss_breakdown(pool, COST, policy="tail", orderings=3)
    (tied,) = b.reasons
    assert (tied.reason, tied.requests, tied.samples) == ("tied", 15, 32.0)
    assert b.best_fixed_n == 1 and b.oracle_samples == 1.0
    assert tied.sampling_part == pytest.approx(5 * 31 * COST)
    assert tied.acceptance_part == 0.0
    assert tied.loss_vs_oracle == pytest.approx(tied.loss_vs_fixed)
    # every request loses exactly 31 c to the fixed N: no spread either way
    assert b.se_deployments == pytest.approx(0.0, abs=1e-12)
    assert b.se_prompts == pytest.approx(0.0, abs=1e-12)


def test_unknown_policy_is_refused(pool):
    with pytest.raises(ValueError, match="policy must be one of"):
        loss_breakdown(pool, COST, policy="nope", orderings=1)


def test_cli_prints_one_block_per_cost(tmp_path, pool, capsys):
    path = tmp_path / "pool.npz"
    np.savez(path, rewards=pool)
    assert main([str(path), "--cost", "0.001", "--cost", "0.01", "--orderings", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("profit per request") == 2
    assert out.count("over deployments") == 2 and out.count("over prompts") == 2
    assert "loss per deployment by stop reason" in out


def test_task_labels_group_the_gap_key_the_priors_and_tighten_the_baseline(pool, breakdown):
    """``by="task"`` partitions the same requests by label; the per-task best fixed N earns at
    least the pooled one (it may pick the pooled N for every task); one label for every prompt
    is the untasked replay (keying itself: test_replay_deployment)."""
    tasks = ["x", "y", "x", "y", "x", "y"]
    shared = loss_breakdown(
        pool, COST, orderings=ORDERINGS, seed=1, by="task", tasks=tasks, keyed=False
    )
    assert shared.profit == pytest.approx(breakdown.profit, rel=1e-12)  # one prior, as untasked
    assert sorted(r.reason for r in shared.reasons) == ["x", "y"]
    assert all(r.requests == 3 * ORDERINGS for r in shared.reasons)
    assert shared.task_fixed_profit >= shared.fixed_profit - 1e-12
    keyed = loss_breakdown(pool, COST, orderings=ORDERINGS, seed=1, by="task", tasks=tasks)
    assert keyed.fixed_profit == shared.fixed_profit  # same streams, same baseline
    assert sum(r.requests for r in keyed.reasons) == 6 * ORDERINGS
    one = loss_breakdown(pool, COST, orderings=ORDERINGS, seed=1, tasks=["z"] * 6)
    assert one.profit == pytest.approx(breakdown.profit, rel=1e-12)
    assert one.task_fixed_profit == pytest.approx(one.fixed_profit, rel=1e-12)
    with pytest.raises(ValueError, match="task"):
        loss_breakdown(pool, COST, orderings=1, by="task")


def test_positions_bin_the_requests_by_when_they_were_served(pool, breakdown):
    """Grouped by position in the deployment: doubling bins that sort in serving order, the
    same requests and gap as by stop reason, each bin holding one request per deployment per
    position (6 prompts: #1, #2-3, #4-6)."""
    assert position_bins(np.arange(24), 24).tolist() == (
        ["#01", "#02-03", "#02-03"] + ["#04-07"] * 4 + ["#08-15"] * 8 + ["#16-24"] * 9
    )
    assert position_bins(np.arange(3), 3).tolist() == ["#1", "#2-3", "#2-3"]
    by_position = loss_breakdown(pool, COST, orderings=ORDERINGS, seed=1, by="position")
    assert (by_position.profit, by_position.fixed_profit) == (
        breakdown.profit,
        breakdown.fixed_profit,
    )
    groups = {g.reason: g.requests for g in by_position.reasons}
    assert groups == {"#1": ORDERINGS, "#2-3": 2 * ORDERINGS, "#4-6": 3 * ORDERINGS}
    vs_fixed = sum(g.loss_vs_fixed for g in by_position.reasons)
    assert vs_fixed == pytest.approx(sum(r.loss_vs_fixed for r in breakdown.reasons), abs=1e-9)

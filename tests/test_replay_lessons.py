"""The unselected-draws ablation: what a replayed prior is taught in place of each request's
own rewards, and that the served streams stay the same."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stoppers import TargetAcceptance
from stoppers.replay.deployment import replay_deployment
from stoppers.replay.lessons import LESSONS, UNSELECTED_DRAWS, UnselectedDraws, lessons_for
from stoppers.replay.synth import SynthSpec, generate
from stoppers.robust import loss_report, target_report
from stoppers.robust.paired_report import paired_differences


def _rewards(prompts=6, samples=150, seed=3):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(prompts, samples)) + 10.0 * np.arange(prompts)[:, None]
    r[1, 40:] = np.nan  # a prompt with fewer rewards than a lesson asks for
    return r


class SpyPrior:
    def __init__(self):
        self.seen: list[list[float]] = []

    def update(self, rewards):
        self.seen.append(list(rewards))
        return True

    def to_dict(self):
        return {"requests": len(self.seen)}


def _replay(rewards, lessons, priors):
    def new_prior():
        priors.append(SpyPrior())
        return priors[-1]

    return replay_deployment(
        rewards,
        lambda _prior: TargetAcceptance(0.8, max_samples=60, min_samples=3),
        new_prior,
        orderings=3,
        seed=5,
        lessons=lessons,
    )


def test_unselected_draws_come_from_the_served_prompt_without_replacement():
    rewards = _rewards()
    priors: list[SpyPrior] = []
    run = _replay(rewards, lessons_for("unselected", rewards, seed=2), priors)
    for o, prior in enumerate(priors):
        for pos, taught in enumerate(prior.seen):
            row = rewards[run.prompt[o, pos]]
            row = row[np.isfinite(row)]
            assert len(taught) == min(UNSELECTED_DRAWS, row.size)  # all of a short row
            assert len(set(taught)) == len(taught)  # without replacement
            assert set(taught) <= set(row.tolist())  # the served prompt's, no other's


def test_matched_lessons_draw_as_many_as_the_previous_request():
    pools = [np.arange(200.0), np.arange(200.0) + 1000.0]
    lessons = UnselectedDraws(pools, matched=True, draws=50, seed=0)
    assert len(lessons(0, [1.0] * 7)) == 50  # the first: the default count
    assert len(lessons(1, [1.0] * 12)) == 7  # then the previous request's count
    taught = lessons(1, [1.0] * 3)
    assert len(taught) == 12 and min(taught) >= 1000.0


def test_the_served_streams_do_not_depend_on_the_lessons():
    rewards = _rewards()
    served = _replay(rewards, None, [])
    for name in LESSONS:
        other = _replay(rewards, lessons_for(name, rewards, seed=9), [])
        np.testing.assert_array_equal(other.prompt, served.prompt)
        np.testing.assert_array_equal(other.samples, served.samples)  # a rule that learns nothing
        np.testing.assert_array_equal(other.kept, served.kept)


def test_served_lessons_are_the_replay_default_and_unknown_ones_are_refused():
    rewards = _rewards()
    assert lessons_for("served", rewards) is None
    with pytest.raises(ValueError, match="lessons must be one of"):
        lessons_for("future", rewards)
    with pytest.raises(ValueError, match="draws must be"):
        UnselectedDraws([np.arange(3.0)], draws=0)


def test_loss_report_ablation_pairs_with_the_served_run(tmp_path, capsys):
    """The ablation replays the same streams (the best fixed N's profits and the positions
    match), so paired_report accepts the two files, and the file says it was the ablation."""
    pool = generate(SynthSpec(family="normal", prompts=6, samples=200, seed=4))["rewards"]
    path = tmp_path / "pool.npz"
    np.savez(path, rewards=pool)
    common = [str(path), "--cost", "0.001", "--orderings", "3"]
    served, ablated = tmp_path / "served.npz", tmp_path / "unselected.npz"
    assert loss_report.main([*common, "--rows-out", str(served)]) == 0
    assert "ablation" not in capsys.readouterr().out
    assert loss_report.main([*common, "--lessons", "unselected", "--rows-out", str(ablated)]) == 0
    assert "ablation: the prior taught unselected draws" in capsys.readouterr().out
    (whole,) = [d for d in paired_differences(str(served), str(ablated)) if d.group == "all"]
    assert whole.requests == 18
    with np.load(ablated) as data:
        assert str(data["replay/lessons"]) == "unselected"


def test_target_report_runs_the_ablation_as_its_own_labelled_row(tmp_path):
    pool = generate(SynthSpec(family="normal", prompts=12, samples=200, seed=6))["rewards"]
    path = tmp_path / "pool.npz"
    np.savez(path, rewards=pool)
    out = tmp_path / "rep"
    for policy in ("pooled", "pooled-unselected-matched"):
        args = ["run", str(path), "--name", "n", "--policy", policy, "--orderings", "2"]
        assert target_report.main([*args, "--out", str(out)]) == 0
    written = json.loads((out / "n-pooled-unselected-matched.json").read_text())
    assert set(written["rows"]) == {str(t) for t in target_report.TARGETS}
    table = target_report.render_table(out, ["n"])
    assert "as many as served (ablation)" in table and "**PooledTargetAcceptance**" in table

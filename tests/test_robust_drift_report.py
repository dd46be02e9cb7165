"""`python -m stoppers.robust.drift_report`: two pools served in order to one prior."""

from __future__ import annotations

import numpy as np
import pytest

from stoppers.replay.synth import SynthSpec, generate
from stoppers.robust.drift_report import drift_run, main


def _pool(tmp_path, name: str, **spec) -> str:
    path = tmp_path / f"{name}.npz"
    np.savez(path, rewards=generate(SynthSpec(prompts=14, samples=120, **spec))["rewards"])
    return str(path)


def test_the_report_serves_a_then_b_beside_b_on_a_fresh_prior(tmp_path, capsys) -> None:
    a = _pool(tmp_path, "a", seed=1)
    b = _pool(tmp_path, "b", seed=2, scale_median=2.0)
    args = [a, b, "--prompts", "12", "--deployments", "1", "--window", "6"]
    assert main([*args, "--mode", "cost", "--cost", "0.002"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| requests | A then B: profit")
    rows = table[2:]
    assert [r.split(" | ")[0] for r in rows] == ["| 0-5", "| 6-11", "| 12-17", "| 18-23"]
    assert all(r.endswith("|  |") for r in rows[:2])  # before the switch: no fresh prior
    assert all(" in " in r.split(" | ")[2] for r in rows[2:])


def test_drift_run_keeps_one_prior_per_deployment_and_counts_what_it_drew() -> None:
    pools = list(generate(SynthSpec(prompts=12, samples=100, seed=3))["rewards"])
    run = drift_run(pools, mode="target", level=0.8, deployments=2)
    assert run.acceptance.shape == run.samples.shape == (2, 12)
    assert np.all((run.acceptance > 0) & (run.acceptance <= 1))
    assert np.all((run.samples >= 8) & (run.samples <= 100))  # the default's floor, the pool
    again = drift_run(pools, mode="target", level=0.8, deployments=2)
    np.testing.assert_array_equal(run.samples, again.samples)  # seeded
    with pytest.raises(ValueError, match="mode"):
        drift_run(pools, mode="fixed", level=0.8, deployments=1)

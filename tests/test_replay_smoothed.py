"""The smoothed bootstrap of a recorded pool (`pandora synth --from-pool`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from server.cli import main as replay_main
from stoppers.replay.smoothed import smoothed_pool


def _judge_like(rng: np.random.Generator, prompts: int = 30, width: int = 49) -> np.ndarray:
    """Clipped logits as the AlpacaEval pool has them: a pile-up at the floor, a few at the top."""
    raw = rng.normal(-6.0, 5.0, size=(prompts, width))
    raw[0, 0] = 9.2  # the top of the judge's range, reached once: no clip there
    return np.clip(raw, -9.2, 9.2)


def test_clipped_scores_stay_on_the_clip_and_the_rest_move_within_the_range() -> None:
    source = _judge_like(np.random.default_rng(0))
    out = smoothed_pool(source, samples=2000, bandwidth=0.5, seed=3)
    assert out.shape == (30, 2000)
    assert out.min() >= -9.2 and out.max() <= 9.2
    for row_in, row_out in zip(source, out, strict=True):
        floor_share_in = np.mean(row_in == -9.2)
        floor_share_out = np.mean(row_out == -9.2)
        # kept exactly, plus the jittered rewards near the floor that the clip catches
        assert floor_share_out >= floor_share_in - 4 * np.sqrt(floor_share_in / 2000) - 1e-9
        interior = row_out[(row_out > -9.2) & (row_out < 9.2)]
        originals = row_in[row_in > -9.2]  # 9.2 is reached once, so it is jittered too
        if originals.size:
            # every unclipped draw is one of the row's rewards moved by a 0.5-sd jitter
            gaps = np.abs(interior[:, None] - originals[None, :]).min(axis=1)
            assert np.quantile(gaps, 0.99) < 0.5 * 3.5
            assert np.unique(interior).size == interior.size  # a continuum, no atoms


def test_the_row_keeps_its_level_spread_and_lone_best() -> None:
    row = np.array([-9.2] * 30 + list(np.linspace(-5.0, 0.0, 18)) + [8.0])
    out = smoothed_pool(row[None, :], samples=40_000, bandwidth=0.3, seed=1)[0]
    assert abs(np.median(out) - np.median(row)) < 0.05
    assert abs(out.std() - row.std()) / row.std() < 0.03
    # the lone best is a lump of 1/49 of the mass around 8, nothing between it and the rest
    assert abs(np.mean(out > 4.0) - 1 / 49) < 0.003
    assert np.mean((out > 1.5) & (out < 6.5)) < 1e-3


def test_reproducible_from_its_seed_and_prompts_caps_the_rows() -> None:
    source = _judge_like(np.random.default_rng(1))
    a = smoothed_pool(source, samples=100, bandwidth=0.5, seed=7, prompts=5)
    b = smoothed_pool(source, samples=100, bandwidth=0.5, seed=7, prompts=5)
    assert a.shape == (5, 100)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, smoothed_pool(source, samples=100, bandwidth=0.5, seed=8)[:5])


def test_missing_rewards_are_never_drawn() -> None:
    source = np.array([[1.0, 2.0, np.nan, np.nan], [0.0, np.nan, 3.0, 4.0]])
    out = smoothed_pool(source, samples=500, bandwidth=0.0, seed=0)
    assert set(np.unique(out[0])) == {1.0, 2.0}
    assert set(np.unique(out[1])) == {0.0, 3.0, 4.0}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bandwidth": -0.1}, "bandwidth"),
        ({"bandwidth": float("nan")}, "bandwidth"),
        ({"samples": 1}, "samples"),
        ({"prompts": 0}, "prompts"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, message: str) -> None:
    args = {"samples": 10, "bandwidth": 0.5, **kwargs}
    with pytest.raises(ValueError, match=message):
        smoothed_pool(np.zeros((2, 3)), **args)


def test_ragged_rows_and_a_padded_matrix_give_the_same_pool() -> None:
    rows = [np.array([-9.0, -9.0, 1.0]), np.array([0.0, 2.0, 5.0, -9.0])]
    padded = np.array([[-9.0, -9.0, 1.0, np.nan], [0.0, 2.0, 5.0, -9.0]])
    np.testing.assert_array_equal(
        smoothed_pool(rows, samples=50, bandwidth=0.3, seed=2),
        smoothed_pool(padded, samples=50, bandwidth=0.3, seed=2),
    )
    with pytest.raises(ValueError, match="prompts x samples"):
        smoothed_pool(np.zeros(5), samples=5, bandwidth=0.1)


def test_a_row_without_rewards_is_an_error() -> None:
    with pytest.raises(ValueError, match="row 1"):
        smoothed_pool(np.array([[1.0, 2.0], [np.nan, np.nan]]), samples=5, bandwidth=0.1)


def test_cli_writes_the_redrawn_pool_with_its_provenance(tmp_path, capsys) -> None:
    source = tmp_path / "pool.npz"
    np.savez(source, rewards=_judge_like(np.random.default_rng(2), prompts=12))
    out = tmp_path / "redrawn.npz"
    code = replay_main(
        ["synth", str(out), "--from-pool", str(source), "--prompts", "8", "--samples", "300"]
    )
    assert code == 0
    with np.load(out) as archive:
        assert archive["rewards"].shape == (8, 300)
        meta = json.loads(str(archive["meta"]))
    assert meta["from_pool"] == str(source) and meta["bandwidth"] == 0.5
    assert "redrawn from" in capsys.readouterr().out


def test_cli_names_a_missing_source(tmp_path, capsys) -> None:
    code = replay_main(["synth", str(tmp_path / "o.npz"), "--from-pool", str(tmp_path / "no.npz")])
    assert code == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_wants_an_npz_output(tmp_path, capsys) -> None:
    source = tmp_path / "pool.npz"
    np.savez(source, rewards=np.zeros((2, 3)))
    code = replay_main(["synth", str(tmp_path / "o.txt"), "--from-pool", str(source)])
    assert code == 2
    assert "must be a .npz" in capsys.readouterr().err


def test_cli_refuses_a_family_with_a_pool(tmp_path, capsys) -> None:
    source = tmp_path / "pool.npz"
    np.savez(source, rewards=np.zeros((2, 3)))
    argv = ["synth", str(tmp_path / "o.npz"), "--from-pool", str(source), "--family", "gumbel"]
    assert replay_main(argv) == 2
    assert "--family does not apply" in capsys.readouterr().err
    assert not (tmp_path / "o.npz").exists()

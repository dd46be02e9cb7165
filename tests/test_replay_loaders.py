"""Loading reward pools: npz/npy/jsonl, NaN = missing sample, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stoppers.replay.loaders import ReplayInputError, load_rewards, pool_from_matrix


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def test_npz_key_selection_and_nan_skipping(tmp_path: Path) -> None:
    matrix = np.array([[1.0, np.nan, 3.0, 4.0], [0.5, 0.25, np.nan, np.nan]])
    path = tmp_path / "pool.npz"
    np.savez(path, scores=matrix, other=np.zeros((2, 2)))
    pool = load_rewards(path, key="scores")
    assert pool.prompts == 2
    assert pool.missing == 3
    np.testing.assert_array_equal(pool.rewards[0], [1.0, 3.0, 4.0])
    np.testing.assert_array_equal(pool.rewards[1], [0.5, 0.25])
    assert list(pool.sizes) == [3, 2]
    with pytest.raises(ReplayInputError, match=r"no array named 'rewards' \(available: "):
        load_rewards(path)


def test_npy_and_dtype_and_shape_errors(tmp_path: Path) -> None:
    path = tmp_path / "pool.npy"
    np.save(path, np.arange(12, dtype=np.float32).reshape(3, 4))
    pool = load_rewards(path)
    assert pool.prompts == 3 and pool.max_samples == 4 and pool.missing == 0
    np.save(path, np.arange(5.0))
    with pytest.raises(ReplayInputError, match="1-D array"):
        load_rewards(path)
    with pytest.raises(ReplayInputError, match="at least 2"):
        pool_from_matrix(np.array([[1.0, np.nan, np.nan], [1.0, 2.0, 3.0]]))
    with pytest.raises(ReplayInputError, match="at least 2"):
        pool_from_matrix(np.ones((3, 1)))
    with pytest.raises(ReplayInputError, match="inf"):
        pool_from_matrix(np.array([[1.0, np.inf]]))


def test_missing_and_unknown_files(tmp_path: Path) -> None:
    with pytest.raises(ReplayInputError, match="no such file"):
        load_rewards(tmp_path / "absent.npz")
    bad = tmp_path / "rewards.csv"
    bad.write_text("1,2\n")
    with pytest.raises(ReplayInputError, match="unknown file type"):
        load_rewards(bad)
    corrupt = tmp_path / "corrupt.npy"
    corrupt.write_bytes(b"not numpy")
    with pytest.raises(ReplayInputError, match="cannot read"):
        load_rewards(corrupt)


def test_jsonl_authors_format_field_detection(tmp_path: Path) -> None:
    records = [
        {"prompt": "a", "generations": [{"text": "x", "mistral_rm_reward": v} for v in (1, 2, 3)]},
        {
            "prompt": "b",
            "generations": [{"text": "y", "mistral_rm_reward": v} for v in (0.5, None, -1)],
        },
    ]
    pool = load_rewards(_jsonl(tmp_path / "a.jsonl", records))
    assert pool.prompts == 2 and pool.missing == 1
    np.testing.assert_array_equal(pool.rewards[1], [0.5, -1.0])
    # The field can be named with or without the _reward suffix.
    assert load_rewards(tmp_path / "a.jsonl", field="mistral_rm").prompts == 2
    assert load_rewards(tmp_path / "a.jsonl", field="mistral_rm_reward").prompts == 2


def test_jsonl_errors_name_the_line(tmp_path: Path) -> None:
    two = [{"generations": [{"a_reward": 1, "b_reward": 2}, {"a_reward": 3, "b_reward": 4}]}]
    with pytest.raises(ReplayInputError, match=r"several reward fields .*--field"):
        load_rewards(_jsonl(tmp_path / "two.jsonl", two))
    assert load_rewards(tmp_path / "two.jsonl", field="b").rewards[0].tolist() == [2.0, 4.0]
    lacking = [
        {"generations": [{"a_reward": 1}, {"a_reward": 2}]},
        {"generations": [{"a_reward": 1}, {"text": "no score"}]},
    ]
    with pytest.raises(ReplayInputError, match=r"lacking.jsonl:2: generation 1 has no 'a_reward'"):
        load_rewards(_jsonl(tmp_path / "lacking.jsonl", lacking))
    with pytest.raises(ReplayInputError, match="no 'zzz_reward' field"):
        load_rewards(tmp_path / "two.jsonl", field="zzz")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"generations": [}\n')
    with pytest.raises(ReplayInputError, match=r"broken\.jsonl:1: not valid JSON"):
        load_rewards(broken)

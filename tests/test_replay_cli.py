"""`pandora replay` / `pandora synth` end to end: outputs follow the schema; bad input is one
clear error line and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from server.cli import main
from stoppers.replay.results import SCHEMA

ROOT = Path(__file__).resolve().parents[1]


def _synth(tmp_path: Path, *extra: str) -> Path:
    out = tmp_path / "pool.npz"
    code = main(["synth", str(out), "--prompts", "6", "--samples", "60", "--seed", "3", *extra])
    assert code == 0
    return out


def test_synth_writes_a_reproducible_npz(tmp_path: Path, capsys) -> None:
    path = _synth(tmp_path, "--family", "clipped", "--missing-fraction", "0.1")
    first = np.load(path)["rewards"]
    assert "wrote" in capsys.readouterr().out
    again = tmp_path / "again.npz"
    assert main(["synth", str(again), "--prompts", "6", "--samples", "60", "--seed", "3",
                 "--family", "clipped", "--missing-fraction", "0.1"]) == 0  # fmt: skip
    np.testing.assert_array_equal(first, np.load(again)["rewards"])
    meta = json.loads(str(np.load(path)["meta"]))
    assert meta["family"] == "clipped" and meta["seed"] == 3


def test_replay_writes_schema_and_figures(tmp_path: Path, capsys) -> None:
    pool = _synth(tmp_path, "--family", "gumbel", "--missing-fraction", "0.05")
    capsys.readouterr()
    out = tmp_path / "out"
    code = main([
        "replay", str(pool), "--permutations", "8", "--costs", "0.01,0.001",
        "--targets", "0.7,0.9", "--out", str(out), "--jobs", "1", "--quiet",
    ])  # fmt: skip
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    for section, keys in SCHEMA.items():
        rows = [results[section]] if section == "meta" else results[section]
        assert rows, section
        for row in rows:
            assert set(keys) <= set(row), (section, set(keys) - set(row))
    assert results["meta"]["prompts"] == 6 and results["meta"]["permutations"] == 8
    assert results["meta"]["missing_samples"] > 0
    assert [r["cost"] for r in results["profit"]] == [0.01, 0.001]
    assert [r["target"] for r in results["savings"]] == [0.7, 0.9]
    for row in results["winrate"]:
        assert 0.0 <= row["win_rate"] <= 1.0
    for row in results["profit"]:
        assert 1 <= row["best_fixed_n"] <= 60
        assert row["oracle_profit"] >= row["best_fixed_profit"] - 0.05
    for name in ("profit.png", "winrate.png", "savings.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out == ""  # --quiet: no table


def test_replay_prints_a_table(tmp_path: Path, capsys) -> None:
    pool = _synth(tmp_path)
    code = main(["replay", str(pool), "--experiment", "winrate", "--permutations", "4",
                 "--costs", "0.001", "--out", str(tmp_path / "o"), "--jobs", "1",
                 "--no-figures"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "winrate" in out and "0.001000" in out
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert results["profit"] == [] and results["savings"] == []


def test_replay_reads_the_authors_jsonl(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "mistral_7b_output.merged_rm.jsonl"
    lines = [
        json.dumps(
            {
                "prompt": f"p{i}",
                "generations": [
                    {"text": "...", "mistral_rm_reward": float(a), "armo_rm_reward": float(b)}
                    for a, b in rng.normal(size=(30, 2))
                ],
            }
        )
        for i in range(3)
    ]
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o"
    code = main(["replay", str(path), "--field", "mistral_rm", "--experiment", "profit",
                 "--costs", "0.01", "--permutations", "4", "--out", str(out), "--jobs", "1",
                 "--quiet", "--no-figures"])  # fmt: skip
    assert code == 0
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["source"].endswith("[mistral_rm_reward]")
    assert (meta["prompts"], meta["samples"]) == (3, 30)


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (None, ["missing.npz"], "missing.npz: no such file"),
        ("npz", ["pool.npz", "--key", "scores"], "no array named 'scores'"),
        ("narrow", ["narrow.npy"], "replay needs at least 2 per prompt"),
        ("jsonl", ["pool.jsonl"], "generation 1 has no 'rm_reward' field"),
        ("npz", ["pool.npz", "--max-samples", "500"], "--max-samples 500 exceeds the 60"),
        ("npz", ["pool.npz", "--costs", "2"], "costs must be in (0, 1)"),
        ("npz", ["pool.npz", "--policy", "target", "--experiment", "profit"], "has no cost"),
        ("npz", ["pool.npz", "--policy-option", "colour=red"], "has no option 'colour'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, make, args, message, capsys) -> None:
    if make == "npz":
        _synth(tmp_path)
    elif make == "narrow":
        np.save(tmp_path / "narrow.npy", np.array([[1.0, 2.0], [3.0, np.nan]]))
    elif make == "jsonl":
        lines = [
            {"generations": [{"rm_reward": 1.0}, {"rm_reward": 2.0}]},
            {"generations": [{"rm_reward": 1.0}, {"text": "unscored"}]},
        ]
        (tmp_path / "pool.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    capsys.readouterr()
    args = [str(tmp_path / args[0]), *args[1:]]
    code = main(["replay", *args, "--out", str(tmp_path / "o"), "--quiet", "--jobs", "1"])
    assert code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("pandora replay: error: ")
    assert message in lines[0]
    assert captured.out == ""
    assert not (tmp_path / "o" / "results.json").exists()


def test_the_installed_command_prints_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "server.cli", "replay", str(tmp_path / "absent.npz")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"pandora replay: error: {tmp_path / 'absent.npz'}: no such file"


def test_bad_arguments_are_rejected_by_argparse(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["replay", "x.npz", "--permutations", "0"])
    assert exc.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err

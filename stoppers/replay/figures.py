"""Paper-style PNG figures from ``results.json`` (matplotlib imported lazily, Agg backend).

* ``profit.png`` — Figure "cost_analysis": mean profit vs cost for several fixed N (thin), their
  envelope (the best fixed N at each cost, blue), the policy (red) and Weitzman's oracle
  (dashed); right: the per-prompt profit performance ratio (Figure "cost_compare_all").
* ``winrate.png`` — Figure "win_rate": win rate at the matched budget and mean samples vs cost.
* ``savings.png`` — Figure "acceptance_rate": save ratio vs target, and achieved vs target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_figures"]


def write_figures(results: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    title = f"{Path(str(results['meta']['file'])).name} · policy {results['meta']['policy']}"
    if results.get("profit"):
        written.append(_profit(plt, results, out_dir / "profit.png", title))
    if results.get("winrate"):
        written.append(_winrate(plt, results, out_dir / "winrate.png", title))
    if results.get("savings"):
        written.append(_savings(plt, results, out_dir / "savings.png", title))
    return written


def _band(ax, x, rows, key, color, label):
    med = np.array([_num(r["stats"][key]["median"]) for r in rows])
    lo = np.array([_num(r["stats"][key]["p10"]) for r in rows])
    hi = np.array([_num(r["stats"][key]["p90"]) for r in rows])
    ax.plot(x, med, "o-", color=color, label=f"{label} (median)")
    ax.fill_between(x, lo, hi, color=color, alpha=0.15, label="10th-90th percentile")


def _num(v):
    return np.nan if v is None else float(v)


def _profit(plt, results, path, title):
    rows = results["profit"]
    costs = np.array([r["cost"] for r in rows])
    curve = np.array([_num(v) for v in results["fixed_n_acceptance"]])
    n = np.arange(1, curve.size + 1)
    grid = np.geomspace(costs.min() / 2, costs.max() * 2, 200)
    fixed = curve[None, :] - grid[:, None] * n[None, :]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    shown = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if k <= curve.size]
    for k in shown:
        ax.plot(grid, fixed[:, k - 1], color="tab:green", lw=0.7, alpha=0.6)
    ax.plot([], [], color="tab:green", lw=0.7, label=f"fixed N ∈ {{{shown[0]}..{shown[-1]}}}")
    ax.plot(grid, fixed.max(axis=1), color="tab:blue", lw=2, label="best fixed N (envelope)")
    ax.plot(
        costs,
        [r["mean_adaptive_profit"] for r in rows],
        "o-",
        color="tab:red",
        label=results["meta"]["policy"],
    )
    oracle = [_num(r["mean_oracle_profit"]) for r in rows]
    if np.isfinite(oracle).any():
        ax.plot(costs, oracle, "k--", label="Weitzman oracle")
    ax.set_xscale("log")
    ax.set_xlabel("cost per sample (utility B = 1)")
    ax.set_ylabel("mean profit (acceptance - cost·n)")
    ax.legend(fontsize=8)
    ax.set_title("Profit vs cost")
    _band(bx, costs, rows, "ratio", "tab:red", "profit ratio")
    bx.axhline(1.0, color="grey", lw=1, ls=":")
    bx.set_xscale("log")
    bx.set_xlabel("cost per sample")
    bx.set_ylabel("policy profit / best fixed-N profit")
    bx.legend(fontsize=8)
    bx.set_title("Profit performance ratio (per prompt)")
    return _save(plt, fig, path, title)


def _winrate(plt, results, path, title):
    rows = results["winrate"]
    costs = np.array([r["cost"] for r in rows])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    _band(ax, costs, rows, "win_rate", "tab:red", "win rate")
    ax.axhline(0.5, color="grey", lw=1, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("cost per sample")
    ax.set_ylabel("win rate vs Best-of-N at matched N")
    ax.legend(fontsize=8)
    _band(bx, costs, rows, "mean_samples", "tab:blue", "mean samples")
    bx.set_xscale("log")
    bx.set_yscale("log")
    bx.set_xlabel("cost per sample")
    bx.set_ylabel("mean samples (= matched budget)")
    bx.legend(fontsize=8)
    return _save(plt, fig, path, title)


def _savings(plt, results, path, title):
    rows = results["savings"]
    targets = np.array([r["target"] for r in rows])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    _band(ax, targets, rows, "save_ratio", "tab:red", "save ratio")
    ax.axhline(0.0, color="grey", lw=1, ls=":")
    ax.set_xlabel("target acceptance rate")
    ax.set_ylabel("(N* - n) / N*")
    ax.legend(fontsize=8)
    _band(bx, targets, rows, "achieved_acceptance", "tab:blue", "achieved")
    bx.plot(targets, targets, color="grey", ls=":", label="target = achieved")
    bx.set_xlabel("target acceptance rate")
    bx.set_ylabel("achieved acceptance rate")
    bx.legend(fontsize=8)
    return _save(plt, fig, path, title)


def _save(plt, fig, path, title):
    """Title, lay out, write and close one figure; returns its path."""
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

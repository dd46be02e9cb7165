"""The README's cost-mode table and figure: ``python -m stoppers.robust.report DIR``.

Reads ``DIR/<pool>-<policy>/results.json`` written by ``pandora replay --experiment profit``
(policies ``shape-cost`` - run with ``--deployment --warm-after 8`` -, ``tail-cost``,
``adaptive``, ``patience``, ``beacon``), prints the markdown table and, with ``--figure``, draws
the profit ratios (matplotlib, imported only then). Target mode has its own report, on
sequential deployments: :mod:`stoppers.robust.target_report`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["main"]

FAMILIES = (
    "normal",
    "gumbel",
    "student-t",
    "mixture",
    "skew-normal",
    "exponential",
    "clipped",
    "mixed",
    "lognormal",
    "logistic",
    "rounded-0.5",
    "rounded-1.0",
    "pool",
)
# never looked at while the cost policies were tuned (lognormal, logistic: added 2026-11-25)
HELD_OUT = {"skew-normal", "exponential", "clipped", "mixed", "lognormal", "logistic"}
COSTS = (0.001, 0.0001)


def _load(root: Path, family: str, policy: str) -> dict | None:
    path = root / f"{family}-{policy}" / "results.json"
    return json.loads(path.read_text()) if path.exists() else None


def _label(family: str) -> str:
    name = "AlpacaEval pool (49)" if family == "pool" else family
    return name + (" *(held out)*" if family in HELD_OUT else "")


def _profit_row(results: dict | None, cost: float) -> dict | None:
    """The profit row at ``cost``; None if it was not run or has no value (e.g. the prompts
    served after 8 prior updates in a deployment of fewer requests)."""
    rows = (results or {}).get("profit", [])
    row = next((r for r in rows if abs(r["cost"] - cost) < 1e-12), None)
    needed = ("mean_adaptive_profit", "mean_best_fixed_profit", "mean_oracle_profit")
    return row if row is not None and all(row.get(k) is not None for k in needed) else None


def _ratios(row: dict) -> tuple[float, float]:
    mine = row["mean_adaptive_profit"]
    return mine / row["mean_best_fixed_profit"], mine / row["mean_oracle_profit"]


def cost_table(root: Path) -> str:
    """Per pool and cost, each policy's mean profit over the best fixed N's (chosen in hindsight
    on the same streams): the default ShapePandora (sequential deployment replay: all prompts,
    its cold start included, then ÷ Weitzman's oracle and its mean samples; and the prompts
    served after 8 prior updates), TailPandora (the default's cold start), the paper's rule,
    Patience(5), BEACON."""
    lines = [
        "| pool | c | **default** (ShapePandora): ÷ best fixed N · ÷ oracle · samples"
        " | default after 8 prior updates | TailPandora | paper's AdaptiveBestOfN · samples"
        " | Patience(5) | BEACON · samples | best fixed N · oracle's samples |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for family in FAMILIES:
        for cost in COSTS:
            shape = _load(root, family, "shape-cost") or {}
            rows = {
                "default": _profit_row({"profit": shape.get("profit", [])}, cost),
                "warm": _profit_row({"profit": shape.get("profit_warm", [])}, cost),
            }
            for policy in ("tail-cost", "adaptive", "patience", "beacon"):
                rows[policy] = _profit_row(_load(root, family, policy), cost)
            if all(row is None for row in rows.values()):
                continue
            cells = []
            for key, row in rows.items():
                if row is None:
                    cells.append("—")
                    continue
                fixed, oracle = _ratios(row)
                if key == "default":
                    cells.append(f"**{fixed:.3f}** · {oracle:.3f} · {row['mean_samples']:.0f}")
                elif key in ("adaptive", "beacon"):
                    cells.append(f"{fixed:.3f} · {row['mean_samples']:.0f}")
                else:
                    cells.append(f"{fixed:.3f}")
            known = next(row for row in rows.values() if row is not None)
            oracle_n = known.get("stats", {}).get("oracle_samples", {}).get("mean")
            best = f"{known['best_fixed_n']}" + ("" if oracle_n is None else f" · {oracle_n:.0f}")
            lines.append(f"| {_label(family)} | {cost:g} | " + " | ".join(cells) + f" | {best} |")
    return "\n".join(lines)


def figure(root: Path, out: Path) -> None:
    """Bars of the cost table's ratios to the best fixed N (the default, its cold start, the
    paper's rule), ticks at the ratio to the oracle, one panel per cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(1, len(COSTS), figsize=(11, 4.4), sharey=True)
    x = np.arange(len(FAMILIES))
    width = 0.27
    bars = (
        ("shape-cost", "tab:blue", "default (ShapePandora)"),
        ("tail-cost", "tab:red", "TailPandora (cold start)"),
        ("adaptive", "tab:gray", "paper's AdaptiveBestOfN"),
    )
    for panel, cost in zip(ax, COSTS, strict=True):
        for k, (policy, colour, label) in enumerate(bars):
            vs_fixed, vs_oracle = [], []
            for family in FAMILIES:
                row = _profit_row(_load(root, family, policy), cost)
                fixed, oracle = _ratios(row) if row else (np.nan, np.nan)
                vs_fixed.append(fixed)
                vs_oracle.append(oracle)
            where = x + (k - 1) * width
            panel.bar(where, vs_fixed, width, color=colour, label=f"{label} / best fixed N")
            panel.plot(where, vs_oracle, "k_", ms=10, mew=2, label="/ oracle" if k == 0 else None)
        panel.axhline(1.0, color="k", lw=0.8)
        panel.axhline(0.97, color="k", ls="--", lw=0.6)
        panel.set_xticks(x, [_label(f).split(" *")[0] for f in FAMILIES], rotation=40, fontsize=8)
        panel.set_ylim(0.4, 1.1)
        panel.set_title(f"cost mode, c = {cost:g}: mean profit ratio", fontsize=9)
    ax[0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="directory holding <family>-<policy>/results.json")
    parser.add_argument("--figure", type=Path, help="write the PNG figure here")
    args = parser.parse_args(argv)
    print(cost_table(args.dir))
    if args.figure is not None:
        figure(args.dir, args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

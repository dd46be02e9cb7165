"""Tables and figure of the README's robust-stopping replay: ``python -m stoppers.robust.report``.

Reads ``DIR/<family>-<policy>/results.json`` written by ``pandora replay`` (policies
``shape-cost`` - run with ``--deployment --warm-after 8`` -, ``tail-cost``, ``adaptive``,
``patience`` for profit; ``tail-target``, ``target`` for savings),
prints the two markdown tables and, with ``--figure``, draws achieved-vs-target and the
cost-mode profit ratios (matplotlib, imported only then).
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
    rows = (results or {}).get("profit", [])
    return next((r for r in rows if abs(r["cost"] - cost) < 1e-12), None)


def _ratios(row: dict) -> tuple[float, float]:
    mine = row["mean_adaptive_profit"]
    return mine / row["mean_best_fixed_profit"], mine / row["mean_oracle_profit"]


def cost_table(root: Path) -> str:
    """TailPandora (the default's cold start), ShapePandora (the default; sequential deployment
    replay: all prompts, and those served after 8 prior updates), the paper's rule,
    Patience(5), BEACON."""
    lines = [
        "| family | c | TailPandora (the default's cold start): ÷ best fixed N (median per"
        " prompt) · ÷ oracle · samples | **ShapePandora** (default), all prompts (cold start"
        " included): ÷ fixed · ÷ oracle · samples | ShapePandora, after 8 prior updates: ÷ fixed"
        " · ÷ oracle"
        " | paper AdaptiveBestOfN: ÷ fixed · ÷ oracle | Patience(5) ÷ fixed"
        " | BEACON: ÷ fixed · samples | best fixed N |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for family in FAMILIES:
        for cost in COSTS:
            cells, best_n = [], "—"
            row = _profit_row(_load(root, family, "tail-cost"), cost)
            if row is None:
                cells.append("—")
            else:
                fixed, oracle = _ratios(row)
                best_n = row["best_fixed_n"]
                samples = row["mean_samples"]
                cells.append(f"{fixed:.3f} ({row['ratio']:.3f}) · {oracle:.3f} · {samples:.0f}")
            shape = _load(root, family, "shape-cost") or {}
            for key in ("profit", "profit_warm"):
                row = _profit_row({"profit": shape.get(key, [])}, cost)
                if row is None or row["mean_oracle_profit"] is None:
                    cells.append("—")
                    continue
                fixed, oracle = _ratios(row)
                best_n = row["best_fixed_n"]
                if key == "profit":
                    cells.append(f"**{fixed:.3f}** · {oracle:.3f} · {row['mean_samples']:.0f}")
                else:
                    cells.append(f"{fixed:.3f} · {oracle:.3f}")
            for policy in ("adaptive", "patience", "beacon"):
                row = _profit_row(_load(root, family, policy), cost)
                if row is None:
                    cells.append("—")
                    continue
                fixed, oracle = _ratios(row)
                best_n = row["best_fixed_n"]
                cells.append(
                    {
                        "adaptive": f"{fixed:.3f} · {oracle:.3f}",
                        "patience": f"{fixed:.3f}",
                        "beacon": f"{fixed:.3f} · {row['mean_samples']:.0f}",
                    }[policy]
                )
            lines.append(f"| {_label(family)} | {cost:g} | " + " | ".join(cells) + f" | {best_n} |")
    return "\n".join(lines)


def target_table(root: Path) -> str:
    lines = [
        "| family | policy | achieved at target 0.7 / 0.8 / 0.9 / 0.95 (median over prompts)"
        " | samples at 0.9 | save ratio at 0.7 / 0.8 / 0.9 / 0.95 (median) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for family in FAMILIES:
        for policy, label in (
            ("tail-target", "**TailTargetAcceptance**"),
            ("target", "paper TargetAcceptance"),
        ):
            results = _load(root, family, policy)
            if results is None:
                continue
            rows = results["savings"]
            achieved = " / ".join(f"{r['achieved_acceptance']:.3f}" for r in rows)
            saves = " / ".join(f"{r['save_ratio']:+.2f}" for r in rows)
            at_90 = [r["mean_samples"] for r in rows if abs(r["target"] - 0.9) < 1e-9]
            samples = f"{at_90[0]:.1f}" if at_90 else "—"
            lines.append(f"| {_label(family)} | {label} | {achieved} | {samples} | {saves} |")
    return "\n".join(lines)


def figure(root: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(1, 3, figsize=(16, 4.8))
    colours = plt.get_cmap("tab10")
    for i, family in enumerate(FAMILIES):
        for policy, style in (("tail-target", "-"), ("target", ":")):
            results = _load(root, family, policy)
            if results is None:
                continue
            rows = results["savings"]
            ax[0].plot(
                [r["target"] for r in rows],
                [r["achieved_acceptance"] for r in rows],
                style,
                marker="o",
                ms=3,
                color=colours(i % 10),
                label=family if policy == "tail-target" else None,
            )
    ax[0].plot([0.65, 1], [0.65, 1], "k-", lw=0.8)
    ax[0].fill_between([0.65, 1], [0.62, 0.97], [0.68, 1.03], color="0.85")
    ax[0].set_xlabel("target acceptance")
    ax[0].set_ylabel("achieved (median over prompts)")
    ax[0].set_title("target mode: TailTargetAcceptance (solid) vs paper (dotted)")
    ax[0].legend(fontsize=7)
    x = np.arange(len(FAMILIES))
    width = 0.27
    bars = (("shape-cost", "tab:blue"), ("tail-cost", "tab:red"), ("adaptive", "tab:gray"))
    for j, cost in enumerate(COSTS):
        panel = ax[1 + j]
        for k, (policy, colour) in enumerate(bars):
            vs_fixed, vs_oracle = [], []
            for family in FAMILIES:
                row = _profit_row(_load(root, family, policy), cost)
                mine = row["mean_adaptive_profit"] if row else np.nan
                vs_fixed.append(mine / row["mean_best_fixed_profit"] if row else np.nan)
                vs_oracle.append(mine / row["mean_oracle_profit"] if row else np.nan)
            where = x + (k - 1) * width
            panel.bar(where, vs_fixed, width, color=colour, label=f"{policy} / best fixed N")
            panel.plot(where, vs_oracle, "k_", ms=12, mew=2, label="/ oracle" if k == 0 else None)
        panel.axhline(1.0, color="k", lw=0.8)
        panel.axhline(0.97, color="k", ls="--", lw=0.6)
        panel.set_xticks(x, FAMILIES, rotation=40, fontsize=8)
        panel.set_ylim(0.4, 1.1)
        panel.set_title(f"cost mode, c = {cost:g}: mean profit ratio")
        panel.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="directory holding <family>-<policy>/results.json")
    parser.add_argument("--figure", type=Path, help="write the PNG figure here")
    args = parser.parse_args(argv)
    print(cost_table(args.dir))
    print()
    print(target_table(args.dir))
    if args.figure is not None:
        figure(args.dir, args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

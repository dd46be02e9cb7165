"""``results.json`` and the terminal table.

The fixed keys (``meta``, ``profit``, ``winrate``, ``savings`` and the per-row keys listed in
:data:`SCHEMA`) always appear; each row also carries ``stats`` (median/mean/p10/p90 over prompts
of every figure) and a few extra fields. A headline value is the median over prompts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA", "format_table", "write_results"]

SCHEMA: dict[str, tuple[str, ...]] = {
    "meta": (
        "file",
        "prompts",
        "samples",
        "permutations",
        "policy",
        "alpha",
        "delta",
        "seed",
        "seconds",
    ),
    "profit": (
        "cost",
        "adaptive_profit",
        "best_fixed_profit",
        "best_fixed_n",
        "ratio",
        "mean_samples",
        "oracle_profit",
    ),
    "winrate": ("cost", "win_rate", "mean_samples"),
    "savings": ("target", "achieved_acceptance", "mean_samples", "matched_fixed_n", "save_ratio"),
}


def write_results(results: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    path.write_text(json.dumps(_clean(results), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return path


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become null; numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    return format(value, spec)


def format_table(results: dict[str, Any]) -> str:
    """A compact, fixed-width summary of whatever experiments ran."""
    meta = results["meta"]
    lines = [
        f"{meta['file']}: {meta['prompts']} prompts x {meta['samples']} samples, "
        f"{meta['permutations']} orderings, policy {meta['policy']}, alpha {meta['alpha']}, "
        f"{meta['seconds']:.1f} s (medians over prompts)"
    ]
    if results.get("profit"):
        lines += [
            "",
            "profit      cost     policy  best-fixed  N*  ratio (p10-p90)      samples  oracle",
        ]
        for row in results["profit"]:
            r = row["stats"]["ratio"]
            lines.append(
                f"        {row['cost']:8.5f}  {_fmt(row['adaptive_profit'], '8.4f')}  "
                f"{_fmt(row['best_fixed_profit'], '10.4f')} {row['best_fixed_n']:3d}  "
                f"{_fmt(row['ratio'], '5.3f')} ({_fmt(r['p10'], '5.2f')}-{_fmt(r['p90'], '5.2f')})"
                f"  {_fmt(row['mean_samples'], '7.1f')}  {_fmt(row['oracle_profit'], '6.4f')}"
            )
    if results.get("winrate"):
        lines += ["", "winrate     cost   win-rate  (mean)  samples"]
        for row in results["winrate"]:
            lines.append(
                f"        {row['cost']:8.6f}  {_fmt(row['win_rate'], '7.3f')}  "
                f"({row['mean_win_rate']:.3f})  {_fmt(row['mean_samples'], '7.1f')}"
            )
    if results.get("savings"):
        lines += ["", "savings   target  achieved  samples  matched-N*  save-ratio  (mean)"]
        for row in results["savings"]:
            lines.append(
                f"          {row['target']:6.3f}  {_fmt(row['achieved_acceptance'], '8.3f')}  "
                f"{_fmt(row['mean_samples'], '7.1f')}  {_fmt(row['matched_fixed_n'], '10.1f')}  "
                f"{_fmt(row['save_ratio'], '10.3f')}  ({row['mean_save_ratio']:.3f})"
            )
    return "\n".join(lines)

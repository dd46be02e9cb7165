"""Two rules on the same streams: ``python -m stoppers.robust.paired_report BEFORE AFTER``.

Why: :mod:`stoppers.robust.loss_report`'s standard errors are one rule's, over its
deployments. Two rules replayed on the same pool, orderings and seed serve the same prompts in
the same order on the same streams, so much of that noise is shared, and the error of their
difference is often several times smaller than either one's (on the real pool redrawn, `ap05`,
24 prompts x 40 deployments: 0.0014 against 0.0041 and 0.0045 at c = 1e-3). Compared by their
two ratios and two errors, a change of 0.001 could not be told from noise
(docs/robust-stopping.md, "The streams' Best-of-N from four requests": "no paired error was
computed").

Each side is the ``--rows-out`` file of a ``loss_report`` run (one per rule: a git worktree of
the old code with ``PYTHONPATH``, say). Per cost both files hold, for every request, the
rule's profit and the best fixed N's on the same stream; the report gives each rule's ratio to
the best fixed N, and the difference after - before per deployment (the mean over its requests,
over the best fixed N's mean profit) with its standard error over the deployments. ``--by
position`` splits it by when the deployment served the request (#1, #2-3, #4-7, ...).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from stoppers.robust.loss_report import position_bins, standard_error

__all__ = ["PairedDifference", "main", "paired_differences"]

REPLAY_KEYS = ("pool", "prompts", "orderings", "seed", "max_samples")


@dataclass(frozen=True)
class PairedDifference:
    """One group of requests (all of them, or a position bin) at one cost: each rule's profit
    over the best fixed N's on the same requests, and the paired difference after - before in
    the same units, with its standard error over the deployments."""

    cost: float
    group: str
    requests: int
    before: float
    after: float
    difference: float
    standard_error: float


def _side(path: str) -> tuple[dict[str, str], dict[str, dict[str, np.ndarray]]]:
    """(replay metadata, {cost: {"profit", "fixed", "position"}}) of a ``--rows-out`` file."""
    with np.load(path) as data:
        replay = {k.split("/", 1)[1]: str(data[k]) for k in data.files if k.startswith("replay/")}
        costs: dict[str, dict[str, np.ndarray]] = {}
        for key in data.files:
            cost, _, name = key.partition("/")
            if cost != "replay":
                costs.setdefault(cost, {})[name] = np.asarray(data[key])
    return replay, costs


def paired_differences(
    before: str, after: str, *, by_position: bool = False
) -> list[PairedDifference]:
    """The paired differences of ``after``'s rule against ``before``'s, per cost both files
    hold (ValueError: not the same replay, or different streams under the same name)."""
    meta_b, rows_b = _side(before)
    meta_a, rows_a = _side(after)
    for path, meta in ((before, meta_b), (after, meta_a)):
        if not meta:
            raise ValueError(f"{path} is not a loss_report --rows-out file")
    differ = [k for k in REPLAY_KEYS if meta_b.get(k) != meta_a.get(k)]
    if differ:
        raise ValueError(f"not the same replay: {', '.join(differ)} differ")
    orderings = int(meta_b["orderings"])
    out = []
    for cost in sorted(set(rows_b) & set(rows_a), key=float, reverse=True):
        b, a = rows_b[cost], rows_a[cost]
        if not np.allclose(b["fixed"], a["fixed"]) or not np.array_equal(
            b["position"], a["position"]
        ):
            raise ValueError(f"c = {cost}: the best fixed N's profits differ: not the same streams")
        groups = {"all": np.ones(b["fixed"].size, dtype=bool)}
        if by_position:
            bins = position_bins(b["position"], int(meta_b["prompts"]))
            groups.update({name: bins == name for name in sorted(set(bins.tolist()))})
        for name, rows in groups.items():
            out.append(_difference(float(cost), name, rows, b, a, orderings))
    return out


def _difference(
    cost: float,
    group: str,
    rows: np.ndarray,
    before: dict[str, np.ndarray],
    after: dict[str, np.ndarray],
    orderings: int,
) -> PairedDifference:
    """Rows in batch layout (prompt * orderings + ordering): a deployment is one ordering."""
    deployment = np.arange(rows.size) % orderings

    def per_deployment(values: np.ndarray) -> np.ndarray:
        return np.bincount(deployment[rows], weights=values[rows], minlength=orderings)

    fixed = per_deployment(before["fixed"]).mean()
    gap = (per_deployment(after["profit"]) - per_deployment(before["profit"])) / fixed
    return PairedDifference(
        cost=cost,
        group=group,
        requests=int(rows.sum()),
        before=float(before["profit"][rows].sum() / before["fixed"][rows].sum()),
        after=float(after["profit"][rows].sum() / after["fixed"][rows].sum()),
        difference=float(gap.mean()),
        standard_error=standard_error(gap),
    )


def render(differences: list[PairedDifference]) -> str:
    lines = []
    for d in differences:
        head = f"c = {d.cost:g}" if d.group == "all" else f"  {d.group:<10}"
        lines.append(
            f"{head}: {d.before:.4f} -> {d.after:.4f} x best fixed N ({d.requests} requests); "
            f"after - before {d.difference:+.4f} (standard error {d.standard_error:.4f}, paired)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="loss_report --rows-out file of the first rule")
    parser.add_argument("after", help="... of the second, on the same pool and orderings")
    parser.add_argument("--by", choices=("all", "position"), default="all")
    args = parser.parse_args(argv)
    try:
        differences = paired_differences(args.before, args.after, by_position=args.by == "position")
    except ValueError as e:
        parser.error(str(e))
    print(render(differences))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

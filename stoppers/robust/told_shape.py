"""What a cost request would earn told its prompt's shape: ``python -m stoppers.robust.told_shape``.

Why: on a deployment whose prompts differ in shape (several kinds of task behind one model), one
shape fitted to all of them is a blend whose tail fits none, so the cost default decides there on
the per-request cold start (docs/robust-stopping.md "Heterogeneous continuous deployments"). Whether
a *per-prompt* choice of shape - a mixture of shapes learned across the deployment, each request
weighing the components by its own rewards - is worth building depends on two numbers this ablation
measures: what cost mode's likelihood rule earns told each prompt's shape, and how much of that
survives when the request must infer which shape is its own.

It replays the likelihood rule of :mod:`stoppers.robust.likelihood_cost` (stop once the
posterior mean of the one-step gain E[(AR(V) - AR(best))+] is <= c; Definitions "Fair-cap
value", "Weitzman's Algorithm"), with every shape built from the pool's *full* rows - no gateway
has them, so this is report-only:

* ``own``: each prompt's own rewards, standardised by their mean and sd;
* ``label``: the pooled standardised rewards of the prompts with the prompt's label (e.g. its
  family: the shape a per-task prior would learn given time);
* ``pooled``: one shape of all the prompts (the blend);
* ``weight``: the label shape, except that where it has several modes the request's own
  weight of the better mode is integrated out with its location and scale: the shape is cut
  at the dip below its top mode (:func:`~stoppers.robust.likelihood_cost.mode_split`) and
  re-weighted, ``(1 - w) bulk + w better``, re-standardised, w the pooled weight times
  ``WEIGHT_FACTORS`` (equal prior weights). Two-mode prompts differ in how often the better
  mode comes, so even their own family's pooled shape misleads them (docs/robust-stopping.md);
* ``mixture``: the label shapes as one mixture, weighted by the labels' shares; the request's
  posterior runs over (shape, m, log s), each shape weighed by its evidence
  (:meth:`~stoppers.robust.likelihood_cost.FittedShape.log_posterior`) and judged against its
  own benchmark quantile.

The scale prior is the rows' log sd. Nothing is learned and there is no cold start: every
request decides as a warm one would, so a stream's stop does not depend on the deployment
order. Profits are set against the best fixed N in hindsight on the same streams, with the
standard errors of :mod:`stoppers.robust.loss_report`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from stoppers.faircap import acceptance_rate
from stoppers.replay.deployment import deployment_batch
from stoppers.robust.likelihood_cost import EDGES, FittedShape, evaluation_due, mode_split
from stoppers.robust.loss_report import fixed_profits, load_pool, ratio_standard_errors
from stoppers.robust.policy import DEFAULT_MIN_SAMPLES
from stoppers.robust.shape_likelihood import standardise_shape

__all__ = [
    "MODES",
    "WEIGHT_FACTORS",
    "ShapeMixture",
    "ToldResult",
    "main",
    "replay_told",
    "told_mixtures",
    "weight_family",
]

MODES = ("own", "label", "weight", "pooled", "mixture")
# the better mode's weight, relative to the pooled shape's: 0.4x to 2.5x, evenly in log
WEIGHT_FACTORS = tuple(float(f) for f in np.geomspace(0.4, 2.5, 7))
_KEEP = 1e-6  # nodes under this share of the top node's weight add nothing (as `posterior`)


@dataclass(frozen=True)
class ShapeMixture:
    """Standardised shapes and their prior weights (one shape: the plain likelihood rule)."""

    shapes: tuple[FittedShape, ...]
    weights: tuple[float, ...]
    alpha: float = 0.99

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights) or not self.shapes:
            raise ValueError("a mixture needs one weight per shape, and at least one shape")
        object.__setattr__(self, "_z_alpha", tuple(s.quantile(self.alpha) for s in self.shapes))
        object.__setattr__(self, "_log_weights", np.log(np.asarray(self.weights, float)))

    def posterior_gain(
        self, rewards: np.ndarray, best: float, scale_mu: float, scale_precision: float
    ) -> float:
        """The one-step gain averaged over the request's posterior on (shape, m, log s)."""
        gain = total = 0.0
        for shape, z_alpha, (m, s, w) in zip(
            self.shapes,
            self._z_alpha,
            self._weighed(rewards, scale_mu, scale_precision),
            strict=True,
        ):
            keep = w > _KEEP * w.max()
            if keep.any():
                total += float(w[keep].sum())
                gain += float(w[keep] @ shape.node_gains(m[keep], s[keep], best, z_alpha))
        return gain / total

    def shares(self, rewards: np.ndarray, scale_mu: float, scale_precision: float) -> np.ndarray:
        """The request's posterior probability of each shape."""
        mass = np.array([w.sum() for _, _, w in self._weighed(rewards, scale_mu, scale_precision)])
        return mass / mass.sum()

    def _weighed(
        self, rewards: np.ndarray, scale_mu: float, scale_precision: float
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per shape, (m, s, weight) on its grid: prior weight x evidence, scaled by a common
        constant so the top node of all is 1."""
        parts = [s.log_posterior(rewards, scale_mu, scale_precision) for s in self.shapes]
        logs = [lp + lw for (_, _, lp), lw in zip(parts, self._log_weights, strict=True)]
        top = max(float(v.max()) for v in logs)
        return [(m, s, np.exp(v - top)) for (m, s, _), v in zip(parts, logs, strict=True)]


def _shape_of(rows: np.ndarray) -> FittedShape:
    """The histogram (bins ``EDGES``) of rows each standardised by its own mean and sd."""
    z = (rows - rows.mean(axis=1, keepdims=True)) / rows.std(axis=1, ddof=1, keepdims=True)
    counts = np.histogram(np.clip(z.ravel(), EDGES[0], EDGES[-1] - 1e-9), EDGES)[0]
    p = counts.astype(np.float64) / counts.sum()
    return FittedShape(p=p, requests=rows.shape[0], streams=rows.shape[0], tied=0.0)


def weight_family(shape: FittedShape, factors: Sequence[float] = WEIGHT_FACTORS) -> ShapeMixture:
    """``shape`` with the better mode's weight left to the request (module docstring, mode
    ``weight``); a one-mode shape as it is."""
    cut = mode_split(shape.p)
    if cut is None:
        return ShapeMixture((shape,), (1.0,))
    bulk, better = shape.p[:cut], shape.p[cut:]
    pooled = float(better.sum())
    shapes = []
    for factor in factors:
        w = min(max(pooled * factor, 1e-3), 1.0 - 1e-3)
        q = np.concatenate([(1.0 - w) * bulk / bulk.sum(), w * better / pooled])
        shapes.append(replace(shape, p=standardise_shape(q, EDGES)))
    return ShapeMixture(tuple(shapes), tuple([1.0 / len(shapes)] * len(shapes)))


def told_mixtures(
    rewards: np.ndarray, mode: str, labels: Sequence[str] | None = None
) -> list[ShapeMixture]:
    """Per prompt, the shape(s) ``mode`` tells its request (module docstring)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    rows = np.asarray(rewards, dtype=np.float64)
    if not np.all(np.isfinite(rows)) or np.any(rows.std(axis=1) == 0.0):
        raise ValueError("told shapes need every prompt's rewards finite and spread")
    if mode == "own":
        return [ShapeMixture((_shape_of(rows[i : i + 1]),), (1.0,)) for i in range(len(rows))]
    if mode == "pooled":
        return [ShapeMixture((_shape_of(rows),), (1.0,))] * len(rows)
    if labels is None or len(labels) != len(rows):
        raise ValueError(f"mode {mode!r} needs one label per prompt")
    tags = np.asarray(labels, dtype=object)
    names = sorted(set(tags.tolist()))
    shapes = {name: _shape_of(rows[tags == name]) for name in names}
    if mode == "label":
        return [ShapeMixture((shapes[t],), (1.0,)) for t in tags]
    if mode == "weight":
        families = {name: weight_family(shape) for name, shape in shapes.items()}
        return [families[t] for t in tags]
    shares = tuple(float(np.mean(tags == name)) for name in names)
    mixture = ShapeMixture(tuple(shapes[name] for name in names), shares)
    return [mixture] * len(rows)


@dataclass(frozen=True)
class ToldResult:
    """Mean profit per request against the best fixed N chosen in hindsight."""

    cost: float
    profit: float
    fixed_profit: float
    best_fixed_n: int
    samples: float
    se_deployments: float
    se_prompts: float
    # with labels: per label, (its requests' profit / the best fixed N's on them, mean samples)
    by_label: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.profit / self.fixed_profit


def replay_told(
    rewards: np.ndarray,
    mixtures: Sequence[ShapeMixture],
    cost: float,
    *,
    orderings: int,
    seed: int = 0,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    max_samples: int | None = None,
    labels: Sequence[str] | None = None,
) -> ToldResult:
    """Replay the told likelihood rule on the streams the deployment replays serve; with
    ``labels`` (one per prompt) also split by label (:attr:`ToldResult.by_label`)."""
    rows = np.asarray(rewards, dtype=np.float64)
    batch = deployment_batch(rows, orderings=orderings, seed=seed, max_samples=max_samples)
    log_sd = np.log(rows.std(axis=1, ddof=1))
    scale_mu, scale_precision = float(log_sd.mean()), 1.0 / max(float(log_sd.var()), 1e-4)
    n_used = np.empty(batch.prompt.size, dtype=np.int64)
    kept = np.empty(batch.prompt.size)
    for r in range(batch.prompt.size):
        mixture = mixtures[int(batch.prompt[r])]
        n_used[r], kept[r] = _stream(
            batch.values[r, : int(batch.budget[r])],
            lambda x, best, m=mixture: m.posterior_gain(x, best, scale_mu, scale_precision),
            cost,
            min_samples,
        )
    profit = acceptance_rate(kept, batch.kappa) - cost * n_used
    fixed = fixed_profits(batch, cost)
    best_n = int(np.argmax(fixed.mean(axis=0))) + 1
    fixed_profit = fixed[:, best_n - 1]
    se_deployments, se_prompts = ratio_standard_errors(profit, fixed_profit, orderings)
    by_label = {}
    if labels is not None:
        row_labels = np.asarray(labels, dtype=object)[batch.prompt]
        for name in sorted(set(row_labels.tolist())):
            on = row_labels == name
            ratio = float(profit[on].sum() / fixed_profit[on].sum())
            by_label[name] = (ratio, float(n_used[on].mean()))
    return ToldResult(
        cost=float(cost),
        profit=float(profit.mean()),
        fixed_profit=float(fixed_profit.mean()),
        best_fixed_n=best_n,
        samples=float(n_used.mean()),
        se_deployments=se_deployments,
        se_prompts=se_prompts,
        by_label=by_label,
    )


def _stream(
    values: np.ndarray,
    gain_of: Callable[[np.ndarray, float], float],
    cost: float,
    min_samples: int,
) -> tuple[int, float]:
    """(samples drawn, kept reward) of the likelihood rule on one stream, evaluated on the cost
    paths' schedule (:func:`~stoppers.robust.likelihood_cost.evaluation_due`)."""
    best, last_n, last_best, gain = -math.inf, 0, -math.inf, math.inf
    for n in range(1, values.size + 1):
        best = max(best, float(values[n - 1]))
        if n < max(min_samples, 2):
            continue
        if evaluation_due(n, best, last_n, last_best):
            x = values[:n]
            if x.std() > 0.0:  # all tied so far: no scale to judge the best against yet
                gain = gain_of(x, best)
            last_n, last_best = n, best
        if gain <= cost:
            return n, best
    return values.size, best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help=".npz with a 'rewards' (prompts x samples) array")
    parser.add_argument("--cost", type=float, action="append", required=True, help="repeatable")
    parser.add_argument("--shape", choices=MODES, action="append", required=True, help="repeatable")
    parser.add_argument(
        "--label-key",
        metavar="ARRAY",
        help="per-prompt labels (label, weight, mixture; without it one label for all prompts)",
    )
    parser.add_argument("--prompts", type=int, help="first N prompts")
    parser.add_argument("--orderings", type=int, default=30)
    parser.add_argument("--max-samples", type=int)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rewards, labels = load_pool(args.file, args.label_key, args.prompts)
    if labels is None and {"label", "weight", "mixture"} & set(args.shape):
        labels = ["all"] * len(rewards)  # one label: the pooled shape
    for mode in args.shape:
        mixtures = told_mixtures(rewards, mode, labels)
        for cost in args.cost:
            r = replay_told(
                rewards,
                mixtures,
                cost,
                orderings=args.orderings,
                seed=args.seed,
                max_samples=args.max_samples,
                labels=labels,
            )
            print(
                f"{mode:<8} c = {cost:g}: {r.ratio:.4f} x best fixed N ({r.best_fixed_n}; "
                f"standard error {r.se_deployments:.4f} over deployments, {r.se_prompts:.4f} "
                f"over prompts); samples {r.samples:.1f}"
            )
            for name, (ratio, samples) in r.by_label.items():
                print(
                    f"  {name:<14} {ratio:.4f} x the same fixed N on its requests; "
                    f"samples {samples:.1f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

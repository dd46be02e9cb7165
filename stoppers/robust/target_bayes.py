"""What not knowing the prompt's location and scale costs target mode: the Bayes rule, by DP.

Why: :mod:`stoppers.robust.target_bound` measures the save of a rule told each prompt's whole
distribution (0.37-0.51 at target 0.9 on every pool). A gateway's rule is told at most the
deployment's shape and the spread of its prompts' scales; each request must learn its own
location m and scale s from its own rewards. This module computes the best any rule can do
with exactly that knowledge, in the one case where it is exact and small enough to solve:
normal rewards, m with a flat prior, log s ~ N(0, spread^2). There (mean, sd) of the rewards
seen are sufficient for (m, s), so the Bayes rule is a function of the state
(n, d = best - mean, sd), and backward induction over that state solves it:

    V_n(d, S) = max( g_n(d, S),  E[V_{n+1}(d', S')] - C * E[lambda_t(s) | S, n] ),

with g_n the posterior mean acceptance of the best (AR against kappa = m + s z_alpha), and the
per-sample price lambda_t(s) = E[(AR - AR(tau_t))+] of the known-distribution rule at scale s
(the Lagrangian form of "acceptance t per prompt", as in
:mod:`stoppers.robust.multiplier_target`), scaled by one multiplier C that sets how much
acceptance the rule buys. Grids: d and log S in steps of 0.1, log s in steps of 0.1, 12
Gauss-Hermite nodes for the next reward; the posterior of s uses the sd alone (the best adds
a little about s, which this ignores, so the rule is slightly below the exact Bayes rule - it
is a rule a gateway could run, so its save is attainable). Beyond ``horizon`` the request
stops.

:func:`evaluate` then replays the rule on simulated prompts (s drawn from the prior) and
reports each prompt's acceptance, mean samples, the fixed N* reaching that acceptance (exact,
by quadrature over the normal maximum) and the save (N* - n) / N*, medians over prompts as in
:func:`~stoppers.replay.experiments.savings_rows`.

CLI: ``python -m stoppers.robust.target_bayes --spread 0.4 --target 0.9 --multipliers 1.0,1.6``
prints one row per multiplier (~1 min each) and the save interpolated at the target.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass, field

import numpy as np
from scipy.special import logsumexp
from scipy.stats import norm

from stoppers.replay.experiments import matched_fixed_n
from stoppers.robust.gpd_tail import _acceptance_array

__all__ = ["BayesTargetSpec", "PromptResult", "evaluate", "fixed_curve", "price", "solve"]

STEP = 0.1  # grid step of d, log sd and log scale
_Z = np.linspace(-6.0, 8.0, 4001)  # standard normal quadrature grid
_PZ = norm.pdf(_Z) / norm.pdf(_Z).sum()
_NEXT_Y, _NEXT_W = np.polynomial.hermite_e.hermegauss(12)
_NEXT_W = _NEXT_W / _NEXT_W.sum()
_MEAN_E, _MEAN_W = np.polynomial.hermite_e.hermegauss(10)
_MEAN_W = _MEAN_W / _MEAN_W.sum()


@dataclass(frozen=True)
class BayesTargetSpec:
    """The problem: target, the prompts' log-scale spread, the sample floor and horizon."""

    target: float
    spread: float  # sd of log s across the deployment's prompts (the prior the rule knows)
    min_samples: int = 8
    horizon: int = 160
    alpha: float = 0.99
    d_grid: np.ndarray = field(default_factory=lambda: np.arange(0.0, 8.0 + 1e-9, STEP))
    log_sd_grid: np.ndarray = field(default_factory=lambda: np.arange(-2.5, 2.5 + 1e-9, STEP))
    log_scale_nodes: np.ndarray = field(default_factory=lambda: np.arange(-1.8, 1.8 + 1e-9, STEP))

    def __post_init__(self) -> None:
        if not 0.0 < self.target < 1.0:
            raise ValueError(f"target must be in (0, 1), got {self.target}")
        if self.spread <= 0.0:
            raise ValueError(f"spread must be > 0, got {self.spread}")
        if not 2 <= self.min_samples < self.horizon:
            raise ValueError("need 2 <= min_samples < horizon")

    @property
    def z_alpha(self) -> float:
        return float(norm.ppf(self.alpha))


def price(scale: np.ndarray, target: float, alpha: float = 0.99) -> tuple[np.ndarray, np.ndarray]:
    """(lambda_t(s), z_t(s)) for normal rewards of scale ``s``: the threshold z_t with
    E[AR | Z >= z_t] = t and the one-step gain E[(AR - AR(z_t))+] there - the price per sample
    at which Weitzman's rule is the known-distribution target rule."""
    z_alpha = norm.ppf(alpha)
    prices, thresholds = [], []
    mass = np.cumsum(_PZ[::-1])[::-1]
    for s in np.atleast_1d(scale):
        a = _acceptance_array(s * (_Z - z_alpha))
        conditional = np.cumsum((a * _PZ)[::-1])[::-1] / np.maximum(mass, 1e-300)
        k = int(np.argmax(conditional >= target))
        prices.append(float(np.maximum(a - a[k], 0.0) @ _PZ))
        thresholds.append(float(_Z[k]))
    return np.array(prices), np.array(thresholds)


def _posterior(spec: BayesTargetSpec, n: int) -> np.ndarray:
    """(log sd grid, log scale nodes): weights of s given the sd of n rewards (m integrated
    out with its flat prior: the sd's chi-square likelihood with n - 1 degrees of freedom)."""
    nodes = spec.log_scale_nodes
    var = np.exp(2.0 * spec.log_sd_grid)[:, None]
    log_w = (
        -0.5 * (nodes / spec.spread) ** 2
        - (n - 1) * nodes[None, :]
        - (n - 1) * var / (2.0 * np.exp(2.0 * nodes[None, :]))
    )
    return np.exp(log_w - logsumexp(log_w, axis=1, keepdims=True))


def _stop_value(spec: BayesTargetSpec, n: int, weights: np.ndarray) -> np.ndarray:
    """g_n(d, S): posterior mean AR of the best, kappa - best = s z_alpha - d - (mean - m)."""
    s = np.exp(spec.log_scale_nodes)
    error = _MEAN_E[None, :] * s[:, None] / np.sqrt(n)  # mean - m given s: N(0, s^2 / n)
    ar = _acceptance_array(
        spec.d_grid[:, None, None] + error[None] - (s * spec.z_alpha)[None, :, None]
    )
    return (ar @ _MEAN_W) @ weights.T  # (d, log sd)


def _bilinear(values: np.ndarray, spec: BayesTargetSpec, d: np.ndarray, log_sd: np.ndarray):
    """``values`` on (d grid, log sd grid) read at (d, log_sd), clamped to the grid."""
    nd, ns = values.shape
    fi = np.clip((d - spec.d_grid[0]) / STEP, 0.0, nd - 1.001)
    fj = np.clip((log_sd - spec.log_sd_grid[0]) / STEP, 0.0, ns - 1.001)
    i, j = fi.astype(np.int64), fj.astype(np.int64)
    a, b = fi - i, fj - j
    return (
        values[i, j] * (1 - a) * (1 - b)
        + values[i + 1, j] * a * (1 - b)
        + values[i, j + 1] * (1 - a) * b
        + values[i + 1, j + 1] * a * b
    )


def solve(spec: BayesTargetSpec, multiplier: float) -> dict[int, np.ndarray]:
    """Backward induction; returns, per n in [2, horizon), the stop margin g - continue on the
    (d, log sd) grid: the Bayes rule stops at n when the margin is >= 0."""
    s = np.exp(spec.log_scale_nodes)
    lam = multiplier * price(s, spec.target, spec.alpha)[0]
    weights = _posterior(spec, spec.horizon)
    value = _stop_value(spec, spec.horizon, weights)
    d = spec.d_grid[:, None, None, None]
    var = np.exp(2.0 * spec.log_sd_grid)[None, :, None, None]
    margins: dict[int, np.ndarray] = {}
    for n in range(spec.horizon - 1, 1, -1):
        weights = _posterior(spec, n)
        y = (_NEXT_Y[None, :] * s[:, None] * np.sqrt(1.0 + 1.0 / n))[None, None]  # next - mean
        d_next = np.maximum(d, y) - y / (n + 1)
        log_sd_next = 0.5 * np.log(((n - 1) * var + y * y * n / (n + 1)) / n)
        d_next, log_sd_next = np.broadcast_arrays(d_next, log_sd_next)
        ahead = _bilinear(value, spec, d_next, log_sd_next) @ _NEXT_W  # (d, log sd, s)
        cont = np.einsum("ijk,jk->ij", ahead, weights) - (weights @ lam)[None, :]
        stop = _stop_value(spec, n, weights)
        margins[n] = stop - cont
        value = np.maximum(stop, cont)
    return margins


def fixed_curve(scale: float, budget: int, alpha: float = 0.99) -> np.ndarray:
    """E[AR(max of N normal rewards)] for N = 1..budget, by quadrature over the maximum."""
    cdf = norm.cdf(_Z)
    ar = _acceptance_array(scale * (_Z - norm.ppf(alpha)))
    powers = cdf[None, :] ** np.arange(1, budget + 1)[:, None]
    density = np.diff(powers, axis=1, prepend=0.0)
    return density @ ar


@dataclass(frozen=True)
class PromptResult:
    scale: float
    acceptance: float
    samples: float
    matched_fixed_n: float
    save: float


def evaluate(
    spec: BayesTargetSpec,
    margins: dict[int, np.ndarray],
    *,
    prompts: int = 150,
    streams: int = 300,
    seed: int = 5,
    fixed_budget: int = 2000,
) -> list[PromptResult]:
    """Replay the rule on ``prompts`` simulated prompts (scale from the prior; the location
    does not matter to a location-equivariant rule), ``streams`` streams each; N* is read on
    Best-of-N for N up to ``fixed_budget``."""
    rng = np.random.default_rng(seed)
    out = []
    n = np.arange(1, spec.horizon + 1)
    for scale in np.exp(rng.normal(0.0, spec.spread, prompts)):
        x = scale * rng.standard_normal((streams, spec.horizon))
        mean = np.cumsum(x, axis=1) / n
        var = (np.cumsum(x * x, axis=1) - n * mean**2) / np.maximum(n - 1, 1)
        log_sd = 0.5 * np.log(np.maximum(var, 1e-24))
        best = np.maximum.accumulate(x, axis=1)
        stop = np.full(streams, spec.horizon - 1)
        alive = np.ones(streams, dtype=bool)
        for k in range(spec.min_samples, spec.horizon):
            margin = _bilinear(margins[k], spec, best[:, k - 1] - mean[:, k - 1], log_sd[:, k - 1])
            hit = alive & (margin >= 0.0)
            stop[hit] = k - 1
            alive &= ~hit
            if not alive.any():
                break
        kept = best[np.arange(streams), stop]
        acceptance = float(_acceptance_array(kept - scale * spec.z_alpha).mean())
        samples = float(stop.mean() + 1)
        matched, _ = matched_fixed_n(fixed_curve(scale, fixed_budget, spec.alpha), acceptance)
        out.append(PromptResult(scale, acceptance, samples, matched, (matched - samples) / matched))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spread", type=float, default=0.4, help="sd of log scale over prompts")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--multipliers", default="1.0,1.6", help="comma-separated C values")
    parser.add_argument("--min-samples", type=int, default=8)
    parser.add_argument("--horizon", type=int, default=160)
    parser.add_argument("--prompts", type=int, default=150)
    parser.add_argument("--streams", type=int, default=300)
    args = parser.parse_args(argv)
    spec = BayesTargetSpec(args.target, args.spread, args.min_samples, args.horizon)
    print("| spread | target | C | achieved (median) | samples (median) | save (median) |")
    print("| --- | --- | --- | --- | --- | --- |")
    rows = []
    for c in (float(v) for v in args.multipliers.split(",")):
        res = evaluate(spec, solve(spec, c), prompts=args.prompts, streams=args.streams)
        row = tuple(
            float(np.median([getattr(r, k) for r in res]))
            for k in ("acceptance", "samples", "save")
        )
        rows.append(row)
        print(
            f"| {args.spread:g} | {args.target:g} | {c:g} | {row[0]:.3f} | {row[1]:.1f} | "
            f"{row[2]:+.3f} |",
            flush=True,
        )
    rows.sort()
    for lo, hi in itertools.pairwise(rows):
        if lo[0] <= args.target <= hi[0] and hi[0] > lo[0]:
            w = (args.target - lo[0]) / (hi[0] - lo[0])
            print(f"save at {args.target:g}, interpolated: {lo[2] + w * (hi[2] - lo[2]):+.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

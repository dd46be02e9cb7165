"""Per-observe latency of every policy, against the paper's own fair-cap method.

``python -m stoppers.bench [--repeats R] [--sizes 10 100 1000]``

For each n a policy is brought to n - 1 observations, copied R times, and one more ``observe``
is timed on each copy (median and p99 over the copies). Rewards are N(0, 1) clipped at 0.5, so
the best stays below the fitted benchmark and the adaptive policies take their full code path
(fit, acceptance, closed-form expected excess) instead of a shortcut; costs are tiny so nothing
stops. The reference is the paper's method (Section 4.2, "Implementation Efficiency"): the same
streaming statistics, then the fair cap tau by Brent's method over a Riemann sum of ~5,000
intervals, then u(M) >= tau. Both run in this process, so their ratio is meaningful even on a
busy machine; absolute microseconds are not.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
from scipy import optimize, stats

from stoppers import adaptive_math as am
from stoppers.adaptive import AdaptiveBestOfN, TargetAcceptance
from stoppers.base import StoppingPolicy
from stoppers.beacon import Beacon, beacon_index_table
from stoppers.classic import FixedN, Patience
from stoppers.weitzman import UCBExponential, Weitzman

__all__ = ["ReferenceAdaptive", "main", "riemann_excess", "riemann_fair_cap"]

RIEMANN_INTERVALS = 5000


def riemann_excess(t: float, b: float, k: float, intervals: int = RIEMANN_INTERVALS) -> float:
    """E[(U - t)+] by a midpoint Riemann sum from u^-1(t) to the 1 - 1e-9 tail quantile."""
    if t >= 1:
        return 0.0
    lo = max(t * k / (2.0 - t), 1.0)
    hi = max(lo, 1.0 + b * math.log(1e9)) + b
    h = (hi - lo) / intervals
    x = lo + (np.arange(intervals) + 0.5) * h
    u = np.minimum(2 * x / (x + k), 1.0)
    density = np.exp(-(x - 1.0) / b) / b
    return float(np.sum((u - t) * density) * h) + (1 - t) * math.exp(-(hi - 1.0) / b)


def riemann_fair_cap(cost: float, b: float, k: float) -> float:
    """The paper's way: Brent's method on the Riemann-sum expected excess."""
    mean = riemann_excess(0.0, b, k)
    if mean <= cost:
        return mean - cost
    return optimize.brentq(lambda t: riemann_excess(t, b, k) - cost, 0.0, 1.0 - 1e-12, xtol=1e-8)


class ReferenceAdaptive(AdaptiveBestOfN):
    """AdaptiveBestOfN deciding with the paper's Riemann-sum fair cap (benchmark reference)."""

    def _decide(self, reward: float) -> str | None:
        self._stats.add(reward)
        if self._stats.n < self.min_samples:
            return None
        fit = am.fit_tail(*self._statistics(), alpha=self.alpha, delta=self.delta)
        if fit.empty:  # empty_tail="continue", as the policy under test
            return None
        tau = riemann_fair_cap(self.cost, fit.scale_ucb, fit.benchmark)
        utility = min(2.0 / (1.0 + math.exp(fit.kappa - self._best)), 1.0)
        return "threshold" if utility >= tau else None


def _policies(max_n: int) -> dict[str, Callable[[], StoppingPolicy]]:
    weitzman = Weitzman(stats.norm(), 1e-9)
    return {
        "FixedN": lambda: FixedN(max_n + 1),
        "Patience": lambda: Patience(max_n + 1),
        "Weitzman": lambda: copy.deepcopy(weitzman),
        "UCBExponential": lambda: UCBExponential(1e-9, 0.05),
        "AdaptiveBestOfN": lambda: AdaptiveBestOfN(1e-6, min_samples=5),
        "TargetAcceptance": lambda: TargetAcceptance(1.0, min_samples=5),
        "Beacon": lambda: Beacon(1e-9, max_n + 1),
        "Reference (paper, Riemann)": lambda: ReferenceAdaptive(1e-6, min_samples=5),
    }


def _rewards(rng: np.random.Generator, size: int, positive: bool = False) -> list[float]:
    if positive:  # UCBExponential models Exp rewards (its tau+ is -inf for a negative mean)
        return rng.exponential(size=size).tolist()
    return np.minimum(rng.normal(size=size), 0.5).tolist()


def time_observe(
    make: Callable[[], StoppingPolicy], n: int, repeats: int, seed: int = 0
) -> list[float]:
    """Seconds of the n-th observe, once per copy of a policy holding n - 1 observations."""
    rng = np.random.default_rng(seed)
    policy = make()
    positive = isinstance(policy, UCBExponential)
    for r in _rewards(rng, n - 1, positive):
        if policy.observe(r):
            raise RuntimeError(f"{type(policy).__name__} stopped while warming up")
    last = _rewards(rng, repeats, positive)
    copies = [copy.deepcopy(policy) for _ in range(repeats)]
    out = []
    clock = time.perf_counter
    for p, r in zip(copies, last, strict=True):
        start = clock()
        p.observe(r)
        out.append(clock() - start)
    return out


def _summary(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return statistics.median(samples) * 1e6, p99 * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stoppers.bench", description=__doc__)
    parser.add_argument("--repeats", type=int, default=300, help="timed copies per cell")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    args = parser.parse_args(argv)
    sizes = sorted(set(args.sizes) | {960})
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (timings scale with it)")
    start = time.perf_counter()
    beacon_index_table(max(sizes) + 1)
    print(f"Beacon index table for n = {max(sizes) + 1}: {time.perf_counter() - start:.1f} s")
    results: dict[str, dict[int, tuple[float, float]]] = {}
    for name, make in _policies(max(sizes)).items():
        results[name] = {}
        for n in sizes:
            # the reference is ~1000x slower: fewer copies keep the run short
            repeats = max(30, args.repeats // 10) if name.startswith("Reference") else args.repeats
            results[name][n] = _summary(time_observe(make, n, repeats, seed=n))
    header = "policy".ljust(28) + "".join(f"n={n} med/p99 µs".rjust(22) for n in sizes)
    print(header)
    for name, row in results.items():
        cells = "".join(f"{row[n][0]:10.1f} /{row[n][1]:9.1f}" for n in sizes)
        print(name.ljust(28) + cells)
    reference = results["Reference (paper, Riemann)"]
    ours = results["AdaptiveBestOfN"]
    for n in sizes:
        print(
            f"AdaptiveBestOfN at n={n}: median {ours[n][0]:.1f} µs, reference "
            f"{reference[n][0]:.0f} µs, ratio {reference[n][0] / ours[n][0]:.0f}x "
            f"({1e6 / ours[n][0]:.0f} decisions/s)"
        )
    target = ours[960][0]
    verdict = "meets" if target <= 20.0 else "MISSES"
    print(f"target: median per-observe at n=960 <= 20 µs: {target:.1f} µs ({verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

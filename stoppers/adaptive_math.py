"""The decision math of Adaptive Best-of-N (paper Algorithm "Adaptive Best-of-N Sampling via UCB
Pandora's Box", Section 4.2) and its target-acceptance variant (Section 4.3), written ONCE.

Every function here is elementwise: it takes Python floats (the per-request policies in
:mod:`stoppers.adaptive`, one call per observation) or broadcastable numpy arrays (the replay
engine, one call per step across all orderings) and returns the same kind. The two drivers
share these formulas, so they can only differ by the rounding of their streaming sums.

Each call picks its elementwise namespace once (``xp``: guarded :mod:`math` for Python numbers,
numpy for arrays; :mod:`stoppers.elementwise`) and runs the one formula in it. A policy binds its
settings once in a :class:`CostKernel` / :class:`TargetKernel` (constants such as log(1/delta)
and the percentile level precomputed, w_n memoised per n) and calls
``kernel.decide(SCALAR, ...)`` per observation; :func:`cost_decision` / :func:`target_decision`
build (and cache) the same kernels for the replay engine's array calls.

Streaming statistics (all over the n rewards r_1..r_n observed so far)
--------------------------------------------------------------------
``n``
    number of rewards observed (>= 1).
``median``
    the median of r_1..r_n in *reward* units; for even n the mean of the two middle order
    statistics (numpy's ``np.median``). The shift of the fit is theta = exp(median) (line 7).
``tail_count``
    k = #{i : r_i > median}, STRICTLY above. Ties at the median are not tail values (their excess
    e^r - theta would be 0). For even n, {r > median} is the upper half whenever the two middle
    values differ.
``tail_sum``
    sum over the same i of exp(r_i - ref): the exponentiated tail relative to a reference point.
``ref``
    any finite reward-unit number used for ``tail_sum``. Only ``ref - median`` enters the math,
    so the choice is free; the policies use the running maximum (every term <= 1, nothing can
    overflow whatever the reward scale), a replay engine may use e.g. the pool's maximum. Rewards
    more than ~700 nats apart are out of scope (the mean excess would leave float range).
``best``
    the running maximum M of the rewards.

Derived quantities, relative to theta (the BT utility depends on e^v / e^kappa only):
m = mean excess / theta = (tail_sum / k) exp(ref - median) - 1 (line 7's mu_hat over theta),
its UCB/LCB m (1 +- w_n) (line 8), kappa = median + log(1 + m_lcb L) (line 11), the utility of
the best u = AR_kappa(M), and the stop test E[(U - u)+] <= cost (line 14 without solving for
tau: E[(U - t)+] decreases in t, so u >= tau exactly when E[(U - u)+] <= c).

Choices the paper leaves open (each a keyword here, defaults as in the paper/authors' code)
-------------------------------------------------------------------------------------------
* ``percentile="shifted_exp"``: Percentile_alpha is that of the fitted shifted exponential
  itself (the authors' code: L = -log(1 - alpha)); ``"whole"`` treats the fit as the upper
  k/n of the whole reward distribution (L = log((k/n) / (1 - alpha)), floored at 0 so that
  kappa never drops below the median). "whole" gives a lower benchmark (L = 3.9 vs 4.6 at
  alpha = 0.99, k/n = 1/2).
* ``delta_schedule="fixed"``: w_n = sqrt(log(n) log(1/delta) / n) (line 8 verbatim);
  ``"anytime"`` uses delta_n = delta / (n (n + 1)) in place of delta, the union-bound schedule of
  Lemma "Anytime-valid Confidence Sequence for Exponential distribution".
* The LCB scale is floored at 0 (w_n > 1 for small n would make it negative).
* ``empty_tail="stop"``: when no reward is strictly above the median (all rewards tie, or the
  top half ties at the maximum) the fit degenerates to a point mass at theta: the best already
  equals the benchmark, acceptance is 1 and the policy stops (the authors' code reaches the same
  result through its 1e-8 scale floor). ``"continue"`` keeps sampling until the tail is
  non-empty (or the budget ends). Real judge rewards tie a lot (see the data README), so this
  matters; the default was chosen on that data (see :mod:`stoppers.adaptive`).
* ``utility="acceptance"``: u_kappa = min(2 e^v / (e^v + e^kappa), 1), the paper's Definitions
  "Acceptance Rate" and "Utility Function" (B = 1). ``"bradley_terry"`` is the uncapped
  e^v / (e^v + e^kappa) the authors' code uses; it never saturates at 1, so it keeps sampling
  longer once the best passes kappa (cost mode only; the reported acceptance is always AR).
* Nothing stops before ``min_samples`` observations (the Algorithm's t).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal, NamedTuple

import numpy as np
from scipy import optimize
from scipy.optimize import elementwise as optimize_elementwise

from stoppers import elementwise as ew
from stoppers.faircap import bt_expected_excess_normalized, excess_in

__all__ = [
    "CostKernel",
    "Decision",
    "DeltaSchedule",
    "EmptyTail",
    "Percentile",
    "TailFit",
    "TargetKernel",
    "confidence_width",
    "cost_decision",
    "cost_kernel",
    "cost_threshold",
    "fit_tail",
    "target_decision",
    "target_kernel",
    "target_threshold",
    "utility_excess",
]

Percentile = Literal["shifted_exp", "whole"]
DeltaSchedule = Literal["fixed", "anytime"]
EmptyTail = Literal["stop", "continue"]
Utility = Literal["acceptance", "bradley_terry"]


class TailFit(NamedTuple):
    """The fitted tail, relative to theta = exp(median) (elementwise)."""

    scale_ucb: Any  # b_ucb = mu_ucb / theta
    benchmark: Any  # K = exp(kappa - median) = 1 + b_lcb L (or b_ucb L in target mode)
    kappa: Any  # the estimated benchmark reward, reward units
    empty: Any  # True where no reward is strictly above the median


class Decision(NamedTuple):
    """Elementwise stop decision with the quantities the gateway reports."""

    stop: Any  # bool
    acceptance: Any  # AR_kappa(best) under the fitted benchmark
    kappa: Any


def confidence_width(n: Any, delta: float, schedule: DeltaSchedule = "fixed") -> Any:
    """w_n with mu_ucb = mu (1 + w_n), mu_lcb = mu (1 - w_n) (Algorithm line 8)."""
    _check_schedule(schedule)
    return _width(ew.namespace(n), n, -math.log(delta), schedule == "anytime")


def _width(xp: Any, n: Any, log_inv_delta: float, anytime: bool) -> Any:
    if anytime:
        log_inv_delta = log_inv_delta + xp.log(n * (n + 1.0))
    return xp.sqrt(xp.log(n * 1.0) * log_inv_delta / n)


def _check_schedule(schedule: str) -> None:
    if schedule not in ("fixed", "anytime"):
        raise ValueError(f"delta_schedule must be 'fixed' or 'anytime', got {schedule!r}")


class _TailFitter:
    """Lines 7-11 with the per-policy constants (level, log(1/delta)) computed once."""

    __slots__ = ("_anytime", "_log1p_neg_alpha", "_log_inv_delta", "_use_ucb", "_whole", "_widths")

    def __init__(
        self,
        alpha: float,
        delta: float,
        percentile: Percentile,
        delta_schedule: DeltaSchedule,
        use_ucb: bool,
    ) -> None:
        if percentile not in ("shifted_exp", "whole"):
            raise ValueError(f"percentile must be 'shifted_exp' or 'whole', got {percentile!r}")
        _check_schedule(delta_schedule)
        self._whole = percentile == "whole"
        self._log1p_neg_alpha = math.log1p(-alpha)
        self._log_inv_delta = -math.log(delta)
        self._anytime = delta_schedule == "anytime"
        self._use_ucb = use_ucb
        self._widths: dict[int, float] = {}  # w_n per integer n: exact memoisation

    def width(self, n: Any) -> Any:
        """w_n, in the namespace of ``n`` alone (it depends on nothing else)."""
        if type(n) is int:  # per-request path: one float per n, computed once per kernel
            width = self._widths.get(n)
            if width is None:
                width = _width(ew.SCALAR, n, self._log_inv_delta, self._anytime)
                if len(self._widths) < _MAX_MEMO:
                    self._widths[n] = width
            return width
        return _width(ew.namespace(n), n, self._log_inv_delta, self._anytime)

    def __call__(
        self, xp: Any, n: Any, median: Any, tail_count: Any, tail_sum: Any, ref: Any
    ) -> tuple[Any, Any, Any, Any]:
        """(b_ucb, K = e^(kappa - median), log K, empty); ``xp`` is the elementwise namespace."""
        empty = tail_count <= 0
        k = xp.maximum(tail_count, 1)
        # log of the tail mean of exp(r) over theta; >= 0 in exact arithmetic.
        a = xp.log(xp.maximum(tail_sum, 1e-300) / k) + (ref - median)
        m = xp.where(empty, 0.0, xp.expm1(xp.maximum(a, 0.0)))
        width = self.width(n)
        b_ucb = m * (1.0 + width)
        if self._whole:
            level = xp.maximum(xp.log(k / n) - self._log1p_neg_alpha, 0.0)
        else:
            level = -self._log1p_neg_alpha
        bound = b_ucb if self._use_ucb else m * xp.maximum(1.0 - width, 0.0)
        log_k = xp.log1p(bound * level)
        return b_ucb, xp.exp(log_k), log_k, empty


_MAX_MEMO = 1 << 16


def fit_tail(
    n: Any,
    median: Any,
    tail_count: Any,
    tail_sum: Any,
    ref: Any,
    *,
    alpha: float,
    delta: float,
    percentile: Percentile = "shifted_exp",
    delta_schedule: DeltaSchedule = "fixed",
    benchmark_bound: Literal["lcb", "ucb"] = "lcb",
) -> TailFit:
    """Lines 7-11: shifted-exponential tail fit, UCB/LCB on its scale, and kappa.

    ``benchmark_bound`` picks which scale bound sets kappa: the LCB in cost mode (line 11), the
    UCB in target mode (the paper's footnote to Section 4.3).
    """
    fitter = _fitter(alpha, delta, percentile, delta_schedule, benchmark_bound == "ucb")
    xp = ew.namespace(n, median, tail_count, tail_sum, ref)
    with xp.quiet():
        b_ucb, benchmark, log_k, empty = fitter(xp, n, median, tail_count, tail_sum, ref)
        return TailFit(scale_ucb=b_ucb, benchmark=benchmark, kappa=median + log_k, empty=empty)


@functools.lru_cache(maxsize=256, typed=True)
def _fitter(
    alpha: float, delta: float, percentile: str, delta_schedule: str, use_ucb: bool
) -> _TailFitter:
    return _TailFitter(alpha, delta, percentile, delta_schedule, use_ucb)


class _Kernel:
    """What the two modes share: the bound tail fitter, min_samples, the empty-tail rule, the
    float/array dispatch and identity copies (immutable apart from an exact memo of w_n)."""

    __slots__ = ("_continue_on_empty", "_fit", "_min_samples")

    def __init__(
        self,
        *,
        alpha: float,
        delta: float,
        min_samples: int,
        percentile: Percentile,
        delta_schedule: DeltaSchedule,
        empty_tail: EmptyTail,
        use_ucb: bool,
    ) -> None:
        self._fit = _fitter(alpha, delta, percentile, delta_schedule, use_ucb)
        self._min_samples = min_samples
        self._continue_on_empty = empty_tail == "continue"

    def __call__(
        self, n: Any, median: Any, tail_count: Any, tail_sum: Any, ref: Any, best: Any
    ) -> Decision:
        xp = ew.namespace(n, median, tail_count, tail_sum, ref, best)
        with xp.quiet():
            return self.decide(xp, n, median, tail_count, tail_sum, ref, best)

    def decide(
        self, xp: Any, n: Any, median: Any, tail_count: Any, tail_sum: Any, ref: Any, best: Any
    ) -> Decision:
        raise NotImplementedError

    def _stop(self, xp: Any, n: Any, passed: Any, empty: Any) -> Any:
        """Nothing stops before min_samples (the Algorithm's t), nor on an empty tail when
        ``empty_tail="continue"``."""
        stop = (n >= self._min_samples) & passed
        return xp.where(empty, False, stop) if self._continue_on_empty else stop

    def __copy__(self) -> _Kernel:
        return self

    def __deepcopy__(self, memo: dict) -> _Kernel:
        return self


class CostKernel(_Kernel):
    """:func:`cost_decision` with its keywords bound once: what a policy object holds.

    ``kernel(n, median, tail_count, tail_sum, ref, best)`` runs the same code as
    :func:`cost_decision` (which builds, caches and calls one of these), on floats or arrays;
    :meth:`decide` takes the namespace directly when the caller knows its inputs are scalars.
    """

    __slots__ = ("_use_acceptance", "cost")

    def __init__(
        self,
        *,
        cost: float,
        alpha: float,
        delta: float,
        min_samples: int,
        percentile: Percentile = "shifted_exp",
        delta_schedule: DeltaSchedule = "fixed",
        empty_tail: EmptyTail = "stop",
        utility: Utility = "acceptance",
    ) -> None:
        super().__init__(
            alpha=alpha,
            delta=delta,
            min_samples=min_samples,
            percentile=percentile,
            delta_schedule=delta_schedule,
            empty_tail=empty_tail,
            use_ucb=False,
        )
        self.cost = cost
        self._use_acceptance = utility == "acceptance"

    def decide(
        self, xp: Any, n: Any, median: Any, tail_count: Any, tail_sum: Any, ref: Any, best: Any
    ) -> Decision:
        """Cost mode in namespace ``xp`` (:data:`~stoppers.elementwise.SCALAR` for floats; the
        array namespace needs the caller to silence numpy's floating-point warnings)."""
        b_ucb, benchmark, log_k, empty = self._fit(xp, n, median, tail_count, tail_sum, ref)
        # Bradley-Terry P(best beats kappa)
        preference = 1.0 / (1.0 + xp.exp((median - best) + log_k))
        acceptance = xp.minimum(2.0 * preference, 1.0)
        if self._use_acceptance:
            excess = excess_in(xp, acceptance, b_ucb, benchmark)
        else:
            excess = 0.5 * excess_in(xp, 2.0 * preference, b_ucb, benchmark, False)
        return Decision(self._stop(xp, n, excess <= self.cost, empty), acceptance, median + log_k)


class TargetKernel(_Kernel):
    """:func:`target_decision` with its keywords bound once (see :class:`CostKernel`)."""

    __slots__ = ("target",)

    def __init__(
        self,
        *,
        target: float,
        alpha: float,
        delta: float,
        min_samples: int,
        percentile: Percentile = "shifted_exp",
        delta_schedule: DeltaSchedule = "fixed",
        empty_tail: EmptyTail = "stop",
    ) -> None:
        super().__init__(
            alpha=alpha,
            delta=delta,
            min_samples=min_samples,
            percentile=percentile,
            delta_schedule=delta_schedule,
            empty_tail=empty_tail,
            use_ucb=True,
        )
        self.target = target

    def decide(
        self, xp: Any, n: Any, median: Any, tail_count: Any, tail_sum: Any, ref: Any, best: Any
    ) -> Decision:
        """Target mode in namespace ``xp`` (see :meth:`CostKernel.decide`)."""
        _, _, log_k, empty = self._fit(xp, n, median, tail_count, tail_sum, ref)
        acceptance = xp.minimum(2.0 / (1.0 + xp.exp((median - best) + log_k)), 1.0)
        stop = self._stop(xp, n, acceptance >= self.target, empty)
        return Decision(stop, acceptance, median + log_k)


@functools.lru_cache(maxsize=256, typed=True)
def cost_kernel(**settings: Any) -> CostKernel:
    """A shared, cached :class:`CostKernel` for these keyword settings."""
    return CostKernel(**settings)


@functools.lru_cache(maxsize=256, typed=True)
def target_kernel(**settings: Any) -> TargetKernel:
    """A shared, cached :class:`TargetKernel` for these keyword settings."""
    return TargetKernel(**settings)


def cost_decision(
    n: Any,
    median: Any,
    tail_count: Any,
    tail_sum: Any,
    ref: Any,
    best: Any,
    *,
    cost: float,
    alpha: float,
    delta: float,
    min_samples: int,
    percentile: Percentile = "shifted_exp",
    delta_schedule: DeltaSchedule = "fixed",
    empty_tail: EmptyTail = "stop",
    utility: Utility = "acceptance",
) -> Decision:
    """Cost mode (Algorithm lines 7-16): stop iff n >= min_samples and u_kappa(M) >= tau,
    evaluated as E[(U - u_kappa(M))+] <= cost (no root finding)."""
    kernel = cost_kernel(
        cost=cost, alpha=alpha, delta=delta, min_samples=min_samples, percentile=percentile,
        delta_schedule=delta_schedule, empty_tail=empty_tail, utility=utility,
    )  # fmt: skip
    return kernel(n, median, tail_count, tail_sum, ref, best)


def target_decision(
    n: Any,
    median: Any,
    tail_count: Any,
    tail_sum: Any,
    ref: Any,
    best: Any,
    *,
    target: float,
    alpha: float,
    delta: float,
    min_samples: int,
    percentile: Percentile = "shifted_exp",
    delta_schedule: DeltaSchedule = "fixed",
    empty_tail: EmptyTail = "stop",
) -> Decision:
    """Target mode (Section 4.3): stop iff n >= min_samples and AR_kappa(M) >= target, with
    kappa from the UCB scale (the paper's footnote: the LCB over-states acceptance)."""
    kernel = target_kernel(
        target=target, alpha=alpha, delta=delta, min_samples=min_samples, percentile=percentile,
        delta_schedule=delta_schedule, empty_tail=empty_tail,
    )  # fmt: skip
    return kernel(n, median, tail_count, tail_sum, ref, best)


def _reward_for_utility(tau: Any, benchmark: Any, median: Any, utility: Utility) -> Any:
    """The reward v with u(v) = tau: e^v = tau K / (2 - tau) for the acceptance utility,
    tau K / (1 - tau) for the Bradley–Terry one (theta units); -inf when tau <= 0."""
    with ew.quiet(tau, benchmark, median):
        positive = tau > 0.0
        safe = ew.minimum(ew.where(positive, tau, 0.5), 1.0)
        top = 2.0 if utility == "acceptance" else 1.0
        v = median + ew.log(safe * benchmark / ew.maximum(top - safe, 1e-300))
        return ew.where(positive, v, -math.inf)


def utility_excess(t: Any, b: Any, k: Any, utility: Utility = "acceptance") -> Any:
    """E[(U - t)+] for the fitted utility distribution (theta-normalised, see faircap)."""
    if utility == "acceptance":
        return bt_expected_excess_normalized(t, b, k)
    return 0.5 * bt_expected_excess_normalized(2.0 * t, b, k, False)


def cost_threshold(
    n: Any,
    median: Any,
    tail_count: Any,
    tail_sum: Any,
    ref: Any,
    *,
    cost: float,
    alpha: float,
    delta: float,
    percentile: Percentile = "shifted_exp",
    delta_schedule: DeltaSchedule = "fixed",
    utility: Utility = "acceptance",
) -> tuple[Any, Any]:
    """(tau, reward threshold): the fair cap of the fitted utility distribution (line 13) and
    the reward the best must reach, u_kappa^-1(tau) (-inf when tau <= 0: stop at once).

    Root-finds, so it is for reporting only: the decision uses :func:`cost_decision`.
    """
    fit = fit_tail(
        n, median, tail_count, tail_sum, ref,
        alpha=alpha, delta=delta, percentile=percentile, delta_schedule=delta_schedule,
    )  # fmt: skip
    tau = _fair_cap_elementwise(cost, fit.scale_ucb, fit.benchmark, utility)
    return tau, _reward_for_utility(tau, fit.benchmark, median, utility)


def target_threshold(
    n: Any,
    median: Any,
    tail_count: Any,
    tail_sum: Any,
    ref: Any,
    *,
    target: float,
    alpha: float,
    delta: float,
    percentile: Percentile = "shifted_exp",
    delta_schedule: DeltaSchedule = "fixed",
) -> Any:
    """The reward the best must reach in target mode: kappa + log(target / (2 - target))."""
    fit = fit_tail(
        n, median, tail_count, tail_sum, ref,
        alpha=alpha, delta=delta, percentile=percentile, delta_schedule=delta_schedule,
        benchmark_bound="ucb",
    )  # fmt: skip
    return _reward_for_utility(target, fit.benchmark, median, "acceptance")


def _fair_cap_elementwise(cost: float, b: Any, k: Any, utility: Utility) -> Any:
    """tau solving E[(U - tau)+] = cost, elementwise (closed-form branch where tau <= 0)."""
    mean_utility = utility_excess(0.0, b, k, utility)
    if not isinstance(mean_utility, np.ndarray) or mean_utility.ndim == 0:
        mean_utility = float(mean_utility)
        if mean_utility <= cost:
            return mean_utility - cost
        b_f, k_f = float(b), float(k)
        return optimize.brentq(
            lambda t: float(utility_excess(t, b_f, k_f, utility)) - cost,
            0.0,
            1.0,
            xtol=1e-300,
            rtol=4 * np.finfo(float).eps,
            maxiter=400,
        )
    b_arr, k_arr, mu = np.broadcast_arrays(np.asarray(b, float), np.asarray(k, float), mean_utility)
    with np.errstate(all="ignore"):
        res = optimize_elementwise.find_root(
            lambda t, bb, kk: utility_excess(t, bb, kk, utility) - cost,
            (np.zeros_like(mu), np.ones_like(mu)),
            args=(b_arr, k_arr),
            tolerances={"xatol": 1e-300, "xrtol": 4 * np.finfo(float).eps},
        )
    return np.where(mu <= cost, mu - cost, res.x)

"""Elementwise math that runs unchanged on Python floats and on numpy arrays.

The adaptive stopping rule is written once (``stoppers.adaptive_math``) and driven two ways: one
request at a time by the policy objects (Python floats, a few microseconds per observation) and
across thousands of orderings at once by the replay engine (numpy arrays). numpy ufuncs cost
~0.3-3 µs *each* on scalars, which would blow the per-observation budget, so every operation the
formulas need is routed here: Python floats go to :mod:`math` (guarded so that overflow gives
``inf`` and log(0) gives ``-inf`` exactly as numpy does, instead of raising), anything involving
an ``ndarray`` goes to numpy. Because the *formulas* are shared, the two drivers cannot drift
apart; the only possible difference is libm vs numpy's last-ulp rounding of exp/log.

Two ways to use them. Hot formulas pick a namespace ONCE per call, array-API style:
``xp = namespace(*inputs)`` gives :data:`SCALAR` (the guarded :mod:`math` functions, no type tests)
or :data:`ARRAY` (numpy's ufuncs), and the formula calls ``xp.exp``, ``xp.log``, ... The
module-level helpers (:func:`exp`, :func:`log`, ...) dispatch per operation instead; they compute
exactly what the two namespaces compute and remain for one-off callers.

Rules for code using these helpers: no Python ``if`` on values (use ``where``, which
evaluates both branches), and no division that can hit zero (floor denominators first).
"""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
from scipy import special
from scipy.special import cython_special

__all__ = [
    "ARRAY",
    "SCALAR",
    "exp",
    "exp1_scaled",
    "expm1",
    "expn2_scaled",
    "log",
    "log1p",
    "maximum",
    "minimum",
    "namespace",
    "quiet",
    "scaled_exp_integrals",
    "sqrt",
    "where",
]

_EXP_OVERFLOW = 709.782712893384  # log(max float64)
# exp(q) E_n(q) for q above this comes from the asymptotic series (A&S 5.1.51): with 20 terms
# the first omitted term is < 4e-17 relative at q = 64. Below it, exp(q) E_1(q) comes from
# scipy and exp(q) E_2(q) = 1 - q exp(q) E_1(q) (A&S 5.1.14), whose cancellation costs at most
# a factor q <= 64 in relative error (< 1.5e-14).
_SERIES_FROM = 64.0
_SERIES_TERMS = 20


def exp(x: Any) -> Any:
    if type(x) is float:  # the per-request fast path
        return math.exp(x) if x < _EXP_OVERFLOW else math.inf
    if isinstance(x, np.ndarray):
        return np.exp(x)
    return math.exp(x) if x < _EXP_OVERFLOW else math.inf


def expm1(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np.expm1(x)
    return math.expm1(x) if x < _EXP_OVERFLOW else math.inf


def log(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np.log(x)
    if x > 0:
        return math.log(x)
    return -math.inf if x == 0 else math.nan


def log1p(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np.log1p(x)
    if x > -1:
        return math.log1p(x)
    return -math.inf if x == -1 else math.nan


def sqrt(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np.sqrt(x)
    return math.sqrt(x) if x >= 0 else math.nan


def minimum(a: Any, b: Any) -> Any:
    if type(a) is float and type(b) is float:
        return a if a < b else b
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return a if a < b else b


def maximum(a: Any, b: Any) -> Any:
    if type(a) is float and type(b) is float:
        return a if a > b else b
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a > b else b


def where(cond: Any, a: Any, b: Any) -> Any:
    if isinstance(cond, np.ndarray) or isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.where(cond, a, b)
    return a if cond else b


# The ufunc's own kernel (xsf exp1) as a plain Python-float function: the ``double``
# specialisation of cython_special's fused exp1 skips ufunc dispatch and 0-d array round trips
# (~0.1-0.2 µs a call; identical values to special.exp1, checked on 4e5 points in [1e-12, 64]).
_exp1_float = cython_special.exp1["double"]
_COEF_E1 = [math.factorial(k) for k in range(_SERIES_TERMS)]  # (1)_k = k!
_COEF_E2 = [math.factorial(k + 1) for k in range(_SERIES_TERMS)]  # (2)_k = (k + 1)!


def _series(q: Any, coef: list[int]) -> Any:
    """exp(q) E_n(q) ~ (1/q) sum_k (-1)^k (n)_k q^-k, Horner in 1/q."""
    inv = 1.0 / q
    acc = 0.0
    for c in reversed(coef):
        acc = c - inv * acc
    return inv * acc


def scaled_exp_integrals(q: Any) -> tuple[Any, Any]:
    """(exp(q) E_1(q), exp(q) E_2(q)) for q > 0, finite for every q.

    scipy has no exponentially scaled E_1; E_1 alone underflows past q ~ 700 and the products
    below would lose everything. One scipy call serves both values.
    """
    if isinstance(q, np.ndarray):
        return _scaled_exp_integrals_array(q)
    return _scaled_exp_integrals_scalar(q)


def _scaled_exp_integrals_array(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    small = np.minimum(q, _SERIES_FROM)
    g_small = np.exp(small) * special.exp1(small)
    big = np.maximum(q, _SERIES_FROM)
    near = q <= _SERIES_FROM
    g = np.where(near, g_small, _series(big, _COEF_E1))
    h = np.where(near, 1.0 - small * g_small, _series(big, _COEF_E2))
    return g, h


def _scaled_exp_integrals_scalar(q: float) -> tuple[float, float]:
    if q <= _SERIES_FROM:
        g = math.exp(q) * _exp1_float(q)
        return g, 1.0 - q * g
    return _series(q, _COEF_E1), _series(q, _COEF_E2)


def exp1_scaled(q: Any) -> Any:
    """exp(q) * E_1(q) for q > 0."""
    return scaled_exp_integrals(q)[0]


def expn2_scaled(q: Any) -> Any:
    """exp(q) * E_2(q) for q > 0."""
    return scaled_exp_integrals(q)[1]


_NULL = contextlib.nullcontext()


def quiet(*values: Any) -> Any:
    """Silence numpy floating-point warnings for array inputs (a no-op context for floats).

    The shared formulas evaluate both branches of every :func:`where`, so the discarded branch
    may divide by zero or overflow on some elements; that is expected, not an error.
    """
    for x in values:
        if isinstance(x, np.ndarray):
            return np.errstate(all="ignore")
    return _NULL


# -- namespaces: dispatch once per formula call -------------------------------------------------
# The scalar functions are exactly the float branches of the helpers above (overflow -> inf,
# log(0) -> -inf, log of a negative -> nan, as numpy), so a formula gives bit-identical results
# whichever way it is dispatched.


def _exp_scalar(x: Any) -> Any:
    return math.exp(x) if x < _EXP_OVERFLOW else math.inf


def _expm1_scalar(x: Any) -> Any:
    return math.expm1(x) if x < _EXP_OVERFLOW else math.inf


def _log_scalar(x: Any) -> Any:
    if x > 0:
        return math.log(x)
    return -math.inf if x == 0 else math.nan


def _log1p_scalar(x: Any) -> Any:
    if x > -1:
        return math.log1p(x)
    return -math.inf if x == -1 else math.nan


def _sqrt_scalar(x: Any) -> Any:
    return math.sqrt(x) if x >= 0 else math.nan


def _minimum_scalar(a: Any, b: Any) -> Any:
    return a if a < b else b


def _maximum_scalar(a: Any, b: Any) -> Any:
    return a if a > b else b


def _where_scalar(cond: Any, a: Any, b: Any) -> Any:
    return a if cond else b


def _quiet_array() -> Any:
    return np.errstate(all="ignore")


#: Python numbers: guarded :mod:`math` (the per-request policies).
SCALAR = SimpleNamespace(
    is_array=False,
    exp=_exp_scalar,
    expm1=_expm1_scalar,
    log=_log_scalar,
    log1p=_log1p_scalar,
    sqrt=_sqrt_scalar,
    minimum=_minimum_scalar,
    maximum=_maximum_scalar,
    where=_where_scalar,
    scaled_exp_integrals=_scaled_exp_integrals_scalar,
    quiet=lambda: _NULL,
)
#: numpy arrays (the replay engine): the ufuncs themselves.
ARRAY = SimpleNamespace(
    is_array=True,
    exp=np.exp,
    expm1=np.expm1,
    log=np.log,
    log1p=np.log1p,
    sqrt=np.sqrt,
    minimum=np.minimum,
    maximum=np.maximum,
    where=np.where,
    scaled_exp_integrals=_scaled_exp_integrals_array,
    quiet=_quiet_array,
)


def namespace(*values: Any) -> SimpleNamespace:
    """:data:`ARRAY` if any value is an ``ndarray``, else :data:`SCALAR`."""
    for x in values:
        if isinstance(x, np.ndarray):
            return ARRAY
    return SCALAR

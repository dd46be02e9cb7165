"""A peaks-over-threshold tail fit for the rewards one request has seen so far.

Why: the paper's adaptive rule (Section 4.2) models ``exp(reward)`` above the median as a shifted
exponential. That is one tail shape among many; on heavy-tailed, bounded, clipped or bimodal
rewards it misplaces the benchmark quantile kappa and the fair cap. Extreme-value theory
(Pickands-Balkema-de Haan) says that exceedances over a high threshold of *any* reasonable
distribution are close to a generalised Pareto distribution GPD(sigma, xi): ``xi > 0`` heavy
(Student-t: xi = 1/df), ``xi = 0`` exponential-like (normal, Gumbel), ``xi < 0`` bounded
(clipped scores). So we fit a GPD to the top ``k`` *raw* rewards and keep the empirical
distribution below it:

    P(V > v) = p_u * S_gpd(v - u; sigma, xi)   for v >= u,   p_u = k / n

where ``u`` is the (k+1)-th largest reward. Everything the stopping rules need - the benchmark
quantile kappa = Percentile_alpha (Definition "Benchmark Reward"), the expected acceptance of the
reward we would stop with, the expected gain of one more sample - is a one-dimensional integral
over the GPD's quantile function, computed by fixed Gauss-Legendre quadrature (no root finding
on the hot path).

The shape xi is estimated by Zhang & Stephens (2009, Technometrics 51:316) - a quasi-Bayesian
estimator that stays sane down to a handful of exceedances - and then shrunk towards a prior
shape ``xi0`` with weight ``prior_weight`` pseudo-exceedances; the prior can be learned across
the prompts of one deployment, as one pooled xi0 (:class:`stoppers.robust.prior.TailPrior`) or
as a distribution of xi whose posterior (mean plus one sd) replaces the shrinkage
(:class:`stoppers.robust.xi_prior.XiPrior`, what the default cost policy's cold start learns).

All quantities are computed relative to ``u`` (exceedances ``v - u``), so adding a constant to
every reward changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

__all__ = [
    "BOUNDED_OFFSETS",
    "OPEN_OFFSETS",
    "TailFit",
    "TailPosterior",
    "choose_tail_size",
    "dequantize",
    "fit_cell",
    "fit_tail",
    "lattice_step",
    "log_sigma_sds",
    "posterior_sigma",
    "posterior_sigmas",
    "shape_weight",
    "sigma_log_likelihood",
    "zhang_stephens_gpd",
]

# Gauss-Legendre nodes and weights on (0, 1) for integrals over a survival probability.
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(24)
_GL_S = 0.5 * (_GL_NODES + 1.0)
_GL_W = 0.5 * _GL_WEIGHTS

_XI_MIN, _XI_MAX = -1.0, 0.9
_MIN_SHAPE_VARIANCE = 0.25  # (1 + xi)^2 at xi = -1/2: see shape_weight


def choose_tail_size(n: int) -> int:
    """How many of the top rewards feed the tail fit after ``n`` observations.

    The top half while n is small (the paper's "above the median", Algorithm line 7), then a
    slowly growing share (10 + n/10) so that the fit describes the upper tail, not the body:
    n=8 -> 4, n=30 -> 13, n=100 -> 20, n=960 -> 106.
    """
    return max(1, min(n // 2, 10 + n // 10))


def tail_exceedances(sorted_values: np.ndarray, k: int | None = None) -> tuple[float, np.ndarray]:
    """(u, y): the threshold - the (k+1)-th largest value, k = ``choose_tail_size(n)`` unless
    given - and the exceedances y = v - u > 0 of the top k, ascending. ``sorted_values``:
    ascending, at least k + 1 of them."""
    n = sorted_values.size
    k = choose_tail_size(n) if k is None else k
    u = float(sorted_values[n - k - 1])
    top = sorted_values[n - k :]
    return u, top[top > u] - u


def zhang_stephens_gpd(exceedances: np.ndarray) -> tuple[float, float]:
    """Zhang & Stephens (2009) estimate of GPD (sigma, xi) from sorted positive exceedances.

    Profile likelihood over theta = -xi / sigma on a data-driven grid of ``20 + sqrt(k)`` points,
    averaged with likelihood weights (their equations 5-7). ``exceedances`` must be sorted
    ascending, positive, with at least two values.
    """
    top = float(exceedances[-1])
    y = exceedances / top  # the shape is scale-free; unit scale keeps the grid finite
    k = y.size
    m = 20 + int(math.sqrt(k))
    j = np.arange(1, m + 1, dtype=float)
    quartile = max(float(y[max(0, int(k / 4.0 + 0.5) - 1)]), 1e-12)
    theta = 1.0 + (1.0 - np.sqrt(m / (j - 0.5))) / (3.0 * quartile)
    with np.errstate(all="ignore"):
        # For a given theta the likelihood-maximising shape is xi(theta) = mean(log(1 - theta y));
        # profile log-likelihood per grid point (their equation 6, with xi = -k).
        xi_grid = np.log1p(-theta[:, None] * y[None, :]).mean(axis=1)
        loglik = k * (np.log(-theta / xi_grid) - xi_grid - 1.0)
        loglik = np.where(np.isfinite(loglik), loglik, -np.inf)
        if not np.isfinite(loglik).any():
            return float(exceedances.mean()), 0.0
        weights = np.exp(loglik - loglik.max())
        weights /= weights.sum()
        theta_hat = float(np.dot(weights, theta))
        xi = float(np.log1p(-theta_hat * y).mean())
    if theta_hat == 0.0 or not math.isfinite(xi):
        return float(exceedances.mean()), 0.0
    sigma = -xi / theta_hat * top
    if not (sigma > 0.0 and math.isfinite(sigma)):
        return float(exceedances.mean()), 0.0
    return sigma, xi


@dataclass(frozen=True)
class TailFit:
    """Empirical body + GPD tail above ``u`` (see the module docstring).

    ``p_u`` is the probability of exceeding ``u``; exceedance ``y = v - u`` has survival
    ``(1 + xi y / sigma) ** (-1 / xi)``.
    """

    u: float
    p_u: float
    sigma: float
    xi: float
    k: int
    # The share of the policies' confidence margins this tail warrants (1: all of them): less
    # where a deployment's learned shapes say it is bounded (XiPrior.tail_posterior).
    margin_share: float = 1.0
    # The deployment's posterior over this tail's shape and scale, (weight, xi, sigma) per node;
    # empty without a learned XiPrior (TailPosterior.shapes).
    shapes: tuple[tuple[float, float, float], ...] = ()

    def shape_fits(self) -> list[tuple[float, TailFit]]:
        """(weight, this fit with that shape) for each of :attr:`shapes`."""
        return [(w, replace(self, xi=xi, sigma=sigma, shapes=())) for w, xi, sigma in self.shapes]

    # -- the GPD pieces, all relative to u --------------------------------------------------
    def _excess_quantile(self, survival: float, sigma: float | None = None) -> float:
        """Exceedance y with S_gpd(y) = survival (0 < survival <= 1)."""
        s = self.sigma if sigma is None else sigma
        e = -math.log(survival)
        if abs(self.xi) < 1e-9:
            return s * e
        return s * math.expm1(self.xi * e) / self.xi

    def excess_survival(self, y: float) -> float:
        """S_gpd(y) for y >= 0: the probability that a tail draw exceeds u + y."""
        if y <= 0.0:
            return 1.0
        z = self.xi * y / self.sigma
        if abs(self.xi) < 1e-9:
            return math.exp(-y / self.sigma)
        if z <= -1.0:
            return 0.0
        return math.exp(-math.log1p(z) / self.xi)

    def kappa_offset(self, alpha: float) -> float:
        """kappa - u: the alpha-percentile of the fitted distribution, relative to u.

        When ``p_u <= 1 - alpha`` the percentile lies in the empirical body; we then return 0
        (kappa = u), the smallest value the tail model can vouch for.
        """
        tail = 1.0 - alpha
        if self.p_u <= tail:
            return 0.0
        return self._excess_quantile(tail / self.p_u)

    def endpoint_offset(self) -> float:
        """Upper end of the support relative to u (inf unless xi < 0)."""
        return -self.sigma / self.xi if self.xi < 0.0 else math.inf

    # -- the two expectations the stopping rules need ----------------------------------------
    def conditional_acceptance(self, m_offset: float, kappa_offset: float) -> float:
        """E[AR_kappa(V) | V > u + m_offset] (Definition "Acceptance Rate").

        This is the mean acceptance of a first-crossing rule with threshold u + m_offset: the
        reward it returns is distributed as V conditioned on exceeding the threshold. Above the
        threshold V - u is again GPD with scale sigma + xi m_offset; we integrate over its
        probability level s in (0, 1), split where V reaches kappa (AR is exactly 1 beyond), so
        24-point Gauss-Legendre sees a smooth integrand.
        """
        sigma_m = self.sigma + self.xi * m_offset
        if sigma_m <= 0.0 or m_offset >= kappa_offset:
            return acceptance(m_offset - kappa_offset)
        # Probability level where the conditional tail reaches kappa.
        to_kappa = kappa_offset - m_offset
        z = self.xi * to_kappa / sigma_m
        if abs(self.xi) < 1e-9:
            log_surv = -to_kappa / sigma_m
        elif z <= -1.0:
            log_surv = -math.inf  # kappa beyond the bounded tail's end: AR < 1 everywhere
        else:
            log_surv = -math.log1p(z) / self.xi
        s_kappa = -math.expm1(log_surv)  # P(V <= kappa | V > m)
        e = -np.log1p(-s_kappa * _GL_S)  # exponential quantiles of the scaled nodes
        if abs(self.xi) < 1e-9:
            nodes = m_offset + sigma_m * e
        else:
            nodes = m_offset + sigma_m * np.expm1(self.xi * e) / self.xi
        below = s_kappa * float(np.dot(_GL_W, _acceptance_array(nodes - kappa_offset)))
        return below + (1.0 - s_kappa)

    def expected_gain(self, m_offset: float, kappa_offset: float) -> float:
        """E[(u_kappa(V) - u_kappa(M))+] for M = u + m_offset: one more sample's expected gain.

        Weitzman's test (Definition "Fair-cap value"): stopping at M is right exactly when this
        is <= c, since the left side decreases in M.
        """
        m_offset = max(m_offset, 0.0)
        base = acceptance(m_offset - kappa_offset)
        if base >= 1.0:
            return 0.0
        p_above = self.p_u * self.excess_survival(m_offset)
        if p_above <= 0.0:
            return 0.0
        gain = self.conditional_acceptance(m_offset, kappa_offset) - base
        return p_above * max(gain, 0.0)


# The sigma grids of a GPD likelihood with sigma integrated out (posterior_sigma, and the
# deployment's xi prior), in units of the mean exceedance. An open tail's spans e^-2.5 .. e^1.5
# of it. A bounded tail's sigma must exceed -xi y_max (its end lies past every exceedance), and
# its likelihood peaks just past that edge - at xi = -1 (uniform) it is sigma^-k there - so its
# grid is sigma = -xi y_max + mean(y) e^t, dense near the edge.
OPEN_OFFSETS = np.linspace(-2.5, 1.5, 45)
BOUNDED_OFFSETS = np.linspace(-9.0, 2.5, 45)


def sigma_log_likelihood(y: np.ndarray, xi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log sigma, log-likelihood), both (xi.size, 45), of positive exceedances ``y`` under
    GPD(sigma, xi) at each xi on its sigma grid (:data:`OPEN_OFFSETS`, :data:`BOUNDED_OFFSETS`);
    -inf where the support cannot hold y.

    sum_k log f(y_k) = -k log sigma - (1 + 1/xi) sum_k log(1 + xi y_k / sigma)  (xi != 0)
                     = -k log sigma - sum_k y_k / sigma                        (xi = 0)
    """
    y = np.asarray(y, dtype=np.float64)
    xi = np.asarray(xi, dtype=np.float64)
    bounded = xi < 0.0
    edge = np.where(bounded, -xi, 0.0) * float(y.max())
    offsets = np.where(bounded[:, None], BOUNDED_OFFSETS[None, :], OPEN_OFFSETS[None, :])
    log_sigma = np.log(edge[:, None] + float(y.mean()) * np.exp(offsets))
    r = y[None, None, :] / np.exp(log_sigma)[:, :, None]
    open_ = xi == 0.0
    safe = np.where(open_, 1.0, xi)
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = (1.0 + 1.0 / safe)[:, None] * np.log1p(safe[:, None, None] * r).sum(axis=2)
    tail = np.where(open_[:, None], r.sum(axis=2), tail)
    log_lik = -y.size * log_sigma - tail
    return log_sigma, np.where(np.isfinite(log_lik), log_lik, -np.inf)


@dataclass(frozen=True)
class TailPosterior:
    """What a deployment's learned tail shapes say about one request's exceedances
    (:meth:`~stoppers.robust.xi_prior.XiPrior.tail_posterior`, read by :func:`fit_tail`).

    ``xi``: the shape to fit (None: keep the fixed shrinkage); ``share``: the share of the
    confidence margins the tail warrants; ``shapes``: the posterior over the shape and scale as
    (weight, xi, sigma) nodes, the weights summing to 1: per xi, the sigma :func:`fit_tail`
    would take with it, spread over the scale's posterior (``XiPrior.tail_posterior``).
    """

    xi: float | None
    share: float
    shapes: tuple[tuple[float, float, float], ...] = ()


def posterior_sigma(exceedances: np.ndarray, xi: float) -> float:
    """sigma given the shape ``xi``, from its posterior (flat in log sigma): 1 / E[1 / sigma].

    Why, for a bounded tail: matching the mean exceedance ignores where the exceedances stop.
    Rewards that end abruptly (uniform, a saturating reward model: xi -> -1) have a largest
    exceedance within a k-th of the end; the mean places the end with a spread of about
    1 / sqrt(3k) of the tail's width, and the fit's kappa_hat lay above every reward the prompt
    can give often enough to keep the search going (`pandora synth --family uniform`: 83 rewards
    per request at c = 1e-3 where the best fixed N is 42). The posterior reads the end from the
    largest exceedance and, unlike the likelihood's maximum (which puts the end right at it),
    keeps sigma's spread, which a shape misread as bounded needs: on exponential exceedances
    fitted with xi = -0.5 (k = 15) the tail's 0.95-quantile errs by +0.05, by -0.13 at the
    maximum and by -0.69 with the mean's match.

    Why the inverse of the mean inverse (the posterior mean of the rate 1 / sigma): at xi = 0
    it *is* the mean-exceedance match, sum(y) / k, so the fit does not jump where xi changes
    sign, and at xi = -1 it puts the end at (k + 1) / k times the largest exceedance, the
    uniform's unbiased end. The posterior mean of sigma, sum(y) / (k - 1) at xi = 0, doubled
    sigma at k = 2: every request of an 8-sample budget at c = 0.01 drew all 8
    (docs/robust-stopping.md, "Rewards that end abruptly").
    """
    return float(posterior_sigmas(*sigma_log_likelihood(exceedances, np.array([xi])))[0])


def posterior_sigmas(log_sigma: np.ndarray, log_lik: np.ndarray) -> np.ndarray:
    """:func:`posterior_sigma` per row of :func:`sigma_log_likelihood`'s arrays."""
    weight = _sigma_weights(log_sigma, log_lik)
    return weight.sum(axis=1) / (weight * np.exp(-log_sigma)).sum(axis=1)


def log_sigma_sds(log_sigma: np.ndarray, log_lik: np.ndarray) -> np.ndarray:
    """The posterior standard deviation of log sigma (flat in log sigma) per row of
    :func:`sigma_log_likelihood`'s arrays: how far the tail's scale is known, given each xi."""
    weight = _sigma_weights(log_sigma, log_lik)
    weight = weight / weight.sum(axis=1, keepdims=True)
    mean = (weight * log_sigma).sum(axis=1, keepdims=True)
    return np.sqrt((weight * (log_sigma - mean) ** 2).sum(axis=1))


def _sigma_weights(log_sigma: np.ndarray, log_lik: np.ndarray) -> np.ndarray:
    """Unnormalised posterior weights of the sigma grid's nodes, per row (flat in log sigma)."""
    top = log_lik.max(axis=1, keepdims=True)
    return np.gradient(log_sigma, axis=1) * np.exp(log_lik - np.where(np.isfinite(top), top, 0))


def shape_weight(k: int, xi: float) -> float:
    """The weight of a shape estimate from ``k`` exceedances, in the prior's pseudo-exceedances.

    The GPD shape estimate's asymptotic variance is (1 + xi)^2 / k (Smith 1985; the variance
    :func:`~stoppers.robust.policy.kappa_offset` uses) and the prior's pseudo-exceedances count
    at xi = 0, so k exceedances that point to a bounded tail weigh k / (1 + xi)^2. Two limits:
    the variance is not taken below its value at xi = -1/2, where the likelihood stops being
    regular, and a heavy tail's estimate keeps the weight k, since pulling a heavy tail towards
    a light one ends the search where that costs most.

    This is a rule measured to pay, not a posterior: at the 10-40 exceedances of a cold start
    the Zhang-Stephens estimate's spread does not narrow with xi (k Var = 1.0-1.7 from xi = -0.9
    to 0, 3,000 GPD samples each), and the exact posterior under the prior's N(0, 0.18^2) did
    not earn what this does. What it changes: the count weight let a prior of 30
    pseudo-exceedances turn a request's strongly bounded estimate (a threshold below a better
    mode, xi ~ -0.8) into an exponential tail whose benchmark lies far beyond the better mode:
    on `mixture` prompts the cold start alone drew 148 rewards per request where the best fixed
    N is 61 (docs/robust-stopping.md, "Weigh a bounded estimate by its precision").
    """
    return k / min(max((1.0 + xi) ** 2, _MIN_SHAPE_VARIANCE), 1.0)


def acceptance(d: float) -> float:
    """AR for reward - kappa = d: min(2 e^d / (e^d + 1), 1) (Definition "Acceptance Rate")."""
    if d >= 0.0:
        return 1.0
    e = math.exp(d)  # d < 0: no overflow, underflows gracefully to 0
    return 2.0 * e / (1.0 + e)


def _acceptance_array(d: np.ndarray) -> np.ndarray:
    e = np.exp(np.minimum(d, 0.0))
    return np.minimum(2.0 * e / (1.0 + e), 1.0)


def lattice_step(values: list[float] | np.ndarray) -> float | None:
    """The rounding cell of ascending ``values`` if they sit on a lattice - a value other than the
    lowest and highest repeats - else None: the smallest gap between distinct values."""
    x = np.asarray(values, dtype=np.float64)
    interior = x[(x > x[0]) & (x < x[-1])]
    if interior.size < 2 or not np.any(interior[1:] == interior[:-1]):
        return None
    gaps = np.diff(np.unique(x))
    return float(gaps.min())


# Copies of each of two values before they are read as two cells: a reward model scores a
# duplicated response identically, so a continuous reward can repeat (AlpacaEval's first 24
# prompts hold duplicates seen twice beside the lower clip, none seen three times); a lattice's
# two levels repeat from the first draws on.
_CELL_COPIES = 3


def fit_cell(values: list[float] | np.ndarray) -> float | None:
    """The cell a request's tail fit spreads tied copies over (:func:`dequantize`), for
    ascending ``values``: their :func:`lattice_step`, or - two distinct values, each seen
    ``_CELL_COPIES`` times - their gap.

    Why the second case: a two-level stream (a coarse lattice where the prompt's rewards fall on
    two levels, or a binary score) has no tail a fit can read as it is - fewer than two distinct
    values above any threshold - and a fit-less cold start kept sampling to the budget. The
    pile-up test (:func:`stoppers.robust.tracker.is_pile_up`) is asked first and reads a top
    level that outnumbers the one below as a clip; what it leaves is read as two rounding cells. On
    normal rewards rounded to 2.0 (`pandora synth --family rounded --resolution 2.0`, seed 7)
    34 of 2,400 requests had drawn all 960 rewards at c = 1e-3, and the default earned 1.007 of
    the best fixed N; with the cells read, 1.024 (docs/robust-stopping.md, "Two levels are two
    cells")."""
    x = np.asarray(values, dtype=np.float64)
    step = lattice_step(x)
    if step is not None or x.size < 2 * _CELL_COPIES:
        return step
    top = int(np.searchsorted(x, x[0], side="right"))  # where the values above the lowest start
    two_levels = top < x.size and x[top] == x[-1]
    if two_levels and min(top, x.size - top) >= _CELL_COPIES:
        return float(x[-1] - x[0])
    return None


def dequantize(values: np.ndarray, step: float) -> np.ndarray:
    """Ascending ``values`` with each run of m equal values v spread evenly over its cell:
    v + step ((j + 1/2) / m - 1/2), j = 0 .. m - 1 (still ascending: cells do not overlap)."""
    _, first, counts = np.unique(values, return_index=True, return_counts=True)
    j = np.arange(values.size) - np.repeat(first, counts)
    m = np.repeat(counts, counts)
    return values + step * ((j + 0.5) / m - 0.5)


def fit_tail(
    sorted_rewards: np.ndarray | list[float],
    *,
    xi0: float = 0.0,
    prior_weight: float = 30.0,
    k: int | None = None,
    posterior: Callable[[np.ndarray], TailPosterior] | None = None,
    precision_weighted: bool = False,
) -> TailFit | None:
    """Fit :class:`TailFit` to ascending-sorted rewards; None when there is no tail to fit.

    "No tail" means fewer than two distinct rewards above the threshold - e.g. every reward tied
    at a clip, which real judge scores often are. Callers then keep sampling.

    The shape estimate is shrunk to ``xi0``: ``xi = (k xi_zs + w xi0) / (k + w)``. For an open
    tail (xi >= 0) sigma is re-solved so that the fitted mean exceedance ``sigma / (1 - xi)``
    equals the observed one (the mean is the best-determined statistic of a small sample). For
    a bounded one it comes from sigma's posterior given xi (:func:`posterior_sigma`), which reads
    the end of the tail from the largest exceedance as well. xi is kept in [-1, 0.9] so that
    the mean exceedance exists. ``posterior(exceedances)``, when given, returns a
    :class:`TailPosterior` from a deployment's learned distribution of xi
    (:meth:`~stoppers.robust.xi_prior.XiPrior.tail_posterior`): a shape replaces the shrinkage
    (None keeps it), the share becomes the fit's ``margin_share`` and the shapes its
    ``shapes``.

    ``precision_weighted`` weighs the k exceedances by the asymptotic precision of their
    estimate (:func:`shape_weight`) instead of as k pseudo-exceedances, so that the prior no
    longer erases a request's strongly bounded estimate: a rule measured to pay (see there).
    """
    values = np.asarray(sorted_rewards, dtype=float)
    n = values.size
    if n < 3:
        return None
    u, y = tail_exceedances(values, k)
    kk = y.size
    if kk < 2:
        return None
    learned = TailPosterior(None, 1.0)
    if y[0] == y[-1]:
        # All exceedances tie (e.g. several rewards at an upper clip): a bounded tail.
        xi = _XI_MIN
    else:
        if posterior is not None:  # a deployment's learned shape distribution (XiPrior)
            learned = posterior(y)
        if learned.xi is not None:
            xi = learned.xi
        else:
            _, xi_zs = zhang_stephens_gpd(y)
            weight = shape_weight(kk, xi_zs) if precision_weighted else kk
            xi = (weight * xi_zs + prior_weight * xi0) / (weight + prior_weight)
    xi = min(max(xi, _XI_MIN), _XI_MAX)
    sigma = float(y.mean()) * (1.0 - xi) if xi >= 0.0 else posterior_sigma(y, xi)
    if not sigma > 0.0:
        return None
    return TailFit(
        u=u,
        p_u=kk / n,
        sigma=sigma,
        xi=xi,
        k=kk,
        margin_share=learned.share,
        shapes=learned.shapes,
    )

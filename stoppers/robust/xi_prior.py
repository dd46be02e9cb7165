"""An empirical-Bayes prior on the GPD tail shape xi, learned across a deployment's requests.

Why: one request's tail fit sees 4-30 exceedances, too few to tell a bounded tail (xi < 0) from
an exponential one (xi = 0) or a heavy one (xi > 0); :func:`~stoppers.robust.gpd_tail.fit_tail`
therefore shrinks its estimate to xi0 = 0 with 30 pseudo-exceedances. That default is wrong
for whole deployments: bimodal rewards ("a few responses much better than most") put a cluster
above a gap, which reads as a short, bounded tail; heavy-tailed reward models have xi ~ 0.3.
A single pooled xi0 (:class:`~stoppers.robust.prior.TailPrior`) fixes one deployment shape but
pulls the heavy-tailed prompts of a *mixed* deployment towards its light average.

So this prior learns the *distribution* g of xi across the deployment's requests - the
nonparametric maximum-likelihood mixing distribution of Kiefer and Wolfowitz on a fixed grid,
fitted by EM (the "g-modeling" of empirical Bayes) - from each finished request's marginal
likelihood of xi (its top exceedances, log sigma integrated out with a flat prior). A new
request's shape is then its posterior mean under g: close to a shared xi when the deployment
has one, near the cluster its own exceedances point to when the deployment has several. It
adds one posterior standard deviation of optimism (``OPTIMISM``): where the requests' tails
differ and a short request cannot tell which kind it has, its posterior is wide, and stopping
on a light tail it does not have costs more than one more sample. Only finished requests'
observed rewards are learned from.

The same posterior also says how much of the cold start's confidence margins a request's tail
warrants (:meth:`XiPrior.margin_share`, from the second learned request on): its probability of
a tail that does not end soon (xi >= ``BOUNDED_XI``).

Plain dataclass, JSON-safe (:meth:`XiPrior.to_dict` / :meth:`XiPrior.from_dict`); bounded: the
likelihood rows of the last ``MAX_ROWS`` requests (19 numbers each).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoppers.robust.gpd_tail import (
    TailPosterior,
    dequantize,
    lattice_step,
    log_sigma_sds,
    posterior_sigmas,
    sigma_log_likelihood,
    tail_exceedances,
)
from stoppers.robust.npmle import npmle_em

__all__ = ["XI_GRID", "XiPrior", "xi_log_likelihood"]

# the support of g: fit_tail's range [-1, 0.9] (-1: rewards that end abruptly, uniform-like)
XI_GRID = np.round(np.arange(-1.0, 0.81, 0.1), 10) + 0.0  # + 0.0: no -0.0
BASE_SD = 0.18  # the base measure: N(0, 0.18^2) on XI_GRID, the unlearned default's spread
BASE_WEIGHT = 2.0  # requests' worth of the base measure mixed into every EM step
MIN_REQUESTS = 8  # requests learned before g replaces the fixed shrinkage
# Optimism on the shape, in posterior standard deviations (the UCB of the paper's Pandora's box
# rule, as TailPandora's scale_z = 1 on the tail scale): a request's xi is its posterior mean
# plus this. With the mean alone, short requests of a deployment whose tails differ (the
# AlpacaEval pool: a quarter of g at the bound -0.9 from clipped judge scores) took the lighter
# average and stopped too soon: 0.9948 -> 0.9925 of the best fixed N at c = 1e-3 in 805-prompt
# deployments; with one sd, 0.9958 -> 0.9990 (scratch, 6 deployments).
OPTIMISM = 1.0
# Bounded tails need no confidence margin. The cold start widens its tail scale and raises its
# benchmark by a few standard errors (TailPandora's scale_z, kappa_z): insurance against a tail
# heavier than its fit, which costs little where the tail is long. On a tail that ends soon after
# the best - the "better mode" cluster above a gap of bimodal prompts (fitted xi: -0.3 to -0.6) -
# the margins keep the search going long after it has nothing left to find (mixture cold starts drew
# 145 rewards per request at c = 1e-3, the best fixed N 63). So a request's fit keeps the share of
# the margins equal to its posterior probability of xi >= BOUNDED_XI under g. Its median over
# requests of 48 rewards after 8 learned ones (40-150 rewards each, the seed-0 pools): 0.98-1.00 on
# Gumbel, Student-t, exponential, lognormal and logistic prompts, 0.95 on normal and skew-normal
# ones, 0.23 on bimodal `mixture` ones (docs/robust-stopping.md "Bounded tails need no margin"). It
# applies from SHARE_MIN_REQUESTS learned requests on, before g replaces the shrinkage
# (MIN_REQUESTS): telling bounded from open tails needs less evidence than a shape does. The cut and
# the start were chosen on the seed-0 mixture, normal, Student-t and `mixed` pools (24 x 30
# deployments); with the shape also learned from 2 requests, -0.15 took half the margins off normal
# prompts and cost `mixed` 0.4 point at c = 1e-4.
BOUNDED_XI = -0.3
SHARE_MIN_REQUESTS = 2
# Shapes of less posterior weight are left out of TailPosterior.shapes (the cold start's gain
# averaged over the shape posterior, TailPandora): at most 0.019 of the mass, and no work on it.
SHAPE_MIN_WEIGHT = 1e-3
# Each kept open shape's sigma is spread over its posterior: three Gauss-Hermite nodes in log
# sigma, at 0 and +-sqrt(3) posterior sds (weights 2/3, 1/6, 1/6: the mean and variance of log
# sigma kept). Why: one sigma per shape left out how little a tail's scale is known from the
# 15-25 exceedances of a cold start, and the gain is a hinge in it (0 while kappa_hat lies under
# the best). On power-law tails (`pareto`, xi = 0.3) at c = 1e-4 the requests that lost most
# stopped 0.5-1.3 of the prompt's sd under the benchmark, their kappa_hat under the best as
# their exceedances happened to be small: 0.979 of the best fixed N; spread, 0.993 (5 nodes
# out to +-2.86 sds: 0.991, the same within its standard error). A bounded shape keeps its one
# sigma, the posterior's (posterior_sigma): that posterior piles up where the tail's end passes
# the largest exceedance, which symmetric nodes do not follow (the low one ends the tail under
# the largest reward); spread so, the bounded families lost up to 5 standard errors (`sigmoid`
# at 1e-4: 0.9984 -> 0.9974). docs/robust-stopping.md, "The tail's scale is not known either".
SIGMA_NODES = ((-math.sqrt(3.0), 1.0 / 6.0), (0.0, 2.0 / 3.0), (math.sqrt(3.0), 1.0 / 6.0))
_ONE_NODE = ((0.0, 1.0),)  # a bounded shape's
MIN_REWARDS = 8  # shorter requests teach nothing (as TailPrior)
MAX_ROWS = 256  # likelihood rows kept (newest)
EM_STEPS = 25  # EM iterations per update, warm-started from the previous g
ROW_DECIMALS = 4  # rows are stored rounded so that a JSON round trip is exact
ROW_FLOOR = -50.0  # log-likelihoods below this are stored as it (JSON has no -inf)
_OLD_GRID_SIZE = 18  # XI_GRID's size until 2026-11-29 (-0.9 .. 0.8): such snapshots restart


def xi_log_likelihood(exceedances: np.ndarray) -> np.ndarray:
    """log p(y | xi) on :data:`XI_GRID`, sigma integrated out (flat in log sigma), max 0
    (floored at ``ROW_FLOOR``: an xi whose support cannot hold y).

    ``exceedances``: positive GPD exceedances y (any order). Each xi integrates over its own
    sigma grid (:func:`~stoppers.robust.gpd_tail.sigma_log_likelihood`): a bounded xi's starts
    where its end passes the largest exceedance. Until 2026-11-29 one grid of e^-2.5 .. e^1.5
    mean exceedances served every xi; its steps of 0.25 in log sigma missed the narrow peak a
    bounded tail's likelihood has at that edge (sigma^-k at xi = -1), and the grid stopped at
    -0.9: a deployment of uniform rewards learned g at -0.9 and -0.8, and its requests' shape
    (posterior mean plus one sd) came out near -0.8.
    """
    return _marginal(*sigma_log_likelihood(exceedances, XI_GRID))


def _marginal(log_sigma: np.ndarray, log_lik: np.ndarray) -> np.ndarray:
    """:func:`xi_log_likelihood` from :func:`~stoppers.robust.gpd_tail.sigma_log_likelihood`'s
    arrays on XI_GRID."""
    weight = np.log(np.gradient(log_sigma, axis=1))  # the integral's steps in log sigma
    out = _log_sum_exp_rows(log_lik + weight)
    return np.maximum(out - out.max(), ROW_FLOOR)


def _log_sum_exp_rows(x: np.ndarray) -> np.ndarray:
    """log sum_j exp(x_ij) per row (-inf for a row of -inf). scipy.special.logsumexp gives the
    same to 1e-15 but costs ~8x as much on these 19 x 45 arrays, and this runs on every refit of
    a request's tail."""
    top = x.max(axis=1)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return top + np.log(np.exp(x - top[:, None]).sum(axis=1))


def _base_measure() -> np.ndarray:
    base = np.exp(-0.5 * (XI_GRID / BASE_SD) ** 2)
    return base / base.sum()


@dataclass
class XiPrior:
    """Learned mixing distribution ``g`` of the tail shape over :data:`XI_GRID`.

    ``rows``: per learned request (newest last, at most ``MAX_ROWS``) its
    :func:`xi_log_likelihood`; ``g``: the current EM estimate (persisted, so that a restored
    prior decides exactly as before); ``requests``: requests learned in all.

    ``xi0`` / ``weight`` are what :class:`~stoppers.robust.policy.TailPolicy` reads from any
    tail prior: the unlearned default's shrinkage (xi0 = 0, 30 pseudo-exceedances), used until
    :attr:`learned`; ``weight`` also stays the kappa margin's prior weight after that.
    """

    rows: list[list[float]] = field(default_factory=list, repr=False)
    g: list[float] = field(default_factory=lambda: _base_measure().tolist())
    requests: int = 0
    xi0: float = field(default=0.0, init=False)
    weight: float = field(default=30.0, init=False)

    def __post_init__(self) -> None:
        size = XI_GRID.size
        if not (isinstance(self.rows, list) and len(self.rows) <= MAX_ROWS):
            raise ValueError(f"rows must be a list of at most {MAX_ROWS} rows")
        rows = []
        for row in self.rows:
            if not (isinstance(row, list | tuple) and len(row) == size):
                raise ValueError(f"each row must hold {size} numbers")
            values = _numbers(row, "rows")
            if not all(ROW_FLOOR <= v <= 0.0 for v in values) or max(values) != 0.0:
                raise ValueError(f"rows must be log-likelihoods in [{ROW_FLOOR:g}, 0], maximum 0")
            rows.append(values)
        self.rows = rows
        if not (isinstance(self.g, list | tuple) and len(self.g) == size):
            raise ValueError(f"g must hold {size} numbers")
        g = _numbers(self.g, "g")
        if not (all(math.isfinite(v) and v >= 0.0 for v in g) and abs(sum(g) - 1.0) < 1e-6):
            raise ValueError("g must be a probability vector")
        self.g = g
        if not (isinstance(self.requests, int) and self.requests >= len(self.rows)):
            raise ValueError("requests must be an int >= the number of rows")

    @property
    def learned(self) -> bool:
        """True once ``MIN_REQUESTS`` requests have been learned."""
        return self.requests >= MIN_REQUESTS

    @property
    def mean_xi(self) -> float:
        """The mean tail shape of the deployment's requests under ``g``."""
        return float(np.asarray(self.g) @ XI_GRID)

    def update(self, rewards: Any) -> bool:
        """Learn from one finished request's observed rewards; True if it counted.

        Its exceedances are those :func:`~stoppers.robust.gpd_tail.fit_tail` fits
        (:func:`~stoppers.robust.gpd_tail.tail_exceedances`); fewer than ``MIN_REWARDS`` rewards, a
        non-finite one, or fewer than two distinct exceedances (all tied at a clip) teach
        nothing.
        """
        x = np.sort(np.asarray(rewards, dtype=np.float64).ravel())
        if x.size < MIN_REWARDS or not np.all(np.isfinite(x)):
            return False
        step = lattice_step(x)  # scores on a lattice: fitted dequantized, as the tracker does
        if step is not None:
            x = dequantize(x, step)
        _, y = tail_exceedances(x)
        if y.size < 2 or y[0] == y[-1]:
            return False
        row = np.round(xi_log_likelihood(y), ROW_DECIMALS)
        self.rows.append(row.tolist())
        del self.rows[:-MAX_ROWS]
        self.requests += 1
        self.g = _em(np.asarray(self.rows), np.asarray(self.g), EM_STEPS).tolist()
        return True

    def posterior_xi(self, exceedances: np.ndarray) -> float:
        """The shape a request with these exceedances uses: its posterior mean of xi under g
        plus ``OPTIMISM`` posterior standard deviations."""
        return _optimistic_mean(self._posterior(exceedances))

    def margin_share(self, exceedances: np.ndarray) -> float:
        """The share of the confidence margins a request with these exceedances keeps: its
        posterior probability of xi >= ``BOUNDED_XI`` (1 before ``SHARE_MIN_REQUESTS``)."""
        return self.tail_posterior(exceedances).share

    def tail_posterior(self, exceedances: np.ndarray) -> TailPosterior:
        """What :func:`~stoppers.robust.gpd_tail.fit_tail` reads, one posterior for all:
        :meth:`posterior_xi` once :attr:`learned` (None before: the fixed shrinkage),
        :meth:`margin_share`, and the shapes of posterior weight at least
        ``SHAPE_MIN_WEIGHT``, each with its sigma, an open shape's spread over that sigma's
        posterior (``SIGMA_NODES``; from ``SHARE_MIN_REQUESTS`` on; none before)."""
        if self.requests < SHARE_MIN_REQUESTS:
            return TailPosterior(None, 1.0)
        y = np.asarray(exceedances, dtype=np.float64)
        log_sigma, log_lik = sigma_log_likelihood(y, XI_GRID)  # one evaluation for all three
        post = self._weigh(_marginal(log_sigma, log_lik))
        share = float(post[XI_GRID >= BOUNDED_XI].sum())
        keep = post >= SHAPE_MIN_WEIGHT
        weight = post[keep] / post[keep].sum()
        xi = XI_GRID[keep]
        # fit_tail's sigma: the mean exceedance's match if open, the posterior if bounded;
        # an open tail's spread over the scale's posterior (SIGMA_NODES). Each computed only
        # on the rows that use it.
        bounded, kept_sigma, kept_lik = xi < 0.0, log_sigma[keep], log_lik[keep]
        sigma = y.mean() * (1.0 - xi)
        sigma[bounded] = posterior_sigmas(kept_sigma[bounded], kept_lik[bounded])
        spread = np.zeros_like(xi)
        spread[~bounded] = log_sigma_sds(kept_sigma[~bounded], kept_lik[~bounded])
        rows = zip(weight.tolist(), xi.tolist(), sigma.tolist(), spread.tolist(), strict=True)
        shapes = tuple(
            (w * node_weight, x, s * math.exp(node * sd))
            for w, x, s, sd in rows
            for node, node_weight in (SIGMA_NODES if sd > 0.0 else _ONE_NODE)
        )
        return TailPosterior(_optimistic_mean(post) if self.learned else None, share, shapes)

    def _posterior(self, exceedances: np.ndarray) -> np.ndarray:
        return self._weigh(xi_log_likelihood(exceedances))

    def _weigh(self, log_lik: np.ndarray) -> np.ndarray:
        """The posterior on XI_GRID of a request's shape likelihood under g."""
        log_post = np.log(np.maximum(np.asarray(self.g), 1e-300)) + log_lik
        post = np.exp(log_post - log_post.max())
        return post / post.sum()

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [list(r) for r in self.rows], "g": list(self.g), "requests": self.requests}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> XiPrior:
        """Restore :meth:`to_dict`'s snapshot (None: a fresh prior); ValueError on anything
        it could not have written."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError("the xi prior must be an object")
        saved_g = data.get("g")
        if isinstance(saved_g, list) and len(saved_g) == _OLD_GRID_SIZE:
            # saved on the grid -0.9 .. 0.8 (before 2026-11-29): its rows integrate sigma on
            # another grid, so they are not comparable; a fresh prior re-learns in MIN_REQUESTS
            return cls()
        requests = data.get("requests", 0)
        if not isinstance(requests, int) or isinstance(requests, bool):
            raise ValueError("requests must be an int")
        g = data.get("g", _base_measure().tolist())
        return cls(rows=data.get("rows", []), g=g, requests=requests)


def _optimistic_mean(post: np.ndarray) -> float:
    """Posterior mean of xi plus ``OPTIMISM`` posterior standard deviations."""
    mean = float(post @ XI_GRID)
    return mean + OPTIMISM * math.sqrt(max(float(post @ (XI_GRID - mean) ** 2), 0.0))


def _numbers(values: Any, name: str) -> list[float]:
    """The values as floats; ValueError unless each is a real number (bools and strings are not)."""
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{name} must hold numbers")
    return [float(v) for v in values]


def _em(rows: np.ndarray, g: np.ndarray, steps: int) -> np.ndarray:
    """``steps`` EM iterations of the grid NPMLE of g, regularised by the base measure.

    g_j <- (sum_i post_ij + BASE_WEIGHT base_j) / (requests + BASE_WEIGHT), post_ij the
    posterior of grid point j for request i under the current g.
    """
    return npmle_em(np.exp(rows), g, _base_measure(), BASE_WEIGHT, steps)

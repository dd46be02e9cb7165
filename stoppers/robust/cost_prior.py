"""The cost-mode deployment prior: the learned shape, and two tests of whether prompts share it.

Why: :class:`~stoppers.robust.shape_cost.ShapePandora` decides on a shape pooled across a
deployment's requests, which helps only where the prompts share it. :class:`CostShapePrior` is the
target prior (:class:`~stoppers.robust.shape_prior.ShapePrior`: standardised shape, scales, kept
streams, tail shapes, the scale's ends) with what cost mode adds: the shape pooled only from long
requests, two Pearson chi-square tests of a shared shape (:func:`shapes_differ`), and the shape
fitted by likelihood to the kept streams (:meth:`CostShapePrior.fitted_shape`, refitted as requests
grow). The policy's gates, which read these, stay in :mod:`stoppers.robust.shape_cost`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoppers.robust.censored_cost import CensoredShape, fit_censored
from stoppers.robust.floor_table import CUT_SHARE_MIN
from stoppers.robust.likelihood_cost import FittedShape
from stoppers.robust.shape_prior import ShapePrior
from stoppers.robust.stream_bootstrap import n_for_cost

__all__ = [
    "CENSORED_KEY",
    "COST_PRIOR_MIN_REWARDS",
    "DISPERSION_LEVEL",
    "EARLY_MAX_DISPERSION",
    "EARLY_REQUESTS",
    "LIKELIHOOD_KEY",
    "LIKELIHOOD_MIN_REQUESTS",
    "MAX_DISPERSION",
    "SHAPE_TEST_EDGES",
    "STREAMS_N_FLOOR_MIN",
    "STREAMS_N_KEY",
    "STREAMS_N_MIN_STREAMS",
    "STREAMS_N_XI_REQUESTS",
    "CostShapePrior",
    "StreamsBestOfN",
    "cost_shape_prior",
    "dispersion_limit",
    "shapes_differ",
]

# A request's draws count towards the shape from its 25th on (predictive standardisation,
# :meth:`ShapePrior._standardise`): earlier ones, standardised by 4-23 rewards' mean and sd,
# made the pooled tail too heavy (normal rewards: 0.935 of the oracle's profit at c = 1e-3 with
# the default 4, 0.953 with 24; deployment replay, 30 prompts x 10 orderings).
COST_PRIOR_MIN_REWARDS = 24
SCALE_MIN_REWARDS = 4
# Shared-shape tests (CostShapePrior.dispersion / shape_dispersion): the tail level, the bin
# edges of the whole-shape test, and the largest dispersion at which the learned shape is
# trusted. The tail test was set on the training families (24 prompts x 100 draws, 5 seeds):
# shared shapes gave 0.8-1.3 on average (max 1.9), the mixture family (per-prompt weights)
# 2.1 (min 1.3). It let clipped and mixed deployments through (1.2-1.3: their prompts differ
# in the body of the shape, not in the fraction above 1.5), so the shape test compares 7 bins.
DISPERSION_LEVEL = 1.5
SHAPE_TEST_EDGES = (-1.5, -0.75, 0.0, 0.75, 1.5, 2.25)
MAX_DISPERSION = 1.6
# ... and the stricter bar while the shape is learned from fewer than EARLY_REQUESTS requests.
# The tests are noisy there, and the two errors are not alike: a deployment of differing
# shapes that passes by chance decides on a blend (the 27 of 480 requests that did, 24
# prompts x 20 `mixed-no-clipped` deployments, earned 0.74-0.84 of the best fixed N), a shared
# shape rejected by chance runs the cold start (~0.97-1.0 of what trust earns). At 1.3 in the
# first 50 requests: `mixed-continuous` draws 0.978 -> 1.001 (seed 3) and 0.999 -> 1.016
# (seed 2) at c = 1e-3 in 24-prompt deployments; held for the whole deployment instead, the
# long Student-t deployments lost 0.6 point (1.057 -> 1.051), which the return to 1.6 keeps
# (docs/robust-stopping.md "Heterogeneous continuous deployments").
EARLY_MAX_DISPERSION = 1.3
EARLY_REQUESTS = 50
# The likelihood path (FittedShape): used once this many requests' streams are kept, refitted
# as requests grow by half (at most every REFIT_EVERY requests, so the shape follows drift),
# and only for continuous rewards: once more than TIED_MAX of the kept streams repeat their
# rewards (rounded scores, a clip; likelihood_cost.tied_fraction) the cold start decides.
LIKELIHOOD_MIN_REQUESTS = 8
REFIT_EVERY = 256
MAXIMA_MIN_REWARDS = 8  # kept streams shorter than this say little about where rewards end
LIKELIHOOD_KEY = ("likelihood-shape",)
CENSORED_KEY = ("censored-shape",)
STREAMS_N_KEY = "streams-best-of-n"  # first item of a streams_best_of_n key
# The streams' Best-of-N is read from this many kept streams, and where the xi distribution
# learned from this many requests reads light tails (the target tables wait for 5 streams and
# 8 requests). Why: a 24-prompt deployment of the real pool redrawn (`ap05`) ran its first 10
# requests on the cold start, at 0.83 of the best fixed N for the first request and 0.96 for
# the 4th-7th (c = 1e-3, 24 x 40); the N's profit curve is flat near its best, so an N read
# from fewer streams pays sooner than the cold start does. The xi distribution's base measure
# (two requests' worth at xi = 0) keeps a deployment read from few requests from passing as
# light-tailed by chance (docs/robust-stopping.md, "The streams' Best-of-N from four requests").
STREAMS_N_MIN_STREAMS = 4
STREAMS_N_XI_REQUESTS = 4
# Where the rewards pile up at a floor (ShapePrior.piled_floor) both bars are this instead. Why:
# there the request the N would decide otherwise runs the cold start with its margins whole,
# which on the real pool redrawn earned 0.978-0.992 of the best fixed N on each deployment's
# 4th-7th requests (c = 1e-3, 24 x 100), and the N read from two or three streams 0.986-1.004.
# The floor is established by then (from the 3rd-4th request on those pools), so it is the
# 4th-7th requests that move (docs/robust-stopping.md, "The streams' Best-of-N from two
# streams on a piled floor").
STREAMS_N_FLOOR_MIN = 2


@dataclass(frozen=True)
class StreamsBestOfN:
    """The Best-of-N that earns most at one cost on the kept streams' pseudo-prompts (None:
    the streams are not read so, or too few), and the requests it was read on."""

    n: int | None
    requests: int
    # the streams counted as readable gave fewer pseudo-prompts than the bar (one nearly all at
    # the floor has no interior to read): read again at the next request, not once requests
    # have doubled (CostShapePrior.is_stale)
    short: bool = False


@dataclass
class CostShapePrior(ShapePrior):
    """The cost-mode deployment prior: a :class:`ShapePrior` that pools the shape only from
    requests with >= ``min_rewards`` (24) rewards, but still learns the scale distribution from
    shorter ones (>= 4 rewards: their sd says how spread the prompt's rewards are).

    ``requests`` counts every request that taught something; ``shape_requests`` those that
    taught the shape (what the policy's warm-up reads).

    ``xi`` (:class:`ShapePrior`'s): the cold start (:class:`TailPandora`) reads it, so a
    deployment whose shape is not trusted - prompts that differ in shape - still gets tails of
    the kind its requests have shown, per request.

    It also tests whether the requests *share* a shape, twice: each shape request's fraction of
    standardised draws above ``DISPERSION_LEVEL`` is binomial around the pooled fraction if they
    do (:attr:`dispersion`), and its counts in the 7 bins cut at ``SHAPE_TEST_EDGES`` are
    multinomial around the pooled bin probabilities (:attr:`shape_dispersion`). Each is a
    Pearson chi-square over its degrees of freedom: about 1 when shared, larger when prompts
    differ in shape - then one pooled shape misleads every request and the policy keeps to its
    cold start.
    """

    min_rewards: int = COST_PRIOR_MIN_REWARDS
    likelihood: bool = True  # keep streams: FittedShape is fitted on them
    shape_requests: int = 0
    tail_hits: float = 0.0  # sum over shape requests of h = draws above the level
    tail_hits_sq: float = 0.0  # sum of h^2 / m (m = the request's standardised draws)
    tail_draws: float = 0.0  # sum of m
    # per bin of SHAPE_TEST_EDGES: sum over shape requests of the draws in it, and of their
    # square / m (the sufficient statistics of the Pearson chi-square across requests); the
    # requests and draws they count (fewer than shape_requests in a state saved before them)
    bin_requests: int = 0
    bin_draws: float = 0.0
    bin_hits: list[float] = field(default_factory=lambda: [0.0] * (len(SHAPE_TEST_EDGES) + 1))
    bin_hits_sq: list[float] = field(default_factory=lambda: [0.0] * (len(SHAPE_TEST_EDGES) + 1))
    # Bayes cost tables built on this prior (stoppers.robust.bayes_cost.cost_table); not persisted
    cost_tables: OrderedDict = field(default_factory=OrderedDict, repr=False, compare=False)
    # the shape fitted by likelihood to the kept streams (fitted_shape); not persisted
    likelihood_shape: FittedShape | None = field(default=None, repr=False, compare=False)
    # the interior shape where the floor is read as censoring (censored_shape); not persisted
    censored: CensoredShape | None = field(default=None, repr=False, compare=False)

    @property
    def dispersion(self) -> float | None:
        """Pearson chi-square / requests of the per-request tail fractions (None: too few)."""
        if self.shape_requests < 2 or self.tail_draws <= 0.0:
            return None
        p = self.tail_hits / self.tail_draws
        if not 0.0 < p < 1.0:
            return None
        chi2 = self.tail_hits_sq - 2.0 * p * self.tail_hits + p * p * self.tail_draws
        return chi2 / (self.shape_requests * p * (1.0 - p))

    @property
    def shape_dispersion(self) -> float | None:
        """Pearson chi-square of the requests x bins table over (requests - 1)(bins - 1).

        With O_rb the draws of request r in bin b, m_r its draws, N their sum and p_b the pooled
        bin fraction: chi2 = sum_rb (O_rb - m_r p_b)^2 / (m_r p_b) = sum_b S_b / p_b - N, where
        S_b = sum_r O_rb^2 / m_r is what :meth:`update` accumulates. None: too few requests, or
        fewer than two occupied bins.
        """
        total = self.bin_draws
        hits = np.asarray(self.bin_hits, dtype=np.float64)
        occupied = hits > 0.0
        bins = int(np.count_nonzero(occupied))
        if self.bin_requests < 2 or total <= 0.0 or bins < 2:
            return None
        p = hits[occupied] / total
        chi2 = float(np.sum(np.asarray(self.bin_hits_sq)[occupied] / p)) - total
        return max(chi2, 0.0) / ((self.bin_requests - 1) * (bins - 1))

    def update(self, rewards: Any) -> bool:
        x = np.asarray(rewards, dtype=np.float64)
        if x.ndim != 1 or not np.all(np.isfinite(x)):
            return False
        tail_learned = self.xi.update(x)
        if x.size >= self.min_rewards:
            learned = self.learn_shape(x)
            if learned:
                z = self._standardise(x)
                if z.size:
                    hits = float(np.count_nonzero(z > DISPERSION_LEVEL))
                    self.tail_hits += hits
                    self.tail_hits_sq += hits * hits / z.size
                    self.tail_draws += z.size
                    self.shape_requests += 1
                    counts = np.bincount(
                        np.searchsorted(SHAPE_TEST_EDGES, z), minlength=len(self.bin_hits)
                    ).astype(np.float64)
                    self.bin_hits = (np.asarray(self.bin_hits) + counts).tolist()
                    self.bin_hits_sq = (np.asarray(self.bin_hits_sq) + counts**2 / z.size).tolist()
                    self.bin_requests += 1
                    self.bin_draws += z.size
            return learned or tail_learned
        self.note_ends(x)  # (super().update notes the longer requests)
        if x.size < SCALE_MIN_REWARDS:
            return tail_learned
        sd = float(x.std(ddof=1))
        if not sd > 0.0:
            return tail_learned
        self.forget()
        self.count_request(x, sd)  # short streams too: leaving them out would select on the data
        return True

    def stream_maxima(self) -> tuple[np.ndarray, np.ndarray]:
        """(n, z_max) of each kept stream with spread: its length and its largest reward
        standardised by its own mean and sd (what :func:`tail_excess` judges a shape by), from
        the facts computed once per kept stream (:meth:`stream_facts`)."""
        facts = self.stream_facts()
        kept = [f for f in facts if f.size >= MAXIMA_MIN_REWARDS and f.z_max is not None]
        n = np.array([f.size for f in kept], dtype=np.float64)
        return n, np.array([f.z_max for f in kept], dtype=np.float64)

    # -- the likelihood shape (fitted to the kept streams; built like the target tables) -----
    def fitted_shape(self) -> FittedShape | None:
        """The shape fitted by likelihood to the kept streams, refitted as requests grow.

        None until ``LIKELIHOOD_MIN_REQUESTS`` streams are kept. Without
        :attr:`schedule_build` a missing or stale fit is made here (blocking, ~0.1-3 s);
        with it the newest fit (stale or not, None if none) is returned and the hook is asked
        to refit elsewhere (the gateway's worker thread), as for the target tables.
        """
        if not self.likelihood or len(self.streams) < LIKELIHOOD_MIN_REQUESTS:
            return None
        cached = self.likelihood_shape
        if cached is not None and not _refit_due(cached.requests, self.requests):
            return cached
        if self.schedule_build is not None:
            self.schedule_build(self, LIKELIHOOD_KEY)
            return cached
        fitted = self.prepare(LIKELIHOOD_KEY)()
        self.install(LIKELIHOOD_KEY, fitted)
        return self.likelihood_shape

    def censored_shape(self) -> CensoredShape | None:
        """The censored reading (:mod:`stoppers.robust.censored_cost`) where the floor may be read
        as censoring (:meth:`ShapePrior.censoring_floor`; from ``CUT_SHARE_MIN`` of the kept
        rewards at it, where only a cut reading decides), refitted as requests grow, else None.
        A fit made for a floor the deployment has since gone below is not returned. Built as
        :meth:`fitted_shape` is (here, or by :attr:`schedule_build` elsewhere)."""
        censored = self.censoring_floor(CUT_SHARE_MIN)
        if censored is None:
            return None
        floor = censored[0].value
        cached = self.censored
        if cached is not None and cached.floor != floor:
            cached = None
        if cached is not None and not _refit_due(cached.requests, self.requests):
            return cached
        if self.schedule_build is not None:
            self.schedule_build(self, CENSORED_KEY)
            return cached
        self.install(CENSORED_KEY, self.prepare(CENSORED_KEY)())
        return self.censored if self.censored is not None and self.censored.floor == floor else None

    def streams_best_of_n(
        self, cost: float, *, min_samples: int, horizon: int, alpha: float | None = None
    ) -> int | None:
        """The Best-of-N that earns most at ``cost`` on the kept streams read as pseudo-prompts
        (:func:`~stoppers.robust.stream_bootstrap.n_for_cost`), where they are read so
        (:meth:`ShapePrior.lumpy_streams`: continuous, light-tailed, lumpy - or smooth, where
        the rewards pile up at a floor, :meth:`ShapePrior.piled_floor`), else None; cached
        and rebuilt as the target tables are (here, or by :attr:`schedule_build` elsewhere).
        The cost is keyed to three significant digits: a client-chosen cost cannot force
        endless builds.

        Why smooth streams on a piled floor: there the request that reads this N would
        otherwise run the cold start with its confidence margins whole (the interiors above
        the floor are not read as censoring), and on the real pool redrawn smoother (`ap15`)
        its streams read smooth, so 378 of 480 requests ran that cold start at 0.959 of the
        best fixed N's profit (c = 1e-3), the N read from the streams at 1.009
        (docs/robust-stopping.md, "Smooth streams on a piled floor"). There the N is read from
        two streams and two requests' xi (``STREAMS_N_FLOOR_MIN``), elsewhere from four."""
        if self.requests == 0:
            return None
        if not self.streams_readable(*self._streams_n_bars(self.piled_floor() is not None)):
            return None
        alpha = self.alpha if alpha is None else float(alpha)
        key = (STREAMS_N_KEY, float(f"{cost:.3g}"), int(min_samples), int(horizon), alpha)
        built = self._built(key)
        return None if built is None else built.n

    def _streams_n_bars(self, floor_piles: bool) -> tuple[int, int]:
        """(kept streams, xi requests) the streams' Best-of-N waits for: ``STREAMS_N_FLOOR_MIN``
        of each on a floor the rewards pile up at, else ``STREAMS_N_MIN_STREAMS`` and
        ``STREAMS_N_XI_REQUESTS``."""
        if floor_piles:
            return STREAMS_N_FLOOR_MIN, STREAMS_N_FLOOR_MIN
        return STREAMS_N_MIN_STREAMS, STREAMS_N_XI_REQUESTS

    def is_stale(self, key: Any) -> bool:
        """:meth:`ShapePrior.is_stale`, and a streams' Best-of-N that read too few streams
        (:attr:`StreamsBestOfN.short`) is stale once one more request has been learned."""
        cached = self._tables.get(key)
        if isinstance(cached, StreamsBestOfN) and cached.short and self.requests > cached.requests:
            return True
        return super().is_stale(key)

    def prepare(self, key: Any) -> Any:
        """A build of ``key``: the likelihood shape on a copy of the kept streams (which never
        change once kept), the censored reading on their rewards above the floor, the Best-of-N
        the streams say pays (:meth:`streams_best_of_n`), or a target table
        (:meth:`ShapePrior.prepare`)."""
        requests = self.requests
        if key[0] == STREAMS_N_KEY:
            _, cost, min_samples, horizon, alpha = key
            # on a floor the rewards pile up at, smooth streams are read too, and from fewer
            # (streams_best_of_n, STREAMS_N_FLOOR_MIN)
            floor_piles = self.piled_floor() is not None
            min_streams, xi_requests = self._streams_n_bars(floor_piles)
            read = self.lumpy_streams(alpha, min_streams, xi_requests, lumpy_only=not floor_piles)

            def build() -> StreamsBestOfN:
                prompts = read()
                if prompts is None:
                    return StreamsBestOfN(None, requests)
                if len(prompts.prompts) < min_streams:
                    return StreamsBestOfN(None, requests, short=True)
                n = n_for_cost(
                    prompts.prompts,
                    cost,
                    horizon=horizon,
                    min_samples=min_samples,
                    min_streams=min_streams,
                )
                return StreamsBestOfN(n, requests)

            return build
        if key == CENSORED_KEY:
            censored = self.censoring_floor(CUT_SHARE_MIN)
            if censored is None:
                return lambda: None
            floor, streams = censored[0], list(self.streams)  # kept streams never change
            return lambda: fit_censored(streams, floor, requests)
        if key != LIKELIHOOD_KEY:
            return super().prepare(key)
        streams, step = list(self.streams), self.lattice_step()
        return lambda: FittedShape.fit(streams, requests, step=step)

    def install(self, key: Any, table: Any) -> bool:
        """Keep a finished build unless one fitted on more requests is already there."""
        if key not in (LIKELIHOOD_KEY, CENSORED_KEY):
            return super().install(key, table)
        name = "likelihood_shape" if key == LIKELIHOOD_KEY else "censored"
        cached = getattr(self, name)
        if table is None or (cached is not None and cached.requests > table.requests):
            return False
        setattr(self, name, table)
        return True

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            **{k: getattr(self, k) for k in _COUNTERS},
            **{k: list(getattr(self, k)) for k in _BIN_COUNTERS},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostShapePrior:
        """Restore :meth:`to_dict`'s snapshot. A snapshot from before the whole-shape test has
        no bin counts: its shape is kept, and trusted again once requests learned after the
        restore have given that test enough counts of its own."""
        prior = super().from_dict(data)
        prior.likelihood = True  # a snapshot from before the likelihood path keeps streams now
        for key in _COUNTERS:
            setattr(prior, key, type(getattr(prior, key))(data.get(key, 0)))
        size = len(SHAPE_TEST_EDGES) + 1
        for key in _BIN_COUNTERS:
            values = data.get(key, [0.0] * size)
            if not (isinstance(values, list) and len(values) == size):
                raise ValueError(f"{key} must be a list of {size} numbers")
            counts = [float(v) for v in values]
            if not all(math.isfinite(v) and v >= 0.0 for v in counts):
                raise ValueError(f"{key} must hold finite counts >= 0")
            setattr(prior, key, counts)
        return prior


def _refit_due(fitted_at: int, requests: int) -> bool:
    """Refit once requests grew by half (at least 4, at most ``REFIT_EVERY``) since the fit."""
    return requests >= fitted_at + min(max(4, fitted_at // 2), REFIT_EVERY)


_COUNTERS = (
    "shape_requests",
    "tail_hits",
    "tail_hits_sq",
    "tail_draws",
    "bin_requests",
    "bin_draws",
)
_BIN_COUNTERS = ("bin_hits", "bin_hits_sq")


def cost_shape_prior() -> CostShapePrior:
    """A fresh cost-mode deployment prior (what ``new_deployment_prior("cost")`` returns)."""
    return CostShapePrior()


def dispersion_limit(shape_requests: int) -> float:
    """The largest dispersion at which the prompts are taken to share their shape, after
    ``shape_requests`` learned requests: ``EARLY_MAX_DISPERSION`` while the tests are noisy,
    ``MAX_DISPERSION`` after ``EARLY_REQUESTS``."""
    return EARLY_MAX_DISPERSION if shape_requests < EARLY_REQUESTS else MAX_DISPERSION


def shapes_differ(prior: CostShapePrior) -> bool:
    """Has a shared-shape test found the prompts to differ (:attr:`CostShapePrior.dispersion`
    or :attr:`CostShapePrior.shape_dispersion` above :func:`dispersion_limit`)? A test
    without counts yet (fewer than 2 requests of ``min_rewards``) has found nothing: requests
    that a blend sends sampling long are the ones that give it counts."""
    limit = dispersion_limit(prior.shape_requests)
    return any(d is not None and d > limit for d in (prior.dispersion, prior.shape_dispersion))

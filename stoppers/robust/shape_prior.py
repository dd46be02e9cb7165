"""A deployment's learned reward shape, for target mode: what one request cannot see alone.

Why: the cheapest rule that delivers a mean acceptance ``t`` when the prompt's reward
distribution is known is a threshold rule - stop at the first reward v whose acceptance
h(v) = E[AR_kappa(V) | V >= v] reaches t (the Lagrangian form of Weitzman's rule, Definition
"Fair-cap value", on the AR scale). Acceptance (Definition "Acceptance Rate") is invariant to
the reward's location but not to its scale, and it depends on the far tail through kappa (the
alpha-quantile, Definition "Benchmark Reward"), which a handful of rewards cannot pin down. The
prompts of one deployment share a generator and a reward model, so they share the *shape* of
their standardised rewards z = (v - mean) / sd and a distribution of scales sd. This prior
learns both from finished requests and turns them into a stop table for the policy
(:class:`stoppers.robust.pooled_target.PooledTargetAcceptance`).

What it keeps (bounded, JSON-safe):

* a histogram of standardised rewards: each observed reward of a finished request (after its
  first few) standardised by that request's mean and sd *before* the draw. Pooling every
  observed draw of stopped streams is unbiased in aggregate by Wald's identity
  (E[#draws in A] = E[N] P(A) for a stopping time N) - the stopped-early streams' high last
  draws balance the truncated ones - provided the standardisation is predictable; standardising
  by the request's final mean and sd instead made the shape far too light-tailed after short
  runs (measured: a 0.7 target delivered 0.61 on normal rewards);
* a histogram of log sd (the scales the requests saw);
* (default) the first ``STREAM_REWARDS`` rewards of each of the last ``STREAM_REQUESTS``
  requests, for the likelihood shape below (at most 256 x 96 floats).

What it derives (:func:`build_table`, with the rule and its calibration from
:mod:`stoppers.robust.stop_table`; cached, rebuilt as evidence grows by ``rebuild_growth``;
at most ``max_tables`` tables are kept, least recently used dropped first):

* ``z_star(log s)``: for a prompt of scale s, the standardised threshold whose conditional mean
  acceptance is t under the learned shape (the known-distribution rule);
* ``offset``: a Monte Carlo correction of that plug-in rule. The policy estimates mean and
  scale from its own few rewards (the scale shrunk to the learned scale distribution); the
  resulting first-crossing rule has a small-sample bias, so we simulate it on prompts drawn
  from the learned shape and scales and bisect the additive offset on z_star at which the
  simulated mean acceptance equals t.

Where most kept streams sit on a lattice (integer or rounded judge scores,
:meth:`ShapePrior.lattice_step`) the shape is fitted to them dequantized
(:func:`~stoppers.robust.likelihood_cost.dequantized`) and
the offset is calibrated on simulated streams rounded to the lattice and judged against a
benchmark on it (:func:`~stoppers.robust.stop_table.on_lattice`): fitted and calibrated as if
continuous, integer scores got a lumpy shape and a rule that asked for kappa's level more
often than the target needed (docs/robust-stopping.md, "Target mode calibrated on the lattice").

The histogram is *what the prior records*, not the shape: predictive draws of short stopped
streams, mapped by normal theory, make a skewed or heavy shape's body too wide and its tail too
light (measured on Student-t(3): recorded 0.9-quantile 1.32 against 0.95; a table built on the
record delivered 0.62-0.64 for a 0.7 target on Gumbel / Student-t rewards). So by default
(``likelihood=True``) the prior also keeps the raw reward streams of its most recent
``STREAM_REQUESTS`` requests, and a build fits the shape to them by likelihood
(:mod:`stoppers.robust.shape_likelihood`: each stream's location and scale integrated out, EM
on a histogram, a generalised Pareto tail above the 0.9-quantile) - a likelihood the stopping
rule does not bend. The recorded histogram remains the shape with ``likelihood=False`` (the
earlier default, for comparison), until ``LIKELIHOOD_MIN_STREAMS`` streams are kept (a snapshot
restored from before the streams), and for the cost-mode subclass. With
``ShapePrior(likelihood=False, deconvolve=True)`` (opt-in; docs/robust-stopping.md "Target mode on a
deployment"), before the plug-in rule :func:`build_table` deconvolves the recorded histogram
(:mod:`stoppers.robust.shape_deconvolve`):
the shape is a two-parameter (Tukey g-and-h) map of it, fitted so that streams simulated from
it, stopped by the rule and recorded as :meth:`ShapePrior.update` records them reproduce the
recorded quantiles. The normal shape is a fixed point. A build runs ~7 calibration-sized
simulations (~0.3 s idle).

Where a table is built: a build costs ~0.035 s of CPU on the recorded histogram, ~0.3-0.7 s
with the likelihood shape (a full set of kept streams; ~85 MB peak) and ~0.3-1.5 s with the
deconvolution.
By default :meth:`ShapePrior.table` builds a missing or stale table on the spot (offline replay
and reports: same numbers every run). A server sets :attr:`ShapePrior.schedule_build`: then
``table()`` never builds - it returns the newest cached table for the key (stale or not; None if
there is none) and hands the missing/stale key to that hook, which runs
:meth:`ShapePrior.prepare`'s snapshot build on a worker thread and puts the result back with
:meth:`ShapePrior.install`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from stoppers.robust.ceiling import (
    FloorBound,
    RewardCeiling,
    RewardFloor,
    ceiling_of,
    floor_of,
)
from stoppers.robust.censored_cost import fit_censored
from stoppers.robust.cut_interior import CutInterior
from stoppers.robust.floor_table import (
    CEILING_SHARE_MAX,
    FLOOR_SHARE_MIN,
    INTERIOR_STREAMS_MIN,
    FloorTable,
    build_floor_table,
    ceiling_share,
    floor_share,
    interior_streams,
)
from stoppers.robust.likelihood_cost import (
    EDGES,
    TIED_MAX,
    FittedShape,
    dequantized,
    shared_step,
    stream_step,
    stream_ties,
)
from stoppers.robust.pile import RewardPile
from stoppers.robust.shape_deconvolve import deconvolve_shape, predictive_to_normal
from stoppers.robust.shape_likelihood import _rebin, fit_shapes
from stoppers.robust.stop_table import (
    S_BINS,
    SIM_HORIZON,
    SIM_STREAMS,
    Z_BINS,
    Z_EDGES,
    StopTable,
    TableKey,
    calibrate,
    calibrated_on,
    plug_in,
    s_bin,
    z_bin,
)
from stoppers.robust.stream_bootstrap import (
    BOOTSTRAP_MIN_STREAMS,
    LIGHT_TAIL_XI,
    STREAM_MIN_REWARDS,
    StreamPrompts,
    n_for_target,
    pseudo_prompts,
)
from stoppers.robust.xi_prior import MIN_REQUESTS as XI_MIN_REQUESTS
from stoppers.robust.xi_prior import XiPrior

__all__ = ["MAX_TABLES", "AnyTable", "ShapePrior", "build_table"]

AnyTable = StopTable | FloorTable  # what a target build makes: censored where a floor piles up
MAX_TABLES = 32  # stop tables cached per prior (LRU): client-chosen keys cannot grow memory
STREAM_REQUESTS = 256  # the likelihood shape is fitted to the most recent requests' streams,
STREAM_REWARDS = 96  # ... each cut to its first rewards (a fixed cut keeps the likelihood valid)
# A deployment's traffic drifts (a new generator behind the same model name, another mix of
# prompts). Past SCALE_MEMORY learned requests the scale histogram and the recorded shape are
# scaled down before each new request's counts (exponential forgetting with that memory), and a
# table is rebuilt at the latest REBUILD_EVERY requests after it was built, not only when the
# request count doubles (a table built at 10,000 requests waited for 20,000). After the scales
# doubled at request 400, a 0.9 target delivered 0.81-0.83 for 250 requests and 0.88 after;
# with these, 0.84 for 100 and 0.88-0.91 after (docs/robust-stopping.md, "A deployment whose
# rewards drift"). A deployment of up to 128 requests decides as before.
SCALE_MEMORY = 128
REBUILD_EVERY = 64
LIKELIHOOD_MIN_STREAMS = 10  # fewer kept streams (a restored old snapshot): the recorded shape
# The target default takes a fitted shape's modes at their word (multimodal_shape) only from
# this many requests' streams: fits to 8-10 streams of unimodal families came out bimodal in 1
# of 280 (seed-0 pools), none from 16 (likelihood_cost.MODE_DIP); a unimodal deployment misread
# as bimodal would run the multiplier rule, which under-delivers on long tails.
MULTIMODAL_MIN_REQUESTS = 16
# A lattice this fine against the streams' spread (median stream sd) is rounding, not a judge's
# levels: bfloat16 scores (8 significant bits) at a reward model's usual level of ~20 step by
# 1/8, and their streams tie though their density is as continuous as float32's. There the
# two-mode test reads the fit as for continuous rewards (multimodal_shape); at 0.25 sd and
# coarser (rounded or integer scores) it does not, as before.
FINE_LATTICE = 0.2


@dataclass
class ShapePrior:
    """Pooled standardised shape and scale distribution of one deployment (target mode).

    ``min_rewards``: requests with fewer rewards teach nothing (their sd is too noisy).
    ``rebuild_growth``: stop tables are rebuilt when the request count has grown by this factor
    since they were built (and at least by one request), or by ``REBUILD_EVERY`` requests.
    ``alpha``: the benchmark percentile the tables use (the policy's).
    ``likelihood``: build tables on the shape fitted by likelihood to the raw reward streams of
    the most recent ``STREAM_REQUESTS`` requests (:mod:`stoppers.robust.shape_likelihood`; the
    default). False: on the recorded histogram of predictive draws (the earlier default; kept for
    comparison and used until ``LIKELIHOOD_MIN_STREAMS`` streams are kept).
    ``deconvolve``: with the recorded histogram, fit the shape to what the prior records before
    building a table (:func:`build_table`). Opt-in: more target cells within 0.03 than the recorded
    histogram but fewer samples saved (docs/robust-stopping.md, "Target mode on a deployment").
    ``streams``: the kept streams (lists of floats, oldest first); persisted.
    ``ceiling`` / ``floor``: the top / bottom of the reward scale once requests keep reaching it
    exactly (:mod:`stoppers.robust.ceiling`; learned from every request offered, persisted).
    ``pile``: how often a repeated first reward was passed (:mod:`stoppers.robust.pile`; learned
    from every request of two rewards or more, persisted): where the deployment's repeated bests
    are its prompts' tops, every policy stops at one (stop reason ``"repeated"``).
    ``xi``: the deployment's distribution of the GPD tail shape
    (:class:`~stoppers.robust.xi_prior.XiPrior`), learned from every request of >= 8 rewards
    and persisted. The cold start of both defaults reads it (cost mode since 2026-11-25, target
    mode since 2026-11-28), so a request that cannot use the learned shape yet still gets a tail
    of the kind its deployment's requests have shown.
    ``scale_shrink``: in [0, 1], the weight of the learned scales against a request's own sd
    (the tables' scale-prior precision is multiplied by it). 1 (default): the Bayes posterior, which
    saves the most but lets wide prompts get less than the target and narrow ones more; smaller
    values trade savings for each prompt getting closer to its target (docs/robust-stopping.md,
    "Target mode on a deployment", per-spread table). A setting, not evidence: not persisted; set it
    before the first table is built (the gateway does when it creates or restores the prior).
    ``max_tables``: stop tables kept (LRU; not persisted).
    ``schedule_build``: None (default) - :meth:`table` builds a missing or stale table itself,
    blocking for ~0.05-0.7 s. A callable ``(prior, key)`` - :meth:`table` never builds; it
    returns the newest cached table (or None) and calls the hook when the key's table is
    missing or stale (the gateway runs the build on a worker thread). Not persisted.
    """

    min_rewards: int = 4
    rebuild_growth: float = 2.0
    alpha: float = 0.99  # default benchmark percentile of the tables
    requests: int = 0
    likelihood: bool = True
    deconvolve: bool = False
    z_counts: Any = field(default_factory=lambda: np.zeros(Z_BINS), repr=False)
    s_counts: Any = field(default_factory=lambda: np.zeros(S_BINS), repr=False)
    streams: list[list[float]] = field(default_factory=list, repr=False)
    ceiling: RewardCeiling = field(default_factory=RewardCeiling)  # persisted
    floor: RewardFloor = field(default_factory=RewardFloor)  # persisted
    pile: RewardPile = field(default_factory=RewardPile)  # persisted
    xi: XiPrior = field(default_factory=XiPrior)  # persisted
    scale_shrink: float = field(default=1.0, compare=False)  # a setting: not persisted
    max_tables: int = field(default=MAX_TABLES, repr=False, compare=False)
    schedule_build: Callable[[ShapePrior, TableKey], None] | None = field(
        default=None, repr=False, compare=False
    )
    _tables: OrderedDict[TableKey, AnyTable] = field(
        default_factory=OrderedDict, repr=False, compare=False
    )
    # the likelihood shape of the newest build and whether its streams ended the upper tail
    # (fit_shapes), by the request count it was fitted at: every table key built at that count
    # shares one fit (not persisted)
    _fitted: dict[int, tuple[np.ndarray, bool]] = field(
        default_factory=dict, repr=False, compare=False
    )
    # that fit as a FittedShape (multimodal_shape), by the request count it was fitted at, and
    # the StreamFacts of each kept stream, kept in step with them (tied_streams, lattice_step,
    # CostShapePrior.stream_maxima); not persisted
    _shape: tuple[int, FittedShape] | None = field(default=None, repr=False, compare=False)
    # piled_floor's share at the floor (None: no floor to read), at a state of (requests,
    # streams kept, floor, ceiling)
    _piled: tuple[tuple, float | None] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    # censoring_floor's interior streams at that state, read when first asked for (None: not yet)
    _interior: list[list[float]] | None = field(default=None, init=False, repr=False, compare=False)
    # the request count since which censoring_floor has held (None: it does not); a plain
    # table built before it is stale (is_stale)
    _censoring_from: int | None = field(default=None, init=False, repr=False, compare=False)
    # the interior shape of the newest floor-table build (build_floor_table), by request count
    _fitted_interior: dict[int, np.ndarray | None] = field(
        default_factory=dict, repr=False, compare=False
    )
    # ... and the latent shape cut at the floor where that build read the floor as a cut (None:
    # as censoring an interior the prompts share), by request count
    _cut_interior: dict[int, CutInterior | None] = field(
        default_factory=dict, repr=False, compare=False
    )
    # the kept streams read as pseudo-prompts (stream_bootstrap), by (requests, streams, alpha,
    # floor, ceiling): every target's build reads the same ones
    _pseudo_prompts: dict[tuple, StreamPrompts] = field(
        default_factory=dict, repr=False, compare=False
    )
    _facts: list[StreamFacts] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.z_counts) != Z_BINS or len(self.s_counts) != S_BINS:
            raise ValueError(f"z_counts/s_counts must have {Z_BINS}/{S_BINS} bins")
        if not (0.0 < self.alpha < 1.0) or self.rebuild_growth < 1.0 or self.min_rewards < 2:
            raise ValueError("need 0 < alpha < 1, rebuild_growth >= 1 and min_rewards >= 2")
        if self.max_tables < 1:
            raise ValueError(f"max_tables must be >= 1, got {self.max_tables}")
        if self.likelihood and self.deconvolve:
            raise ValueError("deconvolve applies to the recorded histogram: pass likelihood=False")
        if not 0.0 <= self.scale_shrink <= 1.0:
            raise ValueError(f"scale_shrink must be in [0, 1], got {self.scale_shrink!r}")
        self.z_counts = np.array(self.z_counts, dtype=np.float64)
        self.s_counts = np.array(self.s_counts, dtype=np.float64)
        self.streams = _streams_of(self.streams)

    # -- learning ---------------------------------------------------------------------------
    def update(self, rewards: Any) -> bool:
        """Learn from one finished request's observed rewards (observation order)."""
        x = np.asarray(rewards, dtype=np.float64)
        tail_learned = x.ndim == 1 and self.xi.update(x)  # XiPrior refuses non-finite rewards
        return self.learn_shape(x) or tail_learned

    def learn_shape(self, x: np.ndarray) -> bool:
        """:meth:`update` without the tail-shape prior: the scale's ends, the shape, the scale."""
        if x.ndim == 1:
            self.note_ends(x)
        if x.ndim != 1 or x.size < self.min_rewards or not np.all(np.isfinite(x)):
            return False
        sd = float(x.std(ddof=1))
        if not sd > 0.0:
            return False
        z = self._standardise(x)
        self.forget()
        self.z_counts += np.bincount(z_bin(z), minlength=Z_BINS)
        self.count_request(x, sd)
        return True

    def count_request(self, x: np.ndarray, sd: float) -> None:
        """Count one learned request (after :meth:`forget`): its sd in the scale histogram, the
        request count, and its stream where the likelihood shape is kept."""
        self.s_counts[s_bin(np.array([math.log(sd)]))[0]] += 1.0
        self.requests += 1
        if self.likelihood:
            self.keep_stream(x)

    def forget(self) -> None:
        """Make room for one more request's counts: once the scale histogram holds
        ``SCALE_MEMORY`` requests, scale it and the recorded shape so they hold one fewer
        (each request's weight then decays by (1 - 1/SCALE_MEMORY) per request learned after
        it). Both are read normalised, so only the old requests' share changes."""
        total = float(self.s_counts.sum())
        if total > SCALE_MEMORY - 1:
            keep = (SCALE_MEMORY - 1) / total
            self.s_counts *= keep
            self.z_counts *= keep

    def keep_stream(self, x: np.ndarray) -> None:
        """Keep the first ``STREAM_REWARDS`` of a finished request's rewards (the last
        ``STREAM_REQUESTS`` requests' are kept), with its tie flag and lattice step
        (:meth:`tied_streams`, :meth:`lattice_step`)."""
        stream = x[:STREAM_REWARDS].tolist()
        if self._facts is not None and len(self._facts) == len(self.streams):
            self._facts.append(_stream_facts(stream))
            del self._facts[:-STREAM_REQUESTS]
        else:
            self._facts = None  # out of step (a restore): recounted when next asked
        self.streams.append(stream)
        del self.streams[:-STREAM_REQUESTS]

    def note_ends(self, x: np.ndarray) -> None:
        """Learn the scale's ends from every request: one all tied at a clip says most."""
        step = self.lattice_step()  # a two-level request is read on it
        self.ceiling.note(x, step=step)
        self.floor.note(x, step=step)
        self.pile.note(x)

    def _standardise(self, x: np.ndarray) -> np.ndarray:
        """Each draw after the first ``min_rewards - 1`` against the mean and sd *before* it.

        Those estimates are predictable (fixed before the draw), so each standardised draw is
        a fresh draw from the predictive distribution, whatever the stopping rule did; pooled,
        they estimate the shape by Wald's identity. The predictive law is wider and heavier-tailed
        than the shape (after k draws, (X - mean) / (sd sqrt(1 + 1/k)) is Student-t with k - 1
        degrees of freedom for normal X); a quantile map t -> normal removes that. A plain
        variance rescaling left the learned 0.99-quantile at 3.0 instead of 2.33 on normal
        rewards (measured), and the policy over-delivered.
        """
        n = x.size
        k = np.arange(1, n + 1, dtype=np.float64)
        mean = np.cumsum(x) / k
        var = (np.cumsum(x * x) - k * mean * mean) / np.maximum(k - 1, 1)
        prev_mean, prev_sd = mean[:-1], np.sqrt(np.maximum(var[:-1], 0.0))
        keep = prev_sd > 0.0  # a draw after all-tied ones has no predictive scale: skip it
        keep[: self.min_rewards - 1] = False
        past = k[:-1][keep]  # draws the estimates were made from
        t = (x[1:][keep] - prev_mean[keep]) / (prev_sd[keep] * np.sqrt(1.0 + 1.0 / past))
        return predictive_to_normal(past, t)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe snapshot (sparse histograms), restore with :meth:`from_dict`."""
        return {
            "min_rewards": self.min_rewards,
            "rebuild_growth": self.rebuild_growth,
            "alpha": self.alpha,
            "requests": self.requests,
            "likelihood": self.likelihood,
            "deconvolve": self.deconvolve,
            "z_counts": {str(i): float(c) for i, c in enumerate(self.z_counts) if c},
            "s_counts": {str(i): float(c) for i, c in enumerate(self.s_counts) if c},
            "streams": [list(stream) for stream in self.streams],
            "ceiling": self.ceiling.to_dict(),
            "floor": self.floor.to_dict(),
            "pile": self.pile.to_dict(),
            "xi": self.xi.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShapePrior:
        """Restore :meth:`to_dict`'s snapshot; ValueError on anything it could not have written.

        A snapshot from before the likelihood shape has no streams: its tables use the recorded
        histogram until ``LIKELIHOOD_MIN_STREAMS`` requests have been learned after the restore.
        One from before the tail-shape prior has no ``xi``: the cold start learns it afresh.
        """
        z = _histogram(data.get("z_counts", {}), Z_BINS, "z_counts")
        s = _histogram(data.get("s_counts", {}), S_BINS, "s_counts")
        deconvolve = bool(data.get("deconvolve", False))
        default = cls.__dataclass_fields__["likelihood"].default and not deconvolve
        likelihood = data.get("likelihood", default)
        return cls(
            min_rewards=int(data.get("min_rewards", 4)),
            rebuild_growth=float(data.get("rebuild_growth", 2.0)),
            alpha=float(data.get("alpha", 0.99)),
            requests=int(data.get("requests", 0)),
            likelihood=bool(likelihood),
            deconvolve=deconvolve,
            z_counts=z,
            s_counts=s,
            streams=data.get("streams", []),
            ceiling=RewardCeiling.from_dict(data.get("ceiling")),
            floor=RewardFloor.from_dict(data.get("floor")),
            pile=RewardPile.from_dict(data.get("pile")),
            xi=XiPrior.from_dict(data.get("xi")),
        )

    # -- what the policy reads -----------------------------------------------------------------
    def tied_streams(self) -> float:
        """:func:`~stoppers.robust.likelihood_cost.tied_fraction` of the kept streams, from
        flags kept in step with them (each new request adds one; a full recount, ~2 ms for
        256 streams, only after a restore)."""
        counted = [t for t in self._tie_flags() if t is not None]
        return sum(counted) / len(counted) if counted else 0.0

    def lattice_step(self) -> float | None:
        """:func:`~stoppers.robust.likelihood_cost.shared_lattice_step` of the kept streams, from
        steps kept in step with them: the lattice the deployment scores on (integer or rounded
        judge ratings), else None."""
        return shared_step([facts.step for facts in self.stream_facts()])

    def fine_lattice(self) -> bool:
        """The kept streams tie only by rounding: they sit on a lattice whose step is at most
        ``FINE_LATTICE`` of their median sd, and the deployment has no established ceiling or
        floor (a clip's point mass, which a density cannot fit). bfloat16 scores at a level of
        ~20 tie so; their fitted shape's modes are read as continuous rewards' are
        (docs/robust-stopping.md, "Rewards in bfloat16")."""
        step = self.lattice_step()
        if step is None or ceiling_of(self) is not None or floor_of(self) is not None:
            return False
        spreads = [facts.sd for facts in self.stream_facts() if facts.sd > 0.0]
        return bool(spreads) and step <= FINE_LATTICE * float(np.median(spreads))

    def _tie_flags(self) -> list[bool | None]:
        """stream_ties of each kept stream, in step with them (recounted after a restore)."""
        return [facts.tied for facts in self.stream_facts()]

    def stream_facts(self) -> list[StreamFacts]:
        """:class:`StreamFacts` of each kept stream, in step with them (recounted after a
        restore)."""
        if self._facts is None:
            self._facts = [_stream_facts(stream) for stream in self.streams]
        return self._facts

    def fit_streams(self) -> list[list[float]]:
        """The kept streams the likelihood shape is fitted to: the continuous ones where they
        are the majority (and at least ``LIKELIHOOD_MIN_STREAMS``), else all of them.

        A histogram density has no room for a clip's point mass or a rounding lattice, so a minority
        of tied streams - the clipped prompts of a deployment whose other prompts score on a
        continuum - bends the shape every request's table is built on (a fifth of clipped streams
        among normal ones pulled the fit's 0.9-quantile from 1.25-1.29 to 1.13-1.21, tested). In
        replay on ``mixed`` (a seventh clipped) the calibrated tables had absorbed most of it: warm
        saves moved within +-0.03 (docs/robust-stopping.md "Target mode on a deployment"). Where
        tied streams are the majority (a clipped or judge-logit deployment) they are the deployment,
        and all are fitted as before.
        """
        ties = self._tie_flags()
        continuous = [s for s, tied in zip(self.streams, ties, strict=True) if not tied]
        if len(continuous) >= LIKELIHOOD_MIN_STREAMS and 2 * len(continuous) > len(ties):
            return continuous
        return list(self.streams)

    def multimodal_shape(self) -> FittedShape | None:
        """The newest table build's likelihood shape if it has more than one mode, was fitted
        to at least ``MULTIMODAL_MIN_REQUESTS`` requests' streams, the kept streams are
        continuous (at most ``TIED_MAX`` of them repeat their rewards, or they tie only by
        rounding: :meth:`fine_lattice`, since 2026-11-30), and they do not end its upper tail;
        else None.

        Never fits: it reads the fit the table builds made (None before the first). Where it
        is not None the target default decides with
        :class:`~stoppers.robust.multiplier_target.MultiplierTargetRule` (a bulk and a better
        mode: the mean and sd its table rule judges the best by mix the modes).

        Why the end: a flat-topped shape that stops abruptly (uniform rewards) often fits with
        two bumps, and 59-68% of uniform streams of 24-96 rewards pass the per-stream two-mode
        test (against 57-92% of mixture's), so neither tells it from a bulk with a better mode.
        The streams ending the tail does (:func:`~stoppers.robust.shape_likelihood.fit_shapes`).
        There the multiplier rule lost where the table rule and its Best-of-N check did not:
        on `uniform` at 0.9 it saved -0.21 where the table rule alone saved -0.04
        (docs/robust-stopping.md, "Two modes or a flat top that ends").
        """
        builds = list(self._fitted.items())  # a build on another thread replaces it whole
        if not builds:
            return None
        tied = self.tied_streams()
        if tied > TIED_MAX and not self.fine_lattice():
            return None
        requests, (p, ended) = builds[-1]
        if requests < MULTIMODAL_MIN_REQUESTS or ended:
            return None
        cached = self._shape
        if cached is None or cached[0] != requests:
            shape = FittedShape(
                p=_rebin(p, Z_EDGES, EDGES),
                requests=requests,
                streams=len(self.streams),
                tied=tied,
            )
            cached = self._shape = (requests, shape)
        return cached[1] if cached[1].modes > 1 else None

    def table_key(
        self, target: float, *, min_samples: int, horizon: int, alpha: float | None = None
    ) -> TableKey:
        """The cache key of a table: one table per target to 3 decimals (a client-chosen target
        cannot force endless builds), min_samples, horizon and alpha."""
        alpha = self.alpha if alpha is None else float(alpha)
        return (round(float(target), 3), int(min_samples), int(horizon), alpha)

    def table(
        self, target: float, *, min_samples: int, horizon: int, alpha: float | None = None
    ) -> AnyTable | None:
        """The stop table for this target (None while the prior is empty); cached.

        Without :attr:`schedule_build` a missing or stale table is built here (blocking).
        With it, nothing is built here: the newest cached table (even stale, None if none) is
        returned and the hook is asked to build the missing/stale one elsewhere.
        """
        if self.requests == 0:
            return None
        return self._built(
            self.table_key(target, min_samples=min_samples, horizon=horizon, alpha=alpha)
        )

    def _built(self, key: Any) -> Any:
        """``key``'s build (:meth:`prepare`), cached: made here when missing or stale, or, with
        :attr:`schedule_build`, the newest cached one (None if none) while the hook builds."""
        if self.schedule_build is not None:
            cached = self._lookup(key)
            if self.is_stale(key):
                self.schedule_build(self, key)
            return cached
        if not self.is_stale(key):
            return self._lookup(key)
        built = self.prepare(key)()
        self.install(key, built)
        return built

    def cached_table(
        self, target: float, *, min_samples: int, horizon: int, alpha: float | None = None
    ) -> AnyTable | None:
        """The newest cached table for this target, stale or not (None if none). Never builds."""
        if self.requests == 0:
            return None
        return self._lookup(
            self.table_key(target, min_samples=min_samples, horizon=horizon, alpha=alpha)
        )

    def is_stale(self, key: TableKey) -> bool:
        """True if ``key``'s table is missing or built on too little or too old evidence (the
        request count has grown by ``rebuild_growth`` or by ``REBUILD_EVERY`` since, and by at
        least one); False for an empty prior."""
        if self.requests == 0:
            return False
        cached = self._tables.get(key)
        if cached is None:
            return True
        if self._reading_changed(cached):
            return True
        due = min(cached.requests * self.rebuild_growth, cached.requests + REBUILD_EVERY)
        return self.requests >= max(cached.requests + 1, due)

    def _reading_changed(self, cached: AnyTable) -> bool:
        """Is ``cached`` built on a reading of the floor the deployment has since left: a plain
        table from before the floor could be read as censoring (:meth:`censoring_floor`; the
        policy runs the cold start rather than use it), or a censored table for a floor no
        longer read so? A plain table built after (the censored build failed) is not."""
        if isinstance(cached, FloorTable):
            censored = self.censoring_floor()
            return censored is None or censored[0].value != cached.floor
        since = self._floor_state()[1]
        return since is not None and cached.requests < since

    def prepare(self, key: TableKey) -> Callable[[], AnyTable]:
        """A build of ``key``'s table on a snapshot of the evidence now (copies of the
        histograms, the kept streams): the returned function touches nothing of this prior but
        its one-entry cache of the fitted shape (replaced whole; builds run one at a time), so it
        may run on another thread while :meth:`update` goes on. Put its result back with
        :meth:`install`.
        """
        if self.requests == 0:
            raise ValueError("an empty prior has no table to build")
        target, min_samples, horizon, alpha = key
        z_counts, s_counts, requests = self.z_counts.copy(), self.s_counts.copy(), self.requests
        options = {
            "min_rewards": self.min_rewards,
            "deconvolve": self.deconvolve,
            "scale_shrink": self.scale_shrink,
        }
        step = self.lattice_step()  # rounded scores: fitted and calibrated on the lattice
        streams = self.fit_streams() if self.likelihood else []  # kept streams never change
        # target tables read a floor from FLOOR_SHARE_MIN at it, as a cut or as censoring: under
        # it a cut table ran Best-of-N where the plain table's rule drew fewer (`floored`, sd 1:
        # saves +0.20 -> +0.01 at 0.9; docs/robust-stopping.md, "The cut read in target mode")
        censored = self.censoring_floor()
        kept = list(self.streams) if censored is not None or step is None else []
        ends = self._stream_ends()
        fitted_cache, interior_cache = self._fitted, self._fitted_interior
        cut_cache, prompts_cache = self._cut_interior, self._pseudo_prompts
        light_tails = self._light_tails(XI_MIN_REQUESTS)

        def build() -> AnyTable:
            table = build_shaped()
            plain = isinstance(table, StopTable)
            # a lattice's streams hold only the levels they drew; heavy tails pass the kernels
            # (they would place a heavy tail's benchmark too low)
            if step is not None or not light_tails or not (plain or _best_of_n_sizes(table)):
                return table
            prompts = _stream_prompts(prompts_cache, kept, requests, alpha, ends)
            # smooth streams, untopped by lumps: the table's own smooth shape is right
            if not prompts.lumpy:
                return table
            if plain:
                return streams_calibrated(table, prompts, min_samples, horizon)
            return streams_best_of_n(table, prompts.prompts, min_samples, horizon)

        def build_shaped() -> AnyTable:
            if censored is not None:
                floor, interior = censored
                if requests not in cut_cache:
                    cut_cache.clear()
                    cut_cache[requests] = cut_reading(kept, floor, requests)
                cut = cut_cache[requests]
                inner = None
                if cut is None:
                    if requests not in interior_cache:
                        fit = fit_shapes(dequantized(interior, step), Z_EDGES)
                        interior_cache.clear()
                        interior_cache[requests] = None if fit is None else fit[0]
                    inner = interior_cache[requests]
                table = None
                if inner is not None or cut is not None:
                    table = build_floor_table(
                        inner,
                        interior,
                        floor,
                        target,
                        alpha,
                        min_samples,
                        horizon,
                        requests,
                        scale_shrink=options["scale_shrink"],
                        cut=cut,
                    )
                if table is not None:
                    return table
            shape = z_counts
            if len(streams) >= LIKELIHOOD_MIN_STREAMS:
                cached = fitted_cache.get(requests)
                fitted = None if cached is None else cached[0]
                if cached is None:
                    fit = fit_shapes(dequantized(streams, step), Z_EDGES)
                    if fit is not None:
                        fitted = fit.open
                        fitted_cache.clear()
                        fitted_cache[requests] = (fitted, fit.ended is not None)
                if fitted is not None:
                    shape = fitted
            return build_table(
                shape, s_counts, target, alpha, min_samples, horizon, requests, step=step, **options
            )

        return build

    def piled_floor(self, min_share: float | None = None) -> FloorBound | None:
        """The floor where continuous scores pile up at it: established and piled up
        (:attr:`RewardFloor.clip`), at least ``min_share`` (default ``FLOOR_SHARE_MIN``) of the
        kept rewards at it and less than ``CEILING_SHARE_MAX`` at an established ceiling; else
        None. The test is run once per state of the requests, streams, floor and ceiling (it
        reads every kept reward); the floor's learned p and lift are read fresh."""
        share = self._floor_state()[0]
        least = FLOOR_SHARE_MIN if min_share is None else min_share
        # read fresh: g and lift move per update
        return floor_of(self) if share is not None and share >= least else None

    def _floor_state(self) -> tuple[float | None, int | None]:
        """(share of the kept rewards at a floor that may be read as censoring - None: none
        may - and the request count since which :meth:`censoring_floor` holds at the default
        share), recomputed when the requests, streams, floor or ceiling change."""
        key = (self.requests, len(self.streams), self.floor.clip, self.ceiling.bound)
        cached = self._piled
        if cached is None or cached[0] != key:
            cached = self._piled = (key, self._piled_share())
            self._interior = None
            if self.censoring_floor() is None:  # at the state just cached
                self._censoring_from = None
            elif self._censoring_from is None:
                self._censoring_from = self.requests
        return cached[1], self._censoring_from

    def _piled_share(self) -> float | None:
        if not self.likelihood or self.floor.clip is None or self.lattice_step() is not None:
            return None  # the floor table simulates no lattice: rounded scores keep the plain one
        floor = floor_of(self)
        if floor is None:
            return None
        top = self.ceiling.bound  # a pile-up at the top censors the interior too, unsimulated
        if top is not None and ceiling_share(self.streams, top) >= CEILING_SHARE_MAX:
            return None
        return floor_share(self.streams, floor.value)

    def censoring_floor(
        self, min_share: float | None = None
    ) -> tuple[FloorBound, list[list[float]]] | None:
        """The floor and the kept streams' interiors where target tables read the floor as
        censoring (:mod:`stoppers.robust.floor_table`): a :meth:`piled_floor` at ``min_share``,
        and ``INTERIOR_STREAMS_MIN`` kept streams with ``INTERIOR_MIN`` rewards above it. With
        a ``min_share`` under ``FLOOR_SHARE_MIN`` (cost mode's ``CUT_SHARE_MIN``), a floor only
        a cut reading may decide on."""
        floor = self.piled_floor(min_share)
        if floor is None:
            return None
        if self._interior is None:  # every request asks: read the streams once per state
            self._interior = interior_streams(self.streams, floor.value)
        interior = self._interior
        return (floor, interior) if len(interior) >= INTERIOR_STREAMS_MIN else None

    def streams_readable(
        self, min_streams: int = BOOTSTRAP_MIN_STREAMS, xi_requests: int = XI_MIN_REQUESTS
    ) -> bool:
        """What :meth:`lumpy_streams` needs before it reads anything: light tails (the mean of
        the xi distribution learned from at least ``xi_requests`` requests), continuous rewards
        and ``min_streams`` kept streams long enough to read (cheap to check, so a build is not
        asked for, and cached, before they hold)."""
        if not self._light_tails(xi_requests) or self.lattice_step() is not None:
            return False
        # a stream shorter than the kept length loses its last reward (pseudo_prompts)
        long = sum(len(s) - (len(s) < STREAM_REWARDS) >= STREAM_MIN_REWARDS for s in self.streams)
        return long >= min_streams

    def _light_tails(self, xi_requests: int) -> bool:
        """Does the xi distribution, learned from at least ``xi_requests`` requests, read light
        tails (its mean at most :data:`LIGHT_TAIL_XI`), where kernels may read the streams' tops?"""
        return self.xi.requests >= xi_requests and self.xi.mean_xi <= LIGHT_TAIL_XI

    def _stream_ends(self) -> tuple[float | None, float | None]:
        """(floor, ceiling) the kept streams are read against as pseudo-prompts (None: none)."""
        bound = floor_of(self)
        return (None if bound is None else bound.value, ceiling_of(self))

    def lumpy_streams(
        self,
        alpha: float,
        min_streams: int = BOOTSTRAP_MIN_STREAMS,
        xi_requests: int = XI_MIN_REQUESTS,
        *,
        lumpy_only: bool = True,
    ) -> Callable[[], StreamPrompts | None]:
        """A read of the kept streams as pseudo-prompts on a snapshot taken now (the returned
        function may run on another thread): the :class:`StreamPrompts` where the bootstrap
        reads them, as the target tables do - continuous rewards (a lattice's streams hold only
        the levels they drew), light tails (heavy ones would put the benchmark too low,
        :data:`LIGHT_TAIL_XI`) and lumpy streams (:attr:`StreamPrompts.lumpy`; on smooth ones
        the fitted shape describes every prompt) - else None. ``min_streams`` and
        ``xi_requests``: :meth:`streams_readable`'s. ``lumpy_only=False``: smooth streams are
        read too, for a caller whose alternative is no fitted shape at all (cost mode's cold
        start on a floor the rewards pile up at)."""
        if not self.streams_readable(min_streams, xi_requests):
            return lambda: None
        kept, requests, cache = list(self.streams), self.requests, self._pseudo_prompts
        ends = self._stream_ends()

        def read() -> StreamPrompts | None:
            prompts = _stream_prompts(cache, kept, requests, alpha, ends)
            return prompts if prompts.lumpy or (not lumpy_only and prompts.kernels) else None

        return read

    def install(self, key: TableKey, table: AnyTable) -> bool:
        """Cache ``table`` for ``key`` unless a table built on more evidence is already there;
        the least recently used tables beyond ``max_tables`` are dropped. True if cached."""
        cached = self._tables.get(key)
        if cached is not None and cached.requests > table.requests:
            return False
        self._tables[key] = table
        self._tables.move_to_end(key)
        while len(self._tables) > self.max_tables:
            self._tables.popitem(last=False)
        return True

    def _lookup(self, key: TableKey) -> AnyTable | None:
        cached = self._tables.get(key)
        if cached is not None:
            self._tables.move_to_end(key)
        return cached


class StreamFacts(NamedTuple):
    """What the priors read from one kept stream, computed once as it is kept."""

    tied: bool | None  # stream_ties
    step: float | None  # stream_step: its lattice's step, None if continuous
    size: int
    # its largest reward standardised by its own mean and sd (None: no spread)
    z_max: float | None
    sd: float  # its sample sd (ddof 1; 0.0 for fewer than 2 rewards or none)


def cut_reading(streams: list[list[float]], floor: FloorBound, requests: int) -> CutInterior | None:
    """The latent shape cut at ``floor`` where the kept ``streams`` read as one shape cut there
    (:attr:`~stoppers.robust.censored_cost.CensoredShape.cut`, cost mode's test: one-mode
    interiors, a positive log Bayes factor over the censored reading, skewness not falling with
    the share at the floor); None where they read as censoring a shared interior."""
    reading = fit_censored(streams, floor, requests)
    if reading is None or not reading.cut:
        return None
    assert reading.latent is not None and reading.latent_scale is not None  # by .cut
    return CutInterior(reading.latent.p, *reading.latent_scale)


def _stream_facts(stream: list[float]) -> StreamFacts:
    x = np.asarray(stream, dtype=np.float64)
    sd = float(x.std(ddof=1)) if x.size > 1 else 0.0
    z_max = (float(x.max()) - float(x.mean())) / sd if sd > 0.0 else None
    return StreamFacts(stream_ties(stream), stream_step(stream), x.size, z_max, sd)


def _best_of_n_sizes(table: AnyTable) -> list[int]:
    """The Best-of-N sizes ``table`` runs: its ``fixed_n`` and its rule's ``cap``, if set."""
    return [n for n in (table.fixed_n, table.cap) if n is not None]


def _stream_prompts(
    cache: dict[tuple, StreamPrompts],
    kept: list[list[float]],
    requests: int,
    alpha: float,
    ends: tuple[float | None, float | None],
) -> StreamPrompts:
    """The kept streams ``kept`` read as pseudo-prompts against the deployment's ``ends``
    (floor, ceiling), from ``cache`` (one entry: every build of one state reads the same)."""
    key = (requests, len(kept), alpha, ends)
    if key not in cache:
        cache.clear()
        cache[key] = pseudo_prompts(
            kept, alpha=alpha, floor=ends[0], ceiling=ends[1], kept_length=STREAM_REWARDS
        )
    return cache[key]


def streams_calibrated(
    table: StopTable, prompts: StreamPrompts, min_samples: int, horizon: int
) -> StopTable:
    """``table`` calibrated on streams drawn from the kept streams' pseudo-prompts
    (:meth:`~stoppers.robust.stream_bootstrap.StreamPrompts.draw`) instead of its smooth shape:
    its offset, slope, cap and Best-of-N (:func:`~stoppers.robust.stop_table.calibrated_on`).

    Why: where each prompt holds its own few tight lumps (answers that agree, a judge's
    levels), the shape pooled over the prompts is smooth and none of them is. Calibrated on it,
    the rule waited for values a prompt's top lump never reaches and its Best-of-N was sized for
    the smooth tail: on the `lumpy` family it drew 50 rewards a request at 0.9 where the
    prompts' own Best-of-N drew 20 (docs/robust-stopping.md, "Lumps: the table calibrated on the
    streams"). The caller reads it only where the streams are lumpy and the tails light, as for
    :func:`streams_best_of_n`; where the pseudo-prompts' Best-of-N does not reach the target
    within the simulated streams the table stays as it is."""
    if len(prompts.prompts) < BOOTSTRAP_MIN_STREAMS:
        return table  # too few streams to read: a few smooth ones may read lumpy
    length = min(horizon, SIM_HORIZON)
    x, kappa = prompts.draw(SIM_STREAMS, length, np.random.default_rng([table.requests, 13]))
    calibrated, _ = calibrated_on(table, x, kappa, min_samples)
    return table if calibrated.cap is None else replace(calibrated, on_streams=True)


def streams_best_of_n(
    table: AnyTable,
    prompts: list[tuple[np.ndarray, np.ndarray]],
    min_samples: int,
    horizon: int,
) -> AnyTable:
    """``table`` with its Best-of-N (``fixed_n``, and the ``cap`` that ends its rule's run, for
    ``cap_factor`` times it) lowered to the N the kept streams'
    pseudo-prompts say delivers its target, where they say fewer
    (:mod:`stoppers.robust.stream_bootstrap`). Why lowered only: the table's N comes from one
    smooth shape, which over-delivers on prompts that each hold their own lumps (a judge's);
    where the streams ask for more, the bootstrap's kernels have smeared a hard end past where
    it is (uniform rewards: 20-40% above the true N), which the table's shape holds. The
    caller reads it only where the deployment's tails are light (``LIGHT_TAIL_XI``) and its
    streams lumpy (``StreamPrompts.lumpy``)."""
    if not _best_of_n_sizes(table):
        return table
    n = n_for_target(prompts, table.target, horizon=horizon, min_samples=min_samples)
    if n is None:
        return table
    lowered = {"fixed_n": n, "cap": max(math.ceil(table.cap_factor * n), min_samples)}
    changes = {
        name: lowered[name]
        for name in ("fixed_n", "cap")
        if (value := getattr(table, name)) is not None and lowered[name] < value
    }
    return replace(table, **changes) if changes else table


def _streams_of(streams: Any) -> list[list[float]]:
    """Validated kept streams: at most ``STREAM_REQUESTS`` lists of at most ``STREAM_REWARDS``
    finite numbers (ValueError otherwise: nothing :meth:`ShapePrior.to_dict` could write)."""
    if not isinstance(streams, list) or len(streams) > STREAM_REQUESTS:
        raise ValueError(f"streams must be a list of at most {STREAM_REQUESTS} reward lists")
    out = []
    for stream in streams:
        if not isinstance(stream, list | tuple) or not 0 < len(stream) <= STREAM_REWARDS:
            raise ValueError(f"each stream must hold 1 to {STREAM_REWARDS} rewards")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in stream):
            raise ValueError("streams must hold numbers")
        values = [float(v) for v in stream]
        if not all(math.isfinite(v) for v in values):
            raise ValueError("streams must hold finite rewards")
        out.append(values)
    return out


def _histogram(sparse: Any, bins: int, name: str) -> list[float]:
    if not isinstance(sparse, dict):
        raise ValueError(f"{name} must be a mapping of bin index to count")
    out = [0.0] * bins
    for key, count in sparse.items():
        i, c = int(key), float(count)
        if not (0 <= i < bins) or not (math.isfinite(c) and c >= 0.0):
            raise ValueError(f"{name}: bad entry {key!r}: {count!r}")
        out[i] = c
    return out


def build_table(
    z_counts: np.ndarray,
    s_counts: np.ndarray,
    target: float,
    alpha: float,
    min_samples: int,
    horizon: int,
    requests: int,
    *,
    min_rewards: int = 4,
    deconvolve: bool = False,
    scale_shrink: float = 1.0,
    step: float | None = None,
) -> StopTable:
    """z_star on the log-scale grid, the scale prior, and the Monte Carlo offset.

    With ``deconvolve=False`` (the default) the recorded histogram is taken as the shape.
    ``step``: the lattice the deployment scores on (:meth:`ShapePrior.lattice_step`), which the
    calibration's simulated streams are rounded to (:func:`~stoppers.robust.stop_table.on_lattice`).

    The histogram ``z_counts`` is what :meth:`ShapePrior.update` records - predictive draws of
    stopped streams, mapped through Student-t -> normal quantiles - not the shape itself: for
    skewed or heavy shapes that statistic is distorted (measured on Gumbel deployments: recorded
    0.99-quantile 2.85 against the true 3.14, body too wide), and a table built on it
    under-delivered low targets (0.7 -> 0.62-0.64). So the shape is *deconvolved* first
    (:func:`deconvolve_shape`): the recorded histogram passed through the Tukey g-and-h map whose
    simulated record - streams drawn from it, stopped by the rule calibrated on the recorded
    histogram, recorded exactly as ``update`` records - matches the recorded quantiles. Two
    parameters (skew g, tail weight h) keep the inversion stable: a bin-by-bin fixed point
    drifted on one deployment's evidence (measured: worse than no correction).
    """
    observed = z_counts / z_counts.sum()
    sw = s_counts / s_counts.sum()
    raw, q_raw = plug_in(observed, sw, target, alpha, requests, scale_shrink)
    rule = calibrate(raw, observed, sw, q_raw, min_samples, horizon, requests, step)
    if not deconvolve:
        return rule
    w = deconvolve_shape(observed, sw, rule, min_samples, horizon, requests, min_rewards)
    table, q_alpha = plug_in(w, sw, target, alpha, requests, scale_shrink)
    return calibrate(table, w, sw, q_alpha, min_samples, horizon, requests, step)

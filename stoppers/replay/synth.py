"""Seeded synthetic reward pools for replay experiments without recorded data.

Every prompt ``i`` draws its rewards as ``loc_i + scale_i * z`` where ``z`` comes from a
standardised family (mean 0, standard deviation 1) and the per-prompt location and scale vary
across prompts the way real reward models do: the AlpacaEval pool in ``../shared/data`` has a
within-prompt spread whose 10th/50th/90th percentiles are 2.0/3.5/5.3 (a ratio of about 0.6 and
1.5 to the median, i.e. a log-normal scale spread of ~0.4) and a median level that moves by
several units from prompt to prompt (the paper's Appendix figure "Median rewards across 960
generations" shows the same for its reward models). Defaults: ``loc_i ~ N(0, 2)``,
``scale_i = exp(N(0, 0.4))``.

Families (``z``):

* ``normal`` — Gaussian;
* ``gumbel`` — right-skewed max-type tail;
* ``skew-normal`` — scipy's ``skewnorm`` with shape 4 (long right tail);
* ``student-t`` — heavy tails, 3 degrees of freedom (scaled to unit variance);
* ``mixture`` — two components: a bulk N(0, 1) and, with a per-prompt weight in [0.1, 0.4], a
  better mode 2.5 higher with standard deviation 0.5 (a few responses much better than most);
* ``exponential`` — Exp(1) - 1 (the paper's worked example of a known family);
* ``clipped`` — Gaussian clipped to ``[-bound, bound]`` and rounded to ``resolution``: bounded,
  heavily tied at the lower bound like the judge-logit pool (51% of its entries sit at a clip);
* ``mixed`` — each prompt picks one of the above at random;
* ``lognormal`` — exp(N(0, 0.5)): right-skewed with a tail heavier than any exponential;
* ``logistic`` — symmetric, exponential tails (kurtosis 4.2).

``lognormal`` and ``logistic`` came later (2026-11-25) as families no policy was tuned on; they
are not among ``mixed``'s choices, so every earlier pool reproduces from its seed.

* ``mixed-continuous`` (2026-11-27) — like ``mixed`` without ``clipped``: every prompt scores on
  a continuum but the prompts differ in shape (a deployment serving several kinds of task). No
  tied scores, so nothing keeps a cost policy off a shape fitted to all of them.
* ``rounded`` (2026-11-28) — Gaussian rounded to ``resolution``, no clip: a lattice of scores
  (integer judge ratings: ``--resolution 1.0`` is one level per unit of the median scale).
  Not among ``mixed``'s choices.

Held out on 2026-11-29 (``HELD_OUT_2``), built to find the shapes the cost default had not met;
none is among ``mixed``'s choices:

* ``uniform`` — flat up to a hard upper end (GPD shape xi = -1);
* ``reflected-exponential`` — 1 - Exp(1): a hard upper end where the density is highest (a
  reward model that saturates);
* ``reflected-gamma`` — k - Gamma(k = 2), scaled: a hard upper end the density falls to
  linearly (xi = -1/2);
* ``sigmoid`` — a probability, sigmoid(N(1, 1.5^2)) (a classifier's "good answer" score);
* ``laplace`` — symmetric, exponential tails with a sharp peak;
* ``weibull`` — Weibull with shape 2 (a tail lighter than the normal's in its body);
* ``pareto`` — generalised Pareto with xi = 0.3 (a power-law tail from the bulk on);
* ``three-mode`` — a bulk N(0, 1), 20% at +1.5 and 5% at +4 (both sd 0.5);
* ``rare-mode`` — a bulk N(0, 1) and, with a per-prompt weight in [0.01, 0.05], a mode 5
  higher with sd 0.7 (AlpacaEval-like: one response in 20-100 far above the rest).

Held out on 2026-11-30 (``HELD_OUT_3``), built to test target mode's reading of a floor the
rewards pile up at (docs/robust-stopping.md, "The floor read as censoring"); not among
``mixed``'s choices:

* ``floored`` — Gaussian clipped below at ``-bound`` only, continuous (no rounding): a latent
  score cut at a floor (a Tobit model), so a prompt's share at the floor follows its location;
* ``judge`` — a judge's clipped scores: each prompt puts its own share, uniform in [0.1, 0.9],
  of its rewards at one floor far below every prompt's rewards (``-4 (loc_spread +
  scale_median)``) and draws the rest as ``normal`` does (the AlpacaEval pool's structure: a
  floor pile-up whose share varies by prompt, and a continuum above it).

Held out on 2026-12-01 (``HELD_OUT_4``), built to test rewards that repeat because responses
do; not among ``mixed``'s choices:

* ``repeats`` — each prompt's responses repeat verbatim as the draws of a Chinese restaurant
  process do (a generator at low temperature, a short factual answer): response i is a new one
  with chance theta / (theta + i), else a copy of an earlier one drawn at random, and each new
  response's ``z`` is a fresh standard normal. theta is the prompt's own, log-uniform in
  [0.5, 300]: from 2-5 distinct responses in 960 to about 430. The repeated rewards sit at
  arbitrary values, not on a lattice (docs/robust-stopping.md, "Responses that repeat
  verbatim").
* ``low-temperature`` — ``repeats`` at a concentration log-uniform in [0.02, 3]: most prompts
  repeat one to a dozen replies, a third of them one reply in 960 draws. Built on 2026-12-01 with
  the learned pile (``stoppers.robust.pile``) and measured on while it was designed, so not
  held out (docs/robust-stopping.md, "A deployment learns its piles").

Built on 2026-12-01 (``LUMPY_FAMILIES``), not among ``mixed``'s choices:

* ``lumpy`` — a prompt's responses agree on a few answers, each scored alike: six lumps at
  standard normal centres with Dirichlet(1) weights, each lump a normal of sd 0.08 (the reward
  model's noise on one answer), scaled by the prompt's scale. Not standardised: a prompt's mean
  and sd are its lumps'. The table's calibration on the streams was designed on it, so it is
  not held out (docs/robust-stopping.md, "Lumps: the table calibrated on the streams"; the
  held-out variant is described there).

Held out on 2026-12-01 (seventeenth session, ``HELD_OUT_5``), built before any rule was run on
them, to look for shapes both modes had not met; none is among ``mixed``'s choices:

* ``top-lump`` — a bulk N(0, 1) and, with a per-prompt weight in [0.02, 0.10], a lump 3 higher
  with sd 0.05: one better answer the generator returns now and then, scored alike each time
  (the correct answer to a question with one), standardised;
* ``wide-lumps`` — three lumps at standard normal centres with Dirichlet(1) weights, each a
  normal of sd 0.35: ``lumpy`` with fewer, wider answers; not standardised;
* ``varied-gpd`` — generalised Pareto with a per-prompt shape xi uniform in [-0.3, 0.4]: tails
  from a soft upper end to a power law in one deployment, standardised;
* ``heavy-t`` — Student-t with 2.5 degrees of freedom, scaled to unit variance (a fourth
  moment that does not exist);
* ``varied-skew`` — skew-normal with a per-prompt shape uniform in [-8, 8]: some prompts with a
  long right tail, others with a long left one and a short upper tail, standardised;
* ``saturated`` — a classifier's probability that presses against 1: sigmoid(N(mu, 1.5^2))
  with a per-prompt mu uniform in [0, 4], standardised by its own draws as ``sigmoid`` is.

Output precision (2026-11-30): ``precision="bfloat16"`` (or ``"float16"``, ``"float32"``)
rounds every reward to that format, as a reward model run in half precision on a GPU returns
its scores (the reward worker's ``auto`` dtype; vLLM's pooling runner likewise). A bfloat16
score keeps 8 significant bits, so its step grows with its magnitude - 1/64 in [2, 4), 1/8 in
[16, 32), 1 in [128, 256) - and most of 960 rewards of one prompt tie. ``loc_mean`` moves every
prompt's location (default 0): at a reward model's usual level of several units the bfloat16
lattice is coarse and uneven, where near 0 it is fine. Neither changes the draws: a pool at
the defaults reproduces from its seed.

The result is reproducible from ``seed`` alone (numpy ``default_rng``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "FAMILIES",
    "HELD_OUT_2",
    "HELD_OUT_3",
    "HELD_OUT_4",
    "HELD_OUT_5",
    "LUMPY_FAMILIES",
    "PRECISIONS",
    "SynthSpec",
    "generate",
    "to_precision",
]

_BASE_FAMILIES = (
    "normal",
    "gumbel",
    "skew-normal",
    "student-t",
    "mixture",
    "exponential",
    "clipped",
)
_HELD_OUT_FAMILIES = ("lognormal", "logistic")  # not in "mixed": earlier pools reproduce
HELD_OUT_2 = (
    "uniform",
    "reflected-exponential",
    "reflected-gamma",
    "sigmoid",
    "laplace",
    "weibull",
    "pareto",
    "three-mode",
    "rare-mode",
)
HELD_OUT_3 = ("floored", "judge")
HELD_OUT_4 = ("repeats", "low-temperature")
LUMPY_FAMILIES = ("lumpy",)
HELD_OUT_5 = ("top-lump", "wide-lumps", "varied-gpd", "heavy-t", "varied-skew", "saturated")
PRECISIONS = ("float64", "float32", "bfloat16", "float16")
_CONTINUOUS_FAMILIES = tuple(f for f in _BASE_FAMILIES if f != "clipped")
FAMILIES = (
    *_BASE_FAMILIES,
    "mixed",
    *_HELD_OUT_FAMILIES,
    "mixed-continuous",
    "rounded",
    *HELD_OUT_2,
    *HELD_OUT_3,
    *HELD_OUT_4,
    *LUMPY_FAMILIES,
    *HELD_OUT_5,
)

_SKEW_SHAPE = 4.0
_T_DF = 3.0
_LOGNORMAL_SIGMA = 0.5
_GAMMA_K = 2.0
_PARETO_XI = 0.3
# the range of a prompt's concentration, drawn log-uniform
_REPEATS_THETA = {"repeats": (0.5, 300.0), "low-temperature": (0.02, 3.0)}
_LUMPS = 6  # answers per prompt (lumpy)
_LUMP_SD = 0.08  # the reward model's noise on one answer, in units of the prompt's scale


@dataclass(frozen=True)
class SynthSpec:
    """Parameters of a synthetic pool; stored verbatim in the output file's ``meta``."""

    family: str = "normal"
    prompts: int = 200
    samples: int = 960
    seed: int = 0
    loc_spread: float = 2.0
    scale_median: float = 1.0
    scale_spread: float = 0.4
    bound: float = 2.0
    resolution: float = 0.1
    missing_fraction: float = 0.0
    loc_mean: float = 0.0
    precision: str = "float64"

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; choose from {', '.join(FAMILIES)}")
        if self.prompts < 1 or self.samples < 2:
            raise ValueError("need at least 1 prompt and 2 samples per prompt")
        if self.scale_median <= 0 or self.loc_spread < 0 or self.scale_spread < 0:
            raise ValueError("scale_median must be > 0; spreads must be >= 0")
        if self.bound <= 0 or self.resolution < 0:
            raise ValueError("bound must be > 0 and resolution >= 0")
        if not 0 <= self.missing_fraction < 0.5:
            raise ValueError("missing_fraction must be in [0, 0.5)")
        if not math.isfinite(self.loc_mean):
            raise ValueError("loc_mean must be finite")
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"unknown precision {self.precision!r}; choose from {', '.join(PRECISIONS)}"
            )

    def to_dict(self) -> dict:
        return asdict(self)


def generate(spec: SynthSpec) -> dict[str, np.ndarray]:
    """Draw the pool; returns the arrays written to the ``.npz`` (``rewards`` is the matrix).

    >>> pool = generate(SynthSpec(family="gumbel", prompts=3, samples=5, seed=1))
    >>> pool["rewards"].shape
    (3, 5)
    """
    rng = np.random.default_rng(spec.seed)
    loc = spec.loc_mean + rng.normal(0.0, spec.loc_spread, size=spec.prompts)
    scale = spec.scale_median * np.exp(rng.normal(0.0, spec.scale_spread, size=spec.prompts))
    if spec.family == "mixed":
        families = rng.choice(np.array(_BASE_FAMILIES), size=spec.prompts)
    elif spec.family == "mixed-continuous":
        families = rng.choice(np.array(_CONTINUOUS_FAMILIES), size=spec.prompts)
    else:
        families = np.full(spec.prompts, spec.family)
    rewards = np.empty((spec.prompts, spec.samples), dtype=np.float64)
    for i, family in enumerate(families):
        z = _standard_draws(str(family), spec.samples, rng)
        row = loc[i] + scale[i] * z
        if family == "clipped":
            row = _clip_and_round(row, spec.bound, spec.resolution)
        elif family == "rounded":
            row = _clip_and_round(row, math.inf, spec.resolution)
        elif family == "floored":
            row = np.maximum(row, -spec.bound)
        elif family == "judge":
            floor = -4.0 * (spec.loc_spread + spec.scale_median)
            at_floor = rng.random(spec.samples) < rng.uniform(0.1, 0.9)
            row = np.where(at_floor, floor, np.maximum(row, floor))
        rewards[i] = row
    rewards = to_precision(rewards, spec.precision)
    if spec.missing_fraction > 0:
        holes = rng.random(rewards.shape) < spec.missing_fraction
        holes[:, :2] = False  # every prompt keeps at least two samples
        rewards[holes] = np.nan
    return {
        "rewards": rewards,
        "family": families.astype(str),
        "loc": loc,
        "scale": scale,
    }


def to_precision(rewards: np.ndarray, precision: str) -> np.ndarray:
    """``rewards`` rounded to ``precision`` (nearest, ties to even) and returned as float64.

    numpy has no bfloat16: a bfloat16 is the top 16 bits of a float32, so the float32's bits
    are rounded to those (stoppers import only numpy and scipy, not torch).

    >>> to_precision(np.array([3.171875, 3.17, 20.3, -0.1]), "bfloat16").tolist()
    [3.171875, 3.171875, 20.25, -0.10009765625]
    """
    if precision == "float64":
        return np.asarray(rewards, dtype=np.float64)
    if precision in ("float32", "float16"):
        return np.asarray(rewards).astype(precision).astype(np.float64)
    if precision != "bfloat16":
        raise ValueError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    bits = np.asarray(rewards, dtype=np.float32).view(np.uint32).astype(np.uint64)
    lower = (bits >> 16) & 1  # round half to even on the bit that stays
    rounded = ((bits + 0x7FFF + lower) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def _standard_draws(family: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` draws with mean 0 and standard deviation 1 from ``family``."""
    if family in ("normal", "clipped", "rounded", "floored", "judge"):
        return rng.standard_normal(size)
    if family == "gumbel":
        raw = rng.gumbel(0.0, 1.0, size)
        return (raw - np.euler_gamma) / (math.pi / math.sqrt(6.0))
    if family == "skew-normal":
        return _standard_skewnorm(_SKEW_SHAPE, size, rng)
    if family == "student-t":
        raw = rng.standard_t(_T_DF, size)
        return raw / math.sqrt(_T_DF / (_T_DF - 2.0))
    if family == "exponential":
        return rng.exponential(1.0, size) - 1.0
    if family == "lognormal":
        w = math.exp(_LOGNORMAL_SIGMA**2)
        mean, sd = math.sqrt(w), math.sqrt((w - 1.0) * w)
        return (rng.lognormal(0.0, _LOGNORMAL_SIGMA, size) - mean) / sd
    if family == "logistic":
        return rng.logistic(0.0, 1.0, size) / (math.pi / math.sqrt(3.0))
    if family in HELD_OUT_2:
        return _held_out_draws(family, size, rng)
    if family in _REPEATS_THETA:
        return _repeated_draws(size, rng, _REPEATS_THETA[family])
    if family in HELD_OUT_5:
        return _held_out_5_draws(family, size, rng)
    if family == "lumpy":
        return _lump_draws(_LUMPS, _LUMP_SD, size, rng)
    if family == "mixture":
        weight = rng.uniform(0.1, 0.4)
        good = rng.random(size) < weight
        raw = np.where(good, rng.normal(2.5, 0.5, size), rng.standard_normal(size))
        mean = weight * 2.5
        var = weight * (0.25 + 2.5**2) + (1 - weight) * 1.0 - mean**2
        return (raw - mean) / math.sqrt(var)
    raise ValueError(f"unknown family {family!r}")


def _held_out_draws(family: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` standardised draws from one of the :data:`HELD_OUT_2` families."""
    if family == "uniform":
        return (rng.random(size) - 0.5) * math.sqrt(12.0)
    if family == "reflected-exponential":
        return 1.0 - rng.exponential(1.0, size)
    if family == "reflected-gamma":
        return (_GAMMA_K - rng.gamma(_GAMMA_K, 1.0, size)) / math.sqrt(_GAMMA_K)
    if family == "sigmoid":
        return _standard_sigmoid(1.0, size, rng)
    if family == "laplace":
        return rng.laplace(0.0, 1.0, size) / math.sqrt(2.0)
    if family == "weibull":
        raw = rng.weibull(2.0, size)
        mean = math.gamma(1.5)
        return (raw - mean) / math.sqrt(1.0 - mean**2)
    if family == "pareto":
        return _standard_gpd(_PARETO_XI, size, rng)
    if family == "three-mode":
        u = rng.random(size)
        raw = np.where(
            u < 0.05,
            rng.normal(4.0, 0.5, size),
            np.where(u < 0.25, rng.normal(1.5, 0.5, size), rng.standard_normal(size)),
        )
        return _standardise_mixture(raw, ((0.75, 0.0, 1.0), (0.2, 1.5, 0.5), (0.05, 4.0, 0.5)))
    if family == "rare-mode":
        weight = rng.uniform(0.01, 0.05)
        good = rng.random(size) < weight
        raw = np.where(good, rng.normal(5.0, 0.7, size), rng.standard_normal(size))
        return _standardise_mixture(raw, ((1.0 - weight, 0.0, 1.0), (weight, 5.0, 0.7)))
    raise ValueError(f"unknown family {family!r}")


def _held_out_5_draws(family: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` draws from one of the :data:`HELD_OUT_5` families (standardised but for
    ``wide-lumps``, whose mean and sd are its lumps')."""
    if family == "top-lump":
        weight = rng.uniform(0.02, 0.10)
        good = rng.random(size) < weight
        raw = np.where(good, rng.normal(3.0, 0.05, size), rng.standard_normal(size))
        return _standardise_mixture(raw, ((1.0 - weight, 0.0, 1.0), (weight, 3.0, 0.05)))
    if family == "wide-lumps":
        return _lump_draws(3, 0.35, size, rng)
    if family == "varied-gpd":
        return _standard_gpd(rng.uniform(-0.3, 0.4), size, rng)
    if family == "heavy-t":
        return rng.standard_t(2.5, size) / math.sqrt(5.0)  # variance df / (df - 2) = 5
    if family == "varied-skew":
        return _standard_skewnorm(rng.uniform(-8.0, 8.0), size, rng)
    if family == "saturated":
        return _standard_sigmoid(rng.uniform(0.0, 4.0), size, rng)
    raise ValueError(f"unknown family {family!r}")


def _lump_draws(lumps: int, sd: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` draws of ``lumps`` answers at standard normal centres, Dirichlet(1) weights, each
    scored with normal noise of ``sd`` (not standardised: the mean and sd are the lumps')."""
    centres = rng.standard_normal(lumps)
    answer = rng.choice(lumps, size, p=rng.dirichlet(np.ones(lumps)))
    return centres[answer] + rng.normal(0.0, sd, size)


def _standard_skewnorm(shape: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` standardised skew-normal draws of ``shape``."""
    from scipy import stats  # only the skew-normal families need scipy.stats (slow to import)

    dist = stats.skewnorm(shape)
    mean, var = dist.stats(moments="mv")
    return (dist.rvs(size=size, random_state=rng) - mean) / math.sqrt(var)


def _standard_sigmoid(mu: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` probabilities sigmoid(N(mu, 1.5^2)), standardised by their own mean and sd (the
    shape's moments have no closed form)."""
    p = 1.0 / (1.0 + np.exp(-rng.normal(mu, 1.5, size)))
    return (p - p.mean()) / p.std()


def _standard_gpd(xi: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` standardised draws of the generalised Pareto GPD(1, xi), xi < 1/2, xi != 0."""
    raw = np.expm1(-xi * np.log(rng.random(size))) / xi
    # GPD(1, xi): mean 1 / (1 - xi), variance 1 / ((1 - xi)^2 (1 - 2 xi))
    return (raw - 1.0 / (1.0 - xi)) * (1.0 - xi) * math.sqrt(1.0 - 2.0 * xi)


def _repeated_draws(
    size: int, rng: np.random.Generator, theta_range: tuple[float, float]
) -> np.ndarray:
    """``size`` draws of a Chinese restaurant process with a standard normal base, at a
    concentration log-uniform in ``theta_range`` (:data:`_REPEATS_THETA`), in a random order."""
    lo, hi = theta_range
    theta = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    i = np.arange(size)
    fresh = rng.random(size) < theta / (theta + i)  # the first draw is always new
    source = np.floor(rng.random(size) * np.maximum(i, 1)).astype(np.int64)  # an earlier draw
    fresh_values = rng.standard_normal(size)
    out = np.empty(size)
    for k in range(size):
        out[k] = fresh_values[k] if fresh[k] else out[source[k]]
    return rng.permutation(out)


def _standardise_mixture(
    raw: np.ndarray, parts: tuple[tuple[float, float, float], ...]
) -> np.ndarray:
    """``raw`` standardised by the mean and sd of the normal mixture ``parts``: (w, mean, sd)."""
    mean = sum(w * m for w, m, _ in parts)
    second = sum(w * (s * s + m * m) for w, m, s in parts)
    return (raw - mean) / math.sqrt(second - mean * mean)


def _clip_and_round(row: np.ndarray, bound: float, resolution: float) -> np.ndarray:
    clipped = np.clip(row, -bound, bound)
    if resolution > 0:
        clipped = np.round(clipped / resolution) * resolution
    return clipped

"""Cost mode by backward induction on the deployment-learned shape (opt-in).

:class:`BayesShapePandora` is :class:`~stoppers.robust.shape_cost.ShapePandora` with its
one-step Weitzman test replaced by the Bayes-optimal stop of
:mod:`stoppers.robust.bayes_table`, which also values what one more reward teaches about the
request's location and scale. Same prior (:class:`CostShapePrior`), same warm-up and
shared-shape test, same cold start (:class:`~stoppers.robust.cost.TailPandora`).

The table costs a build (~1.4 s on one core at the default grid), so a prior keeps the tables
it was asked for (least recently used dropped past ``MAX_COST_TABLES``) and rebuilds one when
the shape has been learned from twice as many requests as when it was built. Per observation
the policy does a Welford update and one bilinear lookup (a few microseconds).
"""

from __future__ import annotations

import math
from collections import OrderedDict

from stoppers.base import StoppingPolicy
from stoppers.robust.bayes_table import DEFAULT_HORIZON, CostTable, build_cost_table
from stoppers.robust.cost import TailPandora
from stoppers.robust.policy import _default_min_samples
from stoppers.robust.prior import TailPrior
from stoppers.robust.shape_cost import (
    WARM_REQUESTS,
    CostShape,
    CostShapePrior,
    ShapePrior,
    _trusted,
    cost_shape_prior,
)
from stoppers.robust.tracker import BestTies

__all__ = ["MAX_COST_TABLES", "BayesShapePandora", "cost_table"]

MAX_COST_TABLES = 8
_TableKey = tuple[float, float, int, int]


def cost_table(
    prior: CostShapePrior, cost: float, *, alpha: float, max_samples: int, horizon: int
) -> CostTable | None:
    """The prior's table for (cost, alpha, budget, horizon), built here if missing or stale
    (None if the prior has no shape yet). Cached on the prior, not persisted."""
    shape = CostShape.from_prior(prior, alpha)
    if shape is None:
        return None
    tables: OrderedDict[_TableKey, CostTable] = prior.cost_tables
    key = (float(cost), float(alpha), int(max_samples), int(horizon))
    table = tables.get(key)
    learned = prior.shape_requests
    if table is None or learned >= max(table.requests + 1, 2 * table.requests):
        table = build_cost_table(
            cost, shape, max_samples=max_samples, horizon=horizon, requests=learned
        )
        tables[key] = table
    tables.move_to_end(key)
    while len(tables) > MAX_COST_TABLES:
        tables.popitem(last=False)
    return table


class BayesShapePandora(StoppingPolicy):
    """Bayes-optimal cost-mode stop on the learned shape (cold start: :class:`TailPandora`).

    Parameters
    ----------
    cost: price of one sample in utility units (B = 1), > 0.
    alpha: benchmark percentile, in (0, 1).
    min_samples: rewards to see before any stop (default 8, or max_samples if smaller).
    max_samples: hard budget, stop reason "budget"; the table's horizon is
        min(max_samples, ``horizon``), and 960 when there is no budget.
    prior: the deployment's :class:`CostShapePrior` (``new_deployment_prior("cost")``);
        anything else, or a prior not yet trusted, gives the cold start.
    warm_requests: requests the prior must have learned the shape from.
    horizon: rows of the table (past it, the parameters are treated as known).
    table: a table built beforehand (:func:`~stoppers.robust.bayes_table.build_cost_table`,
        e.g. on a known shape); it decides from the first request, whatever ``prior`` says.
    """

    deployment_prior = staticmethod(cost_shape_prior)

    def __init__(
        self,
        cost: float,
        *,
        alpha: float = 0.99,
        min_samples: int | None = None,
        max_samples: int | None = None,
        prior: ShapePrior | TailPrior | None = None,
        warm_requests: int = WARM_REQUESTS,
        horizon: int = DEFAULT_HORIZON,
        table: CostTable | None = None,
    ) -> None:
        super().__init__(max_samples=max_samples)
        cost = float(cost)
        if not (cost > 0.0 and math.isfinite(cost)):
            raise ValueError(f"cost must be finite and > 0, got {cost!r}")
        if not (0.0 < alpha < 1.0):
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 3:
            raise ValueError(f"horizon must be an integer >= 3, got {horizon!r}")
        self.cost = cost
        self.alpha = float(alpha)
        self.min_samples = _default_min_samples(min_samples, max_samples)
        if table is not None and table.cost != cost:
            raise ValueError(f"table was built for cost {table.cost!r}, not {cost!r}")
        self.table = table
        if table is None and isinstance(prior, CostShapePrior) and _trusted(prior, warm_requests):
            budget = 960 if max_samples is None else max_samples
            if budget >= 3:
                self.table = cost_table(
                    prior, cost, alpha=self.alpha, max_samples=budget, horizon=horizon
                )
        self._cold: TailPandora | None = None
        if self.table is None:
            self._cold = TailPandora(
                cost,
                alpha=alpha,
                min_samples=self.min_samples,
                max_samples=max_samples,
                prior=prior if isinstance(prior, TailPrior) else None,
            )
        self._shift = 0.0  # first reward: sums of shifted rewards keep the variance exact
        self._ties = BestTies()
        self._sum = 0.0
        self._sum_sq = 0.0

    @property
    def warm(self) -> bool:
        """True when the table decides (False: the cold-start TailPandora)."""
        return self.table is not None

    def _decide(self, reward: float) -> str | None:
        cold = self._cold
        if cold is not None:
            stop = cold.observe(reward)
            return cold.stop_reason if stop and cold.stop_reason != "budget" else None
        n = self._n
        if n == 1:
            self._shift = reward
        x = reward - self._shift
        self._sum += x
        self._sum_sq += x * x
        self._ties.note(reward, self._best, self._best_index, n)
        if n < self.min_samples:
            return None
        if self._ties.ceiling(self._shift + self._sum / n, self._best):
            return "tied"  # the best seen 3 times above lower rewards: a ceiling (clip)
        mean = self._sum / n
        var = (self._sum_sq - n * mean * mean) / (n - 1)
        if not var > 0.0:
            return None  # all tied so far: no scale to judge the best against yet
        table = self.table
        assert table is not None
        gap = self._best - self._shift - mean
        return "threshold" if table.should_stop(n, 0.5 * math.log(var), gap) else None

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

from stoppers.robust.bayes_table import DEFAULT_HORIZON, CostTable, build_cost_table
from stoppers.robust.cost_prior import CostShapePrior
from stoppers.robust.prior import TailPrior
from stoppers.robust.shape_cost import WARM_REQUESTS, CostShape, LearnedShapeCost, _trusted
from stoppers.robust.shape_prior import ShapePrior

__all__ = ["MAX_COST_TABLES", "BayesShapePandora", "cost_table"]

MAX_COST_TABLES = 8
_TableKey = tuple[float, float, int, int]


def cost_table(
    prior: CostShapePrior, cost: float, *, alpha: float, max_samples: int, horizon: int
) -> CostTable | None:
    """The prior's table for (cost, alpha, budget, horizon), built here if missing or stale
    (None if the prior has no shape yet). Cached on the prior, not persisted."""
    tables: OrderedDict[_TableKey, CostTable] = prior.cost_tables
    key = (float(cost), float(alpha), int(max_samples), int(horizon))
    table = tables.get(key)
    learned = prior.shape_requests
    if table is None or learned >= max(table.requests + 1, 2 * table.requests):
        shape = CostShape.from_prior(prior, alpha)  # only for a build: a histogram pass
        if shape is None:
            return None
        table = build_cost_table(
            cost, shape, max_samples=max_samples, horizon=horizon, requests=learned
        )
        tables[key] = table
    tables.move_to_end(key)
    while len(tables) > MAX_COST_TABLES:
        tables.popitem(last=False)
    return table


class BayesShapePandora(LearnedShapeCost):
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
        super().__init__(
            cost, alpha=alpha, min_samples=min_samples, max_samples=max_samples, prior=prior
        )
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 3:
            raise ValueError(f"horizon must be an integer >= 3, got {horizon!r}")
        if table is not None and table.cost != self.cost:
            raise ValueError(f"table was built for cost {table.cost!r}, not {self.cost!r}")
        self.table = table
        if (
            table is None
            and isinstance(prior, CostShapePrior)
            and _trusted(prior, warm_requests, self.alpha)
        ):
            budget = 960 if max_samples is None else max_samples
            if budget >= 3:
                self.table = cost_table(
                    prior, self.cost, alpha=self.alpha, max_samples=budget, horizon=horizon
                )
        if self.table is None:
            self._start_cold(prior)

    @property
    def warm(self) -> bool:
        """True when the table decides (False: the cold-start TailPandora)."""
        return self.table is not None

    def _warm_decide(self, n: int) -> str | None:
        mean, var = self._mean_var(n)
        if not var > 0.0:
            return None  # all tied so far: no scale to judge the best against yet
        table = self.table
        assert table is not None
        gap = self._best - self._shift - mean
        return "threshold" if table.should_stop(n, 0.5 * math.log(var), gap) else None

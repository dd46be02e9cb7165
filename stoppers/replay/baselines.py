"""The two references every replay is judged against: fixed Best-of-N and Weitzman's oracle.

* Fixed N: on each ordering Best-of-N keeps the max of the first N rewards; the prefix max of
  the stream gives every N at once (exact, one ``maximum.accumulate``). Past a row's budget the
  stream is ``-inf`` padded, so N beyond the pool means "the whole pool".
* Oracle: Weitzman's rule (Definition "Weitzman's Algorithm") with the prompt's *empirical*
  utility distribution known: U = AR_kappa(v) for v uniform over the pool; the fair cap tau
  solves E[(U - tau)+] = c (Definition "Fair-cap value"); the oracle samples until it sees a
  reward whose utility reaches tau. E[(U - tau)+] is piecewise linear in tau, so tau is exact.
"""

from __future__ import annotations

import numpy as np

from stoppers.replay.batch import Outcome, PromptBatch
from stoppers.replay.metrics import acceptance_rate

__all__ = [
    "empirical_fair_cap",
    "fixed_acceptance_curves",
    "fixed_best",
    "oracle_outcome",
]


def fixed_best(batch: PromptBatch) -> np.ndarray:
    """(rows, T): the best reward Best-of-N keeps on each row for N = 1..T."""
    return np.maximum.accumulate(batch.values, axis=1)


def fixed_acceptance_curves(batch: PromptBatch) -> np.ndarray:
    """(prompts, T): mean acceptance over the orderings of Best-of-N for N = 1..T.

    AR is non-decreasing, so AR(max of the first N) is the running max of the streamed ARs
    (exactly, in floating point too).
    """
    ar = np.maximum.accumulate(batch.stream_acceptance, axis=1)
    return ar.reshape(batch.prompts, batch.permutations, -1).mean(axis=1)


def empirical_fair_cap(utilities: np.ndarray, cost: float) -> float:
    """tau with mean((u - tau)+) == cost over the sample ``utilities`` (exact, piecewise linear).

    With the top-k utilities above tau, mean((u - tau)+) = (S_k - k tau) / m, so
    tau_k = (S_k - m c) / k and the answer is the tau_k that falls in [u_(k+1), u_(k)].
    """
    if cost <= 0:
        raise ValueError("cost must be > 0")
    u = np.sort(np.asarray(utilities, dtype=np.float64))[::-1]
    m = u.size
    k = np.arange(1, m + 1)
    tau = (np.cumsum(u) - m * cost) / k
    lower = np.append(u[1:], -np.inf)
    inside = (tau <= u) & (tau >= lower)
    return float(tau[np.argmax(inside)])


def oracle_outcome(
    batch: PromptBatch, cost: float, prefix_max: np.ndarray | None = None
) -> Outcome:
    """Weitzman's oracle on every row: stop at the first reward whose utility reaches tau."""
    kappas = batch.kappa[:: batch.permutations]
    taus = np.array(
        [
            empirical_fair_cap(acceptance_rate(batch.pool(i), kappas[i]), cost)
            for i in range(batch.prompts)
        ]
    )
    ar = batch.stream_acceptance
    steps = np.arange(batch.horizon)
    hit = (ar >= taus[batch.prompt][:, None]) & (steps[None, :] < batch.budget[:, None])
    found = hit.any(axis=1)
    n = np.where(found, np.argmax(hit, axis=1) + 1, batch.budget)
    prefix_max = fixed_best(batch) if prefix_max is None else prefix_max
    best = prefix_max[np.arange(batch.rows), n - 1]
    return Outcome(n=n.astype(np.int64), best=best)

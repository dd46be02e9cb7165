"""Stop-table builds off the event loop: one worker thread, one build at a time.

Why: the target-mode prior (:class:`stoppers.robust.shape_prior.ShapePrior`) derives a Monte
Carlo calibrated stop table per (target, min_samples, horizon, alpha) - ~0.1-0.3 s of CPU, again
each time the prior's request count doubles, at most every 64 requests - and the cost-mode prior
(:class:`stoppers.robust.cost_prior.CostShapePrior`) its likelihood shape (0.1-3 s, again as
requests grow by half, at most every 256). Built inside the policy constructor, i.e. on the
gateway's event loop, it would freeze every other request for that long, and a client choosing
many (target, min, max samples) combinations could repeat that at will. So the
:class:`~server.priors.PriorStore` sets each such prior's ``schedule_build`` hook to
:meth:`TableBuilds.request`: the policy uses the newest cached table (stale or not) or, with
none, its cold-start rule, and the missing table is built here.

- :meth:`TableBuilds.request` runs on the loop: de-duplicated per (prior, key); at most
  ``max_pending`` builds waiting or running, a request beyond that is dropped (counted; the
  next request for that key asks again). The prior's histograms are copied on the loop
  (``prior.prepare(key)``) before the thread sees them, so ``update()`` may go on meanwhile.
- One worker thread (a single-thread executor): builds never run in parallel.
- The finished table is installed on the loop (``call_soon_threadsafe``): the prior's cache is
  only touched there, and the next policy built for that key uses it.
- :meth:`TableBuilds.aclose` (the app's lifespan) cancels queued builds, waits for the running
  one and ends the thread. No asyncio task is created.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["MAX_PENDING", "BuildsTables", "TableBuilds"]

log = logging.getLogger(__name__)

MAX_PENDING = 8  # builds queued or running at once (each ~0.1-0.3 s)
THREAD_NAME = "pandora-table-build"


class BuildsTables(Protocol):
    """What a prior offers to have its tables built elsewhere (ShapePrior does)."""

    schedule_build: Callable[[Any, Any], None] | None

    def prepare(self, key: Any) -> Callable[[], Any]: ...

    def install(self, key: Any, table: Any) -> bool: ...


class TableBuilds:
    """Runs priors' table builds on one worker thread; every other method runs on the loop."""

    def __init__(
        self, *, max_pending: int = MAX_PENDING, registry: CollectorRegistry | None = None
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self._executor: ThreadPoolExecutor | None = None
        # (id(prior), key) -> (prior, build): the prior is held while its build is pending, so
        # its id cannot be reused by another object in the meantime.
        self._pending: dict[tuple[int, Hashable], tuple[BuildsTables, Future]] = {}
        self._closed = False
        registry = registry if registry is not None else CollectorRegistry()
        self.built = Counter(
            "pandora_prior_table_builds_total",
            "Learned-prior builds (target stop tables, cost likelihood shapes) run on the worker "
            "thread and installed",
            registry=registry,
        )
        self.dropped = Counter(
            "pandora_prior_table_builds_dropped_total",
            "Table builds not queued because the queue was full (asked again by a later request)",
            registry=registry,
        )
        self.pending = Gauge(
            "pandora_prior_table_builds_pending",
            "Table builds queued or running",
            registry=registry,
        )

    def attach(self, prior: object) -> None:
        """Route ``prior``'s table builds here (priors without the hook are left alone)."""
        if hasattr(prior, "schedule_build") and hasattr(prior, "prepare"):
            prior.schedule_build = self.request  # type: ignore[attr-defined]

    def is_pending(self, prior: object, key: Hashable) -> bool:
        return (id(prior), key) in self._pending

    def request(self, prior: BuildsTables, key: Hashable) -> bool:
        """Queue a build of ``prior``'s table for ``key``; True if queued (or built, with no
        running loop to block). Never blocks on a build while a loop runs."""
        ident = (id(prior), key)
        if self._closed or ident in self._pending:
            return False
        if len(self._pending) >= self.max_pending:
            self.dropped.inc()
            return False
        build = prior.prepare(key)  # snapshot of the histograms, taken on this thread
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop here, nothing to freeze: build in place
            prior.install(key, build())
            self.built.inc()
            return True
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        future = self._executor.submit(build)
        self._pending[ident] = (prior, future)
        self.pending.set(len(self._pending))
        future.add_done_callback(lambda done: self._on_done(loop, ident, key, done))
        return True

    def _on_done(
        self,
        loop: asyncio.AbstractEventLoop,
        ident: tuple[int, Hashable],
        key: Hashable,
        done: Future,
    ) -> None:
        """Worker thread (or the closing thread): hand the result to the loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads the table
            loop.call_soon_threadsafe(self._finish, ident, key, done)

    def _finish(self, ident: tuple[int, Hashable], key: Hashable, done: Future) -> None:
        """On the loop: install the finished table and free the key."""
        entry = self._pending.get(ident)
        if entry is None or entry[1] is not done:
            return
        del self._pending[ident]
        self.pending.set(len(self._pending))
        prior = entry[0]
        if done.cancelled():
            return
        error = done.exception()
        if error is not None:
            log.error("building a stop table for %r failed", key, exc_info=error)
            return
        prior.install(key, done.result())
        self.built.inc()

    def open(self) -> None:
        """Accept builds again (an app's lifespan may run more than once: each start opens, each
        shutdown closes)."""
        self._closed = False

    async def aclose(self) -> None:
        """Cancel queued builds, wait (without blocking the loop) for the running one, and end
        the worker thread."""
        self._closed = True
        executor, self._executor = self._executor, None
        if executor is None:
            return
        executor.shutdown(wait=False, cancel_futures=True)
        running = [future for _, future in self._pending.values() if not future.done()]
        if running:
            await asyncio.wait([asyncio.wrap_future(future) for future in running])
        executor.shutdown(wait=True)  # the thread exits right after its last build
        self._pending.clear()
        self.pending.set(0)

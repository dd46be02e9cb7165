"""Dynamic batching: concurrent requests' sequences share forward passes.

One background task takes sequences from an asyncio queue. A round starts with the first waiting
sequence and lasts at most ``max_wait`` after it was queued, or until ``max_batch_size`` sequences
wait, but only while a request that *announced* itself (it is still being tokenized) has yet to
submit: a lone request is never held back for company that is not coming, so light traffic pays
no batching delay. Then everything waiting (bounded) is sorted by length, so sequences of
similar length share a batch and padding stays small, and cut into batches of at most
``max_batch_size`` sequences and ``max_batch_tokens`` padded tokens. Each batch is one forward
pass on a single worker thread, so the event loop keeps serving and the device runs one pass at
a time. Every sequence knows its request and its index in it, and each request waits on one
future that resolves when its last score arrives, so a request gets its scores back in its own
order however the batches were cut.

If a batch that mixes several requests fails, each request is retried alone, so one poisonous
input fails only its own request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from reward.base import RewardError

__all__ = ["BatchObserver", "DynamicBatcher"]

logger = logging.getLogger(__name__)

Forward = Callable[[list[list[int]]], list[float]]


class BatchObserver(Protocol):
    """Receives what the batcher did (the worker feeds these into Prometheus)."""

    def batch_done(
        self, size: int, padded_tokens: int, queue_waits: Sequence[float], forward_seconds: float
    ) -> None: ...

    def batch_failed(self, size: int) -> None: ...


@dataclass(eq=False, slots=True)
class _Request:
    """One submit() call: its scores fill in as batches finish; ``future`` gets them all."""

    future: asyncio.Future[list[float]]
    scores: list[float]
    remaining: int

    def deliver(self, index: int, score: float) -> None:
        if self.future.done():
            return
        self.scores[index] = score
        self.remaining -= 1
        if self.remaining == 0:
            self.future.set_result(self.scores)


@dataclass(eq=False, slots=True)
class _Item:
    ids: list[int]
    request: _Request
    index: int  # position in its request
    queued_at: float = field(default_factory=time.perf_counter)

    @property
    def done(self) -> bool:
        return self.request.future.done()


class DynamicBatcher:
    """Gathers sequences from concurrent :meth:`submit` calls into batched ``forward`` calls.

    ``max_batch_size=1`` turns batching off (same machinery, one sequence per pass), which is how
    the benchmark compares the two.
    """

    def __init__(
        self,
        forward: Forward,
        *,
        max_batch_size: int = 32,
        max_batch_tokens: int = 16384,
        max_wait: float = 0.005,
        observer: BatchObserver | None = None,
    ) -> None:
        if max_batch_size < 1 or max_batch_tokens < 1 or max_wait < 0:
            raise ValueError("max_batch_size and max_batch_tokens must be >= 1, max_wait >= 0")
        self.forward = forward
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait
        self.observer = observer
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-forward")
        self._task: asyncio.Task[None] | None = None
        self._announced = 0  # requests on their way (announce() called, submit() not yet)
        self._closed = False

    def announce(self) -> None:
        """Tell the batcher a request will submit soon, so a forming batch may wait for it."""
        self._announced += 1

    def withdraw(self) -> None:
        """An announced request will not submit after all (it failed or was cancelled)."""
        self._announced = max(0, self._announced - 1)

    async def submit(
        self, sequences: Sequence[Sequence[int]], *, announced: bool = False
    ) -> list[float]:
        """Score ``sequences`` (token ids) together with whatever else is waiting.

        ``announced``: this request called :meth:`announce` earlier.
        """
        if announced:
            self.withdraw()
        if self._closed:
            raise RewardError("the reward batcher is closed")
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="reward-batcher")
        if not sequences:
            return []
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        request = _Request(future, [0.0] * len(sequences), len(sequences))
        now = time.perf_counter()
        for index, ids in enumerate(sequences):
            self._queue.put_nowait(_Item(list(ids), request, index, now))
        try:
            return list(await future)
        finally:
            future.cancel()  # a cancelled or failed request leaves nothing to compute

    async def aclose(self) -> None:
        """Stop the loop, fail whatever still waits, and release the forward thread."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while not self._queue.empty():
            item = self._queue.get_nowait()
            _fail([item], RewardError("the reward batcher was closed"))
        # A pass in flight finishes on its thread; nothing waits for it.
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- the loop -------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            items = await self._gather_round()
            try:
                for batch in self._cut(items):
                    await self._run_batch(batch)
            except asyncio.CancelledError:  # closing: the round's items must not wait forever
                _fail(items, RewardError("the reward batcher was closed"))
                raise
            except Exception as exc:  # a bug here must fail requests, not strand them
                logger.exception("reward batcher round failed")
                _fail(items, exc)

    async def _gather_round(self) -> list[_Item]:
        """Wait for a first item, then, while announced requests are on their way, up to
        ``max_wait`` after its arrival for a full batch."""
        first = await self._queue.get()
        items = [first]
        deadline = first.queued_at + self.max_wait
        while len(items) < self.max_batch_size:
            if not self._queue.empty():
                items.append(self._queue.get_nowait())
                continue
            remaining = deadline - time.perf_counter()
            if remaining <= 0 or self._announced == 0:
                break
            try:
                items.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        # Whatever else already waits joins this round (bounded, to keep latency fair).
        limit = 4 * self.max_batch_size
        while len(items) < limit and not self._queue.empty():
            items.append(self._queue.get_nowait())
        return [item for item in items if not item.done]

    def _cut(self, items: list[_Item]) -> list[list[_Item]]:
        """Length-sorted batches within the item and padded-token limits."""
        batches: list[list[_Item]] = []
        current: list[_Item] = []
        for item in sorted(items, key=lambda item: len(item.ids)):
            padded = len(item.ids) * (len(current) + 1)  # sorted: the newest is the longest
            if current and (len(current) >= self.max_batch_size or padded > self.max_batch_tokens):
                batches.append(current)
                current = []
            current.append(item)
        if current:
            batches.append(current)
        return batches

    async def _run_batch(self, batch: list[_Item]) -> None:
        batch = [item for item in batch if not item.done]
        if not batch:
            return
        started = time.perf_counter()
        try:
            scores = await self._forward(batch)
        except Exception as exc:
            if self.observer is not None:
                self.observer.batch_failed(len(batch))
            requests = list(dict.fromkeys(item.request for item in batch))  # in arrival order
            if len(requests) == 1:
                _fail(batch, exc)
                return
            for request in requests:  # isolate the request that broke the batch
                await self._run_batch([item for item in batch if item.request is request])
            return
        seconds = time.perf_counter() - started
        if self.observer is not None:
            waits = [started - item.queued_at for item in batch]
            padded = len(batch) * max(len(item.ids) for item in batch)
            self.observer.batch_done(len(batch), padded, waits, seconds)
        for item, score in zip(batch, scores, strict=True):
            item.request.deliver(item.index, score)

    async def _forward(self, batch: list[_Item]) -> list[float]:
        loop = asyncio.get_running_loop()
        scores = await loop.run_in_executor(
            self._executor, self.forward, [item.ids for item in batch]
        )
        if len(scores) != len(batch):
            raise RewardError(f"forward returned {len(scores)} scores for {len(batch)} sequences")
        return scores


def _fail(batch: list[_Item], exc: Exception) -> None:
    error = exc if isinstance(exc, RewardError) else RewardError(f"forward pass failed: {exc}")
    if error is not exc:
        error.__cause__ = exc
    for item in batch:
        if not item.done:
            item.request.future.set_exception(error)

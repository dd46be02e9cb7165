"""The dynamic batcher with a recording forward function (no model): how batches are cut."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import pytest

from reward.base import RewardError
from reward.batcher import DynamicBatcher

T = TypeVar("T")


class RecordingForward:
    """Scores a sequence by the sum of its ids; records every batch and its thread."""

    def __init__(self, delay: float = 0.0, poison: int | None = None) -> None:
        self.delay = delay
        self.poison = poison
        self.batches: list[list[list[int]]] = []
        self.threads: set[str] = set()
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def __call__(self, batch: list[list[int]]) -> list[float]:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            self.batches.append([list(ids) for ids in batch])
            self.threads.add(threading.current_thread().name)
            time.sleep(self.delay)
            if self.poison is not None and any(self.poison in ids for ids in batch):
                raise RuntimeError("poisoned batch")
            return [float(sum(ids)) for ids in batch]
        finally:
            with self._lock:
                self.active -= 1


class Observer:
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.waits: list[float] = []
        self.failed = 0

    def batch_done(
        self, size: int, padded_tokens: int, queue_waits: Sequence[float], forward_seconds: float
    ) -> None:
        self.sizes.append(size)
        self.waits.extend(queue_waits)

    def batch_failed(self, size: int) -> None:
        self.failed += 1


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a test coroutine with a deadline, so a stranded future fails fast instead of hanging."""
    return asyncio.run(asyncio.wait_for(coroutine, timeout=20))


def _seqs(lengths: Sequence[int], start: int = 1) -> list[list[int]]:
    return [[start + i] * n for i, n in enumerate(lengths)]


def test_concurrent_requests_share_batches_and_get_their_own_order() -> None:
    forward = RecordingForward(delay=0.01)
    observer = Observer()

    async def main() -> list[list[float]]:
        batcher = DynamicBatcher(forward, max_batch_size=16, max_wait=0.02, observer=observer)
        requests = [_seqs([3, 1, 7], start=10 * r) for r in range(1, 9)]
        try:
            return await asyncio.gather(*(batcher.submit(seqs) for seqs in requests))
        finally:
            await batcher.aclose()

    results = _run(main())
    for r, scores in enumerate(results, start=1):
        assert scores == [float(sum(ids)) for ids in _seqs([3, 1, 7], start=10 * r)]
    assert max(len(batch) for batch in forward.batches) > 3  # requests were merged
    assert sum(len(batch) for batch in forward.batches) == 24
    assert forward.max_active == 1 and len(forward.threads) == 1  # one pass at a time, off-loop
    assert "MainThread" not in forward.threads
    assert observer.sizes and sum(observer.sizes) == 24 and len(observer.waits) == 24


def test_batches_respect_size_and_padded_token_limits_and_are_length_sorted() -> None:
    forward = RecordingForward(delay=0.0)

    async def main() -> None:
        batcher = DynamicBatcher(forward, max_batch_size=4, max_batch_tokens=40, max_wait=0.05)
        lengths = [9, 1, 10, 2, 3, 8, 2, 1, 30, 4]
        try:
            scores = await batcher.submit(_seqs(lengths))
        finally:
            await batcher.aclose()
        assert scores == [float(sum(ids)) for ids in _seqs(lengths)]

    _run(main())
    for batch in forward.batches:
        assert len(batch) <= 4
        assert len(batch) == 1 or len(batch) * max(map(len, batch)) <= 40
    flat = [len(ids) for batch in forward.batches for ids in batch]
    assert flat == sorted(flat)  # similar lengths share a batch
    # 1,1,2,2 (size cap) | 3,4,8,9 (4 x 9 = 36 tokens) | 10 (2 x 30 > 40) | 30
    assert [len(batch) for batch in forward.batches] == [4, 4, 1, 1]


def test_batching_off_runs_one_sequence_per_pass() -> None:
    forward = RecordingForward()

    async def main() -> None:
        batcher = DynamicBatcher(forward, max_batch_size=1, max_wait=0.01)
        try:
            await asyncio.gather(*(batcher.submit(_seqs([2, 3])) for _ in range(5)))
        finally:
            await batcher.aclose()

    _run(main())
    assert len(forward.batches) == 10 and all(len(batch) == 1 for batch in forward.batches)


def test_batches_wait_only_for_announced_requests_and_at_most_max_wait() -> None:
    forward = RecordingForward()

    async def timed(batcher: DynamicBatcher, seqs: list[list[int]], **kw: bool) -> float:
        started = time.perf_counter()
        await batcher.submit(seqs, **kw)
        return time.perf_counter() - started

    async def main() -> tuple[float, float, float, float]:
        batcher = DynamicBatcher(forward, max_batch_size=32, max_wait=0.3)
        try:
            lone = await timed(batcher, _seqs([4]))  # nobody else is coming: no wait
            batcher.announce()  # a second request is being tokenized...
            first = asyncio.create_task(timed(batcher, _seqs([2])))
            await asyncio.sleep(0.1)
            second = await timed(batcher, _seqs([3]), announced=True)  # ...and joins the batch
            joined = await first
            batcher.announce()  # announced, but never submits: wait at most max_wait
            stood_up = await timed(batcher, _seqs([5]))
            batcher.withdraw()
            return lone, joined, second, stood_up
        finally:
            await batcher.aclose()

    lone, joined, second, stood_up = _run(main())
    assert lone < 0.1
    assert 0.09 <= joined < 0.3 and second < 0.1
    assert [len(batch) for batch in forward.batches] == [1, 2, 1]
    assert 0.29 <= stood_up < 1.5


def test_a_failing_request_does_not_fail_the_requests_batched_with_it() -> None:
    forward = RecordingForward(delay=0.005, poison=666)
    observer = Observer()

    async def main() -> list[object]:
        batcher = DynamicBatcher(forward, max_batch_size=32, max_wait=0.05, observer=observer)
        try:
            return await asyncio.gather(
                batcher.submit(_seqs([2, 2])),
                batcher.submit([[666, 1]]),
                batcher.submit(_seqs([3], start=5)),
                return_exceptions=True,
            )
        finally:
            await batcher.aclose()

    good, bad, other = _run(main())
    assert good == [2.0, 4.0] and other == [15.0]
    assert isinstance(bad, RewardError) and "poisoned batch" in str(bad)
    assert len(forward.batches[0]) == 4  # they did share the first, failing pass
    assert observer.failed == 2  # the mixed batch, then the poisoned request alone


def test_cancelled_request_is_not_computed_and_close_fails_waiters() -> None:
    forward = RecordingForward(delay=0.05)

    async def main() -> None:
        batcher = DynamicBatcher(forward, max_batch_size=1, max_wait=0.0)
        first = asyncio.create_task(batcher.submit([[1]]))
        await asyncio.sleep(0.01)  # the first pass is running
        doomed = asyncio.create_task(batcher.submit([[2, 2]]))
        await asyncio.sleep(0)
        doomed.cancel()
        assert await first == [1.0]
        await asyncio.sleep(0.02)
        assert [[2, 2]] not in forward.batches
        waiting = asyncio.create_task(batcher.submit([[3]] * 3))
        await asyncio.sleep(0.01)
        await batcher.aclose()
        with pytest.raises(RewardError):
            await waiting
        with pytest.raises(RewardError, match="closed"):
            await batcher.submit([[1]])

    _run(main())


def test_invalid_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        DynamicBatcher(RecordingForward(), max_batch_size=0)

"""The reward model loaded in this process: the scorer behind the dynamic batcher.

The worker service wraps exactly this object; the gateway uses it directly as its embedded
default on a machine without a GPU. torch and transformers are imported only when the model
loads, so importing this module stays cheap.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reward.base import RewardError, RewardInputError
from reward.batcher import BatchObserver, DynamicBatcher

if TYPE_CHECKING:
    from reward.scorer import EncodedPair, RewardScorer

__all__ = ["LocalRewardBackend", "ScoreResult"]


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """Scores of one request, with what the worker reports next to them."""

    scores: list[float]
    truncated: list[bool]
    prompt_tokens: int


class LocalRewardBackend:
    """A :class:`~reward.base.RewardBackend` that runs the reward model in-process.

    Loading starts on :meth:`load`, or in the background on the first :meth:`ready`, or on the
    first :meth:`score` (which waits for it); it runs on a thread. ``load_scorer`` replaces the
    loading function (tests, benchmarks: e.g. ``lambda: scorer`` for an already loaded
    :class:`~reward.scorer.RewardScorer`); by default ``model`` is loaded with ``device``/``dtype``.
    ``torch_threads`` sets torch's CPU threads for the forward passes; ``prefix_sharing`` lets a
    batch's shared token prefixes run once (see :mod:`reward.scorer`).
    """

    def __init__(
        self,
        model: str,
        *,
        device: str = "auto",
        dtype: str = "auto",
        label_index: int | None = None,
        max_batch_size: int = 32,
        max_batch_tokens: int = 16384,
        max_wait_ms: float = 5.0,
        max_length: int | None = None,
        torch_threads: int | None = None,
        prefix_sharing: bool = True,
        observer: BatchObserver | None = None,
        load_scorer: Callable[[], RewardScorer] | None = None,
    ) -> None:
        self.model = model
        self.device = device
        self.dtype = dtype
        self.label_index = label_index
        self.max_length = max_length
        self.torch_threads = torch_threads
        self.prefix_sharing = prefix_sharing
        self.batcher_options = {
            "max_batch_size": max_batch_size,
            "max_batch_tokens": max_batch_tokens,
            "max_wait": max_wait_ms / 1000.0,
            "observer": observer,
        }
        self.scorer: RewardScorer | None = None
        self._load_scorer = load_scorer or self._build_scorer
        self.load_error: BaseException | None = None
        self._batcher: DynamicBatcher | None = None
        self._loading: asyncio.Task[None] | None = None
        self._closed = False
        # Tokenizers are not safe to share across threads; one thread encodes, in parallel with
        # the batcher's forward thread. Requests arriving while it works wait in ``_pending`` and
        # are encoded together by its next job: one thread hop and one tokenizer call for all.
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-encode")
        self._pending: list[_EncodeJob] = []
        self._encoding = False

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._batcher is not None

    async def load(self) -> None:
        """Load the model (once) off the event loop; raises :class:`RewardError` on failure."""
        if self._loading is None:
            self._loading = asyncio.create_task(self._load(), name="reward-model-load")
        try:
            await asyncio.shield(self._loading)
        except RewardError:
            raise
        except Exception as exc:
            raise RewardError(f"reward model {self.model!r} failed to load: {exc}") from exc

    async def _load(self) -> None:
        try:
            self.scorer = await asyncio.to_thread(self._load_scorer)
            self._batcher = DynamicBatcher(self.scorer.forward, **self.batcher_options)
        except BaseException as exc:
            self.load_error = exc
            raise

    def _build_scorer(self) -> RewardScorer:
        from reward.scorer import RewardScorer

        return RewardScorer.from_pretrained(
            self.model,
            device=self.device,
            dtype=self.dtype,
            label_index=self.label_index,
            max_length=self.max_length,
            torch_threads=self.torch_threads,
            prefix_sharing=self.prefix_sharing,
        )

    async def ready(self) -> bool:
        """True once the model is loaded; the first call starts loading in the background."""
        if self._loading is None:
            self._loading = asyncio.create_task(self._load(), name="reward-model-load")
            self._loading.add_done_callback(_consume_exception)
        return self.loaded

    async def aclose(self) -> None:
        self._closed = True
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
            await asyncio.gather(self._loading, return_exceptions=True)
        if self._batcher is not None:
            await self._batcher.aclose()
        pending, self._pending = self._pending, []
        for job in pending:
            if not job.future.done():
                job.future.set_exception(RewardError("the in-process reward backend was closed"))
        self._encoder.shutdown(wait=False, cancel_futures=True)

    # -- scoring --------------------------------------------------------------------------------

    async def score(
        self, messages: Sequence[Mapping[str, Any]], responses: Sequence[str]
    ) -> list[float]:
        return (await self.score_detailed(messages, responses)).scores

    async def score_detailed(
        self, messages: Sequence[Mapping[str, Any]], responses: Sequence[str]
    ) -> ScoreResult:
        """Scores with truncation flags and the number of tokens scored."""
        if self._closed:
            raise RewardError("the in-process reward backend is closed")
        await self.load()
        assert self.scorer is not None and self._batcher is not None
        if not responses:
            return ScoreResult([], [], 0)
        self._batcher.announce()  # a batch forming meanwhile may wait for this request
        try:
            encoded = await self._encode(messages, responses)
        except BaseException as exc:
            self._batcher.withdraw()
            if isinstance(exc, Exception) and not isinstance(exc, RewardError):
                # bad content parts, templates refusing the dialogue
                raise RewardInputError(f"cannot format the dialogue for scoring: {exc}") from exc
            raise
        scores = await self._batcher.submit([pair.ids for pair in encoded], announced=True)
        if not all(math.isfinite(score) for score in scores):
            raise RewardError(f"reward model produced non-finite scores: {scores}")
        return ScoreResult(
            scores=scores,
            truncated=[pair.truncated for pair in encoded],
            prompt_tokens=sum(len(pair.ids) for pair in encoded),
        )

    # -- encoding: concurrent requests share one job on the encoder thread ----------------------

    def _encode(
        self, messages: Sequence[Mapping[str, Any]], responses: Sequence[str]
    ) -> asyncio.Future[list[EncodedPair]]:
        future: asyncio.Future[list[EncodedPair]] = asyncio.get_running_loop().create_future()
        self._pending.append(_EncodeJob(messages, responses, future))
        self._start_encoding()
        return future

    def _start_encoding(self) -> None:
        """Hand everything pending to the encoder thread, unless a job is already running (its
        completion starts the next one): a lone request is encoded at once, and requests that
        arrive meanwhile are encoded together."""
        if self._encoding or not self._pending or self._closed:
            return
        jobs, self._pending = self._pending, []
        assert self.scorer is not None
        self._encoding = True
        work = asyncio.get_running_loop().run_in_executor(
            self._encoder, _encode_jobs, self.scorer, jobs
        )
        work.add_done_callback(lambda done: self._encoded(jobs, done))

    def _encoded(self, jobs: list[_EncodeJob], done: asyncio.Future[list[Any]]) -> None:
        self._encoding = False
        if done.cancelled():
            outcomes: list[Any] = [RewardError("encoding was cancelled")] * len(jobs)
        elif done.exception() is not None:
            outcomes = [done.exception()] * len(jobs)
        else:
            outcomes = done.result()
        for job, outcome in zip(jobs, outcomes, strict=True):
            if job.future.done():  # the request was cancelled meanwhile
                continue
            if isinstance(outcome, BaseException):
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)
        self._start_encoding()


@dataclass(frozen=True, slots=True)
class _EncodeJob:
    messages: Sequence[Mapping[str, Any]]
    responses: Sequence[str]
    future: asyncio.Future[list[EncodedPair]]


def _encode_jobs(scorer: RewardScorer, jobs: list[_EncodeJob]) -> list[Any]:
    """Encoded pairs per job, in one ``encode_many`` call; if that fails, job by job, so a
    dialogue the template refuses fails only its own request (its outcome is the exception)."""
    pairs = [(job.messages, response) for job in jobs for response in job.responses]
    try:
        encoded = scorer.encode_many(pairs)
    except Exception:
        if len(jobs) == 1:
            raise
        outcomes: list[Any] = []
        for job in jobs:
            try:
                outcomes.append(scorer.encode_many([(job.messages, r) for r in job.responses]))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes
    outcomes = []
    start = 0
    for job in jobs:
        outcomes.append(encoded[start : start + len(job.responses)])
        start += len(job.responses)
    return outcomes


def _consume_exception(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # kept in load_error; avoids "exception was never retrieved"

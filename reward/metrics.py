"""Prometheus metrics of the reward worker, registered on an injected registry.

Names carry base units and one prefix (``pandora_reward_``); the only label, ``kind`` on the
error counter, takes values from a fixed set created up front so every series exists at 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["ERROR_KINDS", "RewardMetrics"]

# "forward": a failed forward pass (counted per batch); "request": a request answered with an
# error status; "invalid": a request refused for bad input.
ERROR_KINDS = ("forward", "request", "invalid")

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_FORWARD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class RewardMetrics:
    """Implements :class:`reward.batcher.BatchObserver` and counts requests' outcomes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.batch_size = Histogram(
            "pandora_reward_batch_size",
            "Sequences per forward pass.",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.batch_padded_tokens = Histogram(
            "pandora_reward_batch_padded_tokens",
            "Padded tokens per forward pass (sequences x longest sequence).",
            buckets=(64, 256, 1024, 4096, 16384, 65536, 262144),
            registry=registry,
        )
        self.queue_wait = Histogram(
            "pandora_reward_queue_wait_seconds",
            "Time a sequence waited in the batching queue before its forward pass.",
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.forward = Histogram(
            "pandora_reward_forward_seconds",
            "Duration of one forward pass.",
            buckets=_FORWARD_BUCKETS,
            registry=registry,
        )
        self.items_scored = Counter(
            "pandora_reward_items_scored",
            "Sequences scored.",
            registry=registry,
        )
        self.truncated = Counter(
            "pandora_reward_truncated",
            "Sequences truncated to the model's maximum length before scoring.",
            registry=registry,
        )
        self.errors = Counter(
            "pandora_reward_errors",
            "Failures, by kind (forward pass, request answered with an error, invalid input).",
            ["kind"],
            registry=registry,
        )
        for kind in ERROR_KINDS:
            self.errors.labels(kind=kind)
        self.model_loaded = Gauge(
            "pandora_reward_model_loaded",
            "1 once the reward model is loaded and serving.",
            registry=registry,
        )
        # (sharing on, token positions saved so far), read from the scorer at scrape time
        self.prefix_sharing_source: Callable[[], tuple[bool, int]] | None = None
        registry.register(_PrefixSharingCollector(self))

    def batch_done(
        self, size: int, padded_tokens: int, queue_waits: Sequence[float], forward_seconds: float
    ) -> None:
        self.batch_size.observe(size)
        self.batch_padded_tokens.observe(padded_tokens)
        for wait in queue_waits:
            self.queue_wait.observe(wait)
        self.forward.observe(forward_seconds)
        self.items_scored.inc(size)

    def batch_failed(self, size: int) -> None:
        self.errors.labels(kind="forward").inc()


class _PrefixSharingCollector:
    """Exports the scorer's shared-prefix state, which its forward thread keeps as plain numbers
    (the scorer knows nothing of Prometheus): whether sharing is on, and the token positions it
    has saved (``pandora_reward_shared_prefix_tokens_total``); both 0 until the model loads."""

    def __init__(self, metrics: RewardMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        source = self.metrics.prefix_sharing_source
        enabled, saved = source() if source is not None else (False, 0)
        yield GaugeMetricFamily(
            "pandora_reward_prefix_sharing",
            "1 while shared token prefixes run once per batch (the load-time probe passed).",
            value=int(enabled),
        )
        yield CounterMetricFamily(
            "pandora_reward_shared_prefix_tokens",
            "Token positions not computed because sequences of a batch shared a prefix.",
            value=saved,
        )

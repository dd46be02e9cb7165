"""Prometheus metrics of the gateway (names fixed by issue 6; dashboards depend on them).

Built on an injected ``CollectorRegistry`` inside the app factory, so two apps in one process
never share series. Every label takes values from a small fixed set (hostile input cannot create
series): anything else is folded into ``"other"``. Known label values are created up front so
their series exist at 0 from the first scrape.

One uvicorn worker per container (scale with replicas): the metrics live in process memory.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from server.config import METRIC_TASK_FOLDS, MODES

__all__ = [
    "CANDIDATE_OUTCOMES",
    "REQUEST_MODES",
    "SAMPLED_MODES",
    "STATUSES",
    "STOP_REASONS",
    "TOKEN_KINDS",
    "UPSTREAM_ERROR_KINDS",
    "GatewayMetrics",
]

REQUEST_MODES = (*MODES, "unknown")  # "unknown": rejected before a mode was known
SAMPLED_MODES = tuple(m for m in MODES if m != "off")  # the modes whose requests sample
STATUSES = ("200", "400", "401", "404", "413", "422", "429", "499", "500", "502", "503", "504")
CANDIDATE_OUTCOMES = ("scored", "cancelled", "failed")
TOKEN_KINDS = ("prompt", "completion")
STOP_REASONS = (
    "threshold",  # the policy's stopping rule fired (paper Alg. "Adaptive Best-of-N", UCB cap)
    "target",  # target-acceptance rule (paper Sec. 4.3)
    "fixed",  # fixed Best-of-N finished its N
    "budget",  # max-samples reached
    "greedy",  # temperature 0: every candidate would be the same reply, one was drawn
    "min_samples",
    "timeout",  # request deadline hit; best so far returned
    "reward_unavailable",  # reward backend down; first candidate returned (fallback)
    "exhausted",  # candidates failed so the budget ran out before the policy stopped
    "patience",  # stoppers.Patience
    "tied",  # stoppers.robust: the best is tied at a ceiling (e.g. an upper clip)
    "ceiling",  # stoppers.robust: the best is (target mode: near enough) the scale's top
    "floor",  # stoppers.robust: every reward at the bottom of the deployment's scale, long enough
    "repeated",  # stoppers.robust.pile: a best that keeps coming back (the deployment's were tops)
    "other",
)
UPSTREAM_ERROR_KINDS = (
    "rate_limited",  # 429
    "server_error",  # 5xx
    "client_error",  # other 4xx
    "connection",  # refused / reset / DNS
    "timeout",
    "protocol",  # broken or truncated stream, invalid JSON
)

# LLM calls take seconds to minutes: buckets well past the default 10 s.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
REWARD_BUCKETS = (-10, -5, -2, -1, -0.5, 0, 0.25, 0.5, 0.75, 1, 2, 5, 10)


def _fixed(value: str, allowed: tuple[str, ...]) -> str:
    return value if value in allowed else "other"


class GatewayMetrics:
    """All gateway metrics on one registry, with methods that clamp labels to the fixed sets."""

    def __init__(
        self, registry: CollectorRegistry, *, max_samples: int, tasks: tuple[str, ...] = ()
    ) -> None:
        self.registry = registry
        # per-task series: the operator's declared tasks (--metric-tasks), folded otherwise
        self.declared_tasks = tuple(tasks)
        self.tasks = (*tasks, *METRIC_TASK_FOLDS)
        self.requests = Counter(
            "pandora_requests_total",
            "Chat completion requests by mode and HTTP status",
            ["mode", "status"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "pandora_request_duration_seconds",
            "Gateway request latency (until the response is complete)",
            ["mode"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.samples_per_request = Histogram(
            "pandora_samples_per_request",
            "Scored candidates per request",
            ["mode"],
            buckets=tuple(range(1, max_samples + 1)),
            registry=registry,
        )
        self.candidates = Counter(
            "pandora_candidates_total",
            "Candidates by outcome (scored, cancelled on stop, failed after retries)",
            ["outcome"],
            registry=registry,
        )
        self.repeated_candidates = Counter(
            "pandora_repeated_candidates_total",
            "Scored candidates whose reply repeated one already scored in the same request "
            "(its score reused, no reward call)",
            registry=registry,
        )
        self.samples_saved = Counter(
            "pandora_samples_saved_total",
            "Generations saved against the fixed baseline N (baseline_n - candidates used)",
            registry=registry,
        )
        self.tokens = Counter(
            "pandora_tokens_total",
            "Tokens over all candidates (cancelled partials included)",
            ["kind"],
            registry=registry,
        )
        self.stop_reasons = Counter(
            "pandora_stop_reason_total", "Why sampling stopped", ["reason"], registry=registry
        )
        self.best_reward = Histogram(
            "pandora_best_reward",
            "Reward of the returned candidate",
            buckets=REWARD_BUCKETS,
            registry=registry,
        )
        self.upstream_duration = Histogram(
            "pandora_upstream_request_duration_seconds",
            "Duration of one upstream generation call",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.reward_duration = Histogram(
            "pandora_reward_request_duration_seconds",
            "Duration of one reward scoring call",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.upstream_errors = Counter(
            "pandora_upstream_errors_total",
            "Failed upstream attempts by kind",
            ["kind"],
            registry=registry,
        )
        self.inflight_requests = Gauge(
            "pandora_inflight_requests", "Requests being served", registry=registry
        )
        # A plain counter read at scrape time: a Gauge update takes a lock and several checks,
        # and this one changes twice per request (RequestRecord; all on the event loop).
        self.requests_in_flight = 0
        self.inflight_requests.set_function(lambda: self.requests_in_flight)
        self.inflight_candidates = Gauge(
            "pandora_inflight_candidates", "Upstream generations in flight", registry=registry
        )
        task_help = (
            " by X-Pandora-Task (a --metric-tasks label; 'other': another task; 'none': no task)"
        )
        self.task_requests = Counter(
            "pandora_task_requests_total",
            "Sampled requests finished" + task_help,
            ["task", "mode"],
            registry=registry,
        )
        self.task_generations = Counter(
            "pandora_task_generations_total",
            "Generations paid for (scored and cancelled candidates)" + task_help,
            ["task", "mode"],
            registry=registry,
        )
        self.task_samples_saved = Counter(
            "pandora_task_samples_saved_total",
            "Generations saved against the fixed baseline N" + task_help,
            ["task", "mode"],
            registry=registry,
        )
        self._precreate()
        # Children for every known (mode, status): ``labels()`` costs more than the update
        # itself, and request_finished runs once per request (also in mode off).
        self._finished = {
            (mode, int(status)): (
                self.requests.labels(mode=mode, status=status),
                self.request_duration.labels(mode=mode),
            )
            for mode in REQUEST_MODES
            for status in STATUSES
        }

    def _precreate(self) -> None:
        for mode in REQUEST_MODES:
            self.request_duration.labels(mode=mode)
            self.samples_per_request.labels(mode=mode)
            for status in STATUSES:
                self.requests.labels(mode=mode, status=status)
        for outcome in CANDIDATE_OUTCOMES:
            self.candidates.labels(outcome=outcome)
        for kind in TOKEN_KINDS:
            self.tokens.labels(kind=kind)
        for reason in STOP_REASONS:
            self.stop_reasons.labels(reason=reason)
        for kind in UPSTREAM_ERROR_KINDS:
            self.upstream_errors.labels(kind=kind)
        # (task, mode) -> its three children, looked up once (as ``_finished``)
        self._task_children = {
            (task, mode): self._task_series(task, mode)
            for task in self.tasks
            for mode in SAMPLED_MODES
        }

    # -- recording helpers (label values clamped to the fixed sets) ---------------------------
    def request_finished(self, mode: str, status: int, seconds: float) -> None:
        children = self._finished.get((mode, status))
        if children is not None:
            children[0].inc()
            children[1].observe(seconds)
            return
        mode = _fixed(mode, REQUEST_MODES)
        code = str(status)
        self.requests.labels(mode=mode, status=code if code in STATUSES else "other").inc()
        self.request_duration.labels(mode=mode).observe(seconds)

    def task_outcome(self, task: str | None, mode: str, *, generations: int, saved: int) -> None:
        """One sampled request of ``task`` finished (series per declared task, else folded)."""
        label = "none" if task is None else _fixed(task, self.declared_tasks)
        children = self._task_children.get((label, mode))
        if children is None:  # not a sampled mode (the gateway never sends one)
            children = self._task_series(label, "other")
        requests, generations_total, saved_total = children
        requests.inc()
        generations_total.inc(generations)
        saved_total.inc(saved)

    def _task_series(self, task: str, mode: str) -> tuple[Counter, Counter, Counter]:
        return (
            self.task_requests.labels(task=task, mode=mode),
            self.task_generations.labels(task=task, mode=mode),
            self.task_samples_saved.labels(task=task, mode=mode),
        )

    def candidate(self, outcome: str, count: int = 1) -> None:
        if count:
            self.candidates.labels(outcome=_fixed(outcome, CANDIDATE_OUTCOMES)).inc(count)

    def stop_reason(self, reason: str) -> None:
        self.stop_reasons.labels(reason=_fixed(reason, STOP_REASONS)).inc()

    def upstream_error(self, kind: str) -> None:
        self.upstream_errors.labels(kind=_fixed(kind, UPSTREAM_ERROR_KINDS)).inc()

    def add_tokens(self, prompt: int, completion: int) -> None:
        if prompt:
            self.tokens.labels(kind="prompt").inc(prompt)
        if completion:
            self.tokens.labels(kind="completion").inc(completion)

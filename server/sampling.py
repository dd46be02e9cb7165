"""The sampling loop: candidates in parallel, rewards into the stopper, cancel the rest on stop.

This is the online form of the paper's Algorithm "Adaptive Best-of-N Sampling via UCB Pandora's
Box" (Sec. 4.2): draw a candidate, score it, ask the stopping rule; here up to ``parallelism``
draws are in flight so the wall-clock cost of a sequential rule stays low. Rewards reach the
policy in launch order within each batch of candidates that finished together.

With a :class:`server.priors.PriorStore`, adaptive and target requests get their model's
deployment prior, and a request that finished normally (the policy stopped or the budget ran
out; not a timeout, a reward fallback, a failure or a client disconnect) teaches it its
rewards in the order they were scored.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reward.base import RewardBackend, RewardError
from server.candidate import Candidate, CandidateBuilder
from server.control import SamplingPlan
from server.errors import (
    NoCandidateError,
    RewardUnavailableError,
    UpstreamClientError,
    UpstreamTimeoutError,
)
from server.metrics import GatewayMetrics
from server.policies import PolicyFactory, accepts_prior
from server.priors import PriorStore, prior_mode_for
from server.scoped_tasks import ScopedTask, cancel_all
from server.upstream import UpstreamClient, UpstreamFailure

__all__ = ["Sampler", "SamplingOutcome"]

log = logging.getLogger(__name__)
# Stop reasons after which a request's rewards are not what its policy would have seen.
_NOT_LEARNED = frozenset({"timeout", "reward_unavailable"})
# Clients learn that scoring failed and why, never where the reward backend lives.
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)


@dataclass
class SamplingOutcome:
    """Everything a response needs: the ranked candidates and the run's bookkeeping."""

    scored: list[Candidate]  # in the order their rewards reached the policy
    rewards: list[float]  # aligned with ``scored``
    chosen: list[int]  # positions in ``scored``: the n best distinct, best first
    stop_reason: str
    cancelled: int
    failed: int
    prompt_tokens: int
    completion_tokens: int
    threshold: float | None
    acceptance_estimate: float | None

    @property
    def best(self) -> Candidate:
        return self.scored[self.chosen[0]]

    @property
    def best_reward(self) -> float | None:
        return self.rewards[self.chosen[0]] if self.rewards else None


class Sampler:
    """Runs one request's sampling loop; shared by all requests (holds no per-request state)."""

    def __init__(
        self,
        upstream: UpstreamClient,
        reward: RewardBackend,
        metrics: GatewayMetrics,
        policy_factory: PolicyFactory,
        *,
        reward_fallback: bool,
        reward_timeout: float,
        priors: PriorStore | None = None,
    ) -> None:
        self.upstream = upstream
        self.reward = reward
        self.metrics = metrics
        self.policy_factory = policy_factory
        # A factory that cannot take a prior gets none, and then nothing is learned either.
        self.priors = priors if accepts_prior(policy_factory) else None
        self.reward_fallback = reward_fallback
        self.reward_timeout = reward_timeout

    async def run(
        self,
        messages: Sequence[Mapping[str, Any]],
        body: dict[str, Any],
        plan: SamplingPlan,
        *,
        deadline: float,
    ) -> SamplingOutcome:
        run = _Run(self, messages, body, plan)
        try:
            async with asyncio.timeout(deadline):
                await run.loop()
        except TimeoutError:
            run.timed_out = True
        finally:
            await run.cancel_in_flight()
        outcome = run.outcome()  # raises when every candidate failed
        learns = (
            run.prior is not None
            and not plan.greedy  # greedy decoding's one reward says nothing of a shape
            and outcome.stop_reason not in _NOT_LEARNED
            and bool(outcome.rewards)
        )
        if learns:
            assert self.priors is not None and run.prior_mode is not None
            self.priors.learn(run.prior_mode, run.prior, outcome.rewards)
        return outcome

    async def score(self, messages: Sequence[Mapping[str, Any]], replies: list[str]) -> list[float]:
        """One reward call for ``replies`` (candidates' ``scoring_text``), checked."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.reward_timeout):
                rewards = await self.reward.score(messages, replies)
        except RewardError as exc:
            log.warning("reward backend failed: %s", exc)  # the full detail, for operators
            message = _URL.sub("<reward backend>", str(exc))
            raise RewardUnavailableError(f"reward backend failed: {message}") from None
        except TimeoutError:
            raise RewardUnavailableError(
                f"reward backend did not answer within {self.reward_timeout:g} s"
            ) from None
        finally:
            self.metrics.reward_duration.observe(time.perf_counter() - started)
        if len(rewards) != len(replies):
            raise RewardUnavailableError(
                f"reward backend returned {len(rewards)} scores for {len(replies)} responses"
            )
        values = [float(r) for r in rewards]
        if not all(math.isfinite(r) for r in values):
            raise RewardUnavailableError("reward backend returned a non-finite score")
        return values


_Flight = tuple[ScopedTask[Candidate], CandidateBuilder]


class _Run:
    """State of one request's loop (kept apart from the shared Sampler)."""

    def __init__(
        self,
        sampler: Sampler,
        messages: Sequence[Mapping[str, Any]],
        body: dict[str, Any],
        plan: SamplingPlan,
    ) -> None:
        self.sampler = sampler
        self.messages = messages
        self.body = body
        self.plan = plan
        self.prior_mode = prior_mode_for(plan.mode) if sampler.priors is not None else None
        model = body.get("model")
        if self.prior_mode is not None and isinstance(model, str) and sampler.priors is not None:
            self.prior = sampler.priors.get(model, self.prior_mode, plan.task)
            self.policy = sampler.policy_factory(plan, prior=self.prior)
            sampler.priors.policy_built(self.prior_mode, self.policy)
        else:
            self.prior = None
            self.policy = sampler.policy_factory(plan)
        # Candidates still generating, by task, with the handle that cancels them: through a
        # cancel scope on the httpx transport (server.scoped_tasks), natively on the lean one.
        self.in_flight: dict[asyncio.Task[Candidate], _Flight] = {}
        self.scored: list[Candidate] = []
        self.rewards: list[float] = []
        # Replies this request has scored, by the text the reward model judges. A reply the
        # generator repeats takes its earlier score without a reward call: identical replies then
        # tie exactly, which the stoppers read as a repeated response (stoppers.robust.tracker.
        # SeenValues), where a batched reward model on a GPU may score two copies a few ulps
        # apart depending on what else was in their batches.
        self.score_of: dict[str, float] = {}
        self.launched = 0
        self.failed = 0
        self.cancelled = 0
        self.cancelled_completion_tokens = 0
        self.stop_reason: str | None = None
        self.last_failure: UpstreamFailure | None = None
        self.timed_out = False
        self.fallback_used = False

    # -- the loop -----------------------------------------------------------------------------
    async def loop(self) -> None:
        plan = self.plan
        while True:
            while (
                self.stop_reason is None
                and len(self.in_flight) < plan.parallelism
                and self.launched < plan.max_samples
                and not self._gave_up()
            ):
                self._launch()
            if not self.in_flight:
                return
            done, _ = await asyncio.wait(self.in_flight, return_when=asyncio.FIRST_COMPLETED)
            finished = self._harvest(done)
            if finished:
                await self._observe(finished)
            if self.stop_reason is not None:
                return

    def _gave_up(self) -> bool:
        """Until one candidate has succeeded, a failure is not replaced: if the whole first
        wave fails, the upstream is down and the request ends (no hammering a dead server)."""
        return not self.scored and self.failed > 0 and self.launched >= self.plan.parallelism

    def _launch(self) -> None:
        index = self.launched
        self.launched += 1
        body = dict(self.body)
        if isinstance(body.get("seed"), int):
            body["seed"] = body["seed"] + index
        builder = CandidateBuilder(index)
        upstream = self.sampler.upstream
        scoped = ScopedTask(upstream.generate(body, builder), scoped=upstream.needs_scoped_cancel)
        self.in_flight[scoped.task] = (scoped, builder)
        self.sampler.metrics.inflight_candidates.inc()

    def _harvest(self, done: set[asyncio.Task[Candidate]]) -> list[Candidate]:
        finished: list[Candidate] = []
        for task in sorted(done, key=lambda t: self.in_flight[t][1].index):
            self.in_flight.pop(task)
            self.sampler.metrics.inflight_candidates.dec()
            error = task.exception()
            if error is None:
                finished.append(task.result())
                continue
            if not isinstance(error, UpstreamFailure):
                raise error
            self.failed += 1
            self.last_failure = error
            self.sampler.metrics.candidate("failed")
            if error.kind == "client_error":
                # The upstream rejects the request itself: every candidate would fail alike.
                raise UpstreamClientError(error.message, status_code=error.status or 400)
        return finished

    async def _observe(self, finished: list[Candidate]) -> None:
        texts = [candidate.scoring_text() for candidate in finished]
        new = [text for text in dict.fromkeys(texts) if text not in self.score_of]
        if new:
            try:
                rewards = await self.sampler.score(self.messages, new)
            except RewardUnavailableError:
                if not self.sampler.reward_fallback:
                    raise
                if not self.scored:
                    self.scored.append(finished[0])
                    self.sampler.metrics.candidate("scored")
                self.fallback_used = True
                self.stop_reason = "reward_unavailable"
                return
            self.score_of.update(zip(new, rewards, strict=True))
        if len(new) < len(finished):
            self.sampler.metrics.repeated_candidates.inc(len(finished) - len(new))
        for candidate, text in zip(finished, texts, strict=True):
            reward = self.score_of[text]
            self.scored.append(candidate)
            self.rewards.append(reward)
            self.sampler.metrics.candidate("scored")
            if self.stop_reason is None and self.policy.observe(reward):
                self.stop_reason = self.policy.stop_reason or "threshold"

    async def cancel_in_flight(self) -> None:
        """Cancel every candidate still generating; closing its stream aborts it upstream."""
        if not self.in_flight:
            return
        flights = list(self.in_flight.items())
        try:
            await cancel_all(scoped for _, (scoped, _) in flights)
        finally:  # every task has finished by now, even when this request is being cancelled
            for task, (_, builder) in flights:
                del self.in_flight[task]
                self.sampler.metrics.inflight_candidates.dec()
                self.cancelled += 1
                if task.cancelled() or task.exception() is not None:
                    self.cancelled_completion_tokens += builder.completion_tokens
                else:  # finished in the same instant: its work was done, count it as cancelled
                    self.cancelled_completion_tokens += task.result().completion_tokens
            self.sampler.metrics.candidate("cancelled", len(flights))

    # -- the result ---------------------------------------------------------------------------
    def outcome(self) -> SamplingOutcome:
        if not self.scored:
            failure = self.last_failure
            if self.timed_out or (failure is not None and failure.kind == "timeout"):
                raise UpstreamTimeoutError(
                    "no candidate finished before the timeout"
                    + (f" (last upstream error: {failure.message})" if failure else "")
                )
            message = failure.message if failure else "no candidate was generated"
            raise NoCandidateError(f"every candidate failed; upstream said: {message}")
        if self.fallback_used:
            reason = "reward_unavailable"
        elif self.timed_out and self.stop_reason is None:
            reason = "timeout"
        elif self.stop_reason is not None:
            reason = self.stop_reason
        else:
            reason = "exhausted" if self.failed else "budget"
        if reason == "budget" and self.plan.greedy:
            reason = "greedy"  # the one candidate greedy decoding needs (control.is_greedy)
        prompt = next((c.prompt_tokens for c in self.scored if c.prompt_tokens), 0)
        return SamplingOutcome(
            scored=self.scored,
            rewards=self.rewards,
            chosen=self._rank(),
            stop_reason=reason,
            cancelled=self.cancelled,
            failed=self.failed,
            prompt_tokens=sum(c.prompt_tokens or prompt for c in self.scored)
            + prompt * self.cancelled,
            completion_tokens=sum(c.completion_tokens for c in self.scored)
            + self.cancelled_completion_tokens,
            threshold=_finite_or_none(self.policy.threshold),
            acceptance_estimate=_finite_or_none(self.policy.acceptance_estimate),
        )

    def _rank(self) -> list[int]:
        """Positions of the n best distinct candidates, best first (ties: earliest first); where
        fewer than n replies are distinct, the best repeats fill the rest, as n choices are what
        an OpenAI client is owed (greedy decoding with n > 1 returns n copies there too)."""
        if not self.rewards:
            return [0]
        order = sorted(range(len(self.scored)), key=lambda i: (-self.rewards[i], i))
        chosen: list[int] = []
        repeats: list[int] = []
        seen: set[str] = set()
        for i in order:
            text = self.scored[i].scoring_text()
            if text in seen:
                repeats.append(i)
                continue
            seen.add(text)
            chosen.append(i)
            if len(chosen) == self.plan.n:
                return chosen
        return chosen + repeats[: self.plan.n - len(chosen)]


def _finite_or_none(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None

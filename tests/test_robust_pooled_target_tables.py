"""ShapePrior's stop tables: the non-building lookup, the bounded cache, snapshot builds, and
the gateway's worker-thread builder (server.table_builds) on its own loop."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from server.table_builds import THREAD_NAME, TableBuilds
from stoppers.robust import shape_prior, stop_table
from stoppers.robust.pooled_target import PooledTargetAcceptance
from stoppers.robust.shape_prior import MAX_TABLES, ShapePrior


def _value(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(name) or 0.0


def _learned(prompts=20, samples=60, seed=0) -> ShapePrior:
    rng = np.random.default_rng(seed)
    prior = ShapePrior()
    for _ in range(prompts):
        prior.update(rng.normal(0, 2) + math.exp(rng.normal(0, 0.3)) * rng.standard_normal(samples))
    return prior


def _grow(prior: ShapePrior, requests: int, seed=1) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(requests):
        assert prior.update(rng.standard_normal(40))


@pytest.fixture
def build_calls(monkeypatch) -> list[tuple]:
    """Count build_table calls (the real build still runs)."""
    calls: list[tuple] = []
    real = shape_prior.build_table

    def counting(*args, **kwargs):
        calls.append(args[2:])  # (target, alpha, min_samples, horizon, requests)
        return real(*args, **kwargs)

    monkeypatch.setattr(shape_prior, "build_table", counting)
    return calls


@pytest.fixture
def cheap_tables(monkeypatch) -> list[tuple]:
    """build_table replaced by a copy of one real table (instant): for tests of many keys."""
    template = _learned(prompts=12).table(0.9, min_samples=8, horizon=64)
    calls: list[tuple] = []

    def cheap(z_counts, s_counts, target, alpha, min_samples, horizon, requests, **options):
        calls.append((target, min_samples, horizon))
        return dataclasses.replace(template, target=target, requests=requests)

    monkeypatch.setattr(shape_prior, "build_table", cheap)
    return calls


def test_deferred_lookup_never_builds_and_returns_stale_tables(build_calls):
    prior = _learned(prompts=20)
    first = prior.table(0.8, min_samples=8, horizon=100)  # blocking mode: built here
    assert len(build_calls) == 1
    wanted: list[tuple] = []
    prior.schedule_build = lambda p, key: wanted.append((p, key))
    _grow(prior, 25)  # 45 >= 2 x 20: the cached table is now stale
    key = prior.table_key(0.8, min_samples=8, horizon=100)
    assert prior.is_stale(key)
    # the stale table is returned, the rebuild only requested
    assert prior.table(0.8, min_samples=8, horizon=100) is first
    assert prior.cached_table(0.8, min_samples=8, horizon=100) is first
    assert wanted == [(prior, key)]
    # a key never built: None, requested too
    assert prior.table(0.95, min_samples=8, horizon=100) is None
    assert wanted[-1] == (prior, prior.table_key(0.95, min_samples=8, horizon=100))
    assert prior.cached_table(0.7, min_samples=8, horizon=100) is None
    # the policy uses the stale table, or with none runs its cold start; nothing is built
    assert not PooledTargetAcceptance(0.8, prior=prior, min_samples=8, max_samples=100).cold
    assert PooledTargetAcceptance(0.95, prior=prior, min_samples=8, max_samples=100).cold
    assert len(build_calls) == 1
    # the requested build, run elsewhere and installed, is what the next lookup returns
    fresh = prior.prepare(key)()
    assert prior.install(key, fresh)
    assert prior.table(0.8, min_samples=8, horizon=100) is fresh and not prior.is_stale(key)
    assert fresh.requests == 45 and len(build_calls) == 2


def test_blocking_mode_still_builds_and_caches(build_calls):
    prior = _learned(prompts=12)
    table = prior.table(0.9, min_samples=8, horizon=64)
    assert table is not None and prior.table(0.9, min_samples=8, horizon=64) is table
    assert len(build_calls) == 1
    assert ShapePrior().table(0.9, min_samples=8, horizon=64) is None  # empty prior


def test_prepare_snapshots_the_evidence():
    """A build prepared before update() sees the histograms as they were (the gateway hands it
    to a thread while the loop keeps learning)."""
    prior = _learned(prompts=12)
    key = prior.table_key(0.9, min_samples=8, horizon=64)
    build = prior.prepare(key)
    before = build()
    _grow(prior, 30)
    again = build()
    assert again == before and again.requests == 12
    assert prior.prepare(key)() != before  # a new snapshot sees the new evidence
    with pytest.raises(ValueError):
        ShapePrior().prepare(key)


def test_install_keeps_the_table_built_on_more_evidence():
    prior = _learned(prompts=12)
    key = prior.table_key(0.9, min_samples=8, horizon=64)
    old = prior.prepare(key)()
    _grow(prior, 20)
    new = prior.prepare(key)()
    assert prior.install(key, new)
    assert not prior.install(key, old)  # a slow, older build finishing late is ignored
    assert prior.cached_table(0.9, min_samples=8, horizon=64) is new


def test_table_cache_is_a_bounded_lru_under_many_client_keys(cheap_tables):
    prior = _learned(prompts=12)
    assert prior.max_tables == MAX_TABLES
    keep = prior.table(0.9, min_samples=8, horizon=64)
    for i in range(300):  # client-chosen target / min / max samples, all distinct
        prior.table(0.5 + i / 1000, min_samples=2 + i % 7, horizon=10 + i)
        if i % 10 == 0:
            assert prior.table(0.9, min_samples=8, horizon=64) is keep  # recently used: kept
        assert len(prior._tables) <= MAX_TABLES
    assert len(prior._tables) == MAX_TABLES
    assert prior.table_key(0.9, min_samples=8, horizon=64) in prior._tables
    assert prior.cached_table(0.5, min_samples=2, horizon=10) is None  # evicted long ago
    # the deferred mode is bounded the same way
    prior.schedule_build = lambda p, key: p.install(key, p.prepare(key)())
    for i in range(300):
        PooledTargetAcceptance(0.2 + i / 1000, prior=prior, min_samples=3, max_samples=50 + i)
    assert len(prior._tables) == MAX_TABLES


def test_builder_runs_one_deduplicated_bounded_build_at_a_time(monkeypatch):
    """TableBuilds on a running loop: builds on its one worker thread, never on the loop;
    one build per (prior, key) at a time; at most max_pending queued; installs on the loop."""
    gate = threading.Event()
    threads: list[str] = []
    running = 0
    most = 0
    lock = threading.Lock()
    template = _learned(prompts=12).table(0.9, min_samples=8, horizon=64)

    def gated(z_counts, s_counts, target, alpha, min_samples, horizon, requests, **options):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        threads.append(threading.current_thread().name)
        gate.wait(5)
        with lock:
            running -= 1
        return dataclasses.replace(template, target=target, requests=requests)

    monkeypatch.setattr(shape_prior, "build_table", gated)

    async def scenario() -> None:
        registry = CollectorRegistry()
        builds = TableBuilds(max_pending=3, registry=registry)
        prior = _learned(prompts=12)
        builds.attach(prior)
        assert prior.schedule_build == builds.request
        started = time.perf_counter()
        for _ in range(5):  # the same key five times: one build
            assert prior.table(0.9, min_samples=8, horizon=64) is None
        for i in range(20):  # many more keys than the queue holds
            prior.table(0.5 + i / 100, min_samples=8, horizon=64)
        assert time.perf_counter() - started < 0.5  # nothing waited for a build
        assert _value(registry, "pandora_prior_table_builds_pending") == 3
        dropped = _value(registry, "pandora_prior_table_builds_dropped_total")
        assert dropped == 18  # 20 new keys, 2 queued
        gate.set()
        for _ in range(1000):
            if _value(registry, "pandora_prior_table_builds_total") >= 3:
                break
            await asyncio.sleep(0.01)
        assert _value(registry, "pandora_prior_table_builds_total") == 3
        assert prior.cached_table(0.9, min_samples=8, horizon=64) is not None
        assert not builds.is_pending(prior, prior.table_key(0.9, min_samples=8, horizon=64))
        # a dropped key is asked again by the next lookup
        assert prior.table(0.69, min_samples=8, horizon=64) is None
        assert builds.is_pending(prior, prior.table_key(0.69, min_samples=8, horizon=64))
        await builds.aclose()
        assert prior.table(0.68, min_samples=8, horizon=64) is None  # closed: nothing queued
        assert not builds.is_pending(prior, prior.table_key(0.68, min_samples=8, horizon=64))

    asyncio.run(scenario())
    assert most == 1 and all(name.startswith(THREAD_NAME) for name in threads)
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]


def test_builder_close_waits_for_the_running_build_and_drops_the_queue(monkeypatch):
    release = threading.Event()
    started = threading.Event()
    real = shape_prior.build_table
    calls = []

    def slow(*args, **kwargs):
        calls.append(args[2])
        started.set()
        release.wait(5)
        return real(*args, **kwargs)

    monkeypatch.setattr(shape_prior, "build_table", slow)

    async def scenario() -> float:
        builds = TableBuilds()
        prior = _learned(prompts=12)
        builds.attach(prior)
        prior.table(0.9, min_samples=8, horizon=64)
        prior.table(0.8, min_samples=8, horizon=64)  # queued behind the first
        assert await asyncio.to_thread(started.wait, 5)
        threading.Timer(0.3, release.set).start()
        ticks = 0

        async def tick() -> None:  # the loop stays responsive while close waits
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        t0 = time.perf_counter()
        await builds.aclose()
        waited = time.perf_counter() - t0
        ticker.cancel()
        assert ticks >= 10
        return waited

    waited = asyncio.run(scenario())
    assert 0.2 < waited < 5
    assert calls == [0.9]  # the queued build was cancelled
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]


def test_builder_without_a_running_loop_builds_in_place(build_calls):
    registry = CollectorRegistry()
    builds = TableBuilds(registry=registry)
    prior = _learned(prompts=12)
    builds.attach(prior)
    table = prior.table(0.9, min_samples=8, horizon=64)
    assert table is None  # this lookup did not wait for it ...
    assert prior.cached_table(0.9, min_samples=8, horizon=64) is not None  # ... the next has it
    assert len(build_calls) == 1 and _value(registry, "pandora_prior_table_builds_total") == 1


# -- scale_shrink: how far a request's own sd is pulled towards the learned scales ------------
def test_scale_shrink_weights_the_scale_prior_and_is_a_setting_not_evidence():
    with pytest.raises(ValueError, match="scale_shrink"):
        ShapePrior(scale_shrink=1.5)
    full = _learned(prompts=12)
    loose = dataclasses.replace(_learned(prompts=12), scale_shrink=0.25)
    none = dataclasses.replace(_learned(prompts=12), scale_shrink=0.0)
    tables = [p.table(0.9, min_samples=8, horizon=64) for p in (full, loose, none)]
    assert tables[1].scale_prec == pytest.approx(tables[0].scale_prec * 0.25)
    assert 0.0 < tables[2].scale_prec < 1e-5 * tables[0].scale_prec
    # a request whose sd is 4x the typical scale: judged on its own sd the less it is shrunk
    typical = math.exp(tables[0].scale_mu)
    scales = [t.scale(8, 4.0 * typical) for t in tables]
    assert scales[0] < scales[1] < scales[2] == pytest.approx(4.0 * typical, rel=1e-4)
    for table in tables:  # every variant is calibrated and usable from the first reward on
        assert math.isfinite(table.offset) and math.isfinite(table.scale(1, 0.0))
        assert all(math.isfinite(z) for z in table.z_star)
    # not persisted: a restored prior takes the default until its owner sets it
    assert "scale_shrink" not in loose.to_dict()
    assert ShapePrior.from_dict(loose.to_dict()).scale_shrink == 1.0


def test_less_shrinkage_evens_out_wide_and_narrow_prompts():
    """The point of the setting, on one learned prior: with the full scale prior a wide prompt
    (scales 3x the typical) stops on a lower raw threshold than its scale warrants, so it
    gets less than the target; judged on its own sd it is held to its own scale."""
    prior = _learned(prompts=30, samples=60)
    loose = dataclasses.replace(_learned(prompts=30, samples=60), scale_shrink=0.0)
    rng = np.random.default_rng(5)
    typical = math.exp(prior.table(0.9, min_samples=8, horizon=64).scale_mu)
    stops = {}
    for name, p in (("full", prior), ("loose", loose)):
        ns = []
        for _ in range(200):
            policy = PooledTargetAcceptance(0.9, prior=p, max_samples=256)
            for reward in 3.0 * typical * rng.standard_normal(256):
                if policy.observe(float(reward)):
                    break
            ns.append(policy.n)
        stops[name] = float(np.mean(ns))
    assert stops["loose"] > stops["full"]  # held to its own (wide) scale: samples longer


def test_tables_are_rebuilt_every_rebuild_every_requests_not_only_when_the_count_doubles(
    cheap_tables,
):
    """A long-running deployment whose traffic drifts: a table built at 300 requests was stale
    only at 600 before 2026-11-30; now at 300 + REBUILD_EVERY. Early on the doubling decides."""
    prior = _learned(prompts=12)
    key = prior.table_key(0.9, min_samples=8, horizon=64)
    prior.table(0.9, min_samples=8, horizon=64)
    _grow(prior, 11)  # 23 < 24 = 2 x 12: fresh
    assert not prior.is_stale(key)
    _grow(prior, 1)
    assert prior.is_stale(key)
    _grow(prior, 300 - prior.requests)
    prior.table(0.9, min_samples=8, horizon=64)
    assert cheap_tables[-1] == (0.9, 8, 64) and not prior.is_stale(key)
    _grow(prior, shape_prior.REBUILD_EVERY - 1)
    assert not prior.is_stale(key)
    _grow(prior, 1)
    assert prior.is_stale(key)


def test_the_scales_forget_past_scale_memory_requests():
    """Below SCALE_MEMORY requests every request counts once, as before; past it the old ones
    fade, so after the scales double the scale prior follows the new requests: after twice
    SCALE_MEMORY of them the old weigh e^-2. Counted, the old third would hold the mean log sd
    at 2/3 of log 2."""
    rng = np.random.default_rng(4)
    prior = ShapePrior()
    memory = shape_prior.SCALE_MEMORY
    for _ in range(memory):
        prior.update(rng.normal(0, 2) + rng.standard_normal(40))
    assert prior.s_counts.sum() == pytest.approx(memory)
    before = stop_table.scale_prior(prior.s_counts)[0]
    assert abs(before) < 0.1
    for _ in range(2 * memory):
        prior.update(rng.normal(0, 2) + 2.0 * rng.standard_normal(40))
    assert prior.s_counts.sum() == pytest.approx(memory)
    assert prior.z_counts.sum() < memory * 40  # the recorded shape forgets alike
    after = stop_table.scale_prior(prior.s_counts)[0]
    assert 0.8 * math.log(2.0) < after < 1.05 * math.log(2.0)  # 1 - e^-2 of the way
    assert prior.requests == 3 * memory  # the count of requests learned is not a weight

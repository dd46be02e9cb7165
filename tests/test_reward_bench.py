"""The benchmark's machinery (not its timings): both load generators score for real, and the
summary pairs the modes. Timings are measured by running `python -m reward.bench`."""

from __future__ import annotations

import asyncio
import math
import os
import time

import pytest
from reward_fixtures import load_tiny_scorer, serve

from reward.app import create_app
from reward.bench import Measurement, measure, process_cpu_clock, summarize
from reward.local import LocalRewardBackend
from reward.settings import WorkerSettings


def test_load_generators_score_through_http_and_in_process() -> None:
    scorer = load_tiny_scorer()
    options = {"concurrency": 4, "seconds": 0.3, "responses_per_request": 2, "response_words": 5}

    async def in_process() -> Measurement:
        backend = LocalRewardBackend("tiny", load_scorer=lambda: scorer)
        try:
            return await measure(backend, mode="on", cpu_clock=time.process_time, **options)
        finally:
            await backend.aclose()

    async def in_process_without_clock() -> Measurement:
        backend = LocalRewardBackend("tiny", load_scorer=lambda: scorer)
        try:
            return await measure(backend, mode="on", **(options | {"seconds": 0.1}))
        finally:
            await backend.aclose()

    app = create_app(WorkerSettings(model="tiny"), load_scorer=lambda: scorer)
    with serve(app) as url:
        while not app.state.backend.loaded:
            asyncio.run(asyncio.sleep(0.02))
        clock = process_cpu_clock(os.getpid())  # the test's own process serves here
        over_http = asyncio.run(measure(url, mode="off", cpu_clock=clock, **options))
    local = asyncio.run(in_process())
    for result in (over_http, local):
        assert result.errors == 0
        assert result.items > 0 and result.items % 2 == 0
        assert result.items_per_second > 0 and result.latency_p50_ms > 0
        assert 10 < result.tokens_per_item < 200
        assert 0 < result.cpu_ms_per_item < 1000
    assert math.isnan(asyncio.run(in_process_without_clock()).cpu_ms_per_item)


def test_summary_takes_medians_per_mode_and_the_on_off_ratio() -> None:
    def m(mode: str, rate: float, rnd: int) -> Measurement:
        return Measurement(mode, 32, rnd, 100, 1.0, rate, 10.0, 20.0, 0, 50.0, 1000 / rate)

    results = [m("on", 300, 0), m("on", 90, 1), m("on", 310, 2), m("off", 100, 0)]
    results += [m("off", 110, 1), m("off", 50, 2)]
    (row,) = summarize(results)
    assert row["on_items_per_s"] == 300 and row["off_items_per_s"] == 100
    assert row["speedup"] == 3.0
    assert row["round_speedups"] == "3.00, 0.82, 6.20"  # the same round's modes paired
    assert row["cpu_speedup"] == pytest.approx(3.0)  # median CPU per item, off over on
    assert row["round_speedup_median"] == 3.0 and row["round_speedup_min"] == 90 / 110


def test_prompts_differ_in_the_question_under_one_system_prompt() -> None:
    from reward.bench import PROMPT, _prompts

    dialogues = _prompts(4)
    assert dialogues[0] == PROMPT
    assert all(dialogue[0] == PROMPT[0] for dialogue in dialogues)
    assert len({dialogue[1]["content"] for dialogue in dialogues}) == 4

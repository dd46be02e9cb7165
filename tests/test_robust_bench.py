"""The per-observe benchmark's timing harness (stoppers.robust.bench.observe_latency)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from stoppers.robust.bench import observe_latency


class _Recorder:
    """A policy that never stops and keeps what it was fed (in a class-level list: the harness
    times deep copies of the policy)."""

    seen: ClassVar[list[float]] = []

    def __init__(self) -> None:
        self.n = 0

    def observe(self, reward: float) -> bool:
        _Recorder.seen.append(reward)
        self.n += 1
        return False


def test_times_one_window_per_repeat_on_rounded_rewards_when_asked():
    _Recorder.seen = []
    t = observe_latency(_Recorder, 33, repeats=4, step=0.5)
    assert t.shape == (4 * 2,) and np.all(t >= 0.0)  # windows of 33 // 16 rewards
    seen = np.asarray(_Recorder.seen)
    assert seen.size == 32 + 8
    assert np.all(seen * 2 == np.round(seen * 2))  # on the 0.5 lattice
    _Recorder.seen = []
    observe_latency(_Recorder, 33, repeats=1)
    assert len(set(_Recorder.seen)) == len(_Recorder.seen)  # Student-t draws do not repeat


def test_raises_rewards_to_a_floor_when_asked():
    _Recorder.seen = []
    observe_latency(_Recorder, 64, repeats=2, floor=-1.0)
    seen = np.asarray(_Recorder.seen)
    assert seen.min() == -1.0 and 0.05 < np.mean(seen == -1.0) < 0.5  # t(3) under -1: 0.2


def test_the_cut_row_times_the_cut_reading():
    from stoppers.robust.bench import _cut_unreachable

    t = observe_latency(_cut_unreachable(), 40, repeats=2, floor=-1.0)
    assert t.size == 2 * 2 and np.all(t > 0.0)


def test_the_target_rows_time_past_where_the_repeats_rule_would_stop():
    """On continuous rewards the target-aware repeats rule stops a 0.9 request at 229 draws
    (SeenValues); the target rows raise its target out of reach so n = 960 can be timed."""
    from stoppers.robust.bench import _multiplier_unreachable, _pooled_unreachable

    for make in (_pooled_unreachable(), _multiplier_unreachable()):
        t = observe_latency(make, 300, repeats=1)
        assert t.size == 300 // 16 and np.all(t > 0.0)

"""The short CI version of the load and soak script (``python -m server.loadtest``).

The full runs (500 clients for 60 s; a 5-minute soak) are scripts with their figures in the
README; here a few clients drive the real gateway process (adaptive mode, instant fake upstream
and reward) for ~10 s and the same invariants are asserted: no non-2xx, no transport error, no
error in the gateway's log, RSS flat after warm-up, and afterwards the gateway's asyncio tasks
and non-upstream file descriptors back to their baseline.
"""

from __future__ import annotations

from server.loadtest import run


def test_short_load_and_soak():
    clients = 16
    report = run(clients=clients, duration=10.0, warmup=4.0, settle=0)
    summary = "\n".join(report.lines())
    assert report.requests >= clients, summary
    assert report.non_2xx == {} and report.transport_errors == {}, summary
    assert report.gateway_log_problems == [], summary
    assert report.mean_samples > 1, summary  # the adaptive loop really ran
    # back to baseline: every client connection closed, no task left behind
    assert report.end_of_load["tasks"] == report.baseline["tasks"], summary
    assert report.end_of_load["fds_other"] == report.baseline["fds_other"], summary
    # pooled upstream connections never exceed what was ever in flight (parallelism 4)
    assert report.end_of_load["fds_upstream"] <= clients * 4 + report.baseline["fds_upstream"]
    assert report.rss_growth < 0.10, summary

"""A test run stopped by SIGTERM still stops what it started.

By default SIGTERM (a CI timeout, ``kill``) ends pytest at once: no fixture teardown runs, and the
servers and workers the tests started (uvicorn gateways, ``pandora serve``, Prometheus) keep
running - one gateway outlived an interrupted run by 19 minutes. Raised as KeyboardInterrupt
instead, pytest stops the run and tears every fixture down, as on Ctrl-C.
"""

from __future__ import annotations

import signal
from types import FrameType


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def pytest_configure() -> None:
    """Install the handler unless someone else already handles SIGTERM."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)

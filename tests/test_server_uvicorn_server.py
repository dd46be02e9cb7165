"""`pandora serve` runs on FrozenHeapServer: the start-up heap leaves the collector's full scans."""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import weakref
from collections.abc import Iterator

import pytest

from server.uvicorn_server import FrozenHeapServer, freeze_heap


def _app(*, fail_startup: bool = False):
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    if fail_startup:
                        await send({"type": "lifespan.startup.failed", "message": "boom"})
                        return
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        else:  # pragma: no cover - never requested here
            raise AssertionError(scope["type"])

    return app


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Each test starts and ends with nothing frozen (the test process's heap is not ours)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


@contextlib.contextmanager
def _running(app) -> Iterator[tuple[FrozenHeapServer, threading.Thread]]:
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical", lifespan="on")
    server = FrozenHeapServer(config)

    def run() -> None:
        with contextlib.suppress(SystemExit):  # uvicorn exits 3 after a failed start-up
            server.run()

    thread = threading.Thread(target=run, name="uvicorn-frozen-heap", daemon=True)
    thread.start()
    try:
        yield server, thread
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "uvicorn did not stop"


def _wait(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_heap_is_frozen_once_the_server_has_started(unfrozen) -> None:
    assert gc.get_freeze_count() == 0
    with _running(_app()) as (server, _):
        assert _wait(lambda: server.started), "uvicorn did not start"
        assert _wait(lambda: gc.get_freeze_count() > 0), "the start-up heap was not frozen"


def test_nothing_is_frozen_when_start_up_fails(unfrozen) -> None:
    with _running(_app(fail_startup=True)) as (server, thread):
        thread.join(30)  # the server exits on its own after a failed lifespan start-up
        assert not server.started
    assert gc.get_freeze_count() == 0


def test_freeze_heap_collects_garbage_before_freezing(unfrozen) -> None:
    class Node:
        pass

    cycle = Node()
    cycle.self = cycle  # only the cyclic collector can free it
    collected = weakref.ref(cycle)
    alive = Node()
    kept = weakref.ref(alive)
    del cycle
    gc.disable()  # no automatic collection may free the cycle first
    try:
        assert collected() is not None
        freeze_heap()
    finally:
        gc.enable()
    assert gc.get_freeze_count() > 0
    assert collected() is None, "a cycle left by start-up was frozen for ever, not collected"
    assert kept() is alive

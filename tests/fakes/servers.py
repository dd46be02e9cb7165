"""Run an ASGI app (the gateway) on real uvicorn, on a free 127.0.0.1 port, in a thread.

Example::

    with ServerThread(create_app(settings, upstream=client, reward=FakeReward())) as server:
        openai.OpenAI(base_url=server.url + "/v1", api_key="x")...
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

__all__ = ["ServerThread", "free_port"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerThread:
    def __init__(self, app, *, log_level: str = "warning", **config) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.config = uvicorn.Config(app, log_level=log_level, lifespan="on", **config)
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self._run, name="gateway", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self.server.run(sockets=[self.sock])

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (see the log above)")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

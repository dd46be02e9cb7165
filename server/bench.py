"""Loopback benchmark of the gateway's overhead (run from a source checkout).

    python -m server.bench                 # ~2-3 minutes (3 s runs), prints a Markdown table
    python -m server.bench --quick         # 1 s runs

Three processes share the machine: the fake upstream (``tests.fakes.FakeUpstream``, instant,
8 tokens), the gateway (the same uvicorn settings as ``pandora serve``) and this load generator
(a minimal keep-alive HTTP/1.1 client on asyncio streams, so the client costs as little CPU as
possible). For each scenario the same load is sent straight to the upstream and through the
gateway, interleaved, in one run:

- mode ``off`` (pass-through): added latency p50/p99 at concurrency 1; requests/s, p50/p99 and
  gateway CPU milliseconds per request at concurrency 50 and 100;
- mode ``adaptive`` with an instant upstream and an instant in-process reward: the same figures
  (each gateway request then runs the whole sampling loop: ~10 candidates).

Each run is a fixed window (``--seconds``, default 3) after every connection has made one
request; gateway CPU comes from ``/proc/<pid>/stat`` (user + system) over the measured window.
Both servers run as in production: the gateway on :func:`server.uvicorn_server.serve` (heap frozen
after start-up, as ``pandora serve`` does), the fake upstream with its heap frozen as vLLM does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BODY = {
    "model": "bench",
    "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
    "max_tokens": 16,
}


# -- roles run in child processes ------------------------------------------------------------
def run_upstream(port: int) -> None:
    sys.path.insert(0, str(ROOT))
    from server.uvicorn_server import freeze_heap
    from tests.fakes.upstream import FakeUpstream

    upstream = FakeUpstream(tokens=8)
    upstream.start()
    # vLLM freezes its heap after warm-up too; unfrozen, this Python stand-in's own full
    # collections stall both the direct and the proxied runs for tens of milliseconds
    freeze_heap()
    print(upstream.port, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        upstream.stop()


class InstantReward:
    """A reward backend that costs nothing: a pseudo-random score per response."""

    async def score(self, messages, responses):
        return [random.random() for _ in responses]

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        pass


def run_gateway(upstream_url: str, port: int, mode: str) -> None:
    from server.app import create_app
    from server.config import Settings
    from server.uvicorn_server import serve

    settings = Settings(upstream_url=upstream_url, default_mode=mode, port=port)
    app = create_app(settings, reward=InstantReward())
    serve(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- the load generator --------------------------------------------------------------------
class Connection:
    """One keep-alive HTTP/1.1 connection; POSTs JSON and reads the whole answer."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, headers: str = "") -> int:
        try:
            return await self._post(path, body, headers)
        except (asyncio.IncompleteReadError, ConnectionError):
            # the server closed an idle keep-alive connection: reconnect once, as clients do
            self.close()
            self.writer = None
            return await self._post(path, body, headers)

    async def _post(self, path: str, body: bytes, headers: str = "") -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(
            (
                f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n{headers}\r\n"
            ).encode()
            + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        if b"transfer-encoding: chunked" in lower:
            while True:
                size = int((await self.reader.readuntil(b"\r\n"))[:-2], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            start = lower.index(b"content-length:") + 15
            length = int(lower[start : lower.index(b"\r\n", start)])
            await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


@dataclass
class Result:
    requests: int
    seconds: float
    latencies: list[float]
    errors: int
    cpu_seconds: float | None

    def pct(self, q: float) -> float:
        data = sorted(self.latencies)
        return data[min(len(data) - 1, int(q * len(data)))] * 1000

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_ms(self) -> float | None:
        return None if self.cpu_seconds is None else self.cpu_seconds / self.requests * 1000


def cpu_seconds(pid: int | None) -> float | None:
    if pid is None:
        return None
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(
    port: int,
    concurrency: int,
    seconds: float,
    headers: str,
    pid: int | None,
    max_requests: int = 1_000_000,
) -> Result:
    """Closed loop for ``seconds`` from ``concurrency`` connections (at most ``max_requests``).

    A fixed window rather than a fixed count: on a fast machine a few thousand requests last a
    fraction of a second, too short for a steady state (and a single stall dominates it).
    """
    body = json.dumps(BODY).encode()
    latencies: list[float] = []
    errors = 0
    remaining = max_requests
    connections = [Connection("127.0.0.1", port) for _ in range(concurrency)]
    # warm-up: open every connection once (not measured)
    await asyncio.gather(*(c.post("/v1/chat/completions", body, headers) for c in connections))

    deadline = time.perf_counter() + seconds

    async def worker(conn: Connection) -> None:
        nonlocal remaining, errors
        while remaining > 0 and time.perf_counter() < deadline:
            remaining -= 1
            started = time.perf_counter()
            status = await conn.post("/v1/chat/completions", body, headers)
            latencies.append(time.perf_counter() - started)
            errors += status != 200

    cpu_before = cpu_seconds(pid)
    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in connections))
    seconds = time.perf_counter() - started
    cpu_after = cpu_seconds(pid)
    for c in connections:
        c.close()
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return Result(len(latencies), seconds, latencies, errors, cpu)


# -- orchestration -------------------------------------------------------------------------
def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "server.bench", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def wait_port(port: int, timeout: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def median_result(results: list[Result]) -> Result:
    """The run with the median throughput (repeats are interleaved direct/gateway)."""
    return sorted(results, key=lambda r: r.rps)[len(results) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.bench", description=__doc__)
    parser.add_argument("--role", choices=["upstream", "gateway"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--upstream-url", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="off", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="1 s runs (~1 minute)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats per figure")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["off", "adaptive"],
        default=["off", "adaptive"],
        help="gateway modes to measure (default: both)",
    )
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="length of each measured run (default 3)"
    )
    args = parser.parse_args(argv)
    if not args.seconds > 0 or args.repeats < 1:
        parser.error("--seconds must be > 0 and --repeats >= 1")
    if args.role == "upstream":
        run_upstream(args.port)
        return 0
    if args.role == "gateway":
        run_gateway(args.upstream_url, args.port, args.mode)
        return 0

    seconds = min(args.seconds, 1.0) if args.quick else args.seconds
    upstream = spawn("--role", "upstream")
    processes = [upstream]
    try:
        up_port = int(upstream.stdout.readline())
        url = f"http://127.0.0.1:{up_port}/v1"
        gateways = {}
        for mode in args.modes:
            port = free_port()
            processes.append(
                spawn(
                    "--role", "gateway", "--upstream-url", url, "--port", str(port), "--mode", mode
                )
            )
            gateways[mode] = (port, processes[-1].pid)
        for port, _ in gateways.values():
            wait_port(port)
        now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"# pandora-gateway loopback benchmark ({now}, {os.cpu_count()} CPUs)")
        print(f"# load average at start: {os.getloadavg()}")
        rows = []
        for mode, (port, pid) in gateways.items():
            for concurrency in (1, 50, 100):
                direct, through = [], []
                for _ in range(args.repeats):
                    print(f"# {mode} c={concurrency} direct", file=sys.stderr, flush=True)
                    direct.append(asyncio.run(load(up_port, concurrency, seconds, "", None)))
                    print(f"# {mode} c={concurrency} gateway", file=sys.stderr, flush=True)
                    through.append(asyncio.run(load(port, concurrency, seconds, "", pid)))
                d, g = median_result(direct), median_result(through)
                # each repeat's gateway/direct ratio, run back to back: robust to load drifting
                paired = sorted(b.rps / a.rps for a, b in zip(direct, through, strict=True))
                rows.append((mode, concurrency, d, g, paired))
        print()
        print(
            "| mode | conc. | direct req/s | gateway req/s | ratio | paired ratios (median) "
            "| direct p50/p99 ms | gateway p50/p99 ms | added p50 ms | gateway CPU ms/req "
            "| errors |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for mode, concurrency, d, g, paired in rows:
            pairs = ", ".join(f"{r:.0%}" for r in paired)
            print(
                f"| {mode} | {concurrency} | {d.rps:.0f} | {g.rps:.0f} | {g.rps / d.rps:.0%} "
                f"| {pairs} ({statistics.median(paired):.0%}) "
                f"| {d.pct(0.5):.2f} / {d.pct(0.99):.2f} | {g.pct(0.5):.2f} / {g.pct(0.99):.2f} "
                f"| {g.pct(0.5) - d.pct(0.5):+.2f} | {g.cpu_ms:.2f} | {d.errors + g.errors} |"
            )
        print(f"\n# load average at end: {os.getloadavg()}")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())

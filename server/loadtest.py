"""Load and soak test of the gateway on loopback (run from a source checkout).

    python -m server.loadtest                                  # 500 clients, 60 s, adaptive
    python -m server.loadtest --duration 300 --clients 200 --warmup 60 --json soak.json   # soak
    python -m server.loadtest --clients 100 --duration 10      # the short CI version

Three processes share the machine: an instant fake vLLM (``tests.fakes.FakeUpstream``, 8 tokens,
no delay), the gateway (``create_app`` on uvicorn with uvloop/httptools like ``pandora serve``,
scoring with an instant in-process reward) and this process, which runs ``--clients`` closed-loop
clients, each on its own keep-alive connection, for ``--duration`` seconds, then stops.

Reported: requests/s, latency p50/p90/p99/max, every non-2xx status and transport error, mean
samples per request; from inside the gateway process: RSS over time (growth after ``--warmup``),
open file descriptors and asyncio tasks at baseline (after one warm request), at the end of the
load, and after it settled (pooled upstream connections past their keep-alive expiry, pruned by
a trickle of requests). Everything is bounded: 127.0.0.1 only, at most 2,000 clients and 15
minutes, children stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from server.bench import InstantReward

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
MAX_CLIENTS = 2000
MAX_DURATION = 900.0
BODY = json.dumps(
    {
        "model": "load",
        "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
        "max_tokens": 16,
    }
).encode()

__all__ = ["LoadReport", "main", "run"]


# -- child process roles ----------------------------------------------------------------------
def _upstream_role() -> None:
    """The instant fake vLLM; lives until its stdin closes (i.e. until the parent is gone)."""
    sys.path.insert(0, str(ROOT))
    try:
        from tests.fakes.upstream import FakeUpstream
    except ImportError:
        sys.exit("server.loadtest needs a source checkout (tests/fakes) for its fake upstream")
    upstream = FakeUpstream(tokens=8).start()
    print(upstream.port, flush=True)
    sys.stdin.read()
    upstream.stop()


def _socket_peers() -> dict[str, int]:
    """socket inode -> remote port, for this process's TCP sockets."""
    peers = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)
            for line in lines:
                parts = line.split()
                peers[parts[9]] = int(parts[2].rsplit(":", 1)[1], 16)
    return peers


def _process_stats(upstream_port: int) -> dict[str, int]:
    """RSS, and open fds split into pooled upstream connections and everything else."""
    rss_kib = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
    peers = _socket_peers()
    upstream = other = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:[") and peers.get(target[8:-1]) == upstream_port:
                upstream += 1
                continue
            other += 1
    return {
        "rss_kib": rss_kib,
        "fds": upstream + other,
        "fds_upstream": upstream,
        "fds_other": other,
    }


def _gateway_role(upstream_url: str, port: int, mode: str) -> None:
    """The gateway; answers ``stats`` lines on stdin with its RSS, fds and asyncio tasks."""
    from urllib.parse import urlsplit

    import uvicorn

    from server.app import create_app
    from server.config import Settings
    from server.uvicorn_server import FrozenHeapServer

    upstream_port = urlsplit(upstream_url).port
    settings = Settings(upstream_url=upstream_url, default_mode=mode, host=HOST, port=port)
    app = create_app(settings, reward=InstantReward())
    config = uvicorn.Config(
        app, host=HOST, port=port, log_level="warning", access_log=False, backlog=4096
    )
    server = FrozenHeapServer(config)  # as `pandora serve` runs

    def stats_loop(loop: asyncio.AbstractEventLoop) -> None:
        async def tasks() -> int:
            return len(asyncio.all_tasks()) - 1  # not this probe itself

        for line in sys.stdin:
            if line.strip() == "stats":
                count = asyncio.run_coroutine_threadsafe(tasks(), loop).result(30)
                stats = _process_stats(upstream_port)
                print(json.dumps({**stats, "tasks": count}), flush=True)
        server.should_exit = True  # stdin closed: the parent is done

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        threading.Thread(target=stats_loop, args=(loop,), daemon=True).start()
        await server.serve()

    from uvicorn._compat import asyncio_run

    asyncio_run(serve(), loop_factory=config.get_loop_factory())


# -- the load generator -----------------------------------------------------------------------
class Connection:
    """A minimal keep-alive HTTP/1.1 client (cheap on CPU, so the gateway gets the cores)."""

    def __init__(self, port: int, headers: dict[str, str]) -> None:
        self.port = port
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n{extra}\r\n"
        ).encode() + BODY
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self) -> tuple[int, dict[str, str], bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(HOST, self.port)
        assert self.reader is not None
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        else:  # chunked
            parts = []
            while size := int((await self.reader.readline()).strip() or b"0", 16):
                parts.append(await self.reader.readexactly(size))
                await self.reader.readline()
            await self.reader.readline()
            body = b"".join(parts)
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, headers, body

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


@dataclass
class LoadReport:
    clients: int
    duration_s: float
    mode: str
    requests: int = 0
    requests_per_s: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    non_2xx: dict[str, int] = field(default_factory=dict)
    transport_errors: dict[str, int] = field(default_factory=dict)
    mean_samples: float = 0.0
    baseline: dict[str, int] = field(default_factory=dict)
    end_of_load: dict[str, int] = field(default_factory=dict)
    settled: dict[str, int] = field(default_factory=dict)
    rss_after_warmup_kib: int = 0
    rss_end_kib: int = 0
    rss_growth: float = 0.0
    rss_timeline_kib: list[int] = field(default_factory=list)
    gateway_log_problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"{self.clients} clients x {self.duration_s:g} s, mode {self.mode}: "
            f"{self.requests} requests, {self.requests_per_s:.1f} req/s",
            f"latency ms: p50 {self.p50_ms:.1f}  p90 {self.p90_ms:.1f}  "
            f"p99 {self.p99_ms:.1f}  max {self.max_ms:.1f}",
            f"non-2xx: {self.non_2xx or 0}  transport errors: {self.transport_errors or 0}  "
            f"mean samples/request: {self.mean_samples:.2f}",
            f"gateway RSS: {self.rss_after_warmup_kib / 1024:.1f} MiB after warm-up -> "
            f"{self.rss_end_kib / 1024:.1f} MiB at the end ({self.rss_growth:+.1%})",
            *(
                f"{name}: fds {stats.get('fds')} ({stats.get('fds_upstream')} pooled upstream "
                f"connections), asyncio tasks {stats.get('tasks')}"
                for name, stats in (
                    ("baseline", self.baseline),
                    ("end of load", self.end_of_load),
                    ("settled", self.settled),
                )
                if stats
            ),
            f"gateway log: {len(self.gateway_log_problems)} error lines",
            *self.gateway_log_problems[:5],
        ]


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def _drive(port, clients, duration, headers, report, stats, warmup) -> None:
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    samples: list[int] = []
    deadline = time.monotonic() + duration

    async def client() -> None:
        connection = Connection(port, headers)
        try:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                try:
                    status, response_headers, _ = await asyncio.wait_for(connection.post(), 300)
                except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                    errors[type(exc).__name__] += 1
                    await connection.close()
                    await asyncio.sleep(0.05)
                    continue
                latencies.append(time.perf_counter() - started)
                if not 200 <= status < 300:
                    statuses[str(status)] += 1
                elif "x-pandora-samples" in response_headers:
                    samples.append(int(response_headers["x-pandora-samples"]))
        finally:
            await connection.close()

    async def sample_rss() -> None:
        warm_at = time.monotonic() + warmup
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            current = await asyncio.to_thread(stats)
            report.rss_timeline_kib.append(current["rss_kib"])
            if not report.rss_after_warmup_kib and time.monotonic() >= warm_at:
                report.rss_after_warmup_kib = current["rss_kib"]

    started = time.monotonic()
    sampler = asyncio.create_task(sample_rss())
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.monotonic() - started
    await sampler
    latencies.sort()
    report.requests = len(latencies)
    report.requests_per_s = len(latencies) / elapsed
    report.p50_ms, report.p90_ms, report.p99_ms = (
        1000 * _percentile(latencies, q) for q in (0.5, 0.9, 0.99)
    )
    report.max_ms = 1000 * (latencies[-1] if latencies else 0.0)
    report.non_2xx = dict(statuses)
    report.transport_errors = dict(errors)
    report.mean_samples = sum(samples) / len(samples) if samples else 0.0


# -- orchestration ------------------------------------------------------------------------------
def _spawn(*args: str, stderr) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "server.loadtest", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        cwd=ROOT,
    )


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


async def _sequential(port: int, count: int, headers: dict[str, str]) -> None:
    connection = Connection(port, headers)
    try:
        for _ in range(count):
            status, _, body = await connection.post()
            if status != 200:
                raise RuntimeError(f"gateway answered {status}: {body[:200]!r}")
    finally:
        await connection.close()


def run(
    *,
    clients: int = 500,
    duration: float = 60.0,
    warmup: float = 10.0,
    mode: str = "adaptive",
    settle: float = 6.0,
) -> LoadReport:
    """Start the fake upstream and the gateway, drive the load, measure, stop everything.

    ``settle`` > 0: afterwards wait that long (past httpx's 5 s keep-alive expiry) and send a
    trickle of requests so every pool prunes its expired connections, then measure again."""
    clients = max(1, min(clients, MAX_CLIENTS))
    duration = max(1.0, min(duration, MAX_DURATION))
    report = LoadReport(clients=clients, duration_s=duration, mode=mode)
    headers = {"X-Pandora-Mode": mode}
    gateway_log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in the finally below
    # the fake upstream warns when it writes to a candidate stream the gateway just cancelled
    upstream = _spawn("--role", "upstream", stderr=subprocess.DEVNULL)
    gateway = None
    try:
        assert upstream.stdout is not None
        upstream_port = int(upstream.stdout.readline())
        port = _free_port()
        gateway = _spawn(
            "--role", "gateway", "--upstream-url", f"http://{HOST}:{upstream_port}/v1",
            "--port", str(port), "--mode", mode, stderr=gateway_log,
        )  # fmt: skip
        lock = threading.Lock()

        def stats() -> dict[str, int]:
            assert gateway is not None and gateway.stdin and gateway.stdout
            with lock:
                gateway.stdin.write("stats\n")
                gateway.stdin.flush()
                return json.loads(gateway.stdout.readline())

        _wait_until_serving(port, gateway)
        asyncio.run(_sequential(port, 1, headers))
        report.baseline = stats()
        asyncio.run(_drive(port, clients, duration, headers, report, stats, warmup))
        report.end_of_load = _quiesced(stats, report.baseline)
        report.rss_end_kib = report.end_of_load["rss_kib"]
        base = report.rss_after_warmup_kib or report.baseline["rss_kib"]
        report.rss_growth = (report.rss_end_kib - base) / base
        if settle > 0:
            time.sleep(settle)
            asyncio.run(_sequential(port, 64, headers))
            report.settled = stats()
    finally:
        for child in (gateway, upstream):
            if child is not None:
                _stop(child)
        gateway_log.seek(0)
        report.gateway_log_problems = [
            line.rstrip()[:300]
            for line in gateway_log
            if "Traceback" in line or "ERROR" in line or "Exception" in line
        ]
        gateway_log.close()
    return report


def _quiesced(stats, baseline: dict[str, int], timeout: float = 5.0) -> dict[str, int]:
    """Stats once the gateway has noticed every client hang-up (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    current = stats()
    while time.monotonic() < deadline and (
        current["fds_other"] > baseline["fds_other"] or current["tasks"] > baseline["tasks"]
    ):
        time.sleep(0.2)
        current = stats()
    return current


def _wait_until_serving(port: int, gateway: subprocess.Popen, timeout: float = 60.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gateway.poll() is not None:
            raise RuntimeError("the gateway exited during start-up")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError("the gateway did not start listening")


def _stop(child: subprocess.Popen) -> None:
    with contextlib.suppress(Exception):
        assert child.stdin is not None
        child.stdin.close()  # both roles exit when their stdin closes
    try:
        child.wait(15)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m server.loadtest",
        description="Bounded loopback load/soak test of the gateway against an instant fake "
        "upstream and reward (run from a source checkout).",
    )
    parser.add_argument("--clients", type=int, default=500, help="concurrent closed-loop clients")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (<= 900)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before RSS baseline")
    parser.add_argument(
        "--mode", default="adaptive", choices=["adaptive", "target", "fixed", "off"]
    )
    parser.add_argument(
        "--settle", type=float, default=6.0, help="idle seconds, then measure again (0: skip)"
    )
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    parser.add_argument("--role", choices=["upstream", "gateway"], help=argparse.SUPPRESS)
    parser.add_argument("--upstream-url", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "upstream":
        _upstream_role()
        return 0
    if args.role == "gateway":
        _gateway_role(args.upstream_url, args.port, args.mode)
        return 0
    report = run(
        clients=args.clients,
        duration=args.duration,
        warmup=args.warmup,
        mode=args.mode,
        settle=args.settle,
    )
    print("\n".join(report.lines()))
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2))
    clean = not (report.non_2xx or report.transport_errors or report.gateway_log_problems)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())

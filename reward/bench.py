"""Benchmark the reward worker: items/s at several concurrencies, dynamic batching on vs off.

Starts ``pandora reward-worker`` twice (``--max-batch-size 32`` and ``--max-batch-size 1``,
everything else equal), drives each with closed-loop clients over HTTP for a fixed time per
(concurrency, mode), alternating the modes over several rounds so that background load hits both
alike, and reports medians of items/s, latency percentiles and the on/off ratio.

CPU, tiny random-weight model built on the fly (source checkout)::

    python -m reward.bench --tiny --device cpu

A real reward model on a GPU (one worker at a time, so two copies need not fit)::

    python -m reward.bench --model Skywork/Skywork-Reward-V2-Llama-3.1-8B --device cuda \\
        --dtype bfloat16 --sequential --seconds 20 --response-tokens 400

Or an already running worker (one mode, whatever it was started with)::

    python -m reward.bench --url http://reward-worker:8081
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from reward.base import RewardError
from reward.local import LocalRewardBackend

ROOT = Path(__file__).resolve().parents[1]
MODES = {"on": 32, "off": 1}
PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Explain why the sky is blue, briefly."},
]
_WORDS = [
    "light",
    "scatters",
    "more",
    "at",
    "short",
    "wavelengths",
    "so",
    "blue",
    "dominates",
    "the",
    "daytime",
    "sky",
    "while",
    "sunsets",
    "look",
    "red",
    "because",
    "the",
    "path",
    "through",
    "the",
    "air",
    "is",
    "longer",
    "and",
    "blue",
    "is",
    "scattered",
    "away",
]


@dataclass
class Measurement:
    mode: str
    concurrency: int
    round: int
    items: int
    seconds: float
    items_per_second: float
    latency_p50_ms: float
    latency_p95_ms: float
    errors: int
    tokens_per_item: float
    # CPU the scorer side spent per item in the window (the worker process; the whole process
    # in-process), or NaN where it cannot be read: what batching saves in work, whatever share
    # of a busy machine the worker got, unlike items/s
    cpu_ms_per_item: float = float("nan")


def _prompts(count: int) -> list[list[dict[str, str]]]:
    """``count`` dialogues: the first is :data:`PROMPT`, the others ask other questions under the
    same system prompt, as the users of one application do (``--prompts``)."""
    rng = random.Random(1)
    questions = [PROMPT[1]["content"]] + [
        f"Question {k}: " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) + "?"
        for k in range(1, count)
    ]
    return [[PROMPT[0], {"role": "user", "content": question}] for question in questions]


def _responses(count: int, mean_words: int, rng: random.Random) -> list[str]:
    """Candidate texts of varied length (0.25x to 1.75x the mean), like real samples."""
    lengths = [max(1, int(mean_words * rng.uniform(0.25, 1.75))) for _ in range(count)]
    return [" ".join(rng.choice(_WORDS) for _ in range(n)) for n in lengths]


class _Connection:
    """A minimal HTTP/1.1 keep-alive JSON client, one per simulated user.

    The load generator shares the CPU with the worker; httpx's pooled client reached only
    ~50 requests/s at concurrency 32 on our 2-core test machine (a raw socket: ~500), so it would
    have measured itself rather than the worker.
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise SystemExit(f"the benchmark speaks plain http only, not {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, payload: object) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        body = json.dumps(payload).encode()
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self._writer.write(head.encode() + body)
        await self._writer.drain()
        lines = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
        lengths = [v for k, v in headers.items() if k.strip().lower() == "content-length"]
        if not lengths:
            raise ConnectionError("response without content-length")
        return status, await self._reader.readexactly(int(lengths[0]))

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
            self._writer = None


async def measure(
    target: str | LocalRewardBackend,
    *,
    mode: str,
    concurrency: int,
    seconds: float,
    responses_per_request: int,
    response_words: int,
    prompts: int = 1,
    round_index: int = 0,
    seed: int = 0,
    cpu_clock: Callable[[], float] | None = None,
) -> Measurement:
    """Closed loop: ``concurrency`` clients each send a request as soon as the last returns.

    ``target`` is a worker's URL, or a :class:`LocalRewardBackend` to measure the batcher and
    model without HTTP (``--in-process``). ``cpu_clock`` reads the scorer side's CPU seconds.
    Request ``i`` asks about prompt ``i % prompts``: with ``prompts`` dividing ``concurrency``
    each prompt has ``concurrency / prompts`` concurrent requests, like the parallel candidates
    of one gateway request; with ``prompts == concurrency`` no two concurrent requests share one.
    """
    rng = random.Random(seed)
    pool = [_responses(responses_per_request, response_words, rng) for _ in range(256)]
    dialogues = _prompts(prompts)
    latencies: list[float] = []
    tokens: list[int] = []
    errors = 0

    async def loop(worker: int, deadline: float) -> None:
        nonlocal errors
        connection = _Connection(target) if isinstance(target, str) else None
        i = worker
        try:
            while time.perf_counter() < deadline:
                responses = pool[i % len(pool)]
                dialogue = dialogues[i % len(dialogues)]
                i += concurrency
                started = time.perf_counter()
                try:
                    if connection is None:
                        assert not isinstance(target, str)
                        result = await target.score_detailed(dialogue, responses)
                        used = result.prompt_tokens
                    else:
                        body = {"messages": dialogue, "responses": responses}
                        status, data = await connection.post("/v1/rewards", body)
                        if status != 200:
                            raise ConnectionError(f"status {status}")
                        used = json.loads(data)["usage"]["prompt_tokens"]
                except (OSError, ConnectionError, asyncio.IncompleteReadError, RewardError):
                    errors += 1
                    if connection is not None:
                        await connection.close()
                    continue
                latencies.append(time.perf_counter() - started)
                tokens.append(used)
        finally:
            if connection is not None:
                await connection.close()

    warm = time.perf_counter() + min(1.0, seconds / 4)
    await asyncio.gather(*(loop(w, warm) for w in range(concurrency)))
    latencies.clear()
    tokens.clear()
    cpu_started = cpu_clock() if cpu_clock else float("nan")
    started = time.perf_counter()
    await asyncio.gather(*(loop(w, started + seconds) for w in range(concurrency)))
    elapsed = time.perf_counter() - started
    items = len(latencies) * responses_per_request
    cpu = (cpu_clock() - cpu_started) if cpu_clock else float("nan")
    cuts = statistics.quantiles(latencies, n=20) if len(latencies) >= 2 else [0.0] * 19
    return Measurement(
        mode=mode,
        concurrency=concurrency,
        round=round_index,
        items=items,
        seconds=elapsed,
        items_per_second=items / elapsed,
        latency_p50_ms=1000 * statistics.median(latencies) if latencies else float("nan"),
        latency_p95_ms=1000 * cuts[18],
        errors=errors,
        tokens_per_item=sum(tokens) / max(items, 1),
        cpu_ms_per_item=1000 * cpu / items if items else float("nan"),
    )


def process_cpu_clock(pid: int) -> Callable[[], float] | None:
    """CPU seconds (user + system) of process ``pid`` so far, from /proc (None off Linux)."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.exists():
        return None
    ticks = os.sysconf("SC_CLK_TCK")

    def read() -> float:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks

    return read


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def worker(
    model: str, max_batch_size: int, args: argparse.Namespace
) -> Iterator[tuple[str, Callable[[], float] | None]]:
    """A ``pandora reward-worker`` subprocess on a free local port, with its CPU clock; stopped
    on exit."""
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "server.cli",
        "reward-worker",
        "--model",
        model,
        "--device",
        args.device,
        "--dtype",
        args.dtype,
        "--max-batch-size",
        str(max_batch_size),
        "--max-wait-ms",
        str(args.max_wait_ms),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *([] if args.prefix_sharing else ["--no-prefix-sharing"]),
        "--log-level",
        "warning",
    ]
    env = dict(os.environ)
    if args.torch_threads:
        env["OMP_NUM_THREADS"] = str(args.torch_threads)
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + args.load_timeout
        while True:
            if process.poll() is not None:
                raise SystemExit(f"reward worker exited with status {process.returncode}")
            if time.monotonic() > deadline:
                raise SystemExit("reward worker did not become healthy in time")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url, process_cpu_clock(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tiny_model(directory: str) -> str:
    """Build the tests' tiny random-weight reward model (needs a source checkout)."""
    helper = ROOT / "tests" / "tiny_models.py"
    if not helper.exists():
        raise SystemExit("--tiny needs the source checkout's tests/tiny_models.py; use --model")
    spec = importlib.util.spec_from_file_location("tiny_models", helper)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.build_tiny_reward_model(Path(directory) / "tiny-rm"))


def summarize(results: list[Measurement]) -> list[dict[str, float | int | str]]:
    rows: list[dict[str, float | int | str]] = []
    for concurrency in sorted({r.concurrency for r in results}):
        row: dict[str, float | int | str] = {"concurrency": concurrency}
        for mode in MODES:
            runs = [r for r in results if r.mode == mode and r.concurrency == concurrency]
            if runs:
                row[f"{mode}_items_per_s"] = statistics.median(r.items_per_second for r in runs)
                row[f"{mode}_p50_ms"] = statistics.median(r.latency_p50_ms for r in runs)
                row[f"{mode}_p95_ms"] = statistics.median(r.latency_p95_ms for r in runs)
                row[f"{mode}_errors"] = sum(r.errors for r in runs)
                row[f"{mode}_cpu_ms_per_item"] = statistics.median(r.cpu_ms_per_item for r in runs)
        row["tokens_per_item"] = statistics.mean(
            r.tokens_per_item for r in results if r.concurrency == concurrency
        )
        if "on_items_per_s" in row and "off_items_per_s" in row:
            row["speedup"] = float(row["on_items_per_s"]) / float(row["off_items_per_s"])
        # each round's on/off ratio, the two modes measured back to back under the same load
        rates = {
            (r.mode, r.round): r.items_per_second for r in results if r.concurrency == concurrency
        }
        ratios = [
            rates["on", rnd] / rates["off", rnd]
            for rnd in sorted({rnd for _, rnd in rates})
            if ("on", rnd) in rates and ("off", rnd) in rates and rates["off", rnd] > 0
        ]
        if "on_cpu_ms_per_item" in row and "off_cpu_ms_per_item" in row:
            row["cpu_speedup"] = float(row["off_cpu_ms_per_item"]) / float(
                row["on_cpu_ms_per_item"]
            )
        if ratios:
            row["round_speedups"] = ", ".join(f"{ratio:.2f}" for ratio in ratios)
            row["round_speedup_median"] = statistics.median(ratios)
            row["round_speedup_min"] = min(ratios)
        rows.append(row)
    return rows


def _print(rows: list[dict[str, float | int | str]]) -> None:
    header = (
        "concurrency | tokens/item | on items/s (p50/p95 ms) | off items/s (p50/p95 ms) | on/off"
        " | per round on/off (median, min) | CPU ms/item on, off (off/on)"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        cells = [f"{row['concurrency']:>11}", f"{row['tokens_per_item']:11.0f}"]
        for mode in MODES:
            if f"{mode}_items_per_s" in row:
                cells.append(
                    f"{row[f'{mode}_items_per_s']:8.1f} ({row[f'{mode}_p50_ms']:.0f}/"
                    f"{row[f'{mode}_p95_ms']:.0f})"
                )
            else:
                cells.append("-")
        cells.append(f"{row['speedup']:.2f}x" if "speedup" in row else "-")
        cells.append(
            f"{row['round_speedups']} ({row['round_speedup_median']:.2f}x, "
            f"{row['round_speedup_min']:.2f}x)"
            if "round_speedups" in row
            else "-"
        )
        cpu = [
            f"{row[f'{mode}_cpu_ms_per_item']:.2f}"
            for mode in MODES
            if f"{mode}_items_per_s" in row
        ]
        cells.append(
            ", ".join(cpu) + (f" ({row['cpu_speedup']:.2f}x)" if "cpu_speedup" in row else "")
        )
        print(" | ".join(cells))


Target = tuple[str | LocalRewardBackend, Callable[[], float] | None]  # and its CPU clock


async def _run_plan(targets: dict[str, Target], args: argparse.Namespace) -> list[Measurement]:
    results = []
    for round_index in range(args.rounds):
        # the modes alternate, side by side in time, and take turns going first
        order = list(targets.items()) if round_index % 2 == 0 else list(targets.items())[::-1]
        for concurrency in args.concurrency:
            for mode, (target, cpu_clock) in order:
                result = await measure(
                    target,
                    mode=mode,
                    concurrency=concurrency,
                    seconds=args.seconds,
                    responses_per_request=args.responses_per_request,
                    response_words=args.response_words,
                    prompts=args.prompts,
                    round_index=round_index,
                    seed=round_index,
                    cpu_clock=cpu_clock,
                )
                print(
                    f"round {round_index} c={concurrency:<3} batching {mode:<3}: "
                    f"{result.items_per_second:8.1f} items/s, p50 {result.latency_p50_ms:.0f} ms, "
                    f"{result.cpu_ms_per_item:.2f} CPU ms/item",
                    file=sys.stderr,
                )
                results.append(result)
    return results


async def _run_in_process(model: str, args: argparse.Namespace) -> list[Measurement]:
    """Both modes over one loaded model, no HTTP: what batching does for model and batcher."""
    from reward.scorer import RewardScorer

    scorer = RewardScorer.from_pretrained(
        model,
        device=args.device,
        dtype=args.dtype,
        torch_threads=args.torch_threads,
        prefix_sharing=args.prefix_sharing,
    )
    backends = {
        mode: LocalRewardBackend(
            model, max_batch_size=size, max_wait_ms=args.max_wait_ms, load_scorer=lambda: scorer
        )
        for mode, size in MODES.items()
    }
    try:
        targets: dict[str, Target] = {
            mode: (backend, time.process_time) for mode, backend in backends.items()
        }
        return await _run_plan(targets, args)
    finally:
        for backend in backends.values():
            await backend.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward.bench", description=__doc__.split("\n")[0]
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="reward model (path or hub id) to start workers with")
    source.add_argument("--tiny", action="store_true", help="build the tests' tiny model")
    source.add_argument("--url", help="benchmark an already running worker (one mode)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=5.0, help="per (concurrency, mode, round)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--responses-per-request", type=int, default=1)
    parser.add_argument("--response-words", type=int, default=8, help="mean response length")
    parser.add_argument(
        "--prompts",
        type=int,
        default=1,
        help="distinct prompts the requests ask about (1: every request shares one prompt; "
        "= concurrency: no two concurrent requests share one)",
    )
    parser.add_argument(
        "--no-prefix-sharing",
        dest="prefix_sharing",
        action="store_false",
        help="start the workers with --no-prefix-sharing",
    )
    parser.add_argument(
        "--torch-threads", type=int, help="OMP_NUM_THREADS for the workers (CPU; default: torch's)"
    )
    parser.add_argument("--sequential", action="store_true", help="one worker at a time (GPU)")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="drive LocalRewardBackend directly (no HTTP): the batcher and model alone",
    )
    parser.add_argument("--load-timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path, help="also write all measurements here")
    args = parser.parse_args(argv)

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="pandora-bench-") as scratch:
        if args.url:
            results = asyncio.run(_run_plan({"on": (args.url, None)}, args))
        else:
            model = _tiny_model(scratch) if args.tiny else args.model
            results = []
            with contextlib.ExitStack() as stack:
                if args.in_process:
                    results = asyncio.run(_run_in_process(model, args))
                elif args.sequential:
                    for mode, size in MODES.items():
                        with worker(model, size, args) as target:
                            results += asyncio.run(_run_plan({mode: target}, args))
                else:
                    targets: dict[str, Target] = {
                        mode: stack.enter_context(worker(model, size, args))
                        for mode, size in MODES.items()
                    }
                    results = asyncio.run(_run_plan(targets, args))
    rows = summarize(results)
    print(
        f"\nreward worker benchmark{' (in-process, no HTTP)' if args.in_process else ''}, "
        f"{started}, model={args.url or args.model or 'tiny'}, "
        f"device={args.device}, {args.responses_per_request} response(s)/request of "
        f"~{args.response_words} words, {args.prompts} prompt(s), "
        f"prefix sharing {'on' if args.prefix_sharing else 'off'}, "
        f"{args.rounds} rounds x {args.seconds:g}s, "
        f"torch threads={args.torch_threads or 'default'}, cpus={os.cpu_count()}, "
        f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}; medians over rounds"
    )
    _print(rows)
    if args.json:
        payload = {"args": vars(args) | {"json": str(args.json)}, "summary": rows}
        payload["measurements"] = [asdict(r) for r in results]
        args.json.write_text(json.dumps(payload, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

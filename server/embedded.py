"""The embedded default: generate and score in this process (no ``--upstream-url``).

The generator is exposed as an ``httpx`` transport that speaks the same OpenAI protocol as vLLM
(``POST /chat/completions`` streamed or not, ``GET /models``), so the gateway has one code path
whatever the upstream. Generation runs on one worker thread (a CPU laptop gains nothing from
interleaving), one candidate at a time; closing a candidate's stream sets a flag that a
``StoppingCriteria`` checks after every token, so cancelled candidates stop at once.

torch and transformers are imported only when a model loads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from server.config import DEFAULT_GENERATOR_MODEL, DEFAULT_REWARD_MODEL, Settings
from server.embedded_request import (
    EmbeddedRequestError,
    StopMatcher,
    check_supported,
    stop_strings,
)

__all__ = [
    "EmbeddedLoadError",
    "LocalChatTransport",
    "LocalGenerator",
    "build_embedded",
    "build_local_reward",
]

DEFAULT_MAX_TOKENS = 256
log = logging.getLogger(__name__)
OFFLINE_HINT = (
    "without Hugging Face hub access pass local model directories "
    "(--generator-model /path/to/chat-model --reward-model /path/to/reward-model), "
    "point at a server (--upstream-url http://host:8000/v1), or try the offline demo "
    "with --demo-tiny-models (random text)"
)


class EmbeddedLoadError(RuntimeError):
    """A model for the embedded default could not be loaded (message is one clear line)."""


@dataclass
class GenerationResult:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


class LocalGenerator:
    """A causal LM with its tokenizer and chat template, sampling one reply at a time."""

    def __init__(self, model: Any, tokenizer: Any, *, name: str) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")

    @classmethod
    def from_pretrained(cls, path: str, *, device: str = "auto") -> LocalGenerator:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype="auto").to(device).eval()
        return cls(model, tokenizer, name=path)

    def generate(
        self,
        body: dict[str, Any],
        on_text: Callable[[str], None],
        cancelled: threading.Event,
    ) -> GenerationResult:
        """Blocking: sample one reply to ``body`` (OpenAI fields, checked by
        :func:`server.embedded_request.check_supported`); ``on_text`` gets each piece."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList
        from transformers.generation.streamers import BaseStreamer

        messages = [
            {"role": m.get("role", "user"), "content": _text(m.get("content"))}
            for m in body.get("messages", [])
        ]
        prompt = self.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=True,
            **(body.get("chat_template_kwargs") or {}),
        )
        inputs = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        inputs = {k: v.to(self.model.device) for k, v in inputs.items()}
        prompt_tokens = int(inputs["input_ids"].shape[1])
        if cancelled.is_set():
            return GenerationResult("stop", prompt_tokens, 0)
        max_new = int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)
        max_new = max_new or DEFAULT_MAX_TOKENS
        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        options: dict[str, Any] = {"max_new_tokens": max_new, "do_sample": temperature > 0}
        if temperature > 0:
            options["temperature"] = temperature
            if body.get("top_p") is not None:
                options["top_p"] = float(body["top_p"])
            if body.get("top_k") is not None and int(body["top_k"]) > 0:  # vLLM: -1/0 = off
                options["top_k"] = int(body["top_k"])
            if body.get("min_p"):
                options["min_p"] = float(body["min_p"])
        if body.get("repetition_penalty") is not None:
            options["repetition_penalty"] = float(body["repetition_penalty"])
        tokenizer = self.tokenizer
        matcher = StopMatcher(stop_strings(body))

        class Streamer(BaseStreamer):
            def __init__(self) -> None:
                self.ids: list[int] = []
                self.sent = ""
                self.first = True
                self.stopped = False  # a stop string was generated: nothing more is sent

            def put(self, value: Any) -> None:
                if self.first:  # the prompt
                    self.first = False
                    return
                if self.stopped:
                    return
                self.ids.extend(int(t) for t in value.reshape(-1).tolist())
                text = tokenizer.decode(self.ids, skip_special_tokens=True)
                if text.endswith("\ufffd"):  # half a character: wait for the rest
                    return
                self._send(*matcher.cut(text))

            def _send(self, text: str, stopped: bool) -> None:
                if len(text) > len(self.sent):
                    on_text(text[len(self.sent) :])
                    self.sent = text
                self.stopped = stopped

            def end(self) -> None:
                if self.stopped or not self.ids:
                    return
                text = tokenizer.decode(self.ids, skip_special_tokens=True)
                self._send(text, False)  # what was held back as a possible stop prefix

        class Cancelled(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return torch.full(
                    (input_ids.shape[0],),
                    cancelled.is_set() or streamer.stopped,
                    dtype=torch.bool,
                    device=input_ids.device,
                )

        streamer = Streamer()
        with torch.inference_mode():
            if isinstance(body.get("seed"), int):
                torch.manual_seed(body["seed"])
            output = self.model.generate(
                **inputs,
                **options,
                streamer=streamer,
                stopping_criteria=StoppingCriteriaList([Cancelled()]),
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
        completion = int(output.shape[1]) - prompt_tokens
        reason = "length" if completion >= max_new and not streamer.stopped else "stop"
        return GenerationResult(reason, prompt_tokens, completion)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


class _SSEStream(httpx.AsyncByteStream):
    def __init__(self, events: AsyncIterator[bytes], cancelled: threading.Event) -> None:
        self.events = events
        self.cancelled = cancelled

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for event in self.events:
            yield event

    async def aclose(self) -> None:
        self.cancelled.set()
        await self.events.aclose()  # type: ignore[attr-defined]


class LocalChatTransport(httpx.AsyncBaseTransport):
    """An in-process OpenAI-compatible server for one :class:`LocalGenerator`."""

    def __init__(self, generator: LocalGenerator) -> None:
        self.generator = generator

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.rstrip("/")
        if request.method == "GET" and path.endswith("/models"):
            data = {
                "object": "list",
                "data": [
                    {
                        "id": self.generator.name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "pandora-embedded",
                    }
                ],
            }
            return httpx.Response(200, json=data)
        if request.method == "POST" and path.endswith("/chat/completions"):
            body = json.loads(await request.aread())
            try:
                check_supported(body)
            except EmbeddedRequestError as exc:
                return httpx.Response(400, json=exc.to_dict())
            if body.get("stream"):
                cancelled = threading.Event()
                return httpx.Response(
                    200,
                    headers={"content-type": "text/event-stream"},
                    stream=_SSEStream(self._events(body, cancelled), cancelled),
                )
            return httpx.Response(200, json=await self._complete(body))
        return httpx.Response(404, json={"error": {"message": f"no route {path}"}})

    async def _run(
        self, body: dict[str, Any], cancelled: threading.Event
    ) -> tuple[asyncio.Queue[str | None], asyncio.Future[GenerationResult]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | None] = asyncio.Queue()

        def on_text(text: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, text)

        def work() -> GenerationResult:
            try:
                return self.generator.generate(body, on_text, cancelled)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        future = loop.run_in_executor(self.generator.executor, work)
        return queue, future

    async def _events(self, body: dict[str, Any], cancelled: threading.Event):
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.generator.name,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n"

        queue, future = await self._run(body, cancelled)
        try:
            yield chunk({"role": "assistant", "content": ""})
            while (text := await queue.get()) is not None:
                yield chunk({"content": text})
            try:
                result = await future
            except Exception as exc:  # reported in-stream, as vLLM does
                error = {"error": {"message": f"generation failed: {exc}", "type": "server_error"}}
                yield b"data: " + json.dumps(error).encode() + b"\n\n"
                return
            yield chunk({}, result.finish_reason)
            usage = {
                "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens,
            }
            yield b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            cancelled.set()

    async def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        cancelled = threading.Event()
        queue, future = await self._run(body, cancelled)
        parts: list[str] = []
        try:
            while (text := await queue.get()) is not None:
                parts.append(text)
            result = await future
        finally:
            cancelled.set()
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.generator.name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(parts)},
                    "finish_reason": result.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens,
            },
        }


# -- building the embedded default ----------------------------------------------------------
def _load_error(what: str, name: str, exc: BaseException) -> EmbeddedLoadError:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return EmbeddedLoadError(f"cannot load the {what} {name!r} ({reason[:200]}); {OFFLINE_HINT}")


def ensure_loadable(what: str, name: str) -> None:
    """Fail in seconds, not after a minute of hub retries, when a hub model cannot be fetched:
    not a local directory, not in the Hugging Face cache, and the hub unreachable."""
    if Path(name).exists():
        return
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:  # a path, not "org/model"
        raise EmbeddedLoadError(
            f"cannot load the {what} {name!r}: no such directory; {OFFLINE_HINT}"
        )
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except Exception:  # an invalid repo id: let from_pretrained explain
        return
    host = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or ""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        if offline:  # Hugging Face's own switch: no network at all
            raise OSError("HF_HUB_OFFLINE is set")
        socket.create_connection((host, 443), timeout=3).close()
    except OSError:
        raise EmbeddedLoadError(
            f"cannot load the {what} {name!r}: not a local directory, not in the Hugging Face "
            f"cache, and {host} is unreachable; {OFFLINE_HINT}"
        ) from None


def build_local_reward(settings: Settings, model: str):
    """The in-process reward backend, loaded now so a bad model stops start-up clearly."""
    from reward.local import LocalRewardBackend
    from reward.scorer import RewardScorer

    ensure_loadable("reward model", model)
    try:
        scorer = RewardScorer.from_pretrained(model, device=settings.device)
    except Exception as exc:
        raise _load_error("reward model", model, exc) from None
    return LocalRewardBackend(model, device=settings.device, load_scorer=lambda: scorer)


def _default_models_unreachable(generator_model: str, reward_model: str) -> bool:
    """True when the built-in default models are asked for but cannot be had (no hub, no cache).

    The quickstart's ``pandora serve`` must come up on any fresh machine, so it falls back to the
    offline demo with a loud warning. Models the user named are never replaced: a wrong path or
    an unreachable hub model stops start-up with one clear line instead.
    """
    if (generator_model, reward_model) != (DEFAULT_GENERATOR_MODEL, DEFAULT_REWARD_MODEL):
        return False
    try:
        ensure_loadable("generator model", generator_model)
        ensure_loadable("reward model", reward_model)
    except EmbeddedLoadError as exc:
        log.warning(
            "%s. FALLING BACK to the offline demo: tiny RANDOM-weight models that produce random "
            "text (the gateway, stopping and metrics still run end to end). Pass "
            "--generator-model/--reward-model or --upstream-url for real answers.",
            str(exc).split(";")[0],
        )
        return True
    return False


def build_embedded(settings: Settings):
    """(upstream client, reward backend) for the embedded default, models loaded eagerly."""
    generator_model, reward_model = settings.generator_model, settings.reward_model
    if settings.demo_tiny_models or _default_models_unreachable(generator_model, reward_model):
        from server.demo_models import demo_model_paths

        generator_model, reward_model = (str(p) for p in demo_model_paths())
    ensure_loadable("generator model", generator_model)
    ensure_loadable("reward model", reward_model)
    try:
        generator = LocalGenerator.from_pretrained(generator_model, device=settings.device)
    except Exception as exc:
        raise _load_error("generator model", generator_model, exc) from None
    reward = build_local_reward(settings, reward_model)
    client = httpx.AsyncClient(
        transport=LocalChatTransport(generator),
        base_url="http://embedded/v1",
        timeout=httpx.Timeout(settings.request_timeout),
    )
    return client, reward

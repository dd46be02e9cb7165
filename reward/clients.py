"""HTTP reward backends: the batching worker (``POST /v1/rewards``) and a vLLM pooling server.

Both take an injectable ``httpx.AsyncClient`` (tests pass one with a mock transport or point at a
real local server); otherwise they own a pooled client and close it in :meth:`aclose`. Every
transport failure, error status and malformed answer becomes :class:`~reward.base.RewardError`,
translated here and nowhere else. No torch, no transformers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import anyio
import httpx

from reward.base import RewardError

__all__ = ["VLLMRewardClient", "WorkerRewardClient"]


class _HTTPBackend:
    """Connection handling shared by the HTTP backends."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float,
        api_key: str | None,
        client: httpx.AsyncClient | None,
        max_connections: int = 64,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    async def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One whole exchange (body read, response closed) in a task of its own.

        httpcore closes a response inside anyio shielded scopes, which a native
        ``Task.cancel()`` of the caller (a request deadline, a client that hangs up) goes
        straight through: the pooled connection then stays counted as busy for good
        (encode/httpcore#1115), and this pool is bounded. In a task group the caller's
        cancellation reaches the exchange through the group's cancel scope, which waits for
        the shields.
        """
        responses: list[httpx.Response] = []

        async def exchange() -> None:
            responses.append(await self._client.request(method, url, **kwargs))

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(exchange)
        except BaseExceptionGroup as group_error:
            raise _first_error(group_error) from None
        return responses[0]

    async def _post(self, path: str, payload: Mapping[str, Any]) -> Any:
        url = f"{self.base_url}{path}"
        try:
            response = await self._request(
                "POST", url, json=payload, headers=self._headers, timeout=self.timeout
            )
        except httpx.TimeoutException as exc:
            raise RewardError(f"reward backend {url} timed out after {self.timeout:g}s") from exc
        except httpx.HTTPError as exc:
            raise RewardError(f"reward backend {url} unreachable: {exc!r}") from exc
        if not response.is_success:
            raise RewardError(
                f"reward backend {url} answered {response.status_code}: {_error_message(response)}"
            )
        try:
            return response.json()
        except ValueError as exc:
            raise RewardError(f"reward backend {url} answered with invalid JSON") from exc

    # An authenticated request that costs the backend nothing: (method, path, JSON body).
    # ``/health`` needs no key, so without this probe a wrong key would look ready.
    _auth_probe: tuple[str, str, Any] | None = None

    async def ready(self) -> bool:
        """True when ``GET /health`` answers 2xx and, with an API key, the key is accepted."""
        timeout = min(self.timeout, 5.0)
        try:
            response = await self._request(
                "GET", f"{self.base_url}/health", headers=self._headers, timeout=timeout
            )
            if not response.is_success:
                return False
            if self._headers and self._auth_probe is not None:
                method, path, payload = self._auth_probe
                probe = await self._request(
                    method,
                    f"{self.base_url}{path}",
                    json=payload,
                    headers=self._headers,
                    timeout=timeout,
                )
                return probe.status_code not in (401, 403)
        except httpx.HTTPError:
            return False
        return True

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


class WorkerRewardClient(_HTTPBackend):
    """Scores through ``pandora reward-worker`` (one request carries every response)."""

    # Empty lists: the worker checks the key, then answers 400 without scoring anything.
    _auth_probe = ("POST", "/v1/rewards", {"messages": [], "responses": []})

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        api_key: str | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(base_url, timeout=timeout, api_key=api_key, client=client)

    async def score(
        self, messages: Sequence[Mapping[str, Any]], responses: Sequence[str]
    ) -> list[float]:
        if not responses:
            return []
        body = await self._post(
            "/v1/rewards", {"messages": [dict(m) for m in messages], "responses": list(responses)}
        )
        scores = body.get("scores") if isinstance(body, Mapping) else None
        return _checked(scores, len(responses), f"{self.base_url}/v1/rewards")


class VLLMRewardClient(_HTTPBackend):
    """Scores through a vLLM pooling server (``vllm serve <reward model> --runner pooling``).

    ``POST /classify`` takes one conversation per request (``messages``), so a request per
    response is sent concurrently and vLLM batches them itself. The dialogue ends with the
    response as the assistant turn; ``use_activation: false`` keeps vLLM from applying its
    default sigmoid, so ``data[0].probs[0]`` is the raw logit (``/score`` and ``/rerank`` are
    for cross-encoders, not for these models).
    """

    _auth_probe = ("GET", "/v1/models", None)  # vLLM's --api-key guards /v1 routes only

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        timeout: float = 30.0,
        api_key: str | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(base_url, timeout=timeout, api_key=api_key, client=client)
        self.model = model

    async def score(
        self, messages: Sequence[Mapping[str, Any]], responses: Sequence[str]
    ) -> list[float]:
        if not responses:
            return []
        prompt = [dict(m) for m in messages]
        scores = [math.nan] * len(responses)

        async def score_one(i: int) -> None:
            scores[i] = await self._score_one(prompt, responses[i])

        # One failure fails the call: the task group stops and reaps the other requests. It
        # cancels them through its cancel scope, which httpx's shielded connection cleanup
        # holds off; a native Task.cancel() does not, and can leave a pooled connection
        # counted as busy for good (encode/httpcore#1115), until the pool is exhausted.
        try:
            async with anyio.create_task_group() as group:
                for i in range(len(responses)):
                    group.start_soon(score_one, i)
        except BaseExceptionGroup as group_error:
            raise _first_error(group_error) from None
        return scores

    async def _score_one(self, prompt: list[dict[str, Any]], response: str) -> float:
        payload: dict[str, Any] = {
            "messages": [*prompt, {"role": "assistant", "content": response}],
            "use_activation": False,
        }
        if self.model is not None:
            payload["model"] = self.model
        body = await self._post("/classify", payload)
        try:
            probs = body["data"][0]["probs"]
        except (KeyError, IndexError, TypeError) as exc:
            raise RewardError(f"{self.base_url}/classify answered without data[0].probs") from exc
        return _checked(probs[:1] if isinstance(probs, list) else probs, 1, "/classify")[0]


def _checked(scores: Any, expected: int, where: str) -> list[float]:
    if not isinstance(scores, list):
        raise RewardError(f"{where} answered without a list of scores")
    if len(scores) != expected:
        raise RewardError(f"{where} returned {len(scores)} scores for {expected} responses")
    values: list[float] = []
    for score in scores:
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise RewardError(f"{where} returned a non-numeric score {score!r}")
        if not math.isfinite(score):
            raise RewardError(f"{where} returned a non-finite score {score!r}")
        values.append(float(score))
    return values


def _error_message(response: httpx.Response) -> str:
    """The message of an OpenAI-shaped (or vLLM/FastAPI-shaped) error body, else its text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and error.get("message"):
            return str(error["message"])
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key])
    return str(body)[:200]


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """The error that failed a task group (it wraps its children's errors): the first
    RewardError, else the first error of any kind."""
    errors = list(_leaves(group))
    return next((e for e in errors if isinstance(e, RewardError)), errors[0])


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error

"""Wire models of the chat-completions endpoint.

The request model validates only what the gateway itself relies on and allows every other
field (``extra="allow"``): the client's body is forwarded upstream unchanged, so fields the
gateway has never heard of (``chat_template_kwargs``, ``top_k``, ...) still work.
Responses are built as plain dicts in OpenAI's shape (``chat.completion`` and
``chat.completion.chunk``); the tests validate them with the ``openai`` package's own types.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from server.sampling import SamplingOutcome

__all__ = [
    "ChatCompletionRequest",
    "completion_body",
    "completion_chunks",
    "pandora_metadata",
]

# Fields the gateway owns or drops when it forwards a candidate request.
GATEWAY_OWNED = ("n", "stream", "stream_options", "best_of", "pandora")


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class ChatMessage(OpenAIBaseModel):
    role: str
    content: Any = None


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = None


class PandoraOptions(BaseModel):
    """The body form of the ``X-Pandora-*`` headers (``extra_body={"pandora": {...}}``)."""

    model_config = ConfigDict(extra="forbid")
    mode: str | None = Field(None, description="adaptive|target|fixed|off")
    cost: float | None = Field(None, description="cost per sample in (0, 1): adaptive mode")
    target_acceptance: float | None = Field(None, description="in (0, 1]: target mode")
    max_samples: int | None = None
    min_samples: int | None = None
    parallelism: int | None = None
    task: str | None = Field(
        None, description="kind of prompt: keys the learned deployment prior with the model"
    )


class ChatCompletionRequest(OpenAIBaseModel):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    pandora: PandoraOptions | None = Field(
        None, description="per-request sampling control (headers X-Pandora-* win)"
    )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def candidate_body(raw: dict[str, Any]) -> dict[str, Any]:
    """What each candidate request sends upstream: the client's fields, n=1, streamed."""
    body = {k: v for k, v in raw.items() if k not in GATEWAY_OWNED}
    body["n"] = 1
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return body


def pandora_metadata(outcome: SamplingOutcome, mode: str, task: str | None) -> dict[str, Any]:
    return {
        "mode": mode,
        "task": task,
        "samples": len(outcome.scored),
        "stop_reason": outcome.stop_reason,
        "rewards": outcome.rewards,
        "chosen_index": outcome.chosen[0],
        "cancelled": outcome.cancelled,
        "failed": outcome.failed,
        "threshold": outcome.threshold,
        "acceptance_estimate": outcome.acceptance_estimate,
    }


def _usage(outcome: SamplingOutcome) -> dict[str, int]:
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
    }


def completion_body(
    outcome: SamplingOutcome, *, completion_id: str, model: str, mode: str, task: str | None = None
) -> dict[str, Any]:
    choices = []
    for rank, position in enumerate(outcome.chosen):
        candidate = outcome.scored[position]
        choices.append(
            {
                "index": rank,
                "message": candidate.message,
                "finish_reason": candidate.finish_reason or "stop",
                "logprobs": candidate.logprobs,
            }
        )
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": outcome.best.model or model,
        "choices": choices,
        "usage": _usage(outcome),
        "pandora": pandora_metadata(outcome, mode, task),
    }


def completion_chunks(
    outcome: SamplingOutcome,
    *,
    completion_id: str,
    model: str,
    mode: str,
    include_usage: bool,
    task: str | None = None,
) -> list[dict[str, Any]]:
    """The chosen candidates replayed as ``chat.completion.chunk``s, as the upstream sent them."""
    created = int(time.time())
    model = outcome.best.model or model
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": created}
    base["model"] = model
    if include_usage:
        base["usage"] = None
    chunks: list[dict[str, Any]] = []
    for rank, position in enumerate(outcome.chosen):
        candidate = outcome.scored[position]
        chunks.append(
            {
                **base,
                "choices": [
                    {
                        "index": rank,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        )
        finish_seen = False
        for delta in candidate.deltas:
            choice = {"index": rank, "logprobs": None, "finish_reason": None, **delta}
            finish_seen = finish_seen or bool(choice.get("finish_reason"))
            chunks.append({**base, "choices": [choice]})
        if not finish_seen:
            chunks.append(
                {
                    **base,
                    "choices": [
                        {"index": rank, "delta": {}, "logprobs": None, "finish_reason": "stop"}
                    ],
                }
            )
    chunks[-1]["pandora"] = pandora_metadata(outcome, mode, task)
    if include_usage:
        chunks.append({**base, "choices": [], "usage": _usage(outcome)})
    return chunks

"""One candidate completion, assembled from the upstream's streamed ``chat.completion.chunk``s.

The raw deltas are kept so the chosen candidate can be re-streamed to the client exactly as the
upstream produced it (content, tool calls, reasoning, logprobs), and so that a candidate
cancelled mid-stream still reports how many tokens it had consumed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Candidate", "CandidateBuilder"]


@dataclass
class Candidate:
    """A finished candidate: what the client may receive and what the reward model scores."""

    index: int  # launch order; with a client seed, this candidate used seed + index
    content: str
    finish_reason: str | None
    deltas: list[dict[str, Any]]  # upstream choice objects (delta, logprobs, finish_reason)
    message: dict[str, Any]
    logprobs: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    model: str | None

    def scoring_text(self) -> str:
        """The reply the reward model judges: the text, or the tool calls when there is none."""
        if self.content or not self.message.get("tool_calls"):
            return self.content
        return json.dumps(self.message["tool_calls"], ensure_ascii=False)


@dataclass
class CandidateBuilder:
    """Accumulates one upstream stream; readable at any time (for cancelled partials)."""

    index: int
    deltas: list[dict[str, Any]] = field(default_factory=list)
    content_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprob_items: list[Any] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    token_chunks: int = 0  # chunks carrying generated text: ~1 token each (vLLM streams per token)

    def reset(self) -> None:
        """Forget a failed attempt before its retry."""
        fresh = CandidateBuilder(self.index)
        self.__dict__.update(fresh.__dict__)

    def feed(self, chunk: dict[str, Any]) -> None:
        if chunk.get("model"):
            self.model = chunk["model"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            self._feed_choice(choice)

    def _feed_choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        carries_text = False
        if delta.get("content"):
            self.content_parts.append(delta["content"])
            carries_text = True
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            self.reasoning_parts.append(reasoning)
            carries_text = True
        for call in delta.get("tool_calls") or ():
            self._merge_tool_call(call)
            carries_text = True
        logprobs = choice.get("logprobs")
        if logprobs and logprobs.get("content"):
            if self.logprob_items is None:
                self.logprob_items = []
            self.logprob_items.extend(logprobs["content"])
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        self.token_chunks += carries_text
        if carries_text or logprobs or choice.get("finish_reason"):
            kept = {k: v for k, v in choice.items() if k != "index"}
            kept["delta"] = {k: v for k, v in delta.items() if k != "role"}
            self.deltas.append(kept)

    def _merge_tool_call(self, call: dict[str, Any]) -> None:
        slot = self.tool_calls.setdefault(
            call.get("index", 0), {"id": None, "type": "function", "function": {"arguments": ""}}
        )
        if call.get("id"):
            slot["id"] = call["id"]
        if call.get("type"):
            slot["type"] = call["type"]
        function = call.get("function") or {}
        if function.get("name"):
            slot["function"]["name"] = function["name"]
        if function.get("arguments"):
            slot["function"]["arguments"] += function["arguments"]

    # -- reading ------------------------------------------------------------------------------
    @property
    def completion_tokens(self) -> int:
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return self.usage["completion_tokens"]
        return self.token_chunks

    @property
    def prompt_tokens(self) -> int | None:
        if self.usage and isinstance(self.usage.get("prompt_tokens"), int):
            return self.usage["prompt_tokens"]
        return None

    def build(self) -> Candidate:
        content = "".join(self.content_parts)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning_parts:
            message["reasoning_content"] = "".join(self.reasoning_parts)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
            if not content:
                message["content"] = None
        return Candidate(
            index=self.index,
            content=content,
            finish_reason=self.finish_reason,
            deltas=self.deltas,
            message=message,
            logprobs={"content": self.logprob_items} if self.logprob_items is not None else None,
            prompt_tokens=self.prompt_tokens or 0,
            completion_tokens=self.completion_tokens,
            model=self.model,
        )

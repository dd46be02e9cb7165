"""What the embedded generator does with a chat request's fields, and what it refuses.

Why: a client that asks for tools, logprobs or a JSON schema and silently gets plain free text
has a bug it cannot see. The in-process generator (``server.embedded``) honours the sampling
fields it can (``max_tokens``/``max_completion_tokens``, ``temperature``, ``top_p``, ``top_k``,
``min_p``, ``repetition_penalty``, ``seed``, ``stop``, ``chat_template_kwargs``) and answers
400 in OpenAI's error shape, naming the field, for the ones it cannot; a vLLM upstream
(``--upstream-url``) supports them all.

``stop`` follows OpenAI: up to 4 strings; the reply ends before the first occurrence of any of
them (the stop string itself is not returned) with ``finish_reason: "stop"``. Text that might be
the start of a stop string is held back while streaming, so a client never receives a prefix of
a stop string that is then cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EmbeddedRequestError", "StopMatcher", "check_supported", "stop_strings"]

MAX_STOP = 4


class EmbeddedRequestError(ValueError):
    """A field the embedded generator cannot honour (-> 400 naming ``param``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": {
                "message": str(self),
                "type": "invalid_request_error",
                "param": self.param,
                "code": "unsupported_by_embedded_generator",
            }
        }


_HINT = "; point --upstream-url at a vLLM server for it"


def _refuse(param: str, what: str) -> EmbeddedRequestError:
    return EmbeddedRequestError(
        f"{param}: the embedded generator does not support {what}{_HINT}", param
    )


def _number(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise EmbeddedRequestError(
            f"{name} must be a number in [{low:g}, {high:g}], got {value!r}", name
        )


def check_supported(body: dict[str, Any]) -> None:
    """Raise :class:`EmbeddedRequestError` for the first field this generator cannot honour."""
    if body.get("tools"):
        raise _refuse("tools", "tool calling")
    if body.get("functions") or body.get("function_call") not in (None, "none"):
        raise _refuse("functions", "function calling")
    if body.get("tool_choice") not in (None, "none", "auto"):  # "auto" with no tools = none
        raise _refuse("tool_choice", "tool calling")
    if body.get("logprobs"):
        raise _refuse("logprobs", "log probabilities")
    if body.get("top_logprobs") is not None:
        raise _refuse("top_logprobs", "log probabilities")
    response_format = body.get("response_format")
    if response_format is not None and (
        not isinstance(response_format, dict) or response_format.get("type") != "text"
    ):
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        raise _refuse("response_format", f"structured output ({kind or response_format!r})")
    if body.get("logit_bias"):
        raise _refuse("logit_bias", "logit bias")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name):  # 0 (what many clients send by default) is the same as none
            raise _refuse(name, f"{name} (use repetition_penalty)")
    modalities = body.get("modalities")
    if modalities is not None and list(modalities) != ["text"]:
        raise _refuse("modalities", f"output modalities {modalities!r}")
    for name in ("audio", "prediction", "web_search_options", "guided_json", "guided_regex"):
        if body.get(name) is not None:
            raise _refuse(name, name)
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type", "text") != "text":
                    raise _refuse(f"messages.{i}.content", f"{part.get('type')!r} content")
    _number(body, "temperature", 0.0, 2.0)
    _number(body, "top_p", 0.0, 1.0)
    _number(body, "min_p", 0.0, 1.0)
    _number(body, "repetition_penalty", 0.0, 100.0)
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise EmbeddedRequestError(f"{name} must be a positive integer, got {value!r}", name)
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
        raise EmbeddedRequestError(f"top_k must be an integer, got {top_k!r}", "top_k")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise EmbeddedRequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
    stop_strings(body)


def stop_strings(body: dict[str, Any]) -> list[str]:
    """The request's ``stop`` as a list (empty strings dropped); 400 for anything else."""
    stop = body.get("stop")
    if stop is None:
        return []
    values = [stop] if isinstance(stop, str) else stop
    if not isinstance(values, list) or not all(isinstance(s, str) for s in values):
        raise EmbeddedRequestError("stop must be a string or a list of strings", "stop")
    if len(values) > MAX_STOP:
        raise EmbeddedRequestError(
            f"stop takes at most {MAX_STOP} strings, got {len(values)}", "stop"
        )
    return [s for s in values if s]


@dataclass
class StopMatcher:
    """Decides, for the decoded text so far, how much is safe to send and whether to stop."""

    stops: list[str]

    def cut(self, text: str) -> tuple[str, bool]:
        """(the text that may be sent, whether a stop string was found)."""
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            return text[: min(found)], True
        return text[: len(text) - self._held_back(text)], False

    def _held_back(self, text: str) -> int:
        """Length of the longest tail of ``text`` that begins some stop string."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if stop.startswith(text[-size:]):
                    longest = size
                    break
        return longest

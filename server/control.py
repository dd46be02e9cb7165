"""Per-request sampling control: ``X-Pandora-*`` headers and the body's ``"pandora"`` object.

Headers win over the body (OpenAI clients send the body form with ``extra_body``). A cost selects
adaptive mode, a target acceptance selects target mode. Every invalid value is rejected with a
400 naming the header or body field, before any upstream work starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from server.config import MODES, TASK_PATTERN, TASK_RULE, Settings
from server.errors import InvalidRequestError

__all__ = ["MAX_PARALLELISM", "SamplingPlan", "is_greedy", "resolve_plan"]

MAX_PARALLELISM = 64
MAX_HEADER_VALUE = 64

# field -> header name
FIELDS = {
    "mode": "X-Pandora-Mode",
    "cost": "X-Pandora-Cost",
    "target_acceptance": "X-Pandora-Target-Acceptance",
    "max_samples": "X-Pandora-Max-Samples",
    "min_samples": "X-Pandora-Min-Samples",
    "parallelism": "X-Pandora-Parallelism",
    "task": "X-Pandora-Task",
}


@dataclass(frozen=True)
class SamplingPlan:
    """How one request is sampled, after defaults and validation."""

    mode: str
    max_samples: int
    min_samples: int | None
    parallelism: int
    cost: float | None  # adaptive mode
    target: float | None  # target mode
    n: int = 1  # best candidates to return (distinct ones first: sampling._Run._rank)
    task: str | None = None  # keys the learned deployment prior with the model (server.priors)
    greedy: bool = False  # greedy decoding: one candidate (is_greedy)


def is_greedy(body: Mapping[str, Any]) -> bool:
    """Does the chat body ask for greedy decoding (``temperature`` 0, or vLLM's and TGI's
    ``top_k`` 1)? Every candidate is then the same reply, up to the upstream's batch numerics, so
    a Best-of-N over them buys nothing."""
    return _number_is(body.get("temperature"), 0) or _number_is(body.get("top_k"), 1)


def _number_is(value: Any, number: int) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == number


def _raw_values(headers: Mapping[str, str], body: Any) -> dict[str, tuple[Any, str]]:
    """field -> (raw value, param name to report); headers override body."""
    values: dict[str, tuple[Any, str]] = {}
    if body is not None:
        if not isinstance(body, dict):
            raise InvalidRequestError("'pandora' must be an object", param="pandora")
        for key, value in body.items():
            if key not in FIELDS:
                raise InvalidRequestError(
                    f"unknown key pandora.{key}; allowed: {', '.join(FIELDS)}",
                    param=f"pandora.{key}",
                )
            if value is not None:
                values[key] = (value, f"pandora.{key}")
    for key, header in FIELDS.items():
        raw = headers.get(header)
        if raw is not None:
            if len(raw) > MAX_HEADER_VALUE:
                raise InvalidRequestError(f"{header} is too long", param=header)
            values[key] = (raw.strip(), header)
    return values


def _number(value: Any, param: str) -> float:
    if isinstance(value, bool):
        raise InvalidRequestError(f"{param} must be a number, got {value!r}", param=param)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"{param} must be a number, got {value!r}", param=param) from None
    if not math.isfinite(number):
        raise InvalidRequestError(f"{param} must be finite, got {value!r}", param=param)
    return number


def _integer(value: Any, param: str, low: int, high: int) -> int:
    number = _number(value, param)
    if number != int(number):
        raise InvalidRequestError(f"{param} must be an integer, got {value!r}", param=param)
    if not low <= number <= high:
        raise InvalidRequestError(
            f"{param} must be between {low} and {high}, got {value!r}", param=param
        )
    return int(number)


def _task(value: Any, param: str) -> str:
    """A task label: a prior is learned per (model, task), so a label must name a kind of
    prompt, not carry free text."""
    if not isinstance(value, str) or TASK_PATTERN.fullmatch(value) is None:
        raise InvalidRequestError(
            f"{param} must be {TASK_RULE}, got {value!r}",
            param=param,
        )
    return value


def resolve_plan(
    headers: Mapping[str, str], body: Any, settings: Settings, *, n: int = 1, greedy: bool = False
) -> SamplingPlan:
    """Combine server defaults, the body's ``pandora`` object and the headers into a plan.

    ``greedy`` (the chat body's :func:`is_greedy`): adaptive and target requests for one choice
    draw one candidate, unless the client set max-samples or min-samples; fixed mode, the A/B
    baseline, keeps its N."""
    raw = _raw_values(headers, body)
    cost = target = None
    if "cost" in raw:
        cost = _number(*raw["cost"])
        if not 0 < cost < 1:
            raise InvalidRequestError(
                f"{raw['cost'][1]} must be in (0, 1), got {raw['cost'][0]!r}", param=raw["cost"][1]
            )
    if "target_acceptance" in raw:
        value, param = raw["target_acceptance"]
        target = _number(value, param)
        if not 0 < target <= 1:
            raise InvalidRequestError(f"{param} must be in (0, 1], got {value!r}", param=param)
    if cost is not None and target is not None:
        cost_param, target_param = raw["cost"][1], raw["target_acceptance"][1]
        raise InvalidRequestError(
            f"{cost_param} and {target_param} are both given: a cost selects adaptive mode, "
            "a target acceptance selects target mode; give one",
            param=target_param,
        )
    implied = "adaptive" if cost is not None else "target" if target is not None else None
    if "mode" in raw:
        value, param = raw["mode"]
        mode = str(value).lower()
        if mode not in MODES:
            raise InvalidRequestError(
                f"{param} must be one of {', '.join(MODES)}, got {value!r}", param=param
            )
        if implied is not None and mode != implied:
            raise InvalidRequestError(
                f"{param} is {mode!r} but a {'cost' if cost is not None else 'target acceptance'}"
                f" selects {implied!r} mode",
                param=param,
            )
    else:
        mode = implied or settings.default_mode

    cap = settings.max_samples
    max_samples = _integer(*raw["max_samples"], 1, cap) if "max_samples" in raw else cap
    if "min_samples" in raw:
        min_samples: int | None = _integer(*raw["min_samples"], 1, max_samples)
    elif settings.min_samples is not None:
        min_samples = min(settings.min_samples, max_samples)
    else:
        min_samples = None
    greedy = (
        greedy
        and mode in ("adaptive", "target")
        and n == 1
        and "max_samples" not in raw
        and "min_samples" not in raw
    )
    if greedy:
        max_samples, min_samples = 1, None
    parallelism = (
        _integer(*raw["parallelism"], 1, MAX_PARALLELISM)
        if "parallelism" in raw
        else settings.parallelism
    )
    if mode != "off" and n > max_samples:
        raise InvalidRequestError(
            f"n ({n}) must not exceed the sample budget ({max_samples})", param="n"
        )
    task = _task(*raw["task"]) if "task" in raw else None
    if mode == "adaptive" and cost is None:
        cost = settings.default_cost
    if mode == "target" and target is None:
        target = settings.default_target
    return SamplingPlan(
        mode=mode,
        max_samples=max_samples,
        min_samples=min_samples,
        parallelism=min(parallelism, max_samples),
        cost=cost,
        target=target,
        n=n,
        task=task,
        greedy=greedy,
    )

"""Wire models of the worker's HTTP API (``POST /v1/rewards``) and its OpenAI-shaped errors."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ErrorBody", "ErrorResponse", "Message", "RewardRequest", "RewardResponse", "Usage"]


class Message(BaseModel):
    """An OpenAI chat message; extra keys (name, tool_calls, ...) reach the chat template."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class RewardRequest(BaseModel):
    messages: list[Message] = Field(description="The prompt, as OpenAI chat messages.")
    responses: list[str] = Field(description="Candidate assistant replies to score.")


class Usage(BaseModel):
    prompt_tokens: int


class RewardResponse(BaseModel):
    model: str
    scores: list[float] = Field(description="Raw reward logits, in the order of `responses`.")
    truncated: list[bool] = Field(description="Whether each pair was cut to the model's length.")
    usage: Usage


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody

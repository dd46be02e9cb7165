"""Configuration of the reward worker: one object built at start-up (CLI flags or environment)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["WorkerSettings"]


class WorkerSettings(BaseSettings):
    """``pandora reward-worker`` options; each can also come from ``PANDORA_REWARD_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="PANDORA_REWARD_", protected_namespaces=())

    model: str = Field(description="Local path or hub id of a sequence-classification model.")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    label_index: int | None = Field(None, ge=0, description="Logit to use for multi-label models.")
    max_length: int | None = Field(None, ge=8, description="Token limit; default: the model's.")
    max_batch_size: int = Field(32, ge=1)
    max_batch_tokens: int = Field(16384, ge=1)
    max_wait_ms: float = Field(5.0, ge=0)
    max_responses: int = Field(1024, ge=1, description="Responses accepted in one request.")
    torch_threads: int | None = Field(None, ge=1, description="CPU threads for torch ops.")
    prefix_sharing: bool = Field(
        True,
        description="Run a token prefix that sequences of a batch share once (where the model "
        "passes the exactness probe at load).",
    )
    served_model_name: str | None = Field(None, description="Name reported as `model`.")
    host: str = "0.0.0.0"
    port: int = Field(8081, ge=0, le=65535)
    api_key: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Keys clients must send as 'Authorization: Bearer <key>' (repeatable; env: "
        "comma-separated). /health and /metrics stay open.",
    )

    @field_validator("api_key", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

"""Build the configured reward backend by name (the gateway's one entry point to ``reward``)."""

from __future__ import annotations

from reward.base import RewardBackend

__all__ = ["BACKEND_KINDS", "create_backend"]

BACKEND_KINDS = ("worker", "vllm", "local")


def create_backend(
    kind: str,
    *,
    url: str | None = None,
    model: str | None = None,
    timeout: float = 30.0,
    api_key: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
) -> RewardBackend:
    """``worker`` and ``vllm`` need ``url`` (``model`` optional for vllm); ``local`` needs
    ``model``. Raises ``ValueError`` (one line) for an unknown kind or a missing argument.
    Clients are imported here so that ``import reward`` stays free of httpx and torch."""
    if kind == "worker":
        if not url:
            raise ValueError("reward backend 'worker' needs a url (the worker's base URL)")
        from reward.clients import WorkerRewardClient

        return WorkerRewardClient(url, timeout=timeout, api_key=api_key)
    if kind == "vllm":
        if not url:
            raise ValueError("reward backend 'vllm' needs a url (the vLLM server's base URL)")
        from reward.clients import VLLMRewardClient

        return VLLMRewardClient(url, model=model, timeout=timeout, api_key=api_key)
    if kind == "local":
        if not model:
            raise ValueError("reward backend 'local' needs a model (a local path or hub id)")
        from reward.local import LocalRewardBackend

        return LocalRewardBackend(model, device=device, dtype=dtype)
    raise ValueError(f"unknown reward backend {kind!r}; expected one of {', '.join(BACKEND_KINDS)}")

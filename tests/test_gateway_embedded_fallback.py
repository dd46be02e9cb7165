"""The quickstart's bare `pandora serve` comes up anywhere; models a user names never silently
turn into the demo."""

from __future__ import annotations

import logging

import pytest

from server.config import DEFAULT_GENERATOR_MODEL, DEFAULT_REWARD_MODEL
from server.embedded import EmbeddedLoadError, _default_models_unreachable, ensure_loadable


@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def test_default_models_without_hub_fall_back_to_the_demo_loudly(no_hub, caplog):
    with caplog.at_level(logging.WARNING, logger="server.embedded"):
        assert _default_models_unreachable(DEFAULT_GENERATOR_MODEL, DEFAULT_REWARD_MODEL)
    (record,) = caplog.records
    assert "FALLING BACK" in record.message and "RANDOM" in record.message
    assert DEFAULT_GENERATOR_MODEL in record.message


@pytest.mark.parametrize(
    ("generator", "reward"),
    [("my-org/my-chat", DEFAULT_REWARD_MODEL), (DEFAULT_GENERATOR_MODEL, "/models/my-rm")],
)
def test_named_models_are_never_replaced(no_hub, caplog, generator, reward):
    assert not _default_models_unreachable(generator, reward)
    assert not caplog.records
    with pytest.raises(EmbeddedLoadError, match="--demo-tiny-models"):
        ensure_loadable("reward model", "/models/my-rm")

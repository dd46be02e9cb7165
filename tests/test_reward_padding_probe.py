"""Batched passes without a padding mask, only where the model proves padding cannot leak in."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from reward_fixtures import PROMPT, RESPONSES, tiny_reward_model_path
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from reward.scorer import RewardScorer


class _Bidirectional(torch.nn.Module):
    """A base model whose every position also sees the mean of all (unmasked) positions: like an
    encoder, tokens after a sequence change its hidden states unless the mask hides them."""

    def __init__(self, causal: torch.nn.Module) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, input_ids: torch.Tensor, attention_mask: Any = None, **kwargs: Any) -> Any:
        output = self.causal(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden = output.last_hidden_state
        weights = torch.ones(hidden.shape[:2]) if attention_mask is None else attention_mask
        weights = weights.to(hidden.dtype)[..., None]
        context = (hidden * weights).sum(1, keepdim=True) / weights.sum(1, keepdim=True)
        output.last_hidden_state = hidden + context
        return output


def _scorer(bidirectional: bool = False) -> RewardScorer:
    path = str(tiny_reward_model_path(pad_is_end_of_turn=True))
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    if bidirectional:
        model.model = _Bidirectional(model.model)
    return RewardScorer(model, AutoTokenizer.from_pretrained(path), name="tiny-rm")


def _alone_unpadded(scorer: RewardScorer, ids: list[int]) -> float:
    with torch.inference_mode():
        hidden = scorer._base(input_ids=torch.tensor([ids])).last_hidden_state
        return scorer.model.score(hidden[0, -1]).item()


@pytest.mark.parametrize("bidirectional", [False, True])
def test_mask_is_dropped_only_when_padding_cannot_leak_and_scores_stay_exact(
    bidirectional: bool,
) -> None:
    scorer = _scorer(bidirectional)
    assert scorer._padding_is_invisible is (not bidirectional)
    batch = [scorer.encode(PROMPT, response).ids for response in RESPONSES]
    assert max(map(len, batch)) > 8 * min(map(len, batch))  # mostly padding
    batched = scorer.forward(batch)
    assert batched == pytest.approx([scorer.forward([ids])[0] for ids in batch], abs=1e-4)
    assert batched == pytest.approx([_alone_unpadded(scorer, ids) for ids in batch], abs=1e-4)
    assert max(batched) - min(batched) > 0.05
    if bidirectional:  # the probe matters: without the mask this model's scores would move
        scorer._padding_is_invisible = True
        leaked = scorer.forward(batch)
        assert max(abs(a - b) for a, b in zip(leaked, batched, strict=True)) > 1e-3


def test_scoring_builds_no_kv_cache() -> None:
    scorer = _scorer()
    assert scorer.model.config.use_cache is False

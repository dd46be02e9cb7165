"""The scorer: chat template, raw logit of the single label, batch invariance, truncation."""

from __future__ import annotations

import pytest
import torch
from reward_fixtures import PROMPT, RESPONSES, load_tiny_scorer
from tiny_models import END_OF_TURN, tiny_reward_model_path

from reward.scorer import RewardScorer, flatten_content


@pytest.fixture(scope="module")
def scorer() -> RewardScorer:
    return load_tiny_scorer()


@pytest.fixture(scope="module")
def pitfall_scorer() -> RewardScorer:
    """A model whose pad token is its end-of-turn token (FsfairX-LLaMA3-RM style)."""
    return load_tiny_scorer(pad_is_end_of_turn=True)


def _reference(scorer: RewardScorer, ids: list[int]) -> float:
    """The single label's logit at the sequence's last token, computed on the unpadded sequence."""
    with torch.inference_mode():
        hidden = scorer.model.model(input_ids=torch.tensor([ids])).last_hidden_state
        return scorer.model.score(hidden[0, -1]).item()


def test_dialogue_is_templated_without_generation_prompt(scorer: RewardScorer) -> None:
    pair = scorer.encode(PROMPT, "Paris.")
    text = scorer.tokenizer.decode(pair.ids)
    assert text.startswith("<|begin|><|start|>system\nYou are a helpful assistant.<|eot|>")
    assert text.endswith("<|start|>assistant\nParis.<|eot|>")
    assert text.count("<|begin|>") == 1  # the template's BOS, not a second one from the tokenizer
    assert not pair.truncated


@pytest.mark.parametrize("model", ["pad_distinct", "pad_is_end_of_turn"])
def test_batched_scores_equal_one_at_a_time_scores(
    model: str, scorer: RewardScorer, pitfall_scorer: RewardScorer
) -> None:
    chosen = pitfall_scorer if model == "pad_is_end_of_turn" else scorer
    batch = [chosen.encode(PROMPT, response).ids for response in RESPONSES]
    lengths = sorted(len(ids) for ids in batch)
    assert lengths[-1] > 8 * lengths[0]  # very different lengths: most of the batch is padding
    batched = chosen.forward(batch)
    alone = [chosen.forward([ids])[0] for ids in batch]
    reversed_batch = chosen.forward(batch[::-1])[::-1]
    assert batched == pytest.approx(alone, abs=1e-4)
    assert reversed_batch == pytest.approx(alone, abs=1e-4)
    assert batched == pytest.approx([_reference(chosen, ids) for ids in batch], abs=1e-4)
    assert max(batched) - min(batched) > 0.05  # scores differ, so equality above means something


def test_padding_pitfall_is_real_and_avoided(pitfall_scorer: RewardScorer) -> None:
    """transformers' own pooling skips the closing end-of-turn token when pad == end-of-turn."""
    tokenizer = pitfall_scorer.tokenizer
    assert tokenizer.pad_token == END_OF_TURN
    ids = pitfall_scorer.encode(PROMPT, RESPONSES[0]).ids
    assert ids[-1] == tokenizer.pad_token_id
    with torch.inference_mode():
        naive = pitfall_scorer.model(input_ids=torch.tensor([ids])).logits[0, 0].item()
    ours = pitfall_scorer.forward([ids])[0]
    assert naive == pytest.approx(_reference(pitfall_scorer, ids[:-1]), abs=1e-4)  # shifted
    assert ours == pytest.approx(_reference(pitfall_scorer, ids), abs=1e-4)
    assert abs(naive - ours) > 1e-3


def test_scores_are_raw_logits_and_deterministic(scorer: RewardScorer) -> None:
    batch = [scorer.encode(PROMPT, response).ids for response in RESPONSES]
    first = scorer.forward(batch)
    again = load_tiny_scorer().forward(batch)  # a second load of the same weights
    assert first == again
    assert any(score < 0 or score > 1 for score in first)  # no sigmoid squashing into (0, 1)


def test_overlong_pair_keeps_bos_and_response_end_and_is_flagged() -> None:
    short = RewardScorer.from_pretrained(
        str(tiny_reward_model_path()), device="cpu", dtype="float32", max_length=48
    )
    response = "start of a long answer " + "filler words " * 40 + "THE END"
    pair = short.encode(PROMPT, response)
    assert pair.truncated and len(pair.ids) == 48
    assert pair.ids[0] == short.tokenizer.bos_token_id
    full = short.encode(PROMPT[:0], "x")  # a short pair is left alone
    assert not full.truncated
    assert short.tokenizer.decode(pair.ids).endswith("THE END<|eot|>")
    assert short.forward([pair.ids])[0] == pytest.approx(_reference(short, pair.ids), abs=1e-4)


def test_model_limit_comes_from_tokenizer_and_config() -> None:
    limited = RewardScorer.from_pretrained(
        str(tiny_reward_model_path(max_length=64)), device="cpu", dtype="float32"
    )
    assert limited.max_length == 64
    assert limited.encode(PROMPT, "word " * 200).truncated


def test_multi_label_model_is_refused_unless_label_index_given() -> None:
    path = str(tiny_reward_model_path(num_labels=3))
    with pytest.raises(ValueError, match=r"3 labels.*--label-index"):
        RewardScorer.from_pretrained(path, device="cpu")
    with pytest.raises(ValueError, match="out of range"):
        RewardScorer.from_pretrained(path, device="cpu", label_index=3)
    picked = RewardScorer.from_pretrained(path, device="cpu", dtype="float32", label_index=2)
    ids = picked.encode(PROMPT, "Paris.").ids
    with torch.inference_mode():
        hidden = picked.model.model(input_ids=torch.tensor([ids])).last_hidden_state
        logits = picked.model.score(hidden[0, -1])
    assert picked.forward([ids])[0] == pytest.approx(logits[2].item(), abs=1e-5)


def test_content_parts_are_flattened_and_non_text_refused() -> None:
    assert flatten_content([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "ab"
    assert flatten_content(None) == ""
    with pytest.raises(ValueError, match="image_url"):
        flatten_content([{"type": "image_url", "image_url": {"url": "x"}}])

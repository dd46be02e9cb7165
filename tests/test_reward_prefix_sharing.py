"""Shared prompt prefixes run once per batch, and scores stay the one-at-a-time scores."""

from __future__ import annotations

import argparse
import random
import time

import pytest
import torch
from reward_fixtures import PROMPT, RESPONSES, load_tiny_scorer
from test_reward_padding_probe import _scorer as scorer_over

from reward.prefix_groups import common_prefix_length, plan_prefix_groups
from reward.scorer import RewardScorer

# Long prompts (pasted documents) under one system prompt, as when the candidates of a gateway
# request are scored together and the application's requests share their system prompt.
SYSTEM = {"role": "system", "content": "You are a careful reviewer."}
LONG_PROMPTS = [
    [SYSTEM, {"role": "user", "content": "Summarise this report: " + "the river rose; " * 12}],
    [SYSTEM, {"role": "user", "content": "Summarise this letter: " + "the sea is calm; " * 12}],
]


# -- the plan ---------------------------------------------------------------------------------


def _naive_common_prefix(first: list[int], second: list[int]) -> int:
    length = 0
    while length < min(len(first), len(second)) and first[length] == second[length]:
        length += 1
    return length


def test_common_prefix_length_matches_a_token_by_token_scan() -> None:
    rng = random.Random(0)
    for _ in range(500):
        stem = [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        first = stem + [rng.randrange(4) for _ in range(rng.randrange(0, 5))]
        second = stem + [rng.randrange(4) for _ in range(rng.randrange(0, 5))]
        assert common_prefix_length(first, second) == _naive_common_prefix(first, second)


def test_plan_groups_sequences_by_their_shared_prompt() -> None:
    prompt_a, prompt_b = list(range(1000, 1300)), list(range(2000, 2400))
    batch = [
        [*prompt_a, 1, 2, 3],
        [7] * 50,  # shares nothing
        [*prompt_b, 4],
        [*prompt_a, 5],
        [*prompt_b, 6, 6],
        prompt_a + [8] * 40,
    ]
    plan = plan_prefix_groups(batch)
    assert {group.members: group.prefix_length for group in plan.groups} == {
        (0, 3, 5): 300,
        (2, 4): 400,
    }
    assert plan.rest == (1,)
    assert plan.saved_tokens == 2 * 300 + 400


def test_plan_prefers_whole_prompts_over_a_shared_system_prompt() -> None:
    system = list(range(500, 520))  # 20 tokens every request shares
    batch = [system + [q] * 200 + [r] for q in (1, 2) for r in (3, 4, 5)]
    plan = plan_prefix_groups(batch)
    assert sorted(group.prefix_length for group in plan.groups) == [220, 220]
    assert sorted(group.members for group in plan.groups) == [(0, 1, 2), (3, 4, 5)]


def test_every_member_keeps_its_last_token_out_of_the_prefix() -> None:
    prompt = list(range(300))
    plan = plan_prefix_groups([prompt, [*prompt, 1, 2], [*prompt[:-1], 9]])
    (group,) = plan.groups
    assert group.prefix_length == 299  # the shortest member's last token is where it is scored


def test_a_group_that_saves_too_little_is_not_formed() -> None:
    prompt = list(range(100))
    assert plan_prefix_groups([[*prompt, 1], [*prompt, 2]]).groups == ()  # saves 100 < 256
    assert plan_prefix_groups([[*prompt, 1], [*prompt, 2]], group_cost=50).groups
    short = list(range(10))
    assert plan_prefix_groups([[*short, i] for i in range(100)]).groups == ()  # under 16 tokens


def test_plan_places_every_sequence_exactly_once_and_groups_share_their_prefix() -> None:
    rng = random.Random(1)
    stems = [[rng.randrange(50) for _ in range(rng.randrange(10, 300))] for _ in range(4)]
    for _ in range(200):
        batch = [
            rng.choice(stems)[: rng.randrange(5, 300)] + [rng.randrange(50)] * rng.randrange(1, 9)
            for _ in range(rng.randrange(1, 20))
        ]
        plan = plan_prefix_groups(batch, group_cost=rng.choice([0, 64, 256]))
        placed = [m for group in plan.groups for m in group.members] + list(plan.rest)
        assert sorted(placed) == list(range(len(batch)))
        for group in plan.groups:
            first = batch[group.members[0]][: group.prefix_length]
            for member in group.members:
                assert batch[member][: group.prefix_length] == first
                assert len(batch[member]) > group.prefix_length


# -- the scorer -------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["pad_distinct", "pad_is_end_of_turn"])
def scorer(request: pytest.FixtureRequest) -> RewardScorer:
    return load_tiny_scorer(pad_is_end_of_turn=request.param == "pad_is_end_of_turn")


def _reference(scorer: RewardScorer, ids: list[int]) -> float:
    with torch.inference_mode():
        hidden = scorer.model.model(input_ids=torch.tensor([ids])).last_hidden_state
        return scorer.model.score(hidden[0, -1]).item()


def _mixed_batch(scorer: RewardScorer) -> list[list[int]]:
    """Two long prompts' candidates of very different lengths, interleaved with pairs of a short
    prompt (too short to be worth sharing) and pairs that share nothing."""
    batch = []
    for index, response in enumerate(RESPONSES):
        batch += [scorer.encode(prompt, response).ids for prompt in LONG_PROMPTS]
        batch.append(scorer.encode(PROMPT, response).ids)
        alone = [{"role": "user", "content": f"{index} Translate: " + "good morning " * 9}]
        batch.append(scorer.encode(alone, response).ids)
    assert max(map(len, batch)) < scorer.max_length  # nothing truncated
    return batch


def test_shared_prefix_scores_equal_one_at_a_time_scores(
    scorer: RewardScorer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert scorer.prefix_sharing  # the probe passed on this (causal) model
    batch = _mixed_batch(scorer)
    shared_calls: list[tuple[int, int]] = []
    original = RewardScorer._forward_shared

    def spy(self: RewardScorer, members: list[list[int]], prefix_length: int) -> list[float]:
        shared_calls.append((len(members), prefix_length))
        return original(self, members, prefix_length)

    monkeypatch.setattr(RewardScorer, "_forward_shared", spy)
    batched = scorer.forward(batch)
    assert len(shared_calls) == 2 and all(size == len(RESPONSES) for size, _ in shared_calls)
    assert all(prefix > 100 for _, prefix in shared_calls)
    monkeypatch.undo()
    alone = [scorer.forward([ids])[0] for ids in batch]
    assert batched == pytest.approx(alone, abs=1e-4)
    assert batched == pytest.approx([_reference(scorer, ids) for ids in batch], abs=1e-4)
    assert max(batched) - min(batched) > 0.05


def test_a_failing_shared_pass_falls_back_to_plain_passes_for_good(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    scorer = load_tiny_scorer()
    assert scorer.prefix_sharing
    batch = _mixed_batch(scorer)
    expected = [_reference(scorer, ids) for ids in batch]
    calls: list[int] = []

    def out_of_memory(self: RewardScorer, members: list[list[int]], prefix: int) -> list[float]:
        calls.append(len(members))
        raise RuntimeError("out of memory for the repeated cache")

    monkeypatch.setattr(RewardScorer, "_forward_shared", out_of_memory)
    with caplog.at_level("ERROR", logger="reward.scorer"):
        assert scorer.forward(batch) == pytest.approx(expected, abs=1e-4)
    assert calls == [len(RESPONSES)] and not scorer.prefix_sharing
    assert "sharing turned off" in caplog.text
    assert scorer.forward(batch) == pytest.approx(expected, abs=1e-4)
    assert calls == [len(RESPONSES)]  # not tried again


def test_sharing_off_scores_every_sequence_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    from reward_fixtures import tiny_reward_model_path

    path = str(tiny_reward_model_path())
    scorer = RewardScorer.from_pretrained(path, device="cpu", dtype="float32", prefix_sharing=False)
    assert not scorer.prefix_sharing

    def refuse(*args: object) -> list[float]:
        raise AssertionError("shared-prefix pass used with sharing off")

    monkeypatch.setattr(RewardScorer, "_forward_shared", refuse)
    batch = _mixed_batch(scorer)
    assert scorer.forward(batch) == pytest.approx(
        [_reference(scorer, ids) for ids in batch], abs=1e-4
    )


def test_probe_keeps_sharing_off_for_a_bidirectional_model() -> None:
    assert scorer_over(bidirectional=False).prefix_sharing
    assert not scorer_over(bidirectional=True).prefix_sharing


def test_probe_keeps_sharing_off_when_the_cached_pass_is_wrong_or_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = RewardScorer._forward_shared

    def off_by_a_little(self: RewardScorer, batch: list[list[int]], prefix: int) -> list[float]:
        return [score + 0.01 for score in original(self, batch, prefix)]

    monkeypatch.setattr(RewardScorer, "_forward_shared", off_by_a_little)
    assert not load_tiny_scorer().prefix_sharing

    def broken(self: RewardScorer, batch: list[list[int]], prefix: int) -> list[float]:
        raise TypeError("this architecture cannot repeat its cache")

    monkeypatch.setattr(RewardScorer, "_forward_shared", broken)
    assert not load_tiny_scorer().prefix_sharing


def test_worker_exports_whether_it_shares_and_what_sharing_saved() -> None:
    import httpx
    from prometheus_client import CollectorRegistry
    from reward_fixtures import serve

    from reward.app import create_app
    from reward.settings import WorkerSettings

    scorer = load_tiny_scorer()
    registry = CollectorRegistry()
    settings = WorkerSettings(model="tiny-rm", device="cpu", dtype="float32")
    app = create_app(settings, registry=registry, load_scorer=lambda: scorer)
    assert registry.get_sample_value("pandora_reward_prefix_sharing") == 0  # not loaded yet
    assert registry.get_sample_value("pandora_reward_shared_prefix_tokens_total") == 0
    with serve(app) as url:
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").status_code != 200:
            assert time.monotonic() < deadline, "worker never became healthy"
            time.sleep(0.02)
        body = {"messages": LONG_PROMPTS[0], "responses": RESPONSES}
        answer = httpx.post(f"{url}/v1/rewards", json=body, timeout=30)
        text = httpx.get(f"{url}/metrics").text
    assert answer.status_code == 200
    expected = [scorer.forward([scorer.encode(LONG_PROMPTS[0], r).ids])[0] for r in RESPONSES]
    assert answer.json()["scores"] == pytest.approx(expected, abs=1e-4)
    assert "pandora_reward_prefix_sharing 1.0" in text
    saved = registry.get_sample_value("pandora_reward_shared_prefix_tokens_total")
    shared = len(scorer.encode(LONG_PROMPTS[0], "").ids) - 8  # about the prompt's length
    assert saved is not None and saved >= (len(RESPONSES) - 1) * shared


def test_worker_cli_turns_sharing_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import reward.cli

    parser = argparse.ArgumentParser()
    reward.cli.register(parser.add_subparsers())
    captured: dict[str, object] = {}

    def fake_create_app(settings: object, **kwargs: object) -> None:
        captured["settings"] = settings
        raise SystemExit(0)  # stop before uvicorn starts

    monkeypatch.setattr("reward.app.create_app", fake_create_app)
    for flags, expected in (([], True), (["--no-prefix-sharing"], False)):
        args = parser.parse_args(["reward-worker", "--model", "m", *flags])
        with pytest.raises(SystemExit):
            reward.cli.run(args)
        assert captured["settings"].prefix_sharing is expected  # type: ignore[attr-defined]

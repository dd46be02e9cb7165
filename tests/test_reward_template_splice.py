"""One chat-template render per request, spliced per response, only where that is exact."""

from __future__ import annotations

from typing import Any

import pytest
from reward_fixtures import PROMPT, RESPONSES, load_tiny_scorer
from tiny_models import BOS, CHAT_TEMPLATE, END_OF_TURN, START_OF_TURN

from reward.scorer import RewardScorer

# Replies a transforming template would change: edge whitespace, reasoning, quotes and markup.
TRICKY = [
    "  Paris, with spaces around.\n",
    "<think>\nThe capital... Paris.\n</think>\n\nParis.",
    'He said "Paris" \\ & <b>not Lyon</b>',
    "",
    "Plain Paris.",
]

_TURN = "{{ '" + START_OF_TURN + "' + message['role'] + '\\n' }}"
_CLOSE = "{{ '" + END_OF_TURN + "' }}"


def _template(content: str) -> str:
    """CHAT_TEMPLATE's shape with a different way of writing each message's content."""
    return (
        "{{ '"
        + BOS
        + "' }}{% for message in messages %}"
        + _TURN
        + content
        + _CLOSE
        + "{% endfor %}"
    )


TRANSFORMING = {
    "trim": _template("{{ message['content'] | trim }}"),
    "reasoning split": _template(
        "{% set content = message['content'] %}"
        "{% if '</think>' in content %}"
        "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
        "{{ content }}"
    ),
    "tojson": _template("{{ message['content'] | tojson }}"),
}


def _counting(scorer: RewardScorer) -> list[int]:
    renders = [0]
    apply = scorer.tokenizer.apply_chat_template

    def counted(*args: Any, **kwargs: Any) -> Any:
        renders[0] += 1
        return apply(*args, **kwargs)

    scorer.tokenizer.apply_chat_template = counted
    return renders


def _one_by_one(scorer: RewardScorer, replies: list[str]) -> list[list[int]]:
    """Each pair templated and tokenized on its own (encode_many of a single pair renders once)."""
    return [scorer.encode_many([(PROMPT, reply)])[0].ids for reply in replies]


def test_a_verbatim_template_renders_twice_per_request_and_splices_exactly() -> None:
    scorer = load_tiny_scorer()
    assert scorer.tokenizer.chat_template == CHAT_TEMPLATE
    replies = RESPONSES + TRICKY
    expected = _one_by_one(scorer, replies)
    expected_second = [scorer.encode(PROMPT[1:], reply).ids for reply in RESPONSES]
    renders = _counting(scorer)
    user_only = PROMPT[1:]
    two_requests = [(PROMPT, reply) for reply in replies] + [(user_only, r) for r in RESPONSES]
    encoded = scorer.encode_many(two_requests)
    assert [pair.ids for pair in encoded[: len(replies)]] == expected
    assert [pair.ids for pair in encoded[len(replies) :]] == expected_second
    # per request: the sentinel and the first reply; plus the empty reply, rendered directly
    assert renders[0] == (2 + 1) + 2
    assert scorer._splice_replies


@pytest.mark.parametrize("name", sorted(TRANSFORMING))
def test_a_transforming_template_falls_back_to_one_render_per_pair(name: str) -> None:
    scorer = load_tiny_scorer()
    scorer.tokenizer.chat_template = TRANSFORMING[name]
    expected = _one_by_one(scorer, TRICKY)
    # a plain splice would be wrong for this template (so the fallback below is needed)
    head, _, tail = scorer._template(PROMPT, "SENTINEL").partition("SENTINEL")
    assert any(head + r + tail != scorer._template(PROMPT, r) for r in TRICKY)
    renders = _counting(scorer)
    encoded = scorer.encode_many([(PROMPT, reply) for reply in TRICKY])
    assert [pair.ids for pair in encoded] == expected
    assert not scorer._splice_replies
    assert renders[0] == len(TRICKY) + 1  # each pair, plus the one sentinel render that failed
    renders[0] = 0
    scorer.encode_many([(PROMPT, reply) for reply in TRICKY])
    assert renders[0] == len(TRICKY)  # off for good: no more sentinel renders

"""Which sequences of a batch share a token prefix worth computing once.

A reward model reads every (prompt, response) pair whole, yet the pairs of one batch often begin
with the same tokens: the candidates of one gateway request share their entire prompt, and the
requests of one application share its system prompt. In a causal model the hidden states, keys
and values of a prefix do not depend on what follows it, so the scorer can run a shared prefix
once and let each sequence's remaining tokens attend to its cache (exact up to float rounding).
This module only plans; it works on plain token-id lists and knows nothing of torch.

The plan is a tree cut: sorted lexicographically, sequences that share a prefix are adjacent and
the prefix common to a run is the smallest adjacent common prefix in it. A run is either one
group (sharing that prefix) or split where its adjacent common prefix is smallest, whichever
saves more token positions, counting ``group_cost`` positions against every group for the two
extra forward passes it needs. Each sequence keeps at least its last token out of the prefix:
that position is where the score is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PrefixGroup", "PrefixPlan", "common_prefix_length", "plan_prefix_groups"]


@dataclass(frozen=True, slots=True)
class PrefixGroup:
    """Batch positions whose first ``prefix_length`` tokens are identical."""

    members: tuple[int, ...]
    prefix_length: int


@dataclass(frozen=True, slots=True)
class PrefixPlan:
    """Groups that share a prefix pass, and the positions scored by one plain padded pass."""

    groups: tuple[PrefixGroup, ...]
    rest: tuple[int, ...]

    @property
    def saved_tokens(self) -> int:
        """Token positions not computed thanks to the groups."""
        return sum((len(g.members) - 1) * g.prefix_length for g in self.groups)


def common_prefix_length(first: Sequence[int], second: Sequence[int]) -> int:
    """Length of the longest common prefix: a binary search over slice comparisons, which run
    in C (a token-by-token Python loop costs ~1 ms per pair of 2,000-token prompts)."""
    low, high = 0, min(len(first), len(second))
    while low < high:
        middle = (low + high + 1) // 2
        if first[:middle] == second[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def plan_prefix_groups(
    batch: Sequence[Sequence[int]], *, min_prefix: int = 16, group_cost: int = 256
) -> PrefixPlan:
    """Partition ``batch`` into prefix-sharing groups and the rest.

    A group must share at least ``min_prefix`` tokens and save more than ``group_cost`` token
    positions, ``(members - 1) * prefix_length``; otherwise its sequences join the plain pass.
    """
    order = sorted(range(len(batch)), key=lambda index: list(batch[index]))
    adjacent = [
        common_prefix_length(batch[order[i]], batch[order[i + 1]]) for i in range(len(order) - 1)
    ]

    def best(low: int, high: int) -> tuple[int, list[PrefixGroup]]:
        """The most saving cut of sorted positions ``low..high-1`` (net of group costs)."""
        if high - low < 2:
            return 0, []
        shortest = min(len(batch[order[i]]) for i in range(low, high))
        cut = min(adjacent[low : high - 1])
        shared = min(cut, shortest - 1)
        whole = (high - low - 1) * shared - group_cost
        whole_groups = [PrefixGroup(tuple(order[low:high]), shared)]
        if shared < min_prefix or whole <= 0:
            whole, whole_groups = 0, []
        split_saved, split_groups, start = 0, [], low
        if any(adjacent[i] != cut for i in range(low, high - 1)):
            for i in range(low, high):
                if i == high - 1 or adjacent[i] == cut:
                    saved, found = best(start, i + 1)
                    split_saved += saved
                    split_groups += found
                    start = i + 1
        if split_saved > whole:
            return split_saved, split_groups
        return whole, whole_groups

    _, groups = best(0, len(order))
    grouped = {member for group in groups for member in group.members}
    rest = tuple(index for index in range(len(batch)) if index not in grouped)
    return PrefixPlan(tuple(groups), rest)

"""Majority arithmetic for one configuration (single-server changes only).

Pure functions over plain dicts, so the leader's commit rule and the
candidate's vote tally can be checked in isolation. Joint consensus is not
supported: membership changes one server at a time, which keeps every pair of
consecutive majorities overlapping.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum


class VoteResult(Enum):
    PENDING = 0
    WON = 1
    LOST = 2


def majority(n_voters: int) -> int:
    return n_voters // 2 + 1


def committed_index(voters: Iterable[int], match: Mapping[int, int]) -> int:
    """Largest index stored (fsynced) on a majority of `voters`.

    With no voters nothing can commit, so the answer is 0 rather than "all".
    """
    return majority_match([match.get(v, 0) for v in voters])


def majority_match(acked: list[int]) -> int:
    """`committed_index` over the voters' match indexes themselves (0 if none)."""
    if not acked:
        return 0
    acked.sort(reverse=True)
    return acked[majority(len(acked)) - 1]


def vote_result(voters: Iterable[int], votes: Mapping[int, bool]) -> VoteResult:
    """Tally granted/rejected votes; missing voters are still pending."""
    voters = list(voters)
    if not voters:
        return VoteResult.LOST
    granted = sum(1 for v in voters if votes.get(v) is True)
    rejected = sum(1 for v in voters if votes.get(v) is False)
    need = majority(len(voters))
    if granted >= need:
        return VoteResult.WON
    if len(voters) - rejected < need:
        return VoteResult.LOST
    return VoteResult.PENDING


def has_quorum(voters: Iterable[int], active: Iterable[int]) -> bool:
    """True when `active` covers a majority of `voters` (check-quorum, ReadIndex)."""
    voters = set(voters)
    return bool(voters) and len(voters & set(active)) >= majority(len(voters))

"""The leader's view of one follower: what it has and what is in flight.

States follow etcd: PROBE (send one append, wait for the answer; used after a
rejection or on election), REPLICATE (stream appends optimistically, bounded
by an inflight window) and SNAPSHOT (a snapshot is on its way; send nothing
else until the follower reports it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum


class ProgressState(Enum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


class Inflights:
    """Last index of each unacknowledged append, oldest first, at most `size`."""

    __slots__ = ("size", "_q")

    def __init__(self, size: int) -> None:
        self.size = size
        self._q: deque[int] = deque()

    def full(self) -> bool:
        return len(self._q) >= self.size

    def add(self, last_index: int) -> None:
        if self.full():
            raise AssertionError(f"inflights: add {last_index} to full window {self.size}")
        self._q.append(last_index)

    def free_le(self, index: int) -> None:
        while self._q and self._q[0] <= index:
            self._q.popleft()

    def free_first_one(self) -> None:
        if self._q:
            self._q.popleft()

    def reset(self) -> None:
        self._q.clear()

    def __len__(self) -> int:
        return len(self._q)


@dataclass(slots=True)
class Progress:
    match: int = 0
    next: int = 1
    state: ProgressState = ProgressState.PROBE
    probe_sent: bool = False
    pending_snapshot: int = 0
    recent_active: bool = True
    is_learner: bool = False
    app_sent: bool = False  # an append went out since the last heartbeat round
    quiet_rounds: int = 0  # heartbeat rounds since its last append or periodic heartbeat
    inflights: Inflights = field(default_factory=lambda: Inflights(256))

    def _reset(self, state: ProgressState) -> None:
        self.state = state
        self.probe_sent = False
        self.pending_snapshot = 0
        self.inflights.reset()

    def become_probe(self) -> None:
        # After a snapshot, resume right after it; otherwise after the match.
        if self.state is ProgressState.SNAPSHOT:
            pending = self.pending_snapshot
            self._reset(ProgressState.PROBE)
            self.next = max(self.match + 1, pending + 1)
        else:
            self._reset(ProgressState.PROBE)
            self.next = self.match + 1

    def become_replicate(self) -> None:
        self._reset(ProgressState.REPLICATE)
        self.next = self.match + 1

    def become_snapshot(self, index: int) -> None:
        self._reset(ProgressState.SNAPSHOT)
        self.pending_snapshot = index

    def maybe_update(self, n: int) -> bool:
        """An accepted append up to `n`: returns False if it tells us nothing new."""
        updated = n > self.match
        if updated:
            self.match = n
            self.probe_sent = False
        self.next = max(self.next, n + 1)
        return updated

    def sent_entries(self, last: int) -> None:
        """Record an append that carried entries up to `last`."""
        if self.state is ProgressState.REPLICATE:
            self.next = last + 1
            self.inflights.add(last)
        elif self.state is ProgressState.PROBE:
            self.probe_sent = True

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """A rejection of the append at `rejected`; False if it is stale."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return self.inflights.full()
        return True

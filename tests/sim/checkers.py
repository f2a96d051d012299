"""Safety checks of a simulated cluster, run after every simulation step.

Each failure is a `Violation` naming its invariant; the mutation runner
counts a mutant as killed only through one of these names:

* ELECTION: at most one leader per term.
* LOG_MATCHING: two logs with the same term at an index agree on every
  entry up to it.
* LEADER_COMPLETENESS: a leader holds every entry committed before its term.
* SM_SAFETY: no two members apply different entries at one index.
* ACKED_LOST: an acknowledged proposal is missing (checked directly in the
  state machines, after restores and at the end).
* READ_LINEARIZABLE: a ReadIndex read returned before the reader had
  applied everything committed before the read began.
* MEMBERSHIP: a member's voter set differs from the configuration its own
  applied log prefix defines, or two successive configurations have
  majorities that can miss each other.
* RECOVERY: a crashed node cannot restart from its own disk.
* CORE_INVARIANT: the core's own always-on assertions (`raft.log.invariant`).
* FAIL_STOP: a node whose WAL write or fsync failed is still running (it must
  stop: a retry would trust a page cache that may have dropped the data).
* MERGED_ONCE: a proposal merged with others (`propose_quiet(merge=)`) is applied
  at one index only, and never also on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

ELECTION = "election safety"
LOG_MATCHING = "log matching"
LEADER_COMPLETENESS = "leader completeness"
SM_SAFETY = "state machine safety"
ACKED_LOST = "acknowledged write lost"
READ_LINEARIZABLE = "read linearizability"
MEMBERSHIP = "membership"
RECOVERY = "recovery"
CORE_INVARIANT = "core invariant"
FAIL_STOP = "fail-stop"
MERGED_ONCE = "merged proposal applied once"

NAMES = (ELECTION, LOG_MATCHING, LEADER_COMPLETENESS, SM_SAFETY, ACKED_LOST,
         READ_LINEARIZABLE, MEMBERSHIP, RECOVERY, CORE_INVARIANT, FAIL_STOP, MERGED_ONCE)


class Violation(AssertionError):
    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


def majorities_can_miss(a: Iterable[int], b: Iterable[int]) -> bool:
    """True if some majority of `a` and some majority of `b` are disjoint."""
    a, b = set(a), set(b)
    if not a or not b:
        return False
    both = a & b
    need_a = max(0, len(a) // 2 + 1 - len(a - b))
    need_b = max(0, len(b) // 2 + 1 - len(b - a))
    return need_a + need_b <= len(both)


def next_voters(voters: frozenset[int], kind: str, node: int) -> frozenset[int]:
    if kind == "ADD_VOTER":
        return voters | {node}
    if kind == "REMOVE":
        return voters - {node}
    return voters


@dataclass
class Checker:
    initial_voters: frozenset[int]
    # index -> what was applied there (normal data or ("conf", kind, node)).
    applied: dict[int, Any] = field(default_factory=dict)
    acked: dict[int, bytes] = field(default_factory=dict)
    ack_order: list[int] = field(default_factory=list)
    leaders: dict[int, int] = field(default_factory=dict)  # term -> leader id
    committed: dict[int, tuple[int, Any]] = field(default_factory=dict)  # index -> (term, key)
    commit_seen: dict[int, int] = field(default_factory=dict)  # node -> commit recorded
    leader_checked: set[tuple[int, int]] = field(default_factory=set)
    conf_changes: dict[int, tuple[str, int]] = field(default_factory=dict)  # index -> change
    reads: int = 0
    parts: dict[bytes, int] = field(default_factory=dict)  # merged part -> its index
    merged: set[int] = field(default_factory=set)  # indexes of merged entries

    # ---- state machine hooks (called as entries are applied) -------------------------

    def on_apply(self, node: int, index: int, key: Any) -> None:
        old = self.applied.setdefault(index, key)
        if old != key:
            raise Violation(SM_SAFETY, f"node {node} applied {key!r} at {index}, "
                                       f"another member applied {old!r}")

    def on_merged(self, node: int, index: int, parts: list[bytes]) -> None:
        """The parts of a merged entry: each at this index only (a retry or a second
        merge of the same proposal would show up at another index)."""
        for part in parts:
            self.applied_once(node, index, part)
        self.merged.add(index)

    def applied_once(self, node: int, index: int, data: bytes) -> None:
        at = self.parts.setdefault(data, index)
        if at != index:
            raise Violation(MERGED_ONCE, f"node {node} applied {data!r} at {index}, it was "
                                         f"applied at {at}")

    def on_conf(self, node: int, index: int, kind: str, target: int) -> None:
        self.on_apply(node, index, ("conf", kind, target))
        self.conf_changes[index] = (kind, target)

    def on_ack(self, index: int, data: bytes) -> None:
        self.acked[index] = data
        self.ack_order.append(index)
        got = self.applied.get(index)
        if got != data:
            raise Violation(ACKED_LOST, f"proposal acked at {index} but {got!r} applied there")

    def check_image(self, node: int, upto: int, entries: dict[int, bytes]) -> None:
        """A restored state machine image holds every acked entry up to `upto`."""
        for index, data in self.acked.items():
            if index <= upto and entries.get(index) != data:
                raise Violation(ACKED_LOST, f"node {node} restored an image at {upto} "
                                            f"without acked entry {index}")

    # ---- configuration history -----------------------------------------------------------

    def voters_at(self, index: int) -> frozenset[int]:
        voters = self.initial_voters
        for i in sorted(self.conf_changes):
            if i > index:
                break
            voters = next_voters(voters, *self.conf_changes[i])
        return voters

    def check_conf_history(self) -> None:
        voters = self.initial_voters
        for i in sorted(self.conf_changes):
            nxt = next_voters(voters, *self.conf_changes[i])
            if majorities_can_miss(voters, nxt):
                raise Violation(MEMBERSHIP, f"change at {i}: {sorted(voters)} -> {sorted(nxt)}")
            voters = nxt

    # ---- whole-cluster checks ---------------------------------------------------------------

    def check(self, cores: dict[int, Any], sms: dict[int, Any]) -> None:
        """`cores`: live node -> its Raft core; `sms`: live node -> its state machine."""
        for nid, r in cores.items():
            self._check_leader(nid, r)
            self._record_commits(nid, r)
        self._check_log_matching(cores)
        for nid, r in cores.items():
            self._check_membership(nid, r)
        self._check_acked(cores, sms)

    def _check_leader(self, nid: int, r: Any) -> None:
        if r.state.name != "LEADER":
            return
        owner = self.leaders.setdefault(r.term, nid)
        if owner != nid:
            raise Violation(ELECTION, f"nodes {owner} and {nid} both lead term {r.term}")
        if (nid, r.term) in self.leader_checked:
            return
        self.leader_checked.add((nid, r.term))
        first = r.log.first_index()
        for index, (term, _key) in self.committed.items():
            if index < first or term > r.term:
                continue
            have = r.log.term_or_zero(index)
            if have != term:
                raise Violation(LEADER_COMPLETENESS,
                                f"leader {nid} of term {r.term} has term {have} at committed "
                                f"index {index} (term {term})")

    def _record_commits(self, nid: int, r: Any) -> None:
        """Entries at or below a member's commit index are committed: remember
        them; a different entry committed at the same index is a violation."""
        lo = max(self.commit_seen.get(nid, 0), r.log.first_index() - 1)
        hi = r.commit
        if hi <= lo:
            self.commit_seen[nid] = max(self.commit_seen.get(nid, 0), hi)
            return
        for e in r.log.slice(lo + 1, hi + 1):
            key = (e.term, bytes(e.data))
            old = self.committed.setdefault(e.index, key)
            if old != key:
                raise Violation(SM_SAFETY, f"node {nid} committed {key} at {e.index}, "
                                           f"another member committed {old}")
            self._check_leaders_have(e.index, key)
        self.commit_seen[nid] = hi

    def _check_leaders_have(self, index: int, key: tuple[int, Any]) -> None:
        """Leader completeness for a newly committed entry: leaders of later terms."""
        del index, key  # checked when each leader appears (_check_leader)

    def _check_log_matching(self, cores: dict[int, Any], window: int = 24) -> None:
        ids = sorted(cores)
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                ra, rb = cores[a], cores[b]
                lo = max(ra.log.first_index(), rb.log.first_index())
                top = min(ra.log.last_index(), rb.log.last_index())
                j = top
                while j >= lo and ra.log.term_or_zero(j) != rb.log.term_or_zero(j):
                    j -= 1
                if j < lo:
                    continue
                start = max(lo, j - window)
                ea, eb = ra.log.slice(start, j + 1), rb.log.slice(start, j + 1)
                for x, y in zip(ea, eb, strict=True):
                    if (x.term, x.type, bytes(x.data)) != (y.term, y.type, bytes(y.data)):
                        raise Violation(LOG_MATCHING, f"nodes {a},{b} agree on term at {j} "
                                                      f"but differ at {x.index}")

    def _check_membership(self, nid: int, r: Any) -> None:
        self.check_conf_history()
        # A snapshot being installed switches the configuration when it is
        # stepped in, before it is applied: the log then starts after it.
        at = max(r.applied, r.log.first_index() - 1)
        if at == 0:
            return  # a node not yet joined: no configuration until its first snapshot
        want = self.voters_at(at)
        have = frozenset(r.conf_state.voters)
        if have != want:
            raise Violation(MEMBERSHIP, f"node {nid} applied {at} with voters "
                                        f"{sorted(have)}, its log prefix says {sorted(want)}")

    def _check_acked(self, cores: dict[int, Any], sms: dict[int, Any]) -> None:
        for nid, sm in sms.items():
            r = cores.get(nid)
            if r is None:
                continue
            # Each state machine checks each ack once, as soon as it has applied it.
            todo = sm.ack_wait + self.ack_order[sm.ack_pos :]
            sm.ack_pos = len(self.ack_order)
            sm.ack_wait = []
            for index in todo:
                if index > r.applied:
                    sm.ack_wait.append(index)
                elif sm.entries.get(index) != self.acked[index]:
                    raise Violation(ACKED_LOST, f"node {nid} applied {r.applied} but lacks "
                                                f"acked entry {index}")

    def check_read(self, node: int, need: int, applied: int) -> None:
        self.reads += 1
        if applied < need:
            raise Violation(READ_LINEARIZABLE, f"read at node {node} returned with applied "
                                               f"{applied} < {need} committed before it began")

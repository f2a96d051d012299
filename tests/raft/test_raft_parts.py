"""Unit tests of the pure pieces: quorum arithmetic, progress, raftLog, MemoryStorage."""

from __future__ import annotations

import functools
import random
import subprocess
import sys
from typing import Any

import pytest

from raft.log import InvariantError, RaftLog, invariant
from raft.memstorage import MemoryStorage, SnapshotOutOfDateError
from raft.progress import Inflights, Progress, ProgressState
from raft.quorum import VoteResult, committed_index, has_quorum, vote_result
from raft.types import CompactedError, ConfState, Entry, Snapshot, SnapshotMeta, UnavailableError


def ents(*terms: int, start: int = 1) -> list[Entry]:
    return [Entry(t, start + i, data=b"e%d" % (start + i)) for i, t in enumerate(terms)]


# -- quorum -------------------------------------------------------------------------------
def test_committed_index_is_the_majority_match() -> None:
    assert committed_index([1, 2, 3], {1: 5, 2: 3, 3: 1}) == 3
    assert committed_index([1, 2, 3, 4], {1: 5, 2: 5, 3: 1, 4: 1}) == 1
    assert committed_index([1], {1: 7}) == 7
    assert committed_index([], {1: 7}) == 0  # no voters: nothing commits


def test_vote_result_won_lost_pending() -> None:
    assert vote_result([1, 2, 3], {1: True}) is VoteResult.PENDING
    assert vote_result([1, 2, 3], {1: True, 2: True}) is VoteResult.WON
    assert vote_result([1, 2, 3], {1: True, 2: False, 3: False}) is VoteResult.LOST
    assert vote_result([1, 2, 3, 4], {1: True, 2: True, 3: False}) is VoteResult.PENDING
    assert has_quorum([1, 2, 3], [1, 3]) and not has_quorum([1, 2, 3], [3, 9])


# -- progress -----------------------------------------------------------------------------
def test_inflights_bound_and_free() -> None:
    inf = Inflights(2)
    inf.add(3)
    inf.add(5)
    assert inf.full()
    with pytest.raises(AssertionError):
        inf.add(6)
    inf.free_le(4)
    assert len(inf) == 1 and not inf.full()


def test_progress_decrement_ignores_stale_rejections() -> None:
    pr = Progress(match=3, next=10)
    assert not pr.maybe_decr_to(5, 4)  # probe: rejection not of next-1 is stale
    assert pr.maybe_decr_to(9, 6)
    assert pr.next == 7
    pr.become_replicate()
    assert not pr.maybe_decr_to(2, 0)  # below match: stale
    assert pr.maybe_decr_to(8, 0) and pr.next == 4


def test_progress_pause_per_state() -> None:
    pr = Progress(inflights=Inflights(1))
    pr.sent_entries(1)
    assert pr.is_paused()  # probe: one in flight
    pr.maybe_update(1)
    pr.become_replicate()
    assert not pr.is_paused()
    pr.sent_entries(2)
    assert pr.is_paused() and pr.next == 3  # window of one is full
    pr.become_snapshot(10)
    assert pr.is_paused() and pr.state is ProgressState.SNAPSHOT
    pr.become_probe()
    assert pr.next == 11


# -- raftLog ------------------------------------------------------------------------------
def make_log(*terms: int) -> tuple[RaftLog, MemoryStorage]:
    st = MemoryStorage()
    st.append(ents(*terms))
    return RaftLog(st), st


def test_append_truncates_only_from_first_conflict() -> None:
    """§5.3: 'If an existing entry conflicts with a new one (same index but
    different terms), delete the existing entry and all that follow it.'"""
    log, _ = make_log(1, 1, 2, 2)
    log.append(ents(3, start=5))
    # A delayed APP carrying only entries 2..3 (they match): nothing is lost.
    assert log.maybe_append(1, 1, 0, ents(1, 2, start=2)) == 3
    assert log.last_index() == 5  # pysyncobj's bug would have cut 4 and 5
    # A real conflict at 4 replaces 4.. and keeps 1..3.
    assert log.maybe_append(3, 2, 0, [Entry(4, 4, data=b"x")]) == 4
    assert [e.term for e in log.slice(1, 5)] == [1, 1, 2, 4]


def test_append_rejects_on_prev_mismatch_and_never_rewrites_committed() -> None:
    log, _ = make_log(1, 1, 2)
    assert log.maybe_append(3, 1, 0, []) is None  # term at 3 is 2, not 1
    assert log.maybe_append(5, 2, 0, []) is None  # past the end
    log.commit_to(3)
    with pytest.raises(InvariantError):
        log.maybe_append(1, 1, 3, [Entry(9, 2)])


def test_follower_commit_is_capped_by_last_new_entry() -> None:
    log, _ = make_log(1, 1, 1)
    assert log.maybe_append(1, 1, 10, ents(1, start=2)) == 2
    assert log.committed == 2  # min(leader commit, index of last new entry)


def test_find_conflict_by_term_skips_whole_terms() -> None:
    log, _ = make_log(1, 1, 2, 2, 2, 4, 4)
    assert log.find_conflict_by_term(7, 3) == (5, 2)
    assert log.find_conflict_by_term(7, 1) == (2, 1)
    assert log.find_conflict_by_term(7, 4) == (7, 4)


def test_commit_only_counts_current_term() -> None:
    """§5.4.2: 'Raft never commits log entries from previous terms by counting replicas.'"""
    log, _ = make_log(1, 2)
    assert not log.maybe_commit(2, 3)
    assert log.maybe_commit(2, 2) and log.committed == 2


def test_up_to_date_compares_last_term_then_length() -> None:
    """§5.4.1: the log with the later last term wins; same term, the longer."""
    log, _ = make_log(1, 2, 2)
    assert log.is_up_to_date(1, 3)
    assert log.is_up_to_date(3, 2) and not log.is_up_to_date(2, 2)
    assert not log.is_up_to_date(9, 1)


def test_unstable_tail_is_dropped_once_persisted() -> None:
    log, st = make_log(1)
    log.append(ents(1, 1, start=2))
    assert len(log.unstable.entries) == 2
    st.append(log.unstable.entries)
    log.unstable.stable_to(3, 1)
    assert log.unstable.entries == [] and log.unstable.offset == 4
    assert [e.index for e in log.slice(1, 4)] == [1, 2, 3]


def test_stable_to_ignores_a_replaced_entry() -> None:
    log, _ = make_log(1)
    log.append(ents(1, start=2))
    log.append([Entry(2, 2)])  # conflict replaced entry 2 before it was persisted
    log.unstable.stable_to(2, 1)
    assert len(log.unstable.entries) == 1


def test_slice_respects_size_limit_and_compaction() -> None:
    log, st = make_log(1, 1, 1, 1)
    assert len(log.slice(1, 5, max_bytes=1)) == 1  # always at least one
    st.create_snapshot(2, ConfState((1,)), b"")
    st.compact(2)
    with pytest.raises(CompactedError):
        log.slice(2, 5)
    assert [e.index for e in log.slice(3, 5)] == [3, 4]


# -- MemoryStorage ------------------------------------------------------------------------
def test_memstorage_append_compact_snapshot() -> None:
    st = MemoryStorage()
    st.append(ents(1, 1, 2))
    st.append([Entry(3, 3)])  # replaces the tail from index 3
    assert [st.term(i) for i in (1, 2, 3)] == [1, 1, 3]
    st.create_snapshot(2, ConfState((1, 2)), b"sm")
    st.compact(2)
    assert st.first_index() == 3 and st.term(2) == 1
    with pytest.raises(CompactedError):
        st.entries(2, 4)
    with pytest.raises(SnapshotOutOfDateError):
        st.create_snapshot(1, ConfState(), b"")
    st.apply_snapshot(Snapshot(SnapshotMeta(10, 4, ConfState((1,))), b"x"))
    assert (st.first_index(), st.last_index(), st.term(10)) == (11, 10, 4)
    assert st.initial_state()[1] == ConfState((1,))


def test_memstorage_bootstrap_writes_committed_membership() -> None:
    st = MemoryStorage.bootstrap(ConfState((1, 2), (3,)))
    hs, _ = st.initial_state()
    assert st.last_index() == 3 and hs.commit == 3 and hs.term == 1


# -- invariants ---------------------------------------------------------------------------
def test_invariant_reports_numbers_and_survives_dash_o() -> None:
    with pytest.raises(InvariantError, match="commit=7 last=5"):
        invariant(False, "x", commit=7, last=5)
    code = ("from raft.log import invariant\n"
            "try:\n invariant(False, 'x')\nexcept AssertionError:\n print('ok')")
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "ok"


def _term_reference(log: RaftLog, i: int) -> int:
    """raftLog.term as it read before its inline fast path (session 12, r3lead): the
    tail first, then first_index / last_index / maybe_term / storage."""
    u = log.unstable
    if 0 <= i - u.offset < len(u.entries):
        return u.entries[i - u.offset].term
    if i < log.first_index() - 1:
        raise CompactedError(i)
    if i > log.last_index():
        return 0
    t = u.maybe_term(i)
    if t is not None:
        return t
    try:
        return log.storage.term(i)
    except UnavailableError:
        return 0


def _answer(fn: Any, i: int) -> Any:
    try:
        return fn(i)
    except CompactedError:
        return "compacted"


def test_term_answers_as_the_reference_over_random_logs() -> None:
    """Every index around a log's bounds, for random stable parts, compactions,
    unstable tails (persisted in part, replaced by a conflicting append), and
    pending snapshots with or without a tail after them."""
    rng = random.Random(12)
    checked = 0
    for _ in range(400):
        st = MemoryStorage()
        n = rng.randint(0, 12)
        st.append([Entry(term=1 + k // 4, index=k + 1) for k in range(n)])
        if n and rng.random() < 0.4:
            st.compact(rng.randint(1, n))
        log = RaftLog(st)
        last = log.last_index()
        tail = [Entry(term=5 + k // 3, index=last + 1 + k) for k in range(rng.randint(0, 6))]
        if tail:
            log.append(tail)
        if tail and rng.random() < 0.3:  # part of the tail persisted
            k = rng.randrange(len(tail))
            st.append(tail[:k + 1])
            log.unstable.stable_to(tail[k].index, tail[k].term)
        if rng.random() < 0.2 and log.last_index() > log.committed + 1:  # a conflicting append
            at = rng.randint(log.committed + 1, log.last_index())
            log.append([Entry(term=9, index=at)])
        if rng.random() < 0.3:  # a pending snapshot, maybe with entries after it
            idx = log.last_index() + rng.randint(0, 5)
            log.unstable.restore(Snapshot(SnapshotMeta(index=idx, term=8)))
            if rng.random() < 0.5:
                log.append([Entry(term=8, index=idx + 1 + k) for k in range(rng.randint(1, 3))])
        for i in range(-1, log.last_index() + 4):
            assert _answer(log.term, i) == _answer(functools.partial(_term_reference, log), i), i
            checked += 1
    assert checked > 4000

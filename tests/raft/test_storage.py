"""NodeLog on real files with real fsync: the Storage protocol, group commit, reopen, compaction."""

from __future__ import annotations

import asyncio
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raft.storage import NodeLog, segment_name
from raft.types import (
    CompactedError,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Snapshot,
    SnapshotMeta,
    UnavailableError,
)


def ents(lo: int, hi: int, term: int = 1, size: int = 8) -> list[Entry]:
    return [
        Entry(term, i, EntryType.NORMAL, f"{i}:".encode().ljust(size, b"x")) for i in range(lo, hi)
    ]


def test_append_and_read_protocol(tmp_path):
    wal = NodeLog(str(tmp_path))
    wal.append("G", ents(1, 11, term=2))
    wal.sync()
    g = wal.group("G")
    assert (g.first_index(), g.last_index()) == (1, 10)
    assert g.term(0) == 0 and g.term(5) == 2
    got = g.entries(3, 7)
    assert [e.index for e in got] == [3, 4, 5, 6]
    assert got[0].data == b"3:".ljust(8, b"x")
    with pytest.raises(UnavailableError):
        g.term(11)
    with pytest.raises(UnavailableError):
        g.entries(5, 12)
    # max_bytes keeps at least one entry, then stops before exceeding the budget
    assert len(g.entries(1, 11, max_bytes=0)) == 1
    assert len(g.entries(1, 11, max_bytes=3 * 24)) == 3
    assert wal.group("other").last_index() == 0
    wal.close()


def test_overwrite_conflicting_suffix_survives_reopen(tmp_path):
    wal = NodeLog(str(tmp_path))
    wal.append("G", ents(1, 11, term=1))
    wal.sync()
    wal.append("G", ents(6, 8, term=3))  # supersedes 6..10
    wal.sync()
    g = wal.group("G")
    assert g.last_index() == 7
    assert [e.term for e in g.entries(1, 8)] == [1] * 5 + [3, 3]
    with pytest.raises(ValueError):
        wal.append("G", ents(10, 11))  # gap
    wal.close()
    wal = NodeLog(str(tmp_path))
    g = wal.group("G")
    assert g.last_index() == 7
    assert [(e.index, e.term) for e in g.entries(5, 8)] == [(5, 1), (6, 3), (7, 3)]
    wal.close()


def test_hard_state_and_reopen(tmp_path):
    wal = NodeLog(str(tmp_path))
    wal.set_hard_state("A", HardState(term=3, vote=2, commit=0))
    wal.append("A", ents(1, 4, term=3))
    wal.set_hard_state("A", HardState(term=4, vote=1, commit=3))
    wal.set_hard_state("B", HardState(term=9, vote=0, commit=0))
    wal.sync()
    wal.close()
    wal = NodeLog(str(tmp_path))
    assert sorted(wal.groups()) == ["A", "B"]
    hs, cs = wal.group("A").initial_state()
    assert hs == HardState(4, 1, 3) and cs == ConfState()
    assert wal.group("B").initial_state()[0] == HardState(9, 0, 0)
    assert [e.data for e in wal.group("A").entries(1, 4)] == [e.data for e in ents(1, 4, 3)]
    wal.append("A", ents(4, 6, term=4))
    wal.sync()
    wal.close()
    assert NodeLog(str(tmp_path)).group("A").last_index() == 5


def test_unsynced_records_are_lost_on_crash_but_synced_ones_kept(tmp_path):
    wal = NodeLog(str(tmp_path))
    wal.append("G", ents(1, 4))
    wal.sync()
    wal.append("G", ents(4, 6))  # buffered only: no I/O until sync
    assert wal.group("G").entries(4, 6)[1].index == 5  # readable while buffered
    # simulate a crash: drop the object without close()
    wal2 = NodeLog(str(tmp_path))
    assert wal2.group("G").last_index() == 3


def test_group_commit_one_fsync_for_1000_groups(tmp_path):
    wal = NodeLog(str(tmp_path))
    before = wal.stats.fsyncs
    for round_ in range(3):
        for n in range(1000):
            wal.append(f"S-{n}", ents(round_ + 1, round_ + 2, size=16))
            wal.set_hard_state(f"S-{n}", HardState(1, 1, round_))
        written = wal.sync()
        assert written > 1000 * 2 * 29
        assert wal.stats.fsyncs == before + round_ + 1
    assert wal.stats.records == 6000
    wal.close()
    wal = NodeLog(str(tmp_path))
    assert len(wal.groups()) == 1000
    assert wal.group("S-517").last_index() == 3
    assert wal.group("S-517").initial_state()[0].commit == 2


def test_fsync_counter_counts_os_fsync_calls(tmp_path, monkeypatch):
    wal = NodeLog(str(tmp_path))
    calls = []
    for name in ("fsync", "fdatasync"):  # the WAL's data syncs are fdatasyncs
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda fd, real=real: (calls.append(fd), real(fd))[1])
    before = wal.stats.fsyncs
    for n in range(50):
        wal.append(f"g{n}", ents(1, 3))
    wal.sync()
    assert len(calls) == 1 == wal.stats.fsyncs - before
    wal.close()


async def test_sync_async_runs_in_thread_and_keeps_buffering(tmp_path):
    wal = NodeLog(str(tmp_path))
    wal.append("G", ents(1, 100, size=1000))
    task = asyncio.create_task(wal.sync_async())
    await asyncio.sleep(0)
    wal.append("G", ents(100, 101))  # lands in the next sync
    assert wal.group("G").entries(99, 101)[0].index == 99
    n1 = await task
    n2 = await wal.sync_async()
    assert n1 > 99 * 1000 and 0 < n2 < 100
    wal.close()
    assert NodeLog(str(tmp_path)).group("G").last_index() == 100


def test_compaction_and_snapshot_meta(tmp_path):
    wal = NodeLog(str(tmp_path))
    wal.append("G", ents(1, 21, term=2))
    wal.compact("G", 10, ConfState(voters=(1, 2, 3)))
    wal.sync()
    g = wal.group("G")
    assert g.first_index() == 11 and g.last_index() == 20
    assert g.term(10) == 2
    with pytest.raises(CompactedError):
        g.term(9)
    with pytest.raises(CompactedError):
        g.entries(10, 12)
    snap = g.snapshot()
    assert (snap.meta.index, snap.meta.term, snap.meta.conf_state.voters) == (10, 2, (1, 2, 3))
    # a snapshot from the leader replaces the whole log
    assert wal.apply_snapshot("G", SnapshotMeta(50, 7, ConfState((1, 2), (4,))))
    assert not wal.apply_snapshot("G", SnapshotMeta(40, 7))  # stale: ignored
    assert (g.first_index(), g.last_index(), g.term(50)) == (51, 50, 7)
    wal.append("G", ents(51, 53, term=7))
    wal.sync()
    wal.close()
    wal = NodeLog(str(tmp_path))
    g = wal.group("G")
    assert (g.first_index(), g.last_index()) == (51, 52)
    assert g.initial_state()[1] == ConfState((1, 2), (4,))
    assert [e.index for e in g.entries(51, 53)] == [51, 52]


def test_segments_roll_and_are_deleted_once_compacted(tmp_path):
    wal = NodeLog(str(tmp_path), segment_bytes=4096)
    for i in range(1, 201):  # ~100 bytes per record, two groups interleaved
        wal.append("A", [Entry(1, i, data=b"a" * 64)])
        wal.append("B", [Entry(1, i, data=b"b" * 64)])
    wal.set_hard_state("A", HardState(1, 1, 200))
    wal.sync()
    segs = wal.segments()
    assert len(segs) > 5
    assert sorted(wal.pinning_groups()) == ["A", "B"]
    wal.compact("A", 200)
    wal.sync()
    assert wal.pinning_groups() == ["B"]
    assert wal.segments() == segs  # B still pins the oldest segment
    wal.compact("B", 150)
    wal.sync()
    left = wal.segments()
    assert len(left) < len(segs) and wal.stats.segments_deleted == len(segs) - len(left)
    assert not os.path.exists(tmp_path / segment_name(segs[0]))
    wal.close()
    wal = NodeLog(str(tmp_path), segment_bytes=4096)
    a, b = wal.group("A"), wal.group("B")
    assert (a.first_index(), a.last_index(), a.term(200)) == (201, 200, 1)
    assert (b.first_index(), b.last_index()) == (151, 200)
    assert b.entries(151, 152)[0].data == b"b" * 64
    assert a.initial_state()[0] == HardState(1, 1, 200)
    wal.close()


def test_deleted_prefix_with_later_entries_recovers(tmp_path):
    # Group A's entries span segments; after compaction the survivors start mid-log.
    wal = NodeLog(str(tmp_path), segment_bytes=2048)
    for i in range(1, 101):
        wal.append("A", [Entry(1, i, data=b"z" * 100)])
        wal.sync()
    wal.compact("A", 90)
    wal.sync()
    assert wal.stats.segments_deleted > 0
    wal.close()
    wal = NodeLog(str(tmp_path), segment_bytes=2048)
    a = wal.group("A")
    assert (a.first_index(), a.last_index(), a.term(90)) == (91, 100, 1)
    assert [e.index for e in a.entries(91, 101)] == list(range(91, 101))


def test_large_entry_costs_its_size_on_disk(tmp_path):
    wal = NodeLog(str(tmp_path))
    payload = os.urandom(1 << 20)
    wal.append("BIG", [Entry(1, 1, data=payload)])
    wal.sync()
    wal.close()  # a live segment also holds its zero runway (PREALLOC_BYTES); close trims it
    on_disk = sum(os.path.getsize(tmp_path / n) for n in os.listdir(tmp_path))
    assert (1 << 20) <= on_disk < (1 << 20) + 256
    wal = NodeLog(str(tmp_path), cache_bytes=0)  # force a read from the file
    assert wal.group("BIG").entries(1, 2)[0].data == payload
    wal.close()


# ---- same reads as the in-memory twin (raft/memstorage.py) ---------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 6), st.integers(1, 5), st.integers(0, 40)),
        st.tuples(st.just("compact"), st.integers(0, 8)),
        st.tuples(st.just("snapshot"), st.integers(1, 10)),
        st.tuples(st.just("reopen")),
    ),
    max_size=25,
)


# WAL_EXAMPLES raises the count for a long soak; CI runs the default.
@settings(
    max_examples=int(os.environ.get("WAL_EXAMPLES", "60")), deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(script=ops)
def test_reads_match_memory_storage(tmp_path_factory, script):
    memory_storage = pytest.importorskip("raft.memstorage").MemoryStorage
    d = str(tmp_path_factory.mktemp("diff"))
    wal, mem, term = NodeLog(d, segment_bytes=512), memory_storage(), 1
    for op in script:
        if op[0] == "append":  # may overwrite a suffix: start up to `back` entries before the end
            _, back, n, size = op
            term += 1
            lo = max(mem.first_index(), mem.last_index() + 1 - back)
            batch = [Entry(term, i, data=bytes([i % 256]) * size) for i in range(lo, lo + n)]
            wal.append("G", batch)
            mem.append(batch)
        elif op[0] == "compact" and mem.last_index() >= mem.first_index():
            idx = min(mem.last_index(), mem.first_index() - 1 + op[1] + 1)
            wal.compact("G", idx)
            mem.compact(idx)
        elif op[0] == "snapshot":
            meta = SnapshotMeta(mem.last_index() + op[1], term)
            wal.apply_snapshot("G", meta)
            mem.apply_snapshot(Snapshot(meta))
        elif op[0] == "reopen":
            wal.sync()
            wal.close()
            wal = NodeLog(d, segment_bytes=512)
        g = wal.group("G")
        lo, hi = mem.first_index(), mem.last_index()
        assert (g.first_index(), g.last_index()) == (lo, hi)
        span = range(lo - 1, hi + 1)
        assert [g.term(i) for i in span] == [mem.term(i) for i in span]
        assert g.entries(lo, hi + 1) == mem.entries(lo, hi + 1)
        assert g.entries(lo, hi + 1, max_bytes=60) == mem.entries(lo, hi + 1, max_bytes=60)
    wal.sync()
    wal.close()


def test_replay_rewinds_a_hole_when_an_older_index_is_rewritten(tmp_path):
    # Found by the property test above: the surviving segment opens with a checkpoint at
    # 1, holds entry 10 (its predecessors were in the deleted segment), a COMPACT at 4
    # and then entry 5, which supersedes everything from 5 on. Replay must end at 4 + [5].
    d = str(tmp_path)
    wal = NodeLog(d, segment_bytes=512)

    def put(lo: int, n: int, term: int, size: int) -> None:
        wal.append("G", [Entry(term, i, data=bytes([i]) * size) for i in range(lo, lo + n)])

    put(1, 2, 2, 0)
    put(3, 3, 3, 0)
    put(6, 4, 4, 0)
    wal.compact("G", 1)
    put(10, 2, 5, 16)
    put(6, 5, 6, 0)
    wal.compact("G", 4)
    put(5, 1, 7, 0)
    wal.sync()
    assert len(wal.segments()) == 1  # the older segment is gone: replay meets the gap
    wal.close()
    g = NodeLog(d, segment_bytes=512).group("G")
    assert (g.first_index(), g.last_index()) == (5, 5)
    assert (g.term(4), g.term(5)) == (3, 7)


def test_a_run_of_appends_writes_what_single_appends_write(tmp_path):
    """`append` of a run (one buffered piece, one extend per index array) leaves the
    same segment files, rolls included, as appending the entries one by one, and
    reads back every entry from the right offset, before and after a reopen."""
    runs, single = str(tmp_path / "runs"), str(tmp_path / "single")
    # No entry cache: reads of the live log come from the offsets the append recorded.
    a = NodeLog(runs, segment_bytes=700, cache_bytes=0)
    b = NodeLog(single, segment_bytes=700)
    lo, hl = 1, 0
    for n in (1, 5, 13, 2, 9, 30, 3):  # some runs cross a roll, some do not
        for log_ in (a, b):
            log_.append("G", [])
        a.append("G", ents(lo, lo + n, size=20 + n))
        for e in ents(lo, lo + n, size=20 + n):
            b.append("G", [e])
        a.append("H", ents(hl + 1, hl + 3))  # a second group, interleaved
        b.append("H", ents(hl + 1, hl + 2))
        b.append("H", ents(hl + 2, hl + 3))
        hl += 2
        lo += n
        a.sync()
        b.sync()
    assert len(a.segments()) > 3
    assert sorted(os.listdir(runs)) == sorted(os.listdir(single))
    for name in os.listdir(runs):
        with open(os.path.join(runs, name), "rb") as fa:
            with open(os.path.join(single, name), "rb") as fb:
                assert fa.read() == fb.read(), name
    want = ents(1, lo)  # payload sizes differ per run: compare index and prefix
    for log_ in (a, NodeLog(runs, segment_bytes=700)):
        got = log_.group("G").entries(1, lo)
        assert [e.index for e in got] == [e.index for e in want]
        assert all(e.data.startswith(f"{e.index}:".encode()) for e in got), got[:3]
    with pytest.raises(ValueError, match="gap"):
        a.append("G", [Entry(1, lo, EntryType.NORMAL, b"x"),
                       Entry(1, lo + 2, EntryType.NORMAL, b"y")])


@pytest.mark.parametrize("cache_bytes", [0, 300, 1 << 20])
def test_reads_after_cache_eviction_and_truncation(tmp_path, cache_bytes):
    """Whether an entry is read from the entry cache (runs evicted oldest first) or from
    its file, it is the entry last written at that index, also after a conflicting
    suffix replaced cached entries."""
    wal = NodeLog(str(tmp_path), cache_bytes=cache_bytes)
    wal.append("G", ents(1, 11, term=1, size=20))
    wal.append("H", ents(1, 4, term=1, size=20))
    wal.append("G", ents(11, 21, term=1, size=20))
    wal.append("G", ents(6, 9, term=2, size=30))  # supersedes 6..20
    wal.append("G", ents(9, 12, term=2, size=30))  # a run after the conflict
    wal.sync()
    got = wal.group("G").entries(1, 12)
    assert [(e.index, e.term, len(e.data)) for e in got] == \
        [(i, 1, 20) for i in range(1, 6)] + [(i, 2, 30) for i in range(6, 12)]
    assert all(e.data.startswith(f"{e.index}:".encode()) for e in got)
    assert [e.index for e in wal.group("H").entries(1, 4)] == [1, 2, 3]
    cache = wal._cache  # bounded, and its byte count is what it holds
    held = sum(len(e.data) for d in cache._groups.values() for e in d.values())
    assert held == cache._bytes <= cache_bytes


def test_an_entry_whose_data_is_a_view_is_cached_as_bytes(tmp_path):
    """A payload handed over as a view of a buffer the caller reuses (a receive buffer)
    is copied into the cache: a later read returns what was appended."""
    wal = NodeLog(str(tmp_path))
    buf = bytearray(b"first-payload")
    wal.append("G", [Entry(1, 1, EntryType.NORMAL, memoryview(buf))])
    buf[:] = b"XXXXXXXXXXXXX"
    (got,) = wal.group("G").entries(1, 2)
    assert bytes(got.data) == b"first-payload" and type(got.data) is bytes

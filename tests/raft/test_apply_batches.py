"""Applying committed entries: in batches, in the apply worker (off the event
loop), into one LMDB environment per node with a named database per group;
the state machine's own durable applied index spares a restart the copy of
the snapshot image back. Real NodeLog (fsync), real LMDB."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from raft.multigroup import INLINE_APPLY_BYTES, INLINE_APPLY_ENTRIES, MultiRaft
from raft.node import LmdbSM, LmdbStore
from raft.storage import NodeLog
from raft.types import HardState
from tests.raft.test_multigroup import _NoPeers

pytestmark = pytest.mark.timeout(120)


class Recording(LmdbSM):
    """LmdbSM that records where and how it is called."""

    def __init__(self, store: LmdbStore, group: str) -> None:
        super().__init__(store, group)
        self.threads: set[int] = set()
        self.batches: list[int] = []
        self.calls: list[tuple[int, int]] = []  # (thread, entries) per apply_batch
        self.restores = 0

    def apply_batch(self, items: list[tuple[int, bytes]]) -> None:
        self.threads.add(threading.get_ident())
        self.batches.append(len(items))
        self.calls.append((threading.get_ident(), len(items)))
        super().apply_batch(items)

    def restore_from(self, path: str) -> None:
        self.restores += 1
        super().restore_from(path)


async def _node(tmp, **kw) -> MultiRaft:
    mr = MultiRaft(1, NodeLog(str(tmp / "wal")), _NoPeers(), snap_dir=str(tmp / "snap"),
                   tick_interval_s=0.01, snapshot_every=10**9, **kw)
    return mr


async def test_batches_applied_off_the_loop_in_one_environment(tmp_path):
    store = LmdbStore(str(tmp_path / "sm"))
    mr = await _node(tmp_path, inline_apply_entries=0)  # every pass goes to the worker
    sms = {g: Recording(store, g) for g in ("a", "b")}
    try:
        for g, sm in sms.items():
            mr.add_group(g, [1], state_machine=sm)
        await mr.start()
        for g in sms:
            await mr.wait_leader(g)
        await asyncio.gather(*(mr.propose(g, b"%s-%d" % (g.encode(), k))
                               for k in range(200) for g in sms))
        for g, sm in sms.items():
            assert [d for _, d in sm.entries()] == [b"%s-%d" % (g.encode(), k)
                                                    for k in range(200)]
            assert threading.get_ident() not in sm.threads, "applied on the event loop"
            assert max(sm.batches) > 1, "a burst should reach the state machine as batches"
        assert sorted(os.listdir(tmp_path / "sm")) == ["data.mdb", "lock.mdb"]
    finally:
        await mr.stop()
        store.close()


async def test_restart_does_not_copy_the_image_back_when_the_state_is_there(tmp_path):
    store = LmdbStore(str(tmp_path / "sm"))
    mr = await _node(tmp_path)
    sm = Recording(store, "g")
    try:
        mr.add_group("g", [1], state_machine=sm)
        await mr.start()
        await mr.wait_leader("g")
        for k in range(30):
            await mr.propose("g", b"e%d" % k)
        mr.snapshot_now("g")
        async with asyncio.timeout(30):
            while mr.status("g")["first_index"] < 30:
                await asyncio.sleep(0.01)
        for k in range(30, 40):
            await mr.propose("g", b"e%d" % k)
        want = sm.entries()
    finally:
        await mr.stop()
        store.close()
    store = LmdbStore(str(tmp_path / "sm"))
    mr = await _node(tmp_path)
    sm = Recording(store, "g")
    try:
        mr.add_group("g", [1], state_machine=sm)
        assert sm.restores == 0 and mr.stats.restores_skipped == 1
        await mr.start()
        await mr.wait_leader("g")
        await mr.propose("g", b"after")
        assert sm.entries() == [*want, (want[-1][0] + 2, b"after")]  # +1: the new leader's no-op
    finally:
        await mr.stop()
        store.close()


def test_restore_in_several_transactions_marks_applied_last(tmp_path):
    """A large image is restored in several write transactions (one huge one
    would hold LMDB's single writer lock against every other group); the
    `applied` key comes last, so a restore cut short reads as applied 0."""
    store = LmdbStore(str(tmp_path / "sm"))
    src, dst = LmdbSM(store, "src"), LmdbSM(store, "dst")
    try:
        src.apply_batch([(i, b"v" * 1000) for i in range(1, 301)])
        image = tmp_path / "img"
        assert src.snapshot_to(str(image)) == 300
        dst.apply_batch([(1, b"old")])
        dst.RESTORE_TXN_BYTES = 10_000  # about 10 records per transaction
        cut = tmp_path / "cut"
        cut.write_bytes(image.read_bytes()[: image.stat().st_size // 2 + 3])
        with pytest.raises(ValueError, match="truncated"):
            dst.restore_from(str(cut))
        assert dst.applied_index() == 0  # restart would restore again
        assert 0 < len(dst.entries()) < 300
        dst.restore_from(str(image))
        assert dst.applied_index() == 300 and dst.entries() == src.entries()
    finally:
        store.close()


async def test_state_machine_ahead_of_the_known_commit_after_a_crash(tmp_path):
    """A commit-only hard state is not fsynced before the apply (Raft does
    not need it durable), so after kill -9 the LMDB state machine can hold
    entries beyond the commit index the WAL remembers. While the core
    re-learns the commit, an image taken then reports an index above the
    core's applied one: that must not stop the node (found by
    tests/raft/test_process_crash.py: `image holds index 13997, applied 13995`)."""
    store = LmdbStore(str(tmp_path / "sm"))
    mr = await _node(tmp_path)
    sm = Recording(store, "g")
    try:
        mr.add_group("g", [1], state_machine=sm)
        await mr.start()
        await mr.wait_leader("g")
        for k in range(40):
            await mr.propose("g", b"e%d" % k)
        term = mr.status("g")["term"]
    finally:
        await mr.stop()
        store.close()
    # The crash: the last commit-only HARD_STATE never reached the WAL.
    wal = NodeLog(str(tmp_path / "wal"))
    wal.set_hard_state("g", HardState(term, 1, commit=12))
    wal.sync()
    wal.close()
    store = LmdbStore(str(tmp_path / "sm"))
    mr = MultiRaft(1, NodeLog(str(tmp_path / "wal")), _NoPeers(), snap_dir=str(tmp_path / "snap"),
                   tick_interval_s=0.02, snapshot_every=5)
    sm = Recording(store, "g")
    held = sm.applied_index()
    try:
        mr.add_group("g", [1], state_machine=sm)
        await mr.start()
        await mr.wait_leader("g")  # an election timeout: images are taken meanwhile
        await mr.propose("g", b"after")
        async with asyncio.timeout(30):
            while mr.status("g")["first_index"] <= held:
                mr.snapshot_now("g")
                await asyncio.sleep(0.02)
        assert mr.failed is None
        assert [d for _, d in sm.entries()] == [b"e%d" % k for k in range(40)] + [b"after"]
    finally:
        await mr.stop()
        store.close()


async def test_a_few_small_entries_are_applied_on_the_loop_bigger_passes_in_the_worker(tmp_path):
    """At low load a hop to the apply worker (two thread switches) costs more
    than the apply: a pass with at most INLINE_APPLY_ENTRIES small entries
    applies on the loop; a burst still goes to the worker."""
    store = LmdbStore(str(tmp_path / "sm"))
    mr = await _node(tmp_path)
    sm = Recording(store, "g")
    loop_thread = threading.get_ident()
    try:
        mr.add_group("g", [1], state_machine=sm)
        await mr.start()
        await mr.wait_leader("g")
        for k in range(20):  # one at a time: one entry per pass
            await mr.propose("g", b"one-%d" % k)
        assert sm.calls and all(t == loop_thread for t, _ in sm.calls), sm.calls
        sm.calls.clear()
        await asyncio.gather(*(mr.propose("g", b"burst-%d" % k) for k in range(300)))
        big = [(t, n) for t, n in sm.calls if n > INLINE_APPLY_ENTRIES]
        assert big and all(t != loop_thread for t, _ in big), sm.calls
        sm.calls.clear()
        await mr.propose("g", b"x" * (INLINE_APPLY_BYTES + 1))  # one entry, but large
        assert [t for t, _ in sm.calls] != [loop_thread]
        assert len(sm.entries()) == 321
    finally:
        await mr.stop()
        store.close()


class _ThreadLog(NodeLog):
    """NodeLog that records which thread writes+fsyncs each sync, and how much."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.writes: list[tuple[int, int]] = []  # (thread, bytes)

    def _write(self, batch):
        n = super()._write(batch)
        self.writes.append((threading.get_ident(), n))
        return n


async def test_a_small_sync_is_fsynced_on_the_loop_a_big_one_in_the_wal_thread(tmp_path):
    """At low load the hop to the WAL thread and back costs more than the
    fsync: a drain pass with at most INLINE_SYNC_BYTES to write syncs on the
    loop; a bigger one, or any with inline_sync_bytes=0, in the WAL thread.
    Either way the proposal resolves only after its entry's fsync."""
    from raft.multigroup import INLINE_SYNC_BYTES

    loop_thread = threading.get_ident()
    for inline, sizes in ((INLINE_SYNC_BYTES, (16, 2 * INLINE_SYNC_BYTES)), (0, (16,))):
        d = tmp_path / f"i{inline}"
        nl = _ThreadLog(str(d / "wal"))
        mr = MultiRaft(1, nl, _NoPeers(), snap_dir=str(d / "snap"), tick_interval_s=0.01,
                       snapshot_every=10**9, inline_sync_bytes=inline)
        store = LmdbStore(str(d / "sm"))
        try:
            mr.add_group("g", [1], state_machine=Recording(store, "g"))
            await mr.start()
            await mr.wait_leader("g")
            for size in sizes:
                nl.writes.clear()
                f0 = nl.stats.fsyncs
                await mr.propose("g", b"x" * size)
                assert nl.stats.fsyncs > f0  # resolved after its fsync
                big = [t for t, n in nl.writes if n >= size]
                assert big, nl.writes
                on_loop = size <= INLINE_SYNC_BYTES and inline > 0
                assert (big[0] == loop_thread) is on_loop, (inline, size, nl.writes)
        finally:
            await mr.stop()
            store.close()


async def until_idle(mr: MultiRaft) -> None:
    async with asyncio.timeout(30):
        while any(g.snapshotting for g in mr._groups.values()):
            await asyncio.sleep(0.01)


async def test_propose_quiet_reports_exactly_the_proposals_that_fail(tmp_path):
    """`propose_quiet` keeps no Future: an applied proposal reports nothing, one that
    cannot commit (here: the node stops with them queued) reports once, in a later loop
    turn, to `on_error(arg, exc)`; a follower refuses at once with NotLeader."""
    from raft.multigroup import NotLeader, ProposalDropped

    store = LmdbStore(str(tmp_path / "sm"))
    mr = await _node(tmp_path)
    sm = LmdbSM(store, "g")
    errors: list[tuple[int, Exception]] = []
    try:
        mr.add_group("g", [1], state_machine=sm)
        await mr.start()
        await mr.wait_leader("g")
        for k in range(50):
            mr.propose_quiet("g", b"a%d" % k, lambda arg, exc: errors.append((arg, exc)), k)
        await mr.propose("g", b"barrier")
        assert errors == [] and len(sm.entries()) == 51
        for k in range(50, 80):
            mr.propose_quiet("g", b"b%d" % k, lambda arg, exc: errors.append((arg, exc)), k)
        assert errors == []  # never inside the proposing call
        await mr.stop()
        await asyncio.sleep(0)
        applied = {d for _, d in sm.entries()}
    finally:
        await mr.stop()
        store.close()
    failed = {arg for arg, _ in errors}
    assert all(isinstance(exc, ProposalDropped) for _, exc in errors)
    assert len(errors) == len(failed)  # once each
    for k in range(50, 80):
        assert (b"b%d" % k in applied) != (k in failed), k  # applied, or reported: not both
    assert failed, "stopping with proposals queued must report them"
    mr2 = await _node(tmp_path / "f")
    mr2.add_group("h", [1, 2], state_machine=LmdbSM(LmdbStore(str(tmp_path / "sm2")), "h"))
    with pytest.raises(NotLeader):
        mr2.propose_quiet("h", b"x", lambda *_: None)


async def test_a_group_that_pins_the_oldest_segment_lets_it_go(tmp_path):
    """A group far below `snapshot_every` is still snapshotted when it pins the oldest
    WAL segment (`_snapshot_pinning`), so the WAL does not grow without bound."""
    store = LmdbStore(str(tmp_path / "sm"))
    mr = MultiRaft(1, NodeLog(str(tmp_path / "wal"), segment_bytes=4096), _NoPeers(),
                   snap_dir=str(tmp_path / "snap"), tick_interval_s=0.01,
                   snapshot_every=10**9)
    sm = LmdbSM(store, "g")
    try:
        mr.add_group("g", [1], state_machine=sm)
        await mr.start()
        await mr.wait_leader("g")
        for k in range(800):
            await mr.propose("g", b"%04d" % k + b"v" * 96)
        async with asyncio.timeout(30):
            while mr.status("g")["first_index"] < 700:  # compacted by a pinning snapshot
                await asyncio.sleep(0.05)
        # Obsolete segments go at the sync after the pinning snapshot that frees them. On a
        # loaded machine the last snapshot may come after the first small proposal's sync
        # (seen: 5 segments left, a snapshot at 804 next): propose until a sync took them.
        extra = 0
        async with asyncio.timeout(30):
            while True:
                await mr.propose("g", b"after%d" % extra)
                extra += 1
                if len(mr.node_log.segments()) <= 3:
                    break
                await asyncio.sleep(0.2)
        assert len(sm.entries()) == 800 + extra
    finally:
        await mr.stop()
        store.close()


def _join(datas: list[bytes]) -> bytes:
    """A `merge` for the tests: the parts behind a marker, in order."""
    return b"M:" + b"|".join(datas)


def _other_join(datas: list[bytes]) -> bytes:
    return b"N:" + b"|".join(datas)


async def test_quiet_proposals_with_one_merge_become_one_entry_in_order(tmp_path, monkeypatch):
    """`propose_quiet(merge=)`: the quiet proposals queued one after the other with the
    same `merge` are one entry, `merge(datas)` in queue order; any other proposal (a
    Future, a quiet one without merge or with another merge) ends the run and keeps its
    place; a run of one is left as it was; runs stop at MERGE_MAX_COUNT."""
    from raft import multigroup

    monkeypatch.setattr(multigroup, "MERGE_MAX_COUNT", 3)
    store = LmdbStore(str(tmp_path / "sm"))
    mr = await _node(tmp_path)
    sm = LmdbSM(store, "g")
    errors: list = []
    try:
        mr.add_group("g", [1], state_machine=sm)
        await mr.start()
        await mr.wait_leader("g")
        base = len(sm.entries())

        def q(data: bytes, merge=_join) -> None:
            mr.propose_quiet("g", data, lambda arg, exc: errors.append((arg, exc)), data,
                             merge=merge)

        q(b"a"), q(b"b")
        fut = mr.propose_nowait("g", b"c")
        q(b"d"), q(b"e"), q(b"f"), q(b"g"), q(b"h")  # 3 + 2 (MERGE_MAX_COUNT)
        q(b"i", merge=None)
        q(b"j")
        q(b"k"), q(b"l", merge=_other_join)
        await fut
        await mr.propose("g", b"barrier")
        got = [d for _, d in sm.entries()[base:]]
    finally:
        await mr.stop()
        store.close()
    assert got == [b"M:a|b", b"c", b"M:d|e|f", b"M:g|h", b"i", b"M:j|k", b"l", b"barrier"]
    assert errors == []


async def test_a_merged_entry_that_fails_reports_each_part_once(tmp_path):
    """Merged proposals share their entry's fate: when it cannot commit, every part's
    `on_error` runs once (never inside the proposing call); none is both applied and
    reported."""
    from raft.multigroup import ProposalDropped

    store = LmdbStore(str(tmp_path / "sm"))
    mr = await _node(tmp_path)
    sm = LmdbSM(store, "g")
    errors: list = []
    try:
        mr.add_group("g", [1], state_machine=sm)
        await mr.start()
        await mr.wait_leader("g")
        for k in range(40):
            mr.propose_quiet("g", b"x%d" % k, lambda arg, exc: errors.append((arg, exc)), k,
                             merge=_join)
        assert errors == []
        await mr.stop()
        await asyncio.sleep(0)
        applied = [p for _, d in sm.entries() for p in d.removeprefix(b"M:").split(b"|")]
    finally:
        await mr.stop()
        store.close()
    failed = [arg for arg, _ in errors]
    assert failed and len(failed) == len(set(failed))
    assert all(isinstance(exc, ProposalDropped) for _, exc in errors)
    for k in range(40):
        assert (b"x%d" % k in applied) != (k in failed), k  # applied, or reported: not both

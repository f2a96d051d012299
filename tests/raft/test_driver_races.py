"""Races inside one driver, made deterministic by a WAL whose fsync waits for
the test: what arrives while a drain pass is fsyncing. Real NodeLog, real
snapshot files."""

from __future__ import annotations

import asyncio

import pytest

from raft import snapfile
from raft.core import encode_conf_change
from raft.multigroup import MultiRaft, ProposalDropped
from raft.storage import NodeLog
from raft.types import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    Message,
    MsgType,
    Snapshot,
    SnapshotMeta,
)
from tests.raft.test_multigroup import AppendLog, _NoPeers

pytestmark = pytest.mark.timeout(60)


class GatedLog(NodeLog):
    """A NodeLog whose next sync waits until the test opens the gate."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = asyncio.Event()

    async def sync_async(self, run=None, then=None) -> int:
        if not self.gate.is_set():
            self.waiting.set()
            await self.gate.wait()
        return await super().sync_async(run, then)


class ConfLog(AppendLog):
    def __init__(self) -> None:
        super().__init__()
        self.conf: list[int] = []

    def on_conf_change(self, index: int, cc: ConfChange) -> None:
        self.conf.append(index)


async def _chunks(meta: SnapshotMeta):
    yield snapfile.encode_head(meta, 0, 0)  # the empty state: a head and no data


async def test_conf_change_in_flight_is_not_applied_over_a_newer_snapshot(tmp_path):
    """Issue 6, defect 1 at the driver: a Ready commits a membership change;
    during its fsync a snapshot at a later index arrives. After the fsync the
    state machine must not see the stale change, and the group keeps the
    snapshot's configuration."""
    wal = GatedLog(str(tmp_path / "wal"))
    mr = MultiRaft(2, wal, _NoPeers(), snap_dir=str(tmp_path / "snap"), tick_interval_s=60)
    sm = ConfLog()
    mr.add_group("g", [1, 2, 3], state_machine=sm)
    await mr.start()
    try:
        async with asyncio.timeout(10):
            while mr.status("g")["applied"] < 1:
                await asyncio.sleep(0.005)
        wal.gate.clear()
        add4 = Entry(2, 2, EntryType.CONF_CHANGE,
                     encode_conf_change(ConfChange(ConfChangeType.ADD_VOTER, 4)))
        mr.on_messages([Message(MsgType.APP, "g", 1, 2, term=2, index=1, log_term=1,
                                entries=[add4], commit=2)])
        async with asyncio.timeout(10):
            await wal.waiting.wait()  # the pass holding the change is fsyncing
        meta = SnapshotMeta(10, 2, ConfState((1, 2, 3)))
        snap = Message(MsgType.SNAP, "g", 1, 2, term=2, snapshot=Snapshot(meta))
        assert await mr.on_snapshot(snap, _chunks(meta))
        wal.gate.set()
        async with asyncio.timeout(10):
            while mr.status("g")["applied"] < 10:
                await asyncio.sleep(0.005)
        assert sm.conf == [], "the stale membership change reached the state machine"
        assert mr.status("g")["voters"] == [1, 2, 3]
        assert mr.failed is None
    finally:
        await mr.stop()


async def test_a_stale_leaders_snapshot_does_not_replace_the_one_being_installed(tmp_path):
    """Leader change during a snapshot transfer: the new leader's snapshot arrives and is
    stepped (the core will install it at the next drain pass), then the deposed leader's
    transfer of an older snapshot finishes. The core ignores the stale one (lower term),
    so the file the next pass installs must still be the new leader's: replacing it made
    the pass find "snapshot 20 without its data" and fail-stop the node."""
    wal = GatedLog(str(tmp_path / "wal"))
    mr = MultiRaft(2, wal, _NoPeers(), snap_dir=str(tmp_path / "snap"), tick_interval_s=60)
    sm = ConfLog()
    mr.add_group("g", [1, 2, 3], state_machine=sm)
    await mr.start()
    try:
        async with asyncio.timeout(10):
            while mr.status("g")["applied"] < 1:
                await asyncio.sleep(0.005)
        wal.gate.clear()  # the next pass waits in its fsync: stepped snapshots queue up
        mr.on_messages([Message(MsgType.HEARTBEAT, "g", 1, 2, term=2)])
        async with asyncio.timeout(10):
            await wal.waiting.wait()
        new = SnapshotMeta(20, 3, ConfState((1, 2, 3)))
        assert await mr.on_snapshot(
            Message(MsgType.SNAP, "g", 3, 2, term=3, snapshot=Snapshot(new)), _chunks(new))
        old = SnapshotMeta(10, 2, ConfState((1, 2, 3)))
        await mr.on_snapshot(
            Message(MsgType.SNAP, "g", 1, 2, term=2, snapshot=Snapshot(old)), _chunks(old))
        wal.gate.set()
        async with asyncio.timeout(10):
            while mr.status("g")["applied"] < 20 and mr.failed is None:
                await asyncio.sleep(0.005)
        assert mr.failed is None, f"the node stopped: {mr.failed!r}"
        assert mr.status("g")["first_index"] == 21
    finally:
        await mr.stop()


async def test_removed_waits_for_the_drop_to_be_durable(tmp_path):
    """`removed(group)` is what JetStream awaits before deleting a stream's LMDB keys: it
    must not return before the group's DROP record is fsynced and its snapshot files are
    gone (never delete what a not-yet-durable record makes obsolete). Awaited right after
    `remove_group`, as `_close_stream` does, it returned at once: the task doing the removal
    had not started yet, so the keys went while a crash could still bring the group back
    (with its snapshot, naming an index the store no longer holds: [FTL] at restart)."""
    wal = GatedLog(str(tmp_path / "wal"))
    mr = MultiRaft(1, wal, _NoPeers(), snap_dir=str(tmp_path / "snap"), tick_interval_s=0.01)
    await mr.start()
    try:
        mr.add_group("g", [1], state_machine=AppendLog())
        await mr.wait_leader("g")
        for k in range(5):
            await mr.propose("g", b"e%d" % k)
        mr.snapshot_now("g")
        async with asyncio.timeout(10):
            while mr.stats.snapshots_taken < 1:
                await asyncio.sleep(0.005)
        files = sorted(n.name for n in (tmp_path / "snap").iterdir() if n.name != "empty.image")
        assert files, "the group has snapshot files"
        wal.gate.clear()  # the DROP's fsync waits for the test
        durable = asyncio.Event()

        async def fsync_later() -> None:
            await wal.waiting.wait()
            await asyncio.sleep(0.1)
            durable.set()
            wal.gate.set()

        opener = asyncio.ensure_future(fsync_later())
        mr.remove_group("g")
        async with asyncio.timeout(10):
            await mr.removed("g")  # as JetStream's _close_stream awaits it
        assert durable.is_set(), "removed() returned before the DROP was durable"
        left = sorted(n.name for n in (tmp_path / "snap").iterdir())
        assert not set(left) & set(files), f"snapshot files left: {left}"
        await opener
    finally:
        wal.gate.set()
        await mr.stop()


class AheadLog(AppendLog):
    """A durable machine whose store is ahead of what the driver gave it: a member that
    installed a leader's export, taken past the snapshot it stood for (clsnap)."""

    AHEAD = 7

    def snapshot_to(self, path: str) -> int:
        return super().snapshot_to(path) + self.AHEAD


async def test_a_store_ahead_of_the_log_compacts_at_the_applied_index(tmp_path):
    """A member whose store holds entries past its Raft applied index (an installed export)
    compacts before it caught up: the snapshot names the applied index (the store covers
    at least that), the node goes on. Naming the store's index instead claims entries the
    log never applied here; raising (the code before clsnap) fail-stopped the node."""
    from raft.storage import NodeLog

    mr = MultiRaft(1, NodeLog(str(tmp_path / "wal")), _NoPeers(),
                   snap_dir=str(tmp_path / "snap"), tick_interval_s=0.01)
    await mr.start()
    try:
        mr.add_group("g", [1], state_machine=AheadLog())
        await mr.wait_leader("g")
        for k in range(5):
            await mr.propose("g", b"e%d" % k)
        applied = mr.status("g")["applied"]
        mr.snapshot_now("g")
        async with asyncio.timeout(10):
            while not (mr.stats.snapshots_taken or mr.stats.snapshots_discarded
                       or mr.failed):
                await asyncio.sleep(0.005)
        assert mr.failed is None, f"the node stopped: {mr.failed!r}"
        assert mr.stats.snapshots_taken == 1, "the image was discarded"
        assert mr.status("g")["first_index"] == applied + 1
        assert mr._groups["g"].snap.meta.index == applied  # noqa: SLF001
        await mr.propose("g", b"after")
    finally:
        await mr.stop()


class _Outbox:
    """A transport that keeps what the driver sends (nothing reaches a peer)."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def send(self, msgs) -> None: self.sent.extend(msgs)
    def beat(self) -> None: ...
    def last_seen(self, peer: int) -> float: return 0.0
    def add_peer(self, node: int, addr: str) -> None: ...
    def remove_peer(self, node: int) -> None: ...


async def _until(pred, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.005)


async def test_a_deposed_leaders_overwritten_proposals_fail_in_an_idle_group(tmp_path):
    """The 1,000-busy-group stall (issue 6, 2026-11-27): a leader appends two
    proposals (3, 4) that reach nobody; a new leader with a shorter log writes
    its no-op at 3 and the group goes idle. The proposal at 3 learns its fate
    when 3 commits with another term; the one at 4 used to wait for a commit
    at 4 that never comes. Both must fail with ProposalDropped."""
    out = _Outbox()
    mr = MultiRaft(1, NodeLog(str(tmp_path / "wal")), out, snap_dir=str(tmp_path / "snap"),
                   tick_interval_s=60)  # no ticks: every step is the test's
    mr.add_group("g", [1, 2, 3], state_machine=AppendLog())
    await mr.start()
    try:
        mr.on_messages([Message(MsgType.HUP, "g", 1, 1)])
        await _until(lambda: any(m.type is MsgType.PRE_VOTE for m in out.sent))
        mr.on_messages([Message(MsgType.PRE_VOTE_RESP, "g", 2, 1, term=1)])
        await _until(lambda: any(m.type is MsgType.VOTE for m in out.sent))
        mr.on_messages([Message(MsgType.VOTE_RESP, "g", 2, 1, term=1)])
        await _until(lambda: mr.status("g")["last_index"] == 2)  # leader of term 1, no-op at 2
        mr.on_messages([Message(MsgType.APP_RESP, "g", 2, 1, term=1, index=2)])
        await _until(lambda: mr.status("g")["applied"] == 2)
        a = mr.propose_nowait("g", b"a")
        b = mr.propose_nowait("g", b"b")
        await _until(lambda: mr.status("g")["last_index"] == 4)
        # Node 3 leads term 2 with the log up to 2: its no-op at 3 replaces ours.
        mr.on_messages([Message(MsgType.APP, "g", 3, 1, term=2, index=2, log_term=1,
                                entries=[Entry(2, 3, EntryType.NORMAL, b"")], commit=3)])
        async with asyncio.timeout(10):  # without the fix `b` never settles
            results = await asyncio.gather(a, b, return_exceptions=True)
        assert all(isinstance(r, ProposalDropped) for r in results), results
        assert mr.status("g")["last_index"] == 3 and mr.status("g")["leader"] == 3
        assert not mr._groups["g"].pending
    finally:
        await mr.stop()

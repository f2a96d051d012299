"""A single-voter group (every group of a standalone node): its own fsync is the whole
quorum, so the only thing between a proposal and its apply is that fsync.

Real driver and NodeLog, one voter (node 1 leads "g" alone). `MarkedLog` records what
each completed write+fsync made durable; the state machine fails any apply of an entry
past it. What must hold: nothing committed or applied while the fsync is held; after it,
applied with the right index; a read asked beside a proposal resolves; whatever reaches
the core during the fsync (a membership change, a peer's stale message) does not stop
the node (a pass that takes its commit early, as r1lat3's `_commit_at_sync` did, must
fall back then: it fail-stopped on the stale message)."""

from __future__ import annotations

import asyncio

import pytest

from raft.multigroup import MultiRaft
from raft.types import Message, MsgType
from tests.raft.test_driver_races import GatedLog, _Outbox, _until
from tests.raft.test_multigroup import AppendLog

pytestmark = pytest.mark.timeout(60)


class MarkedLog(GatedLog):
    """A gated NodeLog that knows, per group, the last index its completed
    write+fsyncs made durable (the batch `_take` hands to `_write` holds every
    record buffered so far)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.durable: dict[str, int] = {}
        self._taking: dict[str, int] = {}

    def _take(self):
        batch = super()._take()
        self._taking = {name: g.last_index() for name, g in self._groups.items()}
        return batch

    def _write(self, batch) -> int:
        n = super()._write(batch)
        self.durable = dict(self._taking)
        return n


class CheckedLog(AppendLog):
    """Fails an apply of an entry the WAL has not made durable yet."""

    def __init__(self, wal: MarkedLog, group: str = "g") -> None:
        super().__init__()
        self.wal, self.group = wal, group

    def apply(self, index: int, data: bytes) -> None:
        durable = self.wal.durable.get(self.group, 0)
        assert index <= durable, f"entry {index} applied before its fsync (durable to {durable})"
        super().apply(index, data)


async def _single(tmp_path) -> tuple[MultiRaft, MarkedLog, CheckedLog]:
    wal = MarkedLog(str(tmp_path / "wal"))
    sm = CheckedLog(wal)
    mr = MultiRaft(1, wal, _Outbox(), snap_dir=str(tmp_path / "snap"),
                   tick_interval_s=0.01, election_tick=3)
    mr.add_group("g", [1], state_machine=sm)
    await mr.start()
    await mr.wait_leader("g")
    await _quiet(mr)
    return mr, wal, sm


async def _quiet(mr: MultiRaft) -> None:
    await _until(lambda: mr.status("g")["applied"] == mr.status("g")["last_index"]
                 and not mr._dirty and not mr._passing)  # noqa: SLF001
    for _ in range(5):
        await asyncio.sleep(0)


async def _hold(mr: MultiRaft, wal: MarkedLog, data: bytes) -> asyncio.Future[int]:
    """Propose `data` and return once its pass waits to fsync (the gate closed)."""
    await _quiet(mr)
    wal.gate.clear()
    wal.waiting.clear()
    fut = mr.propose_nowait("g", data)
    async with asyncio.timeout(10):
        await wal.waiting.wait()
    return fut


async def test_nothing_is_committed_or_applied_while_its_fsync_is_held(tmp_path):
    mr, wal, sm = await _single(tmp_path)
    try:
        for k in range(5):
            fut = await _hold(mr, wal, b"x%d" % k)
            index = mr.status("g")["last_index"]
            for _ in range(5):
                await asyncio.sleep(0)
            assert mr.status("g")["commit"] < index and not fut.done()
            assert all(i < index for i, _ in sm.entries)
            wal.gate.set()
            async with asyncio.timeout(10):
                assert await fut == index
            assert sm.entries[-1] == (index, b"x%d" % k)
            assert mr.failed is None
    finally:
        wal.gate.set()
        await mr.stop()


async def test_a_read_asked_beside_a_held_proposal_resolves_after_it(tmp_path):
    mr, wal, sm = await _single(tmp_path)
    try:
        for k in range(3):
            await _quiet(mr)
            wal.gate.clear()
            wal.waiting.clear()
            reading = asyncio.ensure_future(mr.read_index("g", timeout=5))
            await asyncio.sleep(0)  # the read is stepped (a single voter answers at once)
            fut = mr.propose_nowait("g", b"r%d" % k)
            async with asyncio.timeout(10):
                await wal.waiting.wait()
            wal.gate.set()
            async with asyncio.timeout(10):
                index = await fut
                await reading
            assert sm.entries[-1][0] == index
        assert mr.failed is None
    finally:
        wal.gate.set()
        await mr.stop()


async def test_a_change_stepped_in_during_the_fsync_does_not_stop_the_node(tmp_path):
    """A membership change appends to the core at once (it is not queued like a
    proposal), during the held fsync of another entry."""
    mr, wal, sm = await _single(tmp_path)
    try:
        fut = await _hold(mr, wal, b"x")
        change = asyncio.ensure_future(mr.add_member("g", 2, learner=True))
        reading = asyncio.ensure_future(mr.read_index("g"))
        for _ in range(5):
            await asyncio.sleep(0)
        wal.gate.set()
        async with asyncio.timeout(10):
            index = await fut
            await change
            await reading
        await _quiet(mr)
        assert mr.failed is None, f"node failed: {mr.failed!r}"
        assert [i for i, _ in sm.entries][-1] == index
    finally:
        wal.gate.set()
        await mr.stop()


async def test_a_stale_peer_message_during_the_fsync_does_not_stop_the_node(tmp_path):
    """A former member's stale heartbeat, stepped in while the pass fsyncs: the leader
    answers it with its term (a message queued in the core, no term or state change).
    r1lat3's commit-at-sync took the commit Ready carrying that answer and fail-stopped."""
    mr, wal, sm = await _single(tmp_path)
    await mr.stop()
    mr, wal, sm = await _single(tmp_path)  # restarted: it leads in a later term
    try:
        term = mr._groups["g"].core.term  # noqa: SLF001
        assert term > 1
        fut = await _hold(mr, wal, b"x")
        mr.on_messages([Message(MsgType.HEARTBEAT, to=1, frm=2, term=term - 1, group="g")])
        assert mr._groups["g"].core.msgs  # noqa: SLF001 - the leader's answer, queued
        wal.gate.set()
        async with asyncio.timeout(10):
            index = await fut
        await _quiet(mr)
        assert mr.failed is None, f"node failed: {mr.failed!r}"
        assert sm.entries[-1][0] == index
        assert any(m.type is MsgType.APP_RESP and m.to == 2 for m in mr.transport.sent)
    finally:
        wal.gate.set()
        await mr.stop()

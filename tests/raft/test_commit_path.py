"""A leader's commit while its own fsync is in flight, and the commit pass run
straight from the transport callback (`MultiRaft._drain_now`). One real
driver and NodeLog as leader of a 3-member group; the followers are the test,
which answers the appends by hand, and a WAL whose sync waits for the test.
Last: a follower's append pass, whose answer leaves only after its fsync."""

from __future__ import annotations

import asyncio

import pytest

from raft.multigroup import MultiRaft
from raft.storage import NodeLog
from raft.types import Entry, EntryType, Message, MsgType
from tests.raft.test_driver_races import GatedLog, _Outbox, _until
from tests.raft.test_multigroup import AppendLog

pytestmark = pytest.mark.timeout(60)


async def _leader(tmp_path) -> tuple[MultiRaft, GatedLog, _Outbox, AppendLog]:
    """Node 1 leads g (members 1, 2, 3) in term 1, its no-op at 2 applied."""
    out, wal, sm = _Outbox(), GatedLog(str(tmp_path / "wal")), AppendLog()
    mr = MultiRaft(1, wal, out, snap_dir=str(tmp_path / "snap"),
                   tick_interval_s=60)  # no ticks: every step is the test's
    mr.add_group("g", [1, 2, 3], state_machine=sm)
    await mr.start()
    mr.on_messages([Message(MsgType.HUP, "g", 1, 1)])
    await _until(lambda: any(m.type is MsgType.PRE_VOTE for m in out.sent))
    mr.on_messages([Message(MsgType.PRE_VOTE_RESP, "g", 2, 1, term=1)])
    await _until(lambda: any(m.type is MsgType.VOTE for m in out.sent))
    mr.on_messages([Message(MsgType.VOTE_RESP, "g", 2, 1, term=1)])
    await _until(lambda: mr.status("g")["last_index"] == 2)
    mr.on_messages([Message(MsgType.APP_RESP, "g", 2, 1, term=1, index=2)])
    await _until(lambda: mr.status("g")["applied"] == 2)
    return mr, wal, out, sm


def _ack(frm: int, index: int, group: str = "g") -> Message:
    return Message(MsgType.APP_RESP, group, frm, 1, term=1, index=index)


async def test_the_leader_counts_itself_only_after_its_fsync_and_applies_nothing_before(
        tmp_path):
    """While the leader's fsync of entry 3 is in flight: one follower's answer
    does not commit 3 (the leader's own copy is not durable: it must not
    count); the second follower's does (two durable copies of three), but
    nothing is applied and the proposer waits until the local fsync, so the
    state machine never runs ahead of this node's durable log."""
    mr, wal, out, sm = await _leader(tmp_path)
    try:
        wal.gate.clear()
        fut = mr.propose_nowait("g", b"x")
        async with asyncio.timeout(10):
            await wal.waiting.wait()  # the pass holding entry 3 is fsyncing
        assert any(m.type is MsgType.APP and m.entries and m.entries[-1].index == 3
                   for m in out.sent), "appends leave before the leader's fsync"
        mr.on_messages([_ack(2, 3)])
        for _ in range(5):
            await asyncio.sleep(0)
        assert mr.status("g")["commit"] == 2, "the leader counted its unsynced entry"
        mr.on_messages([_ack(3, 3)])
        for _ in range(5):
            await asyncio.sleep(0)
        assert mr.status("g")["commit"] == 3  # a quorum of two durable followers
        assert [i for i, _ in sm.entries] == [], "applied before the local fsync"
        assert not fut.done()
        wal.gate.set()
        async with asyncio.timeout(10):
            assert await fut == 3
        assert [i for i, _ in sm.entries] == [3]
    finally:
        wal.gate.set()
        await mr.stop()


async def test_a_commit_after_the_leaders_fsync_is_applied_inside_the_answers_callback(
        tmp_path):
    """The leader's entry is durable; the first follower answer commits it, and
    the commit pass (apply, proposer resolved) runs inside `on_messages`: no
    loop turn of the drain task between an APP_RESP and the commit."""
    mr, _wal, _out, sm = await _leader(tmp_path)
    try:
        fut = mr.propose_nowait("g", b"x")
        await _until(lambda: mr._groups["g"].core.prs[1].match == 3)  # noqa: SLF001
        eager = mr.stats.eager_passes
        mr.on_messages([_ack(2, 3)])  # no await in between
        assert [i for i, _ in sm.entries] == [3]
        assert fut.done() and fut.result() == 3
        assert mr.stats.eager_passes == eager + 1
        # A proposal queued meanwhile (a write to make) leaves the pass to the drain task.
        fut2 = mr.propose_nowait("g", b"y")
        mr.on_messages([_ack(3, 3)])
        assert mr.stats.eager_passes == eager + 1
        async with asyncio.timeout(10):
            while not fut2.done():
                await asyncio.sleep(0.005)
                mr.on_messages([_ack(2, mr.status("g")["last_index"])])
        assert fut2.result() == 4
    finally:
        await mr.stop()


async def test_an_answer_that_moves_only_a_peers_progress_runs_no_pass(tmp_path):
    """At window 1 the second follower's answer comes after the commit: it
    moves that peer's match and nothing else (no message, no commit, no apply),
    so no drain pass runs for it (its `_after` would find nothing to do). The
    answer that commits still runs its pass at once, and the peer's progress
    is kept: a later append to it starts after the entry it acknowledged."""
    mr, _wal, out, sm = await _leader(tmp_path)
    core = mr._groups["g"].core  # noqa: SLF001
    try:
        for index, data in ((3, b"x"), (4, b"y")):
            fut = mr.propose_nowait("g", data)
            await _until(lambda index=index: core.prs[1].match == index)
            mr.on_messages([_ack(2, index)])
            assert fut.done() and [i for i, _ in sm.entries][-1] == index
            if index == 3:
                mr.on_messages([_ack(3, 3)])  # probing until now: this one sends
        passes, drains = mr.stats.eager_passes, mr.stats.drains
        mr.on_messages([_ack(3, 4)])
        for _ in range(5):
            await asyncio.sleep(0)
        assert mr.stats.eager_passes == passes and mr.stats.drains == drains, \
            "a pass ran for an answer that changed only a peer's progress"
        assert core.prs[3].match == 4
        sent = len(out.sent)
        fut = mr.propose_nowait("g", b"z")

        def app_to_3() -> Message | None:
            return next((m for m in out.sent[sent:]
                         if m.type is MsgType.APP and m.to == 3 and m.entries), None)
        await _until(lambda: app_to_3() is not None)
        assert (app_to_3().index, [e.index for e in app_to_3().entries]) == (4, [5])
        mr.on_messages([_ack(3, 5)])
        async with asyncio.timeout(10):
            assert await fut == 5
    finally:
        await mr.stop()


async def test_a_new_leaders_appends_wait_for_the_fsync_of_its_term(tmp_path):
    """The early appends (sent before the leader's own records are even
    buffered) need only a durable term. A sole voter wins its election in one
    step, so its first Ready holds both the new term/vote and its appends (the
    no-op to its learner): those wait for the fsync. Else a crash before it
    restarts the node in the old term; it wins the same term again and writes
    another entry at the index the learner already holds with that term."""
    out, wal, sm = _Outbox(), GatedLog(str(tmp_path / "wal")), AppendLog()
    mr = MultiRaft(1, wal, out, snap_dir=str(tmp_path / "snap"), tick_interval_s=60)
    mr.add_group("g", [1], learners=[2], state_machine=sm)
    await mr.start()
    try:
        wal.gate.clear()
        mr.on_messages([Message(MsgType.HUP, "g", 1, 1)])
        async with asyncio.timeout(10):
            await wal.waiting.wait()  # the pass holding term 1 and the no-op is fsyncing
        assert mr.status("g")["state"] == "leader"
        assert not [m for m in out.sent if m.type is MsgType.APP], \
            "an append left before the fsync of the term it carries"
        wal.gate.set()
        await _until(lambda: any(m.type is MsgType.APP and m.to == 2 and m.term == 1
                                 for m in out.sent))
    finally:
        wal.gate.set()
        await mr.stop()


class _SyncedOutbox(_Outbox):
    """Records, with every message sent, how many fsyncs the WAL had made."""

    def __init__(self) -> None:
        super().__init__()
        self.wal: NodeLog | None = None
        self.at: list[tuple[Message, int]] = []

    def send(self, msgs) -> None:
        super().send(msgs)
        self.at.extend((m, self.wal.stats.fsyncs) for m in msgs)


async def test_a_followers_answer_leaves_right_after_the_fsync_of_its_entry(tmp_path):
    """Node 2 follows g (members 1, 2, 3). An append from leader 1 is written,
    fsynced and answered; the APP_RESP leaves only after the fsync that made
    its entry durable, and before the entry is applied (the next append's
    commit index applies it)."""
    out, sm = _SyncedOutbox(), AppendLog()
    wal = out.wal = NodeLog(str(tmp_path / "wal"))
    mr = MultiRaft(2, wal, out, snap_dir=str(tmp_path / "snap"), tick_interval_s=60)
    mr.add_group("g", [1, 2, 3], state_machine=sm)
    await mr.start()
    try:
        await _until(lambda: wal.stats.fsyncs > 0 and not mr._dirty)  # noqa: SLF001 (bootstrap)
        fsyncs = wal.stats.fsyncs
        mr.on_messages([Message(MsgType.APP, "g", 1, 2, term=1, index=1, log_term=1, commit=1,
                                entries=[Entry(1, 2, EntryType.NORMAL, b"x")])])

        def resps():
            return [(m, n) for m, n in out.at if m.type is MsgType.APP_RESP and m.index == 2]
        await _until(lambda: resps())
        assert not resps()[0][0].reject
        assert resps()[0][1] > fsyncs, "APP_RESP sent before the fsync of its entry"
        assert mr.status("g")["last_index"] == 2 and sm.entries == []
        mr.on_messages([Message(MsgType.APP, "g", 1, 2, term=1, index=2, log_term=1,
                                commit=2)])
        await _until(lambda: [i for i, _ in sm.entries] == [2])
    finally:
        await mr.stop()



class _GatedApply:
    """An apply executor whose jobs each wait for their own gate (`open(k)`
    lets the k-th job run): an eager pass applying more than
    `inline_apply_entries` suspends here."""

    def __init__(self) -> None:
        self.gates: list[asyncio.Event] = []

    async def run(self, fn, *args):
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return fn(*args)

    def open_all(self) -> None:
        for g in self.gates:
            g.set()

    def close(self) -> None:
        self.open_all()


async def test_the_drain_task_never_passes_beside_an_eager_pass_started_as_the_last_ended(
        tmp_path):
    """Review (session 10): eager pass E1 (groups a, b) suspends, its apply of
    two entries in the worker; the drain task, kicked meanwhile, waits for E1.
    E1 ends; before the drain task resumes, answers for c, d start eager pass
    E2, which suspends too. The drain task must wait for E2 as well: a pass
    beside it takes c's Ready again (E2 has not advanced it) and applies its
    committed entry a second time (AppendLog: "applied out of order")."""
    out, wal = _Outbox(), NodeLog(str(tmp_path / "wal"))
    ex = _GatedApply()
    mr = MultiRaft(1, wal, out, snap_dir=str(tmp_path / "snap"), tick_interval_s=60,
                   apply_executor=ex, inline_apply_entries=1)
    names = "abcd"
    sms = {n: AppendLog() for n in names}
    for n, sm in sms.items():
        mr.add_group(n, [1, 2, 3], state_machine=sm)
    await mr.start()
    try:
        for n in names:  # node 1 leads every group, its no-op at 2 applied
            mr.on_messages([Message(MsgType.HUP, n, 1, 1)])
            await _until(lambda: any(m.type is MsgType.PRE_VOTE and m.group == n  # noqa: B023
                                     for m in out.sent))
            mr.on_messages([Message(MsgType.PRE_VOTE_RESP, n, 2, 1, term=1)])
            await _until(lambda: any(m.type is MsgType.VOTE and m.group == n  # noqa: B023
                                     for m in out.sent))
            mr.on_messages([Message(MsgType.VOTE_RESP, n, 2, 1, term=1)])
            await _until(lambda: mr.status(n)["last_index"] == 2)  # noqa: B023
            mr.on_messages([_ack(2, 2, n)])
            await _until(lambda: mr.status(n)["applied"] == 2)  # noqa: B023
        for n in names:
            mr.propose_nowait(n, b"x")
        await _until(lambda: all(mr._groups[n].core.prs[1].match == 3  # noqa: SLF001
                                 for n in names))
        mr.on_messages([_ack(2, 3, "a"), _ack(2, 3, "b")])  # eager E1 -> the worker
        e1 = mr._eager_tail  # noqa: SLF001
        assert e1 is not None and len(ex.gates) == 1
        mr.on_messages([Message(MsgType.HEARTBEAT_RESP, "a", 3, 1, term=1)])  # kicks the task
        for _ in range(5):
            await asyncio.sleep(0)
        second: list[object] = []

        def between(_t) -> None:
            # E1 is over, the drain task not resumed yet: eager E2 (c, d).
            mr.on_messages([_ack(2, 3, "c"), _ack(2, 3, "d")])
            second.append(mr._eager_tail)  # noqa: SLF001
            mr.on_messages([Message(MsgType.HEARTBEAT_RESP, "c", 3, 1, term=1)])

        e1.add_done_callback(between)
        ex.gates[0].set()
        await _until(lambda: len(ex.gates) >= 2 or mr.failed is not None)
        for _ in range(20):
            await asyncio.sleep(0)
        ex.open_all()
        await _until(lambda: all(len(sm.entries) == 1 for sm in sms.values())
                     or mr.failed is not None)
        for _ in range(20):
            await asyncio.sleep(0)
        assert second and second[0] is not None, "E2 did not suspend: schedule not reached"
        assert mr.failed is None, f"node failed: {mr.failed!r}"
        assert {n: [i for i, _ in sm.entries] for n, sm in sms.items()} == {
            n: [3] for n in names}
    finally:
        ex.open_all()
        await mr.stop()

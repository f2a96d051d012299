"""ReadIndex across a restart of the reading node (tests/sim seed 925): a
leader may answer a read of the node's previous process after the node came
back; that answer must not resolve a read of the new process. Real NodeLog,
real driver; the leader is played by the test."""

from __future__ import annotations

import asyncio

import pytest

from raft.multigroup import MultiRaft
from raft.storage import NodeLog
from raft.types import Entry, Message, MsgType
from tests.raft.test_multigroup import AppendLog, _NoPeers

pytestmark = pytest.mark.timeout(60)


class Capture(_NoPeers):
    """A transport that keeps what the node sends."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.new = asyncio.Event()

    def send(self, msgs) -> None:
        self.sent.extend(msgs)
        self.new.set()

    async def next_read(self) -> Message:
        while True:
            for m in self.sent:
                if m.type is MsgType.READ_INDEX:
                    self.sent.remove(m)
                    return m
            self.new.clear()
            await self.new.wait()


async def _follower(tmp_path, t: Capture, commit: int) -> MultiRaft:
    """Node 2 of group g (voters 1,2,3), following leader 1 in term 2, with
    `commit` entries committed and applied."""
    mr = MultiRaft(2, NodeLog(str(tmp_path / "wal")), t, snap_dir=str(tmp_path / "snap"),
                   tick_interval_s=60)
    mr.add_group("g", [1, 2, 3], state_machine=AppendLog())
    await mr.start()
    last = mr.status("g")["last_index"]
    ents = [Entry(term=2, index=i, data=b"x%d" % i) for i in range(last + 1, commit + 1)]
    prev_term = 1 if last <= 1 else 2
    mr.on_messages([Message(MsgType.APP, "g", 1, 2, term=2, index=last, log_term=prev_term,
                            entries=ents, commit=commit)])
    async with asyncio.timeout(10):
        while mr.status("g")["applied"] < commit:
            await asyncio.sleep(0.005)
    return mr


def _answer(read: Message, index: int) -> Message:
    return Message(MsgType.READ_INDEX_RESP, "g", 1, 2, term=2, index=index,
                   context=read.context)


async def test_an_answer_to_the_previous_process_does_not_resolve_a_new_read(tmp_path):
    t1 = Capture()
    mr = await _follower(tmp_path, t1, commit=3)
    old_task = asyncio.ensure_future(mr.read_index("g", timeout=30))
    async with asyncio.timeout(10):
        old = await t1.next_read()
    await mr.stop()
    old_task.cancel()

    # The new process: the leader has committed up to 6 since, this node has
    # applied only 5 so far (it learns commit 5 from its leader).
    t2 = Capture()
    mr = await _follower(tmp_path, t2, commit=5)
    try:
        read = asyncio.ensure_future(mr.read_index("g", timeout=30))
        async with asyncio.timeout(10):
            new = await t2.next_read()
        assert new.context != old.context, "a new process reuses a read context"
        # The leader's late answer to the old read (index 3 <= applied 5).
        mr.on_messages([_answer(old, 3)])
        for _ in range(50):
            await asyncio.sleep(0.002)
        assert not read.done(), "an answer meant for the previous process resolved a new read"
        # The real answer: index 6, so the read waits until 6 is applied.
        mr.on_messages([_answer(new, 6)])
        mr.on_messages([Message(MsgType.APP, "g", 1, 2, term=2, index=5, log_term=2,
                                entries=[Entry(term=2, index=6, data=b"x6")], commit=6)])
        async with asyncio.timeout(10):
            await read
        assert mr.status("g")["applied"] >= 6
    finally:
        await mr.stop()

"""Fail-stop (issue 6, defect 7): a node whose ready loop hits a fatal error
(here: its WAL fsync fails) stops itself: no more ticks or liveness beats, its
streams close, every waiter fails with NodeFailed, and the other members elect
a new leader. Real NodeLogs, real gRPC on loopback."""

from __future__ import annotations

import asyncio
import errno

import pytest

from raft.multigroup import MultiRaft, NodeFailed, NotLeader, ProposalDropped
from raft.storage import NodeLog
from raft.transport_grpc import GrpcTransport
from tests.ports import free_port
from tests.raft.test_multigroup import AppendLog

pytestmark = pytest.mark.timeout(120)


class FailingLog(NodeLog):
    """A NodeLog whose next sync fails as a dying disk's fsync does."""

    fail = False

    async def sync_async(self, run=None, then=None) -> int:
        if self.fail:
            raise OSError(errno.EIO, "fsync: input/output error")
        return await super().sync_async(run, then)


async def _start(nid: int, tmp, addrs: dict[int, str], fatal: list) -> MultiRaft:
    mr = MultiRaft(nid, FailingLog(str(tmp / f"n{nid}" / "wal")), snap_dir=str(tmp / f"n{nid}/s"),
                   tick_interval_s=0.05, on_fatal=fatal.append)
    mr.bind_transport(GrpcTransport(nid, addrs[nid], addrs, **mr.transport_callbacks()))
    mr.add_group("g", list(addrs), state_machine=AppendLog())
    await mr.start()
    return mr


async def _leader(nodes: dict[int, MultiRaft], skip: int = 0) -> MultiRaft:
    async with asyncio.timeout(30):
        while True:
            for nid, mr in nodes.items():
                if nid != skip and mr.status("g")["state"] == "leader":
                    return mr
            await asyncio.sleep(0.02)


async def test_failed_fsync_stops_the_leader_and_peers_elect_another(tmp_path):
    addrs = {i: f"127.0.0.1:{free_port()}" for i in (1, 2, 3)}
    fatal: list[BaseException] = []
    nodes = {nid: await _start(nid, tmp_path, addrs, fatal) for nid in addrs}
    try:
        old = await _leader(nodes)
        await old.propose("g", b"before")
        old.node_log.fail = True
        with pytest.raises(ProposalDropped):
            await asyncio.wait_for(old.propose("g", b"lost?"), 10)
        assert isinstance(old.failed, OSError) and fatal == [old.failed]
        ticks = old.stats.ticks
        with pytest.raises(NodeFailed):
            await old.propose("g", b"after the failure")
        # The others stop hearing from it and elect a new leader, which commits.
        new = await _leader(nodes, skip=old.node_id)
        while True:
            try:
                await asyncio.wait_for(new.propose("g", b"after"), 10)
                break
            except (NotLeader, ProposalDropped):
                new = await _leader(nodes, skip=old.node_id)
        assert old.stats.ticks == ticks, "a stopped node must not tick (nor beat)"
    finally:
        for mr in nodes.values():
            await mr.stop()

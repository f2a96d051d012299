"""Groups and peers at runtime: a fourth node joins a running cluster without
a restart (transport peers added on the fly, then a group member added,
caught up by snapshot), and is removed again. Real NodeLogs, real gRPC."""

from __future__ import annotations

import asyncio

import pytest

from raft import multigroup
from raft.transport_grpc import GrpcTransport
from raft.types import Entry, Message, MsgType
from tests.ports import free_port
from tests.raft.test_multigroup import AppendLog, Cluster
from tests.raft.test_transport_grpc import Inbox

pytestmark = pytest.mark.timeout(120)


async def test_transport_adds_and_removes_peers_without_restart():
    addrs = {i: f"127.0.0.1:{free_port()}" for i in (1, 2)}
    inboxes = {1: Inbox(), 2: Inbox()}
    a = GrpcTransport(1, addrs[1], {1: addrs[1]}, inboxes[1])  # knows nobody yet
    b = GrpcTransport(2, addrs[2], {2: addrs[2]}, inboxes[2])
    try:
        await a.start()
        await b.start()
        app = Message(MsgType.APP, "g", 1, 2, term=1, entries=[Entry(1, 1, data=b"x")])
        b.add_peer(1, addrs[1])
        a.add_peer(2, addrs[2])  # node 1 (lower id) dials
        await a.wait_connected(20)
        a.send([app])
        await inboxes[2].until(lambda: len(inboxes[2].of(MsgType.APP)) == 1)
        a.remove_peer(2)
        assert a.peers() == [] and 2 not in [p for p in a.peers()]
        await inboxes[2].until(lambda: not b.connected(1))
        a.send([app])  # to a removed peer: dropped, never delivered
        await asyncio.sleep(0.3)
        assert len(inboxes[2].of(MsgType.APP)) == 1
        a.add_peer(2, addrs[2])  # and back again
        await a.wait_connected(20)
        a.send([app])
        await inboxes[2].until(lambda: len(inboxes[2].of(MsgType.APP)) == 2)
    finally:
        await a.stop()
        await b.stop()


async def test_fourth_node_joins_and_leaves_a_running_group(tmp_path):
    c = Cluster(tmp_path, snapshot_every=20)
    try:
        for nid in (1, 2, 3):
            await c.start(nid, ["g"])
        for k in range(50):  # enough for a snapshot: node 4 needs one to catch up
            await c.propose("g", b"e%d" % k)
        addr4 = f"127.0.0.1:{free_port()}"
        for mr in c.nodes.values():
            mr.add_peer(4, addr4)
        n4 = multigroup.create(4, str(tmp_path / "n4"), addr4, {**c.addrs, 4: addr4},
                               tick_interval_s=0.05, snapshot_every=20)
        sm4 = AppendLog()
        n4.add_group("g", [1, 2, 3], state_machine=sm4)  # not a member: joins empty
        await n4.start()
        c.nodes[4] = n4
        leader = await c.leader_of("g")
        await leader.add_member("g", 4)
        await c.propose("g", b"after-join")
        await c.until(lambda: sm4.datas()[-1:] == [b"after-join"])
        assert sm4.restored >= 1  # caught up by snapshot
        assert sm4.datas() == c.sms[leader.node_id]["g"].datas()
        leader = await c.leader_of("g")
        if leader is n4:
            await n4.transfer_leader("g", 1)
            leader = await c.leader_of("g")
        await leader.remove_member("g", 4)
        await c.nodes.pop(4).stop()
        for mr in c.nodes.values():
            mr.remove_peer(4)
        await c.propose("g", b"after-leave")
    finally:
        await c.close()

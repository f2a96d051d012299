"""Traffic classes and queue bounds of GrpcTransport (issue 6: priority and bounds).

The peer here is a stand-in gRPC server that speaks the Cluster protocol but
never reads its bulk stream, as a peer with a full disk or a saturated link
would: the sender's bulk queue must stay bounded by bytes (the rest is
reported UNREACHABLE for Raft to retry), and heartbeats and meta-group
appends must keep arriving on the priority stream meanwhile."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from proto import cluster_pb2 as pb
from proto import cluster_pb2_grpc as pb_grpc
from raft.codec import decode_batch
from raft.transport_grpc import BATCH_SPLIT_BYTES, LANE_BULK, GrpcTransport
from raft.types import Entry, Message, MsgType
from tests.ports import free_port
from tests.raft.test_transport_grpc import Inbox

pytestmark = pytest.mark.timeout(90)


class StallingPeer(pb_grpc.ClusterServicer):
    """Node 2: answers every hello, reads the priority stream, never reads bulk."""

    def __init__(self) -> None:
        self.received: list[Message] = []
        self.lanes: list[int] = []

    async def Raft(self, request_iterator, context):  # noqa: N802
        hello = await context.read()
        self.lanes.append(hello.lane)
        await context.write(pb.Batch(from_node=2, to_node=1, hello=True, lane=hello.lane))
        if hello.lane == LANE_BULK:
            await asyncio.sleep(3600)  # stalled: gRPC flow control backs up to the sender
        while (batch := await context.read()) is not grpc.aio.EOF:
            self.received.extend(decode_batch(batch))


def _bulk(group: str, i: int, size: int) -> Message:
    return Message(MsgType.APP, group, 1, 2, term=2, log_term=2, index=i - 1,
                   entries=[Entry(2, i, data=b"x" * size)])


async def test_bulk_stalls_priority_flows_and_queue_is_bounded_by_bytes():
    peer = StallingPeer()
    server = grpc.aio.server()
    pb_grpc.add_ClusterServicer_to_server(peer, server)
    addr2 = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(addr2)
    await server.start()
    inbox = Inbox()
    limit = 2 << 20
    t = GrpcTransport(1, f"127.0.0.1:{free_port()}", {2: addr2}, inbox, queue_bytes=limit)
    try:
        await t.start()
        await t.wait_connected(20)
        assert sorted(peer.lanes) == [0, 1]
        lane = t._links[2].lanes[LANE_BULK]
        peak = 0
        for i in range(1, 201):  # 200 x 256 KiB = 50 MiB of appends the peer never reads
            t.send([_bulk("S-BULK", i, 256 << 10)])
            t.send([Message(MsgType.HEARTBEAT, "S-BULK", 1, 2, term=2, commit=i)])
            await asyncio.sleep(0.005)
            peak = max(peak, lane.queued_bytes)
        t.send([_bulk("$meta", 1, 100)])  # the meta group's appends are priority traffic
        await inbox.until(lambda: any(m.group == "$meta" for m in peer.received))
        beats = [m.commit for m in peer.received if m.type == MsgType.HEARTBEAT]
        assert beats[-1] == 200, "heartbeats must not wait behind stalled bulk appends"
        assert not any(m.group == "S-BULK" and m.type == MsgType.APP for m in peer.received)
        assert peak <= limit + BATCH_SPLIT_BYTES, f"bulk queue held {peak} bytes"
        unreachable = [m for m in inbox.msgs if m.type == MsgType.UNREACHABLE]
        assert unreachable and {m.group for m in unreachable} == {"S-BULK"}
    finally:
        await t.stop()
        await server.stop(0)


def test_a_backlog_on_a_lane_leaves_as_one_write_in_order():
    """Batches that queued behind a slow write are merged into the next write
    (1,000 busy groups under load: 200+ small batches on a priority lane, the
    heartbeats behind them late enough for followers to time out), in order,
    liveness kept, and never past BATCH_SPLIT_BYTES."""
    from raft.codec import encode_batch
    from raft.transport_grpc import LANE_PRIORITY, _Lane

    lane = _Lane(LANE_PRIORITY)
    sent: list[list[Message]] = []
    for k in range(5):
        msgs = [Message(MsgType.HEARTBEAT, f"g{k}", 1, 2, term=2, commit=k),
                Message(MsgType.VOTE, f"g{k}", 1, 2, term=3, index=k, log_term=2)]
        sent.append(msgs)
        lane.queue.append((encode_batch(1, 2, msgs, liveness=k == 2), {f"g{k}"}, 100))
        lane.queued_bytes += 100
    big = [_bulk("g-big", 1, BATCH_SPLIT_BYTES)]
    lane.queue.append((encode_batch(1, 2, big), {"g-big"}, BATCH_SPLIT_BYTES))
    lane.queued_bytes += BATCH_SPLIT_BYTES
    batch, groups, size = GrpcTransport._take(lane)
    got = decode_batch(batch)
    assert [m.group for m in got if m.type == MsgType.VOTE] == [f"g{k}" for k in range(5)]
    assert [m.commit for m in got if m.type == MsgType.HEARTBEAT] == list(range(5))
    assert batch.liveness and groups == {f"g{k}" for k in range(5)} and size == 500
    # The big one would pass the split bound: it stays for the next write.
    assert len(lane.queue) == 1 and lane.queued_bytes == BATCH_SPLIT_BYTES
    assert GrpcTransport._take(lane)[1] == {"g-big"} and lane.queued_bytes == 0

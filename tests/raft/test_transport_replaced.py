"""An acceptor's lane whose stream a stale dial replaced still carries its sends.

The CI failure of 2026-11-27 (docs/notes/lag1.md): at start a node replaces its link
to a peer once the peer's direct-lane address is gossiped; a dial of the old link
that was already under way reaches the peer after the new link's stream, replaces
it there, and then ends (its dialer cancelled it). The peer kept reading the live
stream but sent on none: every answer on that lane was dropped for good, and the
dialer, whose stream looked healthy, never redialed (a follower one commit behind
for as long as the group stayed idle). Real sockets, real transports."""

from __future__ import annotations

import pytest

from raft import tcp_lane
from raft.transport_grpc import LANE_PRIORITY, GrpcTransport
from raft.types import Message, MsgType
from tests.ports import free_port
from tests.raft.test_mtls_identity import Inbox, until

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("stale_direct", [True, False], ids=["stale-direct", "stale-grpc"])
async def test_a_stale_dial_that_replaced_the_live_stream_does_not_silence_the_lane(
        stale_direct: bool) -> None:
    peers = {i: f"127.0.0.1:{free_port()}" for i in (1, 2)}
    direct = {i: f"127.0.0.1:{free_port()}" for i in (1, 2)}
    inbox = {i: Inbox() for i in (1, 2)}
    ts = {i: GrpcTransport(i, peers[i], peers, inbox[i], direct=direct) for i in (1, 2)}
    try:
        for t in ts.values():
            await t.start()
        link = ts[1]._links[2]  # node 1 dials, node 2 accepts
        lane = link.lanes[LANE_PRIORITY]
        await until(lambda: isinstance(lane.stream, tcp_lane.TcpStream)
                    and ts[2]._links[1].lanes[LANE_PRIORITY].stream is not None)
        # The stale dial: a full handshake node 1's dial loop knows nothing of, ended
        # by its dialer once the acceptor took it.
        accepting = ts[2]._links[1].lanes[LANE_PRIORITY]
        live = accepting.stream
        stale = await ts[1]._handshake(link, lane, stale_direct)
        await until(lambda: accepting.stream is not live)
        stale.cancel()
        beat = 0

        def answered() -> bool:
            nonlocal beat
            beat += 1  # keep sending: the ones sent while the lane redials are lost
            ts[2].send_now([Message(MsgType.HEARTBEAT_RESP, "g", 2, 1, term=2,
                                    context=b"%d" % beat)])
            return any(m.type == MsgType.HEARTBEAT_RESP for m in inbox[1].msgs)

        await until(answered, timeout=30)
    finally:
        for t in ts.values():
            await t.stop()

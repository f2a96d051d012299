"""The direct TCP lane (raft/tcp_lane.py): same batches, hello and checks as gRPC.

Real sockets, real TLS (openssl-made PKI), real MultiRaft nodes with their WALs."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import grpc
import pytest

from raft import tcp_lane
from raft.codec import encode_batch
from raft.transport_grpc import LANE_BULK, LANE_PRIORITY, GrpcTransport
from raft.types import LOCAL_MSG_TYPES, Entry, Message, MsgType
from tests.cluster.netcut import NetCut, _pipe
from tests.ports import free_port
from tests.raft import test_mtls_identity
from tests.raft.test_mtls_identity import Inbox, tls, until
from tests.raft.test_multigroup import Cluster
from tests.raft.test_transport_lane_auth import proven_dial

pytestmark = pytest.mark.timeout(120)
pki = test_mtls_identity.pki  # the module-scoped PKI fixture


def _app(frm: int, to: int, index: int, group: str = "g") -> Message:
    return Message(MsgType.APP, group, frm, to, term=2, log_term=2, index=index - 1,
                   entries=[Entry(2, index, data=b"x")])


def _addrs(ids) -> dict[int, str]:
    return {i: f"127.0.0.1:{free_port()}" for i in ids}


async def test_direct_lanes_carry_batches_in_order_and_other_peers_stay_on_grpc():
    peers, direct = _addrs((1, 2, 3)), _addrs((1, 2))  # node 3 has no direct lane
    inboxes = {i: Inbox() for i in (1, 2, 3)}
    ts = {i: GrpcTransport(i, peers[i], peers, inboxes[i], direct=direct) for i in (1, 2, 3)}
    try:
        for t in ts.values():
            await t.start()
        for t in ts.values():
            await t.wait_connected(20)
        lanes = ts[1]._links[2].lanes
        # Node 2 may have started after node 1's first dial: its gRPC lanes stand in
        # until the next probe of its direct lane.
        await until(lambda: all(isinstance(lane.stream, tcp_lane.TcpStream) for lane in lanes))
        assert not any(isinstance(lane.stream, tcp_lane.TcpStream)
                       for lane in ts[1]._links[3].lanes)
        for k in range(1, 201):  # bulk (entries) and priority (heartbeats) interleaved
            ts[1].send_now([_app(1, 2, k), _app(1, 3, k),
                            Message(MsgType.HEARTBEAT, "h", 1, 2, term=2, commit=k)])
        await until(lambda: len(inboxes[2].msgs) == 400 and len(inboxes[3].msgs) == 200)
        apps = [m.entries[0].index for m in inboxes[2].msgs if m.type == MsgType.APP]
        beats = [m.commit for m in inboxes[2].msgs if m.type == MsgType.HEARTBEAT]
        assert apps == list(range(1, 201)) and beats == list(range(1, 201))
        assert [m.entries[0].index for m in inboxes[3].msgs] == list(range(1, 201))
        # A peer restart: the lane is redialed and carries traffic again.
        await ts[2].stop()
        ts[2] = GrpcTransport(2, peers[2], peers, inboxes[2], direct=direct)
        await ts[2].start()
        await ts[1].wait_connected(20)
        ts[1].send_now([_app(1, 2, 201)])
        await until(lambda: any(m.type == MsgType.APP and m.entries[0].index == 201
                                for m in inboxes[2].msgs))
    finally:
        for t in ts.values():
            await t.stop()


async def test_direct_lane_drops_forged_local_and_unknown_messages_stream_stays():
    peers, direct = _addrs((2, 3)), _addrs((2, 3))
    inbox = Inbox()
    b = GrpcTransport(2, peers[2], peers, inbox, direct=direct)
    try:
        await b.start()
        s = await tcp_lane.dial(direct[2], None, None, 1 << 20)  # node 3 by its hello
        await s.write(tcp_lane.pb.Batch(from_node=3, to_node=2, hello=True, lane=LANE_BULK))
        assert (await s.read()).hello
        forged_vote = Message(MsgType.VOTE, "g", 1, 2, term=9, index=100, log_term=9)
        local = [Message(t, "g", 3, 2, term=2, index=5) for t in sorted(LOCAL_MSG_TYPES)]
        batch = encode_batch(3, 2, [forged_vote, *local, _app(3, 2, 1)])
        batch.messages.add(type=99, group="g", frm=3, to=2, term=2)  # a newer version's type
        await s.write(batch)
        await s.write(encode_batch(1, 2, [_app(1, 2, 1)]))  # a header claiming node 1
        await s.write(encode_batch(3, 2, [_app(3, 2, 2)]))  # the stream survived
        await until(lambda: len(inbox.msgs) >= 2)
        await asyncio.sleep(0.2)
        assert [(m.type, m.frm, m.entries[0].index) for m in inbox.msgs] == [
            (MsgType.APP, 3, 1), (MsgType.APP, 3, 2)]
        assert b.dropped_in == 1 + len(local) + 1 + 2
        s.cancel()
        # An unknown node, a wrong receiver and an unknown lane are refused.
        for hello in (dict(from_node=7, to_node=2), dict(from_node=3, to_node=5),
                      dict(from_node=3, to_node=2, lane=9)):
            s = await tcp_lane.dial(direct[2], None, None, 1 << 20)
            await s.write(tcp_lane.pb.Batch(hello=True, **hello))
            assert await s.read() is grpc.aio.EOF
            s.cancel()
    finally:
        await b.stop()


async def test_direct_lane_mtls_binds_the_node_to_its_certificate(pki: Path):
    peers, direct = _addrs((1, 2)), _addrs((1, 2))
    inbox = Inbox()
    a = GrpcTransport(1, peers[1], peers, Inbox(), tls=tls(pki, "node-1"), direct=direct)
    b = GrpcTransport(2, peers[2], peers, inbox, tls=tls(pki, "node-2"), direct=direct)
    try:
        await b.start()
        await a.start()
        await a.wait_connected(20)
        assert isinstance(a._links[2].lanes[LANE_PRIORITY].stream, tcp_lane.TcpStream)
        a.send([_app(1, 2, 1)])
        await until(lambda: len(inbox.msgs) == 1)
        # node 3's valid certificate cannot speak as node 1
        _, client = tcp_lane.contexts(*tls(pki, "node-3"))
        s = await tcp_lane.dial(direct[2], client, "node-2", 1 << 20)
        await s.write(tcp_lane.pb.Batch(from_node=1, to_node=2, hello=True))
        assert await s.read() is grpc.aio.EOF
        s.cancel()
        # no client certificate: the TLS handshake fails (the acceptor requires one)
        bare = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            s = await tcp_lane.dial(direct[2], bare, "node-2", 1 << 20)
            await s.write(tcp_lane.pb.Batch(from_node=1, to_node=2, hello=True))
            if await s.read() is grpc.aio.EOF:
                raise ConnectionError("refused after the handshake")
        # the dialer checks the acceptor's name: node 2 is not node 1
        _, client1 = tcp_lane.contexts(*tls(pki, "node-1"))
        with pytest.raises(ssl.SSLCertVerificationError):
            await tcp_lane.dial(direct[2], client1, "node-1", 1 << 20)
        assert len(inbox.msgs) == 1
    finally:
        await a.stop()
        await b.stop()


async def test_raft_groups_commit_over_direct_lanes_and_survive_a_leader_restart(tmp_path):
    c = Cluster(tmp_path, direct=_addrs((1, 2, 3)))
    try:
        for nid in (1, 2, 3):
            await c.start(nid, ["a", "b"])
        for k in range(30):
            await c.propose("a", b"a%d" % k)
            await c.propose("b", b"b%d" % k)
        leader = await c.leader_of("a")
        await c.until(lambda: isinstance(leader.transport._links[next(iter(
            leader.transport._links))].lanes[LANE_BULK].stream, tcp_lane.TcpStream))
        await c.until(lambda: all(len(c.sms[n]["a"].entries) == 30 for n in c.nodes))
        old = leader.node_id
        await c.stop(old)
        await c.propose("a", b"after")
        await c.start(old, ["a", "b"])
        await c.until(lambda: all(c.sms[n]["a"].datas()[-1:] == [b"after"] for n in c.nodes))
        assert all(c.sms[n]["a"].datas() == [b"a%d" % k for k in range(30)] + [b"after"]
                   for n in c.nodes)
    finally:
        await c.close()


def _cluster_auth(**kw):
    """The cluster port's own rule (node/cluster/security.py) and credential text."""
    from node.cluster.security import Authorizer, credentials_text
    from node.options import ClusterOptions

    return Authorizer(ClusterOptions(**kw)).allows, credentials_text(
        kw.get("user"), kw.get("password"), kw.get("token"))


@pytest.mark.parametrize("conf", [dict(token="s3cret"), dict(user="ruser", password="pw")])
async def test_direct_lane_refuses_a_peer_without_the_cluster_secret(conf):
    allows, cred = _cluster_auth(**conf)
    peers, direct = _addrs((1, 2, 3)), _addrs((1, 2, 3))
    inboxes = {i: Inbox() for i in (1, 2, 3)}
    # Node 1 (the lowest id: it dials both others) knows the addresses, not the secret.
    # Its fallback is off: these gRPC ports have no interceptor (in a cluster they
    # refuse it too, tests/cluster/test_security.py), and this test is about the lane.
    creds = {1: None, 2: cred, 3: cred}
    ts = {i: GrpcTransport(i, peers[i], peers, inboxes[i], direct=direct, direct_cred=creds[i],
                           direct_allows=allows, direct_fallback=i != 1) for i in (1, 2, 3)}
    try:
        for t in ts.values():
            await t.start()
        await until(lambda: ts[2].lanes_up(3) == 2, timeout=20)
        await until(lambda: ts[2].direct_refused >= 2 and ts[3].direct_refused >= 2, timeout=20)
        ts[2].send_now([_app(2, 3, 1)])
        await until(lambda: len(inboxes[3].msgs) == 1)
        assert ts[1].lanes_up(2) == 0 and ts[1].lanes_up(3) == 0
        ts[1].send_now([_app(1, 2, 1), _app(1, 3, 1)])
        # A hand-made dialer: wrong or missing secrets, a valid hello behind them;
        # the right one too when sent raw (the lanes only take a proof of it).
        for wrong in (None, "", "token nope", "user ruser:nope", "user other:pw", "s3cret", cred):
            s = await tcp_lane.dial(direct[2], None, None, 1 << 20, wrong)
            await s.write(tcp_lane.pb.Batch(from_node=3, to_node=2, hello=True))
            await s.write(encode_batch(3, 2, [_app(3, 2, 2)]))
            assert await s.read() is grpc.aio.EOF
            s.cancel()
        # The proof of the right secret is let in.
        s = await proven_dial(direct[2], cred, 3, 2)
        await s.write(tcp_lane.pb.Batch(from_node=3, to_node=2, hello=True))
        assert (await s.read()).hello
        s.cancel()
        await asyncio.sleep(0.2)
        assert not inboxes[2].msgs and [m.frm for m in inboxes[3].msgs] == [2]
    finally:
        for t in ts.values():
            await t.stop()


async def test_direct_lane_bounds_what_an_unauthenticated_dialer_can_hold():
    allows, cred = _cluster_auth(token="s3cret")
    peers, direct = _addrs((1, 2)), _addrs((1, 2))
    b = GrpcTransport(2, peers[2], peers, Inbox(), direct=direct, direct_cred=cred,
                      direct_allows=allows)
    try:
        await b.start()
        host, port = tcp_lane.split_addr(direct[2])
        from raft import transport_grpc

        # A first frame past AUTH_MAX_FRAME: closed on its header (not after
        # the handshake timeout, not after buffering what the frame claims).
        r, w = await asyncio.open_connection(host, port)
        w.write(tcp_lane.HEADER.pack(tcp_lane.AUTH_MAX_FRAME + 1) + b"x" * 100)
        async with asyncio.timeout(transport_grpc.HANDSHAKE_TIMEOUT / 2):
            assert await r.read() == b""
        w.close()
        # A member's proof gets in; a first frame that is no challenge does not.
        s = await proven_dial(direct[2], cred, 1, 2)
        await s.write(tcp_lane.pb.Batch(from_node=1, to_node=2, hello=True))
        assert (await s.read()).hello
        s.cancel()
        r, w = await asyncio.open_connection(host, port)
        w.write(tcp_lane.HEADER.pack(5) + b"hello")
        async with asyncio.timeout(5):
            assert await r.read() == b""
        w.close()
        # Connections that never finish their handshake: at most
        # DIRECT_HANDSHAKES_MAX are held; the rest are closed on arrival.
        held = [await asyncio.open_connection(host, port)
                for _ in range(transport_grpc.DIRECT_HANDSHAKES_MAX + 5)]
        async with asyncio.timeout(5):
            closed = await asyncio.gather(*(r.read() for r, _ in held[-5:]))
        assert closed == [b""] * 5
        assert b._direct_handshakes == transport_grpc.DIRECT_HANDSHAKES_MAX
        for _, w in held:
            w.close()
    finally:
        await b.stop()


async def test_direct_lane_reassembles_frames_split_and_joined_anywhere():
    """The lane's receive area (tcp_lane._Frames, a BufferedProtocol): frames of
    0 B to 3 MiB (past the usual area) written as one byte stream cut at
    arbitrary points, several frames per write and one frame over many, arrive
    whole and in order; a frame larger than the limit closes the connection."""
    import random
    import socket

    rng = random.Random(7)
    sizes = [0, 1, 3, 4, 5, 100, 65535, 65536, 65537, tcp_lane.RECV_AREA - 4,
             tcp_lane.RECV_AREA, tcp_lane.RECV_AREA + 1, 3 << 20, 7, 0]
    sizes += [rng.randrange(0, 2000) for _ in range(300)] + [rng.randrange(0, 600_000)
                                                              for _ in range(10)]
    frames = [rng.randbytes(n) for n in sizes]
    wire = b"".join(tcp_lane.HEADER.pack(len(f)) + f for f in frames)
    got: list[bytes] = []
    streams: list[tcp_lane.TcpStream] = []
    port = free_port()
    server = await tcp_lane.listen("127.0.0.1", port, None, 4 << 20, streams.append)
    try:
        sock = socket.create_connection(("127.0.0.1", port))
        await until(lambda: len(streams) == 1)
        streams[0].authorized()
        streams[0]._p.switch(got.append)
        pos = 0
        while pos < len(wire):  # cuts of 1 B .. 1 MiB, none aligned with frames on purpose
            step = rng.choice((1, 2, 3, 5, 4096, 70_000, 1 << 20))
            await asyncio.to_thread(sock.sendall, wire[pos:pos + step])
            pos += step
        await until(lambda: len(got) == len(frames), timeout=30)
        assert got == frames
        # One frame above the limit: the connection is closed on its header.
        sock.sendall(tcp_lane.HEADER.pack((4 << 20) + 1) + b"x" * 10)
        await asyncio.wait_for(streams[0]._p.closed, 10)
        sock.close()
    finally:
        server.close()


def test_direct_lane_finds_the_grpc_proxy_by_grpc_rules():
    addr = "10.1.2.3:4248"
    assert tcp_lane.proxy_for(addr, {}) is None
    assert tcp_lane.proxy_for(addr, {"grpc_proxy": "http://127.0.0.1:3128"}) == ("127.0.0.1", 3128)
    assert tcp_lane.proxy_for(addr, {"https_proxy": "http://p:1", "http_proxy": "http://q:2"}) \
        == ("p", 1)
    assert tcp_lane.proxy_for(addr, {"http_proxy": "http://u:pw@q:2/"}) == ("q", 2)
    assert tcp_lane.proxy_for(addr, {"grpc_proxy": "http://p:1", "no_proxy": "10.1.2.3"}) is None
    assert tcp_lane.proxy_for("n1.example.com:1", {"grpc_proxy": "http://p:1",
                                                   "no_grpc_proxy": "example.com"}) is None
    assert tcp_lane.proxy_for(addr, {"grpc_proxy": "http://p:1", "no_grpc_proxy": "x",
                                     "no_proxy": "*"}) == ("p", 1)  # no_grpc_proxy wins
    assert tcp_lane.proxy_for(addr, {"grpc_proxy": "http://p:1", "no_proxy": "*"}) is None


async def test_direct_lane_dials_through_the_proxy_and_a_cut_holds():
    """With `grpc_proxy` set the lane goes through the same CONNECT proxy as the
    gRPC lanes (the partition tests' netcut): it carries frames through a tunnel,
    a cut closes it, and a dial during the cut gets no answer until the heal."""

    net = NetCut(["a", "b"])
    port = free_port()
    net.port_of = {port: "b"}
    streams: list[tcp_lane.TcpStream] = []
    server = await tcp_lane.listen("127.0.0.1", port, None, 1 << 20, streams.append)
    proxy = ("127.0.0.1", net.egress["a"])
    addr = f"127.0.0.1:{port}"
    try:
        dialer = await asyncio.wait_for(tcp_lane.dial(addr, None, None, 1 << 20, "token t",
                                                      proxy=proxy), 10)
        await until(lambda: len(streams) == 1)
        assert await streams[0].read_auth() == "token t"
        assert net.counts["tunnels"] == 1
        net.cut("a")
        await asyncio.wait_for(streams[0]._p.closed, 10)  # the tunnel was closed
        with pytest.raises(TimeoutError):  # held: no CONNECT answer during the cut
            await asyncio.wait_for(tcp_lane.dial(addr, None, None, 1 << 20, proxy=proxy), 1.0)
        assert net.counts["refused"] >= 1 and len(streams) == 1
        net.heal()
        again = await asyncio.wait_for(tcp_lane.dial(addr, None, None, 1 << 20, proxy=proxy), 10)
        await until(lambda: len(streams) == 2)
        again.cancel()
        dialer.cancel()
    finally:
        server.close()
        net.stop()


class _Gate:
    """A firewall in front of a direct lane port: closed, it answers a connect
    with nothing (`hold`, a dropped SYN's timeout) or a close (a reset); open,
    it forwards to the lane. Closing it also cuts the connections it carries.
    `frozen`: a stalled middlebox, it stops forwarding on every connection without
    closing any (the sockets stay open, nothing crosses; TCP alone would not notice
    for minutes)."""

    frozen = False

    def __init__(self, target: int, hold: bool) -> None:
        self.target, self.hold, self.open = target, hold, False
        self.port = free_port()
        self.conns: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.conns.append(w)
        if not self.open:
            if not self.hold:
                w.close()
            return
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        self.conns.append(up_w)

        def frozen() -> bool:
            return self.frozen
        await asyncio.gather(_pipe(r, up_w, frozen), _pipe(up_r, w, frozen))

    def close_all(self) -> None:
        self.open = False
        for w in self.conns:
            w.close()
        self.conns.clear()

    def stop(self) -> None:
        self.close_all()
        if self.server is not None:
            self.server.close()


@pytest.mark.parametrize("hold", [False, True], ids=["reset", "silent"])
async def test_unreachable_direct_lane_falls_back_to_grpc_and_returns(hold: bool):
    """A peer whose lane port cannot be dialed (a firewall passing only the gRPC
    port) is reached over the gRPC lanes; once the port answers, a probe moves
    both lanes back to it; a lane lost again falls back again. Messages flow in
    every phase."""
    peers, direct = _addrs((1, 2)), _addrs((1, 2))
    gate = _Gate(tcp_lane.split_addr(direct[2])[1], hold)
    await gate.start()
    seen = dict(direct)
    seen[2] = f"127.0.0.1:{gate.port}"  # node 1 reaches node 2's lane only through the gate
    inboxes = {i: Inbox() for i in (1, 2)}
    ts = {1: GrpcTransport(1, peers[1], peers, inboxes[1], direct=seen, direct_retry_s=0.3),
          2: GrpcTransport(2, peers[2], peers, inboxes[2], direct=direct)}
    sent = 0

    async def flows() -> None:
        nonlocal sent
        sent += 1
        ts[1].send_now([_app(1, 2, sent)])
        ts[2].send_now([Message(MsgType.HEARTBEAT, "h", 2, 1, term=2, commit=sent)])
        await until(lambda: sum(m.type == MsgType.APP for m in inboxes[2].msgs) == sent
                    and sum(m.type == MsgType.HEARTBEAT for m in inboxes[1].msgs) == sent, 20)

    try:
        for t in ts.values():
            await t.start()
        await ts[1].wait_connected(30)
        assert ts[1].lane_kinds() == {2: ("grpc", "grpc")}
        assert ts[1].direct_fallbacks >= 1 and ts[1].direct_restored == 0
        await flows()
        await until(lambda: ts[1].direct_probes_failed >= 2, 20)  # probes of a shut gate
        assert ts[1].lane_kinds()[2] == ("grpc", "grpc")
        await flows()
        gate.open = True
        await until(lambda: ts[1].lane_kinds()[2] == ("direct", "direct"), 30)
        assert ts[1].direct_restored == 2
        await until(lambda: ts[2].lane_kinds()[1] == ("direct", "direct"), 10)
        await flows()
        gate.close_all()  # the lane dies and its port stops answering
        await until(lambda: ts[1].lane_kinds()[2] == ("grpc", "grpc"), 30)
        await flows()
        assert [m.entries[0].index for m in inboxes[2].msgs
                if m.type == MsgType.APP] == list(range(1, sent + 1))
    finally:
        for t in ts.values():
            await t.stop()
        gate.stop()


async def test_direct_lane_without_fallback_never_uses_grpc():
    """`direct_fallback=False` (`raft_lane: direct`): an unreachable lane is
    redialed, never replaced by gRPC."""
    peers, direct = _addrs((1, 2)), _addrs((1, 2))
    gate = _Gate(tcp_lane.split_addr(direct[2])[1], hold=False)
    await gate.start()
    seen = {**direct, 2: f"127.0.0.1:{gate.port}"}
    ts = {1: GrpcTransport(1, peers[1], peers, Inbox(), direct=seen, direct_fallback=False),
          2: GrpcTransport(2, peers[2], peers, Inbox(), direct=direct)}
    try:
        for t in ts.values():
            await t.start()
        await asyncio.sleep(1.5)
        assert ts[1].lane_kinds() == {2: ("down", "down")} and ts[1].direct_fallbacks == 0
        gate.open = True
        await until(lambda: ts[1].lane_kinds()[2] == ("direct", "direct"), 30)
    finally:
        for t in ts.values():
            await t.stop()
        gate.stop()


async def test_a_stalled_direct_lane_is_dropped_and_grpc_takes_over():
    """A direct lane that stops carrying anything while its sockets stay open (a
    stalled middlebox, a silent blackhole) is closed once it has read nothing for
    `direct_dead_s` (idle lanes carry an empty batch every `direct_ping_s`), so the
    link falls back to gRPC as a refused lane does, and returns once it moves again.
    Before: both ends kept the dead lane as "direct" (seen for 30 s, nothing delivered)."""
    peers, direct = _addrs((1, 2)), _addrs((1, 2))
    gate = _Gate(tcp_lane.split_addr(direct[2])[1], hold=False)
    gate.open = True
    await gate.start()
    seen = {**direct, 2: f"127.0.0.1:{gate.port}"}
    inboxes = {i: Inbox() for i in (1, 2)}
    kw = {"direct_retry_s": 0.3, "direct_ping_s": 0.3, "direct_dead_s": 2.5}
    ts = {1: GrpcTransport(1, peers[1], peers, inboxes[1], direct=seen, **kw),
          2: GrpcTransport(2, peers[2], peers, inboxes[2], direct=direct, **kw)}
    try:
        for t in ts.values():
            await t.start()
        await until(lambda: ts[1].lane_kinds()[2] == ("direct", "direct"), 30)
        await asyncio.sleep(3.0)  # idle longer than direct_dead_s, healthy: pings keep it up
        assert ts[1].lane_kinds()[2] == ("direct", "direct")
        assert ts[1].direct_stalled == ts[2].direct_stalled == 0
        gate.frozen = True
        await until(lambda: ts[1].lane_kinds()[2] == ("grpc", "grpc"), 30)
        await until(lambda: ts[2].lane_kinds()[1] == ("grpc", "grpc"), 30)
        ts[1].send_now([_app(1, 2, 1)])
        await until(lambda: any(m.type == MsgType.APP for m in inboxes[2].msgs), 10)
        gate.close_all()
        gate.frozen = False
        gate.open = True
        await until(lambda: ts[1].lane_kinds()[2] == ("direct", "direct"), 30)
    finally:
        for t in ts.values():
            await t.stop()
        gate.frozen = False
        gate.stop()

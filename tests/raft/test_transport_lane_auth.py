"""The direct lane's mutual proof of the cluster secret (raft/lane_auth.py, review
finding F4 of r3sync): the acceptor proves first, the secret never crosses the wire,
proofs cannot be replayed, reflected or relayed. Real sockets, real transports; the
squatter and the hand-made dialers are plain TCP peers that speak the frames."""

from __future__ import annotations

import asyncio
import os

import pytest

from raft import lane_auth, tcp_lane
from raft.codec import encode_batch
from raft.transport_grpc import GrpcTransport
from raft.types import Entry, Message, MsgType
from tests.ports import free_port
from tests.raft import test_mtls_identity
from tests.raft.test_mtls_identity import Inbox, tls, until

pytestmark = pytest.mark.timeout(120)

CRED = "token s3cret-lane"  # the cluster authorization text (credentials_text's form)
KEY = CRED.encode()
KNOWN_NONCE = b"N" * lane_auth.NONCE  # the squatter's "acceptor nonce"


def _addrs(ids) -> dict[int, str]:
    return {i: f"127.0.0.1:{free_port()}" for i in ids}


def _app(frm: int, to: int, index: int) -> Message:
    return Message(MsgType.APP, "g", frm, to, term=2, log_term=2, index=index - 1,
                   entries=[Entry(2, index, data=b"x")])


def _frame(data: bytes) -> bytes:
    return tcp_lane.HEADER.pack(len(data)) + data


class _Squatter:
    """A local process listening on a peer's stale lane port, without the secret.
    It records every byte a dialer sends it and, by `mode`: says nothing
    ("silent"), answers the challenge with a well-formed answer whose nonce it
    chose and whose proof it cannot make ("answers"), or relays both ways to
    `target` (a member's real lane: "relay")."""

    def __init__(self, mode: str, target: int = 0) -> None:
        self.mode, self.target = mode, target
        self.port = free_port()
        self.got: list[bytearray] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Future[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        got = bytearray()
        self.got.append(got)
        self.writers.append(w)
        up: asyncio.StreamWriter | None = None
        if self.mode == "relay":
            up_r, up = await asyncio.open_connection("127.0.0.1", self.target)
            self.writers.append(up)
            self.tasks.add(asyncio.ensure_future(self._back(up_r, w)))
        try:
            while data := await r.read(1 << 16):
                got += data
                if up is not None:
                    up.write(data)
                elif self.mode == "answers" and len(got) == 4 + lane_auth.CHALLENGE_SIZE:
                    w.write(_frame(lane_auth.ANSWER_MAGIC + KNOWN_NONCE + os.urandom(32)))
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()
            if up is not None:
                up.close()

    @staticmethod
    async def _back(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(1 << 16):
                w.write(data)
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    def stop(self) -> None:
        for w in self.writers:
            w.close()
        if self.server is not None:
            self.server.close()


@pytest.mark.parametrize("mode", ["silent", "answers", "relay-peer", "relay-self"])
async def test_a_squatter_on_a_stale_lane_port_learns_nothing_and_raft_uses_grpc(mode: str):
    """Node 1 believes node 2's lane is at a port a local process now holds (node 2
    restarted on a new ephemeral port, gossip not caught up). Whatever that process
    does, it receives one challenge per connection and nothing else: neither the
    secret nor a proof for the nonce it chose; a relay to node 2's real lane (or
    back to node 1's own) is refused there. Node 1 reaches node 2 over gRPC."""
    peers, direct = _addrs((1, 2)), _addrs((1, 2))
    target = {"relay-peer": direct[2], "relay-self": direct[1]}.get(mode, "x:0")
    squat = _Squatter(mode.split("-")[0], tcp_lane.split_addr(target)[1])
    await squat.start()
    seen = {**direct, 2: f"127.0.0.1:{squat.port}"}
    inboxes = {i: Inbox() for i in (1, 2)}
    ts = {1: GrpcTransport(1, peers[1], peers, inboxes[1], direct=seen, direct_cred=CRED,
                           direct_retry_s=0.3),
          2: GrpcTransport(2, peers[2], peers, inboxes[2], direct=direct, direct_cred=CRED)}
    try:
        for t in ts.values():
            await t.start()
        await until(lambda: ts[1].lane_kinds().get(2) == ("grpc", "grpc"), 30)
        ts[1].send_now([_app(1, 2, 1)])
        await until(lambda: len(inboxes[2].msgs) == 1)
        await until(lambda: len(squat.got) >= 3, 30)  # both lanes' dials and a probe
        if mode == "answers":
            assert ts[1].direct_refused >= 1  # the squatter's answer did not check out
        elif mode == "relay-peer":
            await until(lambda: ts[2].direct_refused >= 1)  # not its port: no answer
        elif mode == "relay-self":
            await until(lambda: ts[1].direct_refused >= 1)  # not its id: no answer
        assert ts[1].lane_kinds()[2] == ("grpc", "grpc") and ts[1].direct_fallbacks >= 1
    finally:
        for t in ts.values():
            await t.stop()
        squat.stop()
    assert squat.got
    for got in squat.got:
        data = bytes(got)
        assert KEY not in data and b"s3cret" not in data
        # Exactly (a prefix of) one challenge: no proof, no hello, no Raft batch.
        assert len(data) <= 4 + lane_auth.CHALLENGE_SIZE, data
        if len(data) < 4 + lane_auth.CHALLENGE_SIZE:
            continue
        ch = lane_auth.Challenge.parse(data[4:])
        assert ch is not None and (ch.dialer, ch.acceptor, ch.port) == (1, 2, squat.port)
        assert lane_auth.proof(KEY, ch, KNOWN_NONCE)[len(lane_auth.PROOF_MAGIC):] not in data


async def _dial(addr: str) -> tcp_lane.TcpStream:
    return await tcp_lane.dial(addr, None, None, 1 << 20, prove=True)


async def _rest(s: tcp_lane.TcpStream) -> list[bytes]:
    """Every further frame until the acceptor closes (bounded)."""
    out = []
    async with asyncio.timeout(10):
        while (f := await s.read_frame()) is not None:
            out.append(f)
    return out


async def proven_dial(addr: str, cred: str, frm: int, to: int) -> tcp_lane.TcpStream:
    """A hand-made member dialer: the whole proof, checked; the stream past it."""
    s = await _dial(addr)
    ch = lane_auth.Challenge(os.urandom(16), frm, to, tcp_lane.split_addr(addr)[1])
    s.write_frame(ch.frame())
    nonce = lane_auth.check_answer(cred.encode(), ch, await s.read_frame())
    assert nonce is not None
    s.write_frame(lane_auth.proof(cred.encode(), ch, nonce))
    s.authorized()
    return s


def _hello(frm: int, to: int) -> bytes:
    return tcp_lane.pb.Batch(from_node=frm, to_node=to, hello=True).SerializeToString()


@pytest.fixture
async def acceptor():
    """Node 2's transport alone (peers 1 and 3 known, neither running)."""
    peers, direct = _addrs((1, 2, 3)), _addrs((1, 2, 3))
    inbox = Inbox()
    t = GrpcTransport(2, peers[2], peers, inbox, direct=direct, direct_cred=CRED)
    await t.start()
    try:
        yield t, direct[2], inbox
    finally:
        await t.stop()


async def test_a_dialer_without_the_secret_is_refused_before_any_raft_frame(acceptor):
    t, addr, inbox = acceptor
    port = tcp_lane.split_addr(addr)[1]
    refused = t.direct_refused
    # Legacy authorization frames, the right raw secret included: never accepted
    # (no frame carries the secret); no answer, nothing read after them.
    for cred in (None, "token nope", CRED):
        s = await tcp_lane.dial(addr, None, None, 1 << 20, cred)
        await s.write(tcp_lane.pb.Batch(from_node=1, to_node=2, hello=True))
        await s.write(encode_batch(1, 2, [_app(1, 2, 1)]))
        assert await _rest(s) == []
    # A valid challenge answered; then a wrong proof, no proof, a proof of the
    # wrong size, each followed by a hello and an append: the answer is all it gets.
    for wrong in ("key", "none", "size"):
        s = await _dial(addr)
        ch = lane_auth.Challenge(os.urandom(16), 1, 2, port)
        s.write_frame(ch.frame())
        nonce = lane_auth.check_answer(KEY, ch, await s.read_frame())
        assert nonce is not None  # node 2 proved itself
        s.write_frame({"key": lane_auth.proof(b"token nope", ch, nonce), "none": _hello(1, 2),
                       "size": lane_auth.proof(KEY, ch, nonce)[:-1]}[wrong])
        s.write_frame(_hello(1, 2))
        s.write_frame(encode_batch(1, 2, [_app(1, 2, 1)]).SerializeToString())
        assert await _rest(s) == []
    await asyncio.sleep(0.1)
    assert not inbox.msgs and t.direct_refused == refused + 6 and t.lane_kinds()[1] == (
        "down", "down")


async def test_proofs_cannot_be_replayed_reflected_or_asked_for_another_node(acceptor):
    t, addr, _ = acceptor
    port = tcp_lane.split_addr(addr)[1]
    refused = t.direct_refused
    # A member's real handshake (node 1), recorded.
    s = await _dial(addr)
    ch = lane_auth.Challenge(os.urandom(16), 1, 2, port)
    s.write_frame(ch.frame())
    nonce = lane_auth.check_answer(KEY, ch, await s.read_frame())
    assert nonce is not None
    recorded = lane_auth.proof(KEY, ch, nonce)
    s.write_frame(recorded)
    s.write_frame(_hello(1, 2))
    assert tcp_lane.pb.Batch.FromString(await s.read_frame()).hello
    s.cancel()
    # Replay: the same challenge and the recorded proof on a new connection.
    s = await _dial(addr)
    s.write_frame(ch.frame())
    again = lane_auth.check_answer(KEY, ch, await s.read_frame())
    assert again is not None and again != nonce
    s.write_frame(recorded)
    s.write_frame(_hello(1, 2))
    assert await _rest(s) == []
    # Reflection: the acceptor's own proof sent back as the dialer's.
    s = await _dial(addr)
    ch = lane_auth.Challenge(os.urandom(16), 1, 2, port)
    s.write_frame(ch.frame())
    ans = await s.read_frame()
    s.write_frame(lane_auth.PROOF_MAGIC + ans[-lane_auth.MAC:])
    s.write_frame(_hello(1, 2))
    assert await _rest(s) == []
    # A right proof as node 3, then a hello claiming node 1.
    s = await _dial(addr)
    ch = lane_auth.Challenge(os.urandom(16), 3, 2, port)
    s.write_frame(ch.frame())
    s.write_frame(lane_auth.proof(KEY, ch, lane_auth.check_answer(KEY, ch, await s.read_frame())))
    s.write_frame(_hello(1, 2))
    assert await _rest(s) == []
    # Challenges node 2 does not answer at all: for another node, another port
    # (a squatter relaying a member's challenge), from an unknown node or itself.
    for frm, to, p in ((1, 3, port), (1, 2, port + 1), (99, 2, port), (2, 2, port)):
        s = await _dial(addr)
        s.write_frame(lane_auth.Challenge(os.urandom(16), frm, to, p).frame())
        assert await _rest(s) == []
    assert t.direct_refused == refused + 7


pki = test_mtls_identity.pki  # the module-scoped PKI fixture


async def test_the_proof_runs_inside_tls(pki):
    """With TLS the same proof runs inside the session: members get their lanes; a
    dialer with a valid member certificate but without the secret is refused."""
    peers, direct = _addrs((1, 2)), _addrs((1, 2))
    inbox = Inbox()
    ts = {i: GrpcTransport(i, peers[i], peers, inbox if i == 2 else Inbox(),
                           tls=tls(pki, f"node-{i}"), direct=direct, direct_cred=CRED)
          for i in (1, 2)}
    try:
        for t in ts.values():
            await t.start()
        await until(lambda: ts[1].lane_kinds().get(2) == ("direct", "direct"), 30)
        ts[1].send_now([_app(1, 2, 1)])
        await until(lambda: len(inbox.msgs) == 1)
        _, client = tcp_lane.contexts(*tls(pki, "node-1"))
        refused = ts[2].direct_refused
        s = await tcp_lane.dial(direct[2], client, "node-2", 1 << 20, prove=True)
        ch = lane_auth.Challenge(os.urandom(16), 1, 2, tcp_lane.split_addr(direct[2])[1])
        s.write_frame(ch.frame())
        nonce = lane_auth.check_answer(KEY, ch, await s.read_frame())
        assert nonce is not None
        s.write_frame(lane_auth.proof(b"token nope", ch, nonce))
        s.write_frame(_hello(1, 2))
        assert await _rest(s) == []
        assert ts[2].direct_refused == refused + 1 and len(inbox.msgs) == 1
    finally:
        for t in ts.values():
            await t.stop()

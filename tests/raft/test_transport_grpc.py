"""GrpcTransport on loopback: batching, ordering, reconnects, mTLS, chunked snapshots."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import time
from pathlib import Path

import grpc
import pytest

from proto import cluster_pb2 as pb
from proto import cluster_pb2_grpc as pb_grpc
from raft.codec import decode_batch, encode_batch, message_from_pb, message_to_pb
from raft.transport_grpc import GrpcTransport
from raft.types import ConfState, Entry, EntryType, Message, MsgType, Snapshot, SnapshotMeta
from tests import certs
from tests.ports import free_port

pytestmark = pytest.mark.timeout(90)


class Inbox:
    """Collects what a transport delivers; lets tests poll until a condition holds."""

    def __init__(self) -> None:
        self.calls: list[list[Message]] = []
        self.msgs: list[Message] = []
        self.times: list[float] = []

    def __call__(self, msgs: list[Message]) -> None:
        self.calls.append(msgs)
        self.msgs.extend(msgs)
        self.times.extend([time.monotonic()] * len(msgs))

    def of(self, kind: MsgType) -> list[Message]:
        return [m for m in self.msgs if m.type == kind]

    async def until(self, pred, timeout: float = 20.0) -> None:
        async with asyncio.timeout(timeout):
            while not pred():
                await asyncio.sleep(0.01)


def app(group: str, frm: int, to: int, index: int, data: bytes = b"d") -> Message:
    return Message(
        MsgType.APP, group, frm, to, term=3, log_term=3, index=index - 1, commit=index - 1,
        entries=[Entry(3, index, data=data)],
    )


def hb(group: str, frm: int, to: int, commit: int = 0) -> Message:
    return Message(MsgType.HEARTBEAT, group, frm, to, term=3, commit=commit)


async def cluster(n: int, tls=None, **kw) -> tuple[list[GrpcTransport], list[Inbox]]:
    ports = {i: free_port() for i in range(1, n + 1)}
    peers = {i: f"127.0.0.1:{p}" for i, p in ports.items()}
    inboxes = [Inbox() for _ in range(n)]
    ts = [
        GrpcTransport(i, peers[i], peers, inboxes[i - 1], tls=tls(i) if tls else None, **kw)
        for i in range(1, n + 1)
    ]
    for t in ts:
        await t.start()
    for t in ts:
        await t.wait_connected(20)
    return ts, inboxes


async def stop_all(ts: list[GrpcTransport]) -> None:
    for t in ts:
        await t.stop()


# ---- codec (pure) ---------------------------------------------------------------


def test_codec_roundtrip_and_heartbeat_coalescing():
    full = Message(
        MsgType.SNAP, "S-ORDERS", 1, 2, term=7, log_term=6, index=40, commit=39, reject=True,
        reject_hint=12, context=b"ctx", entries=[Entry(6, 41, data=b"\x00\xff")],
        snapshot=Snapshot(SnapshotMeta(40, 6, ConfState((1, 2, 3), (9,))), data=b"not sent"),
    )
    back = message_from_pb(pb.Message.FromString(message_to_pb(full).SerializeToString()))
    assert back.snapshot.data == b"" and back.snapshot.meta == full.snapshot.meta
    back.snapshot = full.snapshot
    assert back == full
    assert message_from_pb(message_to_pb(Message(MsgType.APP, "g"))).snapshot is None
    resp = Message(MsgType.HEARTBEAT_RESP, "b", 2, 1, term=3, context=b"r")
    odd = Message(MsgType.HEARTBEAT, "c", 1, 2, term=3, index=5)  # unusual: sent in full
    msgs = [app("a", 1, 2, 5), hb("a", 1, 2, 4), resp, odd]
    batch = pb.Batch.FromString(encode_batch(1, 2, msgs).SerializeToString())
    assert (len(batch.messages), len(batch.heartbeats), len(batch.heartbeat_resps)) == (2, 1, 1)
    assert sorted(map(repr, decode_batch(batch))) == sorted(map(repr, msgs))
    # Entry types survive the wire (a membership change must not arrive as data).
    mixed = Message(MsgType.APP, "m", 1, 2, term=4, index=9, entries=[
        Entry(4, 10, EntryType.CONF_CHANGE, b"cc"), Entry(4, 11, EntryType.NORMAL, b"d"),
        Entry(4, 12, EntryType.NORMAL, b"")])
    got = decode_batch(pb.Batch.FromString(encode_batch(1, 2, [mixed]).SerializeToString()))
    assert got == [mixed] and [type(e.type) for e in got[0].entries] == [EntryType] * 3


# ---- Raft stream ----------------------------------------------------------------------


async def test_many_groups_both_directions_and_coalescing():
    (a, b), (ia, ib) = await cluster(2)
    try:
        out = []
        for g in range(200):
            out += [app(f"S-{g}", 1, 2, 1), hb(f"S-{g}", 1, 2)]
        a.send(out[:150])
        a.send(out[150:])  # same loop turn: one Batch per lane
        await ib.until(lambda: len(ib.msgs) == 400)
        # Heartbeats on the priority stream, appends with entries on the bulk one.
        assert sorted(sorted({m.type for m in call}) for call in ib.calls) == [
            [MsgType.APP], [MsgType.HEARTBEAT]]
        assert {m.group for m in ib.of(MsgType.HEARTBEAT)} == {f"S-{g}" for g in range(200)}
        assert ib.of(MsgType.APP)[0].entries == [Entry(3, 1, data=b"d")]
        # the acceptor (node 2) answers over the same stream
        b.send([Message(MsgType.APP_RESP, f"S-{g}", 2, 1, term=3, index=1) for g in range(200)])
        await ia.until(lambda: len(ia.of(MsgType.APP_RESP)) == 200)
        assert not ia.of(MsgType.UNREACHABLE) and not ib.of(MsgType.UNREACHABLE)
    finally:
        await stop_all([a, b])


async def test_a_commit_append_rides_on_the_next_append_with_entries():
    """A leader's commit-index append (no entries, `send_lazy`) whose news an
    append with entries in the same flush carries (same group, commit at least
    as high) is left out: over two lanes it cost a second write per peer and
    commit. Another group's, or one with a higher commit, still goes."""
    (a, b), (ia, ib) = await cluster(2)
    try:
        def commit_only(group: str, commit: int) -> Message:
            return Message(MsgType.APP, group, 1, 2, term=3, log_term=3, index=4, commit=commit)
        a.send_lazy([commit_only("G", 4), commit_only("H", 4), commit_only("K", 6)])
        a.send([Message(MsgType.APP, "G", 1, 2, term=3, log_term=3, index=4, commit=4,
                        entries=[Entry(3, 5, data=b"d")]),
                Message(MsgType.APP, "K", 1, 2, term=3, log_term=3, index=4, commit=5,
                        entries=[Entry(3, 5, data=b"d")])])
        await ib.until(lambda: len(ib.msgs) == 4)
        await asyncio.sleep(0.05)  # nothing more comes
        got = sorted((m.group, len(m.entries), m.commit) for m in ib.msgs)
        assert got == [("G", 1, 4), ("H", 0, 4), ("K", 0, 6), ("K", 1, 5)]
    finally:
        await stop_all([a, b])


async def test_order_per_peer_pair_across_turns_three_nodes():
    ts, inboxes = await cluster(3)
    try:
        for turn in range(20):
            for t in ts:
                peers = [p for p in (1, 2, 3) if p != t.node_id]
                t.send([app("G", t.node_id, p, turn * 50 + i) for p in peers for i in range(1, 51)])
            await asyncio.sleep(0)
        for inbox in inboxes:
            await inbox.until(lambda inbox=inbox: len(inbox.msgs) == 2 * 1000)
        for t, inbox in zip(ts, inboxes, strict=True):
            for frm in (p for p in (1, 2, 3) if p != t.node_id):
                seen = [m.entries[0].index for m in inbox.msgs if m.frm == frm]
                assert seen == list(range(1, 1001))
    finally:
        await stop_all(ts)


async def test_unreachable_reported_when_peer_is_down():
    inbox = Inbox()
    dead = f"127.0.0.1:{free_port()}"
    t = GrpcTransport(1, f"127.0.0.1:{free_port()}", {2: dead}, inbox)
    await t.start()
    try:
        t.send([app("X", 1, 2, 1), hb("Y", 1, 2)])
        await inbox.until(lambda: len(inbox.of(MsgType.UNREACHABLE)) == 2)
        assert {(m.group, m.frm, m.to) for m in inbox.msgs} == {("X", 2, 1), ("Y", 2, 1)}
        assert not t.connected(2)
    finally:
        await t.stop()


@pytest.mark.parametrize("restart", [1, 2], ids=["dialer-restarts", "acceptor-restarts"])
async def test_reconnect_after_peer_restart(restart):
    ts, inboxes = await cluster(2)
    other = 3 - restart
    try:
        old = ts[restart - 1]
        await old.stop()
        survivor, s_inbox = ts[other - 1], inboxes[other - 1]
        # The bulk lane may notice the loss after the priority lane: an append
        # written into its dying stream would vanish without an UNREACHABLE.
        await s_inbox.until(lambda: survivor.lanes_up(restart) == 0)
        survivor.send([app("G", other, restart, 1)])
        await s_inbox.until(lambda: len(s_inbox.of(MsgType.UNREACHABLE)) == 1)
        inbox = Inbox()
        peers = {1: ts[0].listen_addr, 2: ts[1].listen_addr}
        new = GrpcTransport(restart, old.listen_addr, peers, inbox)
        ts[restart - 1] = new
        await new.start()
        await new.wait_connected(20)
        await s_inbox.until(lambda: survivor.connected(restart))
        survivor.send([app("G", other, restart, 2)])
        new.send([app("H", restart, other, 7)])
        await inbox.until(lambda: len(inbox.of(MsgType.APP)) == 1)
        await s_inbox.until(lambda: len(s_inbox.of(MsgType.APP)) == 1)
        assert inbox.msgs[0].entries[0].index == 2 and s_inbox.of(MsgType.APP)[0].group == "H"
    finally:
        await stop_all(ts)


async def test_liveness_beats():
    seen: list[int] = []
    ports = [free_port(), free_port()]
    peers = {1: f"127.0.0.1:{ports[0]}", 2: f"127.0.0.1:{ports[1]}"}
    a = GrpcTransport(1, peers[1], peers, Inbox())
    b = GrpcTransport(2, peers[2], peers, Inbox(), on_liveness=seen.append)
    await a.start()
    await b.start()
    try:
        await a.wait_connected(20)
        assert b.last_seen(1) == 0.0
        a.beat()
        async with asyncio.timeout(20):
            while not seen:
                await asyncio.sleep(0.01)
        assert seen == [1] and b.last_seen(1) > 0
    finally:
        await stop_all([a, b])


# ---- snapshots ------------------------------------------------------------------------


async def test_snapshot_streams_in_chunks_while_heartbeats_flow():
    size = 4 << 20
    blob = bytes(range(256)) * (size // 256)
    got = bytearray()
    chunks: list[int] = []
    spans: list[float] = []

    async def on_snapshot(msg: Message, data) -> bool:
        assert msg.snapshot.meta.index == 99 and msg.group == "BIG"
        spans.append(time.monotonic())
        async for piece in data:
            chunks.append(len(piece))
            got.extend(piece)
            await asyncio.sleep(0.01)  # a slow receiver: flow control must hold the sender
        spans.append(time.monotonic())
        return True

    async def source():
        for i in range(0, size, 100_000):  # odd-sized pieces get re-cut to 256 KiB
            yield blob[i : i + 100_000]

    (a, b), (_, ib) = await cluster(2, on_snapshot=on_snapshot)
    try:
        snap = Message(
            MsgType.SNAP, "BIG", 1, 2, term=5,
            snapshot=Snapshot(SnapshotMeta(99, 5, ConfState((1, 2)))),
        )
        transfer = asyncio.create_task(a.send_snapshot(snap, source()))
        n = 0
        while not transfer.done():
            n += 1
            a.send([hb(f"G-{n}", 1, 2, commit=n)])
            await asyncio.sleep(0.01)
        assert await transfer
        assert hashlib.sha256(got).digest() == hashlib.sha256(blob).digest()
        assert max(chunks) == 256 << 10 and len(chunks) == 16
        during = [t for t in ib.times if spans[0] < t < spans[1]]
        assert len(during) >= 5  # heartbeats kept arriving during the transfer
    finally:
        await stop_all([a, b])


async def test_snapshot_via_send_reports_status_and_rejection():
    async def on_snapshot(msg: Message, data) -> bool:
        async for _ in data:
            pass
        return msg.group == "OK"

    async def source(msg: Message):
        yield b"x" * 1000

    (a, b), (ia, _) = await cluster(2, on_snapshot=on_snapshot, snapshot_source=source)
    try:
        for g in ("OK", "NO"):
            a.send([Message(MsgType.SNAP, g, 1, 2, snapshot=Snapshot(SnapshotMeta(3, 1)))])
        await ia.until(lambda: len(ia.of(MsgType.SNAP_STATUS)) == 2)
        status = {m.group: m.reject for m in ia.of(MsgType.SNAP_STATUS)}
        assert status == {"OK": False, "NO": True}
    finally:
        await stop_all([a, b])


# ---- mutual TLS ---------------------------------------------------------------------


def _node_ext(name: str) -> str:
    node = f",DNS:node-{name[1:]}" if name[1:].isdigit() else ""  # n2 is node 2 (docs/raft.md)
    return (f"subjectAltName=IP:127.0.0.1,DNS:localhost{node}\n"
            "extendedKeyUsage=serverAuth,clientAuth\n")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    d = tmp_path_factory.mktemp("pki")
    certs.make_ca(d, "ca")
    certs.make_ca(d, "rogue-ca")
    for n in ("n1", "n2", "n3"):
        certs.make_leaf(d, n, _node_ext(n))
    certs.make_leaf(d, "rogue", _node_ext("rogue"), ca="rogue-ca")
    return d


async def test_mtls_cluster_works_and_foreign_certs_are_rejected(pki: Path):
    def tls(i: int):
        return (str(pki / f"n{i}.pem"), str(pki / f"n{i}.key"), str(pki / "ca.pem"))

    ts, inboxes = await cluster(3, tls=tls)
    try:
        ts[2].send([app("T", 3, 1, 1), app("T", 3, 2, 1)])
        await inboxes[0].until(lambda: len(inboxes[0].msgs) == 1)
        await inboxes[1].until(lambda: len(inboxes[1].msgs) == 1)
        target = ts[1].listen_addr
        rogue = grpc.ssl_channel_credentials(
            (pki / "ca.pem").read_bytes(),  # trusts our CA, but its own cert is foreign
            private_key=(pki / "rogue.key").read_bytes(),
            certificate_chain=(pki / "rogue.pem").read_bytes(),
        )
        no_cert = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes())
        for creds in (rogue, no_cert):
            async with grpc.aio.secure_channel(target, creds) as ch:
                call = pb_grpc.ClusterStub(ch).Raft(timeout=5)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call.write(pb.Batch(from_node=1, to_node=2, hello=True))
                    await call.read()
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.insecure_channel(target) as ch:  # plaintext is refused too
            with pytest.raises(grpc.aio.AioRpcError):
                call = pb_grpc.ClusterStub(ch).Raft(timeout=5)
                await call.write(pb.Batch(from_node=1, to_node=2, hello=True))
                await call.read()
        assert len(inboxes[1].msgs) == 1  # nothing from the impostors got through
    finally:
        await stop_all(ts)


async def test_snapshot_status_reported_when_peer_address_changes_mid_transfer():
    # A peer announcing a new address replaces its link: the old channels close
    # under an in-flight Snapshot call. The leader's progress for that peer
    # waits in SNAPSHOT state for this report; without it, it waits forever.
    started = asyncio.Event()

    async def on_snapshot(msg: Message, data) -> bool:
        async for _ in data:
            started.set()
        return True

    async def source(msg: Message):
        for _ in range(10_000):
            yield b"x" * 65536
            await asyncio.sleep(0.01)

    (a, b), (ia, _) = await cluster(2, on_snapshot=on_snapshot, snapshot_source=source)
    try:
        a.send([Message(MsgType.SNAP, "G", 1, 2, snapshot=Snapshot(SnapshotMeta(3, 1)))])
        async with asyncio.timeout(20):
            await started.wait()
        a.add_peer(2, f"127.0.0.1:{free_port()}")  # the old link goes, with its channels
        await ia.until(lambda: ia.of(MsgType.SNAP_STATUS), timeout=10)
        assert [m.reject for m in ia.of(MsgType.SNAP_STATUS)] == [True]
    finally:
        await stop_all([a, b])


async def test_snapshot_to_unknown_peer_reports_snapshot_failure():
    # UNREACHABLE alone leaves a SNAPSHOT-state progress paused (the core
    # only leaves REPLICATE on it): a SNAP that cannot go needs SNAP_STATUS.
    async def source(msg: Message):
        yield b"x"

    (a,), (ia,) = await cluster(1, snapshot_source=source)
    try:
        a.send([Message(MsgType.SNAP, "G", 1, 7, snapshot=Snapshot(SnapshotMeta(3, 1)))])
        await ia.until(lambda: ia.of(MsgType.SNAP_STATUS), timeout=5)
        st = ia.of(MsgType.SNAP_STATUS)
        assert [(m.frm, m.to, m.group, m.reject) for m in st] == [(7, 1, "G", True)]
    finally:
        await stop_all([a])


async def _snapshot_awaiting_its_ack() -> tuple[GrpcTransport, GrpcTransport, Inbox]:
    """Transports 1 and 2; a SNAP from 1 to 2 whose chunks 2 has all read while its
    install (and so the ack 1 awaits) stalls for 30 s."""
    consumed = asyncio.Event()

    async def on_snapshot(msg: Message, data) -> bool:
        async for _ in data:
            pass
        consumed.set()
        await asyncio.sleep(30)
        return True

    async def source(msg: Message):
        yield b"x" * 1000

    (a, b), (ia, _) = await cluster(2, on_snapshot=on_snapshot, snapshot_source=source)
    try:
        a.send([Message(MsgType.SNAP, "G", 1, 2, snapshot=Snapshot(SnapshotMeta(3, 1)))])
        async with asyncio.timeout(20):
            await consumed.wait()
    except BaseException:
        await stop_all([a, b])
        raise
    return a, b, ia


async def test_snapshot_status_reported_when_link_goes_while_awaiting_the_ack():
    # Awaiting a call whose channel was closed (the link replaced) raises
    # CancelledError in a task nobody cancelled: still a failure report.
    a, b, ia = await _snapshot_awaiting_its_ack()
    try:
        await asyncio.sleep(0.1)
        a.add_peer(2, f"127.0.0.1:{free_port()}")
        await ia.until(lambda: ia.of(MsgType.SNAP_STATUS), timeout=10)
        assert [m.reject for m in ia.of(MsgType.SNAP_STATUS)] == [True]
    finally:
        await stop_all([a, b])


async def test_stop_mid_snapshot_sends_no_report_and_ends_the_task():
    # stop() cancels the snapshot task: that cancellation must be honoured
    # (not turned into a failure report for a driver that is going away).
    a, b, ia = await _snapshot_awaiting_its_ack()
    try:
        tasks = set(a._tasks)
        await a.stop()
        await asyncio.sleep(0.3)  # a report scheduled by the stop would land now
        assert ia.of(MsgType.SNAP_STATUS) == []
        assert all(t.done() for t in tasks)
        assert any(t.cancelled() for t in tasks)  # the snapshot task honoured the cancel
    finally:
        await stop_all([b])


async def test_snapshot_report_comes_once_when_link_is_replaced():
    # Replacing the link closes the snapshot channel (one report); the new
    # link must not produce a second report for the same SNAP.
    a, b, ia = await _snapshot_awaiting_its_ack()
    try:
        a.add_peer(2, f"127.0.0.1:{free_port()}")
        a.remove_peer(2)
        await ia.until(lambda: ia.of(MsgType.SNAP_STATUS), timeout=10)
        await asyncio.sleep(0.5)
        assert [m.reject for m in ia.of(MsgType.SNAP_STATUS)] == [True]
    finally:
        await stop_all([a, b])

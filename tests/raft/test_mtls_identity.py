"""Node identity under mutual TLS: a peer is who its certificate says, not what it claims.

Convention (docs/raft.md "Transport"): node N's certificate carries `node-N` as a SAN DNS
entry. Every certificate here is signed by the one cluster CA, so TLS alone accepts them
all; only the identity binding can tell node 3's certificate from node 1's.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import grpc
import pytest

from proto import cluster_pb2 as pb
from proto import cluster_pb2_grpc as pb_grpc
from raft.codec import message_to_pb
from raft.transport_grpc import GrpcTransport
from raft.types import Entry, Message, MsgType, Snapshot, SnapshotMeta
from tests import certs
from tests.ports import free_port

pytestmark = pytest.mark.timeout(90)


def _node_ext(san: str) -> str:
    return f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    d = tmp_path_factory.mktemp("pki-identity")
    certs.make_ca(d, "ca")
    for i in (1, 2, 3):
        certs.make_leaf(d, f"node-{i}", _node_ext(f"DNS:node-{i}"))
    certs.make_leaf(d, "orders-a", _node_ext("DNS:orders-a"))  # for the configured-name case
    return d


def tls(pki: Path, name: str) -> tuple[str, str, str]:
    return str(pki / f"{name}.pem"), str(pki / f"{name}.key"), str(pki / "ca.pem")


class Inbox:
    def __init__(self) -> None:
        self.msgs: list[Message] = []

    def __call__(self, msgs: list[Message]) -> None:
        self.msgs.extend(m for m in msgs if m.type != MsgType.UNREACHABLE)


def app(frm: int, to: int) -> Message:
    return Message(MsgType.APP, "g", frm, to, term=2, log_term=2, index=0,
                   entries=[Entry(2, 1, data=b"x")])


async def until(pred, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.02)


async def test_matching_certificates_connect(pki: Path):
    peers = {1: f"127.0.0.1:{free_port()}", 2: f"127.0.0.1:{free_port()}"}
    inbox = Inbox()
    a = GrpcTransport(1, peers[1], peers, Inbox(), tls=tls(pki, "node-1"))
    b = GrpcTransport(2, peers[2], peers, inbox, tls=tls(pki, "node-2"))
    try:
        await a.start()
        await b.start()
        await a.wait_connected(20)
        a.send([app(1, 2)])
        await until(lambda: len(inbox.msgs) == 1)
    finally:
        await a.stop()
        await b.stop()


async def test_valid_certificate_of_another_node_is_rejected(pki: Path):
    """Node 2 waits for node 1; an impostor dials as node 1 with node 3's (valid) certificate."""
    peers = {1: f"127.0.0.1:{free_port()}", 2: f"127.0.0.1:{free_port()}"}
    inbox = Inbox()
    offered: list[Message] = []

    async def on_snapshot(header: Message, chunks) -> bool:
        offered.append(header)
        return True

    b = GrpcTransport(2, peers[2], peers, inbox, on_snapshot, tls=tls(pki, "node-2"))
    impostor = GrpcTransport(1, peers[1], peers, Inbox(), tls=tls(pki, "node-3"))
    try:
        await b.start()
        await impostor.start()
        # The same stream through raw gRPC shows why it never comes up.
        creds = grpc.ssl_channel_credentials(
            (pki / "ca.pem").read_bytes(), private_key=(pki / "node-3.key").read_bytes(),
            certificate_chain=(pki / "node-3.pem").read_bytes())
        options = [("grpc.ssl_target_name_override", "node-2")]
        async with grpc.aio.secure_channel(peers[2], creds, options=options) as ch:
            call = pb_grpc.ClusterStub(ch).Raft(timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.write(pb.Batch(from_node=1, to_node=2, hello=True))
                await call.read()
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "node-1" in (err.value.details() or "")
            # Snapshots are bound the same way.
            snap = pb_grpc.ClusterStub(ch).Snapshot(timeout=10)
            header = Message(MsgType.SNAP, "g", 1, 2, term=2,
                             snapshot=Snapshot(SnapshotMeta(5, 2)))
            await snap.write(pb.SnapshotChunk(header=message_to_pb(header)))
            await snap.write(pb.SnapshotChunk(offset=0, done=True))
            await snap.done_writing()
            ack = await snap
            assert not ack.ok and "certificate" in ack.error
            assert offered == []
        # Give the impostor's dial loop time for several attempts: none may attach.
        for _ in range(10):
            impostor.send([app(1, 2)])
            await asyncio.sleep(0.1)
        assert not b.connected(1) and not impostor.connected(2)
        assert inbox.msgs == []
    finally:
        await impostor.stop()
        await b.stop()


async def test_dialer_rejects_acceptor_with_another_nodes_certificate(pki: Path):
    """Node 1 dials node 2's address, but the listener there holds node 3's certificate."""
    peers = {1: f"127.0.0.1:{free_port()}", 2: f"127.0.0.1:{free_port()}"}
    inbox = Inbox()
    a = GrpcTransport(1, peers[1], peers, Inbox(), tls=tls(pki, "node-1"))
    fake = GrpcTransport(2, peers[2], peers, inbox, tls=tls(pki, "node-3"))
    try:
        await fake.start()
        await a.start()
        for _ in range(10):
            a.send([app(1, 2)])
            await asyncio.sleep(0.1)
        assert not a.connected(2) and not fake.connected(1)
        assert inbox.msgs == []
    finally:
        await a.stop()
        await fake.stop()


async def test_configured_names_replace_the_convention(pki: Path):
    peers = {1: f"127.0.0.1:{free_port()}", 2: f"127.0.0.1:{free_port()}"}
    names = {2: "orders-a"}
    inbox = Inbox()
    a = GrpcTransport(1, peers[1], peers, Inbox(), tls=tls(pki, "node-1"), tls_names=names)
    b = GrpcTransport(2, peers[2], peers, inbox, tls=tls(pki, "orders-a"), tls_names=names)
    try:
        await a.start()
        await b.start()
        await a.wait_connected(20)
        a.send([app(1, 2)])
        await until(lambda: len(inbox.msgs) == 1)
    finally:
        await a.stop()
        await b.stop()

"""The transport does not trust message contents (issue 6, defect 8).

A peer is who its hello, under mutual TLS bound to its certificate, proved:
a message claiming another sender is dropped, local-only message types
(STORAGE_APPEND_RESP, HUP, ...) and snapshots outside the Snapshot RPC are
dropped, and a message type this version does not know is dropped without
tearing down the stream (rolling upgrade)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from proto import cluster_pb2 as pb
from proto import cluster_pb2_grpc as pb_grpc
from raft.codec import decode_wire, encode_batch, message_to_pb
from raft.transport_grpc import GrpcTransport
from raft.types import LOCAL_MSG_TYPES, Entry, Message, MsgType, Snapshot, SnapshotMeta
from tests.ports import free_port
from tests.raft import test_mtls_identity
from tests.raft.test_mtls_identity import Inbox, tls, until

pytestmark = pytest.mark.timeout(90)
pki = test_mtls_identity.pki  # the module-scoped PKI fixture


def _app(frm: int, to: int, index: int = 1) -> Message:
    return Message(MsgType.APP, "g", frm, to, term=2, log_term=2, index=index - 1,
                   entries=[Entry(2, index, data=b"x")])


def test_codec_drops_local_and_unknown_types():
    local = [Message(t, "g", 3, 2, term=2, index=5) for t in sorted(LOCAL_MSG_TYPES)]
    batch = encode_batch(3, 2, [*local, _app(3, 2)])
    batch.messages.add(type=99, group="g", frm=3, to=2, term=2)  # from a newer version
    odd = batch.messages.add()
    message_to_pb(_app(3, 2, 2), odd)
    odd.entries[0].type = 7  # an entry type we do not know
    msgs, dropped = decode_wire(pb.Batch.FromString(batch.SerializeToString()))
    assert [m.type for m in msgs] == [MsgType.APP]
    assert dropped == len(local) + 2


async def test_forged_sender_local_and_unknown_types_are_dropped_stream_stays(pki: Path):
    peers = {i: f"127.0.0.1:{free_port()}" for i in (1, 2, 3)}
    inbox = Inbox()
    b = GrpcTransport(2, peers[2], peers, inbox, tls=tls(pki, "node-2"))
    creds = grpc.ssl_channel_credentials(
        (pki / "ca.pem").read_bytes(), private_key=(pki / "node-3.key").read_bytes(),
        certificate_chain=(pki / "node-3.pem").read_bytes())
    options = [("grpc.ssl_target_name_override", "node-2")]
    try:
        await b.start()
        async with grpc.aio.secure_channel(peers[2], creds, options=options) as ch:
            call = pb_grpc.ClusterStub(ch).Raft(timeout=20)
            await call.write(pb.Batch(from_node=3, to_node=2, hello=True))
            assert (await call.read()).hello  # node 3's certificate proves node 3
            forged_vote = Message(MsgType.VOTE, "g", 1, 2, term=9, index=100, log_term=9)
            snap = Message(MsgType.SNAP, "g", 3, 2, term=2, snapshot=Snapshot(SnapshotMeta(9, 2)))
            fsynced = Message(MsgType.STORAGE_APPEND_RESP, "g", 3, 2, term=2, index=5)
            batch = encode_batch(3, 2, [forged_vote, snap, fsynced, _app(3, 2)])
            batch.messages.add(type=99, group="g", frm=3, to=2, term=2)
            await call.write(batch)
            # A whole batch whose header claims node 1 is dropped too.
            await call.write(encode_batch(1, 2, [_app(1, 2)]))
            # The stream survived the unknown type: a later batch still arrives.
            await call.write(encode_batch(3, 2, [_app(3, 2, 2)]))
            await until(lambda: len(inbox.msgs) >= 2)
            await asyncio.sleep(0.2)
            assert [(m.type, m.frm, m.entries[0].index) for m in inbox.msgs] == [
                (MsgType.APP, 3, 1), (MsgType.APP, 3, 2)]
            assert b.dropped_in == 4 + 2  # vote, snap, local, unknown; batch of 1 + header
            await call.done_writing()
    finally:
        await b.stop()

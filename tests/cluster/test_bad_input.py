"""Bad input on the cluster port is refused or ignored; the node keeps
routing. Talks raw gRPC to a real node process."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import grpc
import nats
import pytest

from node.cluster.local import LocalCluster
from proto import cluster_pb2 as pb
from proto import cluster_pb2_grpc as pb_grpc

FAKE = 0x1234_5678_9ABC


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("bad"), 1, name="bad", jetstream=False)
    try:
        c.start()
        yield c
    finally:
        c.stop()


async def _still_routes(c: LocalCluster) -> None:
    """The node still serves clients and its own pub/sub."""
    node = c.nodes[0]
    nc = await nats.connect(node.url, allow_reconnect=False)
    sub = await nc.subscribe("alive")
    await nc.publish("alive", b"yes")
    msg = await sub.next_msg(timeout=2)
    assert msg.data == b"yes"
    await nc.close()
    assert node.alive()


def _fake_member() -> pb.MemberInfo:
    # shutdown: the node records it but does not dial the made-up address.
    return pb.MemberInfo(peer_id=FAKE, name="fake", cluster_addr="127.0.0.1:9", version=1,
                         shutdown=True)


async def test_messages_before_hello_are_refused(one: LocalCluster) -> None:
    node = one.nodes[0]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{node.cluster_port}") as ch:
        call = pb_grpc.RouteStub(ch).Messages()
        await call.write(pb.RouteBatch(from_peer=999, ops=[pb.RouteOp(reset=True)]))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    await _still_routes(one)


async def test_malformed_ops_are_ignored(one: LocalCluster) -> None:
    node = one.nodes[0]
    watcher = await nats.connect(node.url, allow_reconnect=False)
    seen: list = []

    async def on_any(m):
        seen.append(m)

    await watcher.subscribe(">", cb=on_any)
    await watcher.flush()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{node.cluster_port}") as ch:
        stub = pb_grpc.RouteStub(ch)
        hello = await stub.Hello(pb.HelloMsg(cluster_name="bad", self=_fake_member()))
        assert hello.self.name == "n1" and not hello.error
        bad_ops = [
            pb.RouteOp(),  # no op at all
            pb.RouteOp(interest=pb.Interest(account="$G", subject="foo..bar", weight=1)),
            pb.RouteOp(interest=pb.Interest(account="$G", subject="", weight=1)),
            pb.RouteOp(interest=pb.Interest(account="", subject="x", weight=1)),
            pb.RouteOp(interest=pb.Interest(account="$G", subject="q", queue="a b", weight=3)),
            pb.RouteOp(interest=pb.Interest(account="$G", subject="gone", weight=0)),
            pb.RouteOp(interest=pb.Interest(account="$G", subject="big", queue="q",
                                            weight=2**32 - 1)),
            pb.RouteOp(msg=pb.RouteMsg(account="nope", subject="alive", payload=b"x")),
            pb.RouteOp(msg=pb.RouteMsg(account="$G", subject="", payload=b"x")),
            pb.RouteOp(msg=pb.RouteMsg(account="$G", subject="a b", payload=b"x")),
            pb.RouteOp(msg=pb.RouteMsg(account="$G", subject=">", queues=["nope"] * 100)),
            pb.RouteOp(msg=pb.RouteMsg(account="$G", subject="h", has_headers=True,
                                       headers=b"\x00garbage")),
        ]
        call = stub.Messages()
        await call.write(pb.RouteBatch(from_peer=FAKE, ops=bad_ops))
        await call.write(pb.RouteBatch(from_peer=FAKE + 1, ops=[pb.RouteOp(reset=True)]))
        await asyncio.sleep(0.2)
        await call.done_writing()
        await call
        # A client that sees everything got only well-formed messages.
        await watcher.flush()
        assert watcher.is_connected
        assert all(" " not in m.subject and m.subject for m in seen)
        assert [m.subject for m in seen if m.subject in ("h", "a b", "alive")] == []
        await watcher.close()
        # Gossip that claims to be the node itself, or has no id, changes nothing.
        me = pb.MemberInfo(peer_id=hello.self.peer_id, name="impostor", version=2**63,
                           cluster_addr="127.0.0.1:1")
        reply = await stub.Gossip(pb.GossipMsg(members=[me, pb.MemberInfo()]))
        assert [m.name for m in reply.members if m.peer_id == hello.self.peer_id] == ["n1"]
        # Requests for nothing, or for another node, get an error reply.
        r = await stub.Request(pb.NodeRequest(from_peer=FAKE, to_peer=hello.self.peer_id,
                                              kind="no.such.kind"))
        assert "no handler" in r.error
        r = await stub.Request(pb.NodeRequest(from_peer=FAKE, to_peer=1, kind="x"))
        assert "wrong node" in r.error
        # A Prove for an address that is not this node's gets no proof.
        p = await stub.Prove(pb.ProveMsg(nonce=b"n" * 16, addr="10.0.0.1:4248"))
        assert p.proof == b""
    await _still_routes(one)


async def test_garbage_bytes_on_the_cluster_port(one: LocalCluster) -> None:
    node = one.nodes[0]
    for junk in (b"CONNECT {}\r\nPING\r\n", b"\x00" * 4096, b"GET / HTTP/1.1\r\n\r\n",
                 b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 100):
        with socket.create_connection(("127.0.0.1", node.cluster_port), timeout=2) as s:
            s.sendall(junk)
            try:
                s.recv(1024)
            except (TimeoutError, ConnectionResetError):
                pass
    await _still_routes(one)

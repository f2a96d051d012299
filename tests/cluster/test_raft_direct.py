"""Raft's direct TCP lane inside a real cluster (`cluster { raft_port: 0 }`), behind
the cluster port's authorization and TLS. Real node processes, real sockets."""

from __future__ import annotations

import asyncio
import re
import ssl
from pathlib import Path

import nats
import psutil
import pytest

from node.cluster.local import LocalCluster
from raft import tcp_lane
from tests import certs
from tests.cluster.jshelp import JsCluster
from tests.cluster.test_security import AUTH, _tls_block

_LANE = re.compile(r"Listening for Raft direct lanes on [^:]+:(\d+)")


def _lane_port(text: str) -> int:
    m = _LANE.search(text)
    assert m, text[-1500:]
    return int(m.group(1))


async def _refused(port: int, cred: str | None) -> bool:
    s = await tcp_lane.dial(f"127.0.0.1:{port}", None, None, 1 << 20, cred)
    await s.write(tcp_lane.pb.Batch(from_node=1, to_node=2, hello=True))
    try:
        async with asyncio.timeout(10):
            return await s.read() is tcp_lane.grpc.aio.EOF
    finally:
        s.cancel()


async def test_r3_stream_commits_over_authorized_direct_lanes(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, 3, name="dl", jetstream=True,
                     cluster_extra=AUTH + "\n  raft_port: 0")
    try:
        c.start()
        c.wait_routes()
        JsCluster.wait_js(c)  # type: ignore[arg-type]  # uses only .nodes
        ports = [_lane_port(n.log_text()) for n in c.nodes]
        nc = await nats.connect(c.nodes[0].url)
        js = nc.jetstream()
        await js.add_stream(name="DL", subjects=["dl.>"], num_replicas=3)
        for k in range(20):
            ack = await js.publish("dl.x", str(k).encode())
            assert ack.seq == k + 1
        await nc.close()
        # The members' Raft traffic runs on those listeners: each node holds an
        # established connection per lane (priority, bulk) and peer, dialed to a
        # peer's lane port or accepted on its own.
        # (A connection replaced by a redial after gossip may linger a moment.)
        for n, mine in zip(c.nodes, ports, strict=True):
            for _ in range(100):
                conns = psutil.Process(n.proc.pid).net_connections(kind="tcp")
                lanes = [x for x in conns if x.raddr and x.status == "ESTABLISHED"
                         and (x.laddr.port == mine or x.raddr.port in set(ports) - {mine})]
                if len(lanes) == 4:
                    break
                await asyncio.sleep(0.1)
            assert len(lanes) == 4, (n.name, ports, conns)
        # Without the cluster secret, with a wrong one, or with the right one sent
        # raw instead of the lane's proof (raft/lane_auth.py), a dialer is refused
        # before its hello is read; the node says why.
        for cred in (None, "user route:wrong", "token s3cret", "user route:s3cret"):
            assert await _refused(ports[0], cred)
        assert "refused a direct stream: cluster authorization failed" in c.nodes[0].log_text()
    finally:
        c.stop()


@pytest.mark.skipif(not certs.available(), reason="needs the openssl CLI")
async def test_direct_lanes_use_the_cluster_tls(tmp_path: Path) -> None:
    d = tmp_path / "pki"
    d.mkdir()
    certs.make_ca(d, "ca")
    certs.make_ca(d, "other")
    ext = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    for name in ("n1", "n2", "n3"):
        certs.make_leaf(d, name, ext)
    certs.make_leaf(d, "bad", ext, ca="other")
    c = LocalCluster(tmp_path / "c", 3, name="dlt", jetstream=True, cluster_extra="raft_port: 0")
    try:
        for node, cert in zip(c.nodes, ("n1", "n2", "n3"), strict=True):
            c.start_node(node, wait=False, config=c.config_for(node).replace(
                "routes:", _tls_block(d, cert) + "\n  routes:"))
        for node in c.nodes:
            c.wait_ready(node)
        c.wait_routes()
        JsCluster.wait_js(c)  # type: ignore[arg-type]
        port = _lane_port(c.nodes[0].log_text())
        nc = await nats.connect(c.nodes[1].url)
        js = nc.jetstream()
        await js.add_stream(name="DLT", subjects=["dlt"], num_replicas=3)
        assert (await js.publish("dlt", b"x")).seq == 1
        await nc.close()
        # Plain TCP, or a certificate of another CA: no TLS session, nothing read.
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            s = await tcp_lane.dial(f"127.0.0.1:{port}", None, None, 1 << 20, None)
            await s.write(tcp_lane.pb.Batch(from_node=1, to_node=2, hello=True))
            if await s.read() is tcp_lane.grpc.aio.EOF:
                raise ConnectionError("closed")
        _, client = tcp_lane.contexts(str(d / "bad.pem"), str(d / "bad.key"), str(d / "other.pem"))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            s = await tcp_lane.dial(f"127.0.0.1:{port}", client, "127.0.0.1", 1 << 20, None)
            await s.write(tcp_lane.pb.Batch(from_node=1, to_node=2, hello=True))
            if await s.read() is tcp_lane.grpc.aio.EOF:
                raise ConnectionError("closed")
        # Both ended in the TLS layer: the transport never saw a frame of theirs.
        assert "refused a direct stream" not in c.nodes[0].log_text()
    finally:
        c.stop()

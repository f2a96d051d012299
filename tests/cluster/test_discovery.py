"""Cluster discovery: nodes find each other through one seed, clients learn
every node from INFO connect_urls (and updates as nodes leave), fail over to
another node when theirs dies, and lame duck mode is announced."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections.abc import Iterator

import nats
import pytest

from node.cluster.local import LocalCluster, LocalNode


@pytest.fixture
def seeded(tmp_path) -> Iterator[LocalCluster]:
    """n2 and n3 are configured with n1 only: n2 <-> n3 comes from gossip."""
    c = LocalCluster(tmp_path, 3, name="disc", jetstream=False, routes_to="first")
    try:
        c.start()
        yield c
    finally:
        c.stop()


class RawClient:
    """A protocol-1 client that records every INFO the node sends."""

    def __init__(self, node: LocalNode) -> None:
        self.sock = socket.create_connection(("127.0.0.1", node.port), timeout=5)
        self.buf = b""
        self.infos: list[dict] = [self._next_info()]
        self.sock.sendall(b'CONNECT {"protocol":1,"verbose":false}\r\nPING\r\n')

    def _next_info(self, timeout: float = 5.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\r\n" in self.buf:
                line, self.buf = self.buf.split(b"\r\n", 1)
                if line.startswith(b"INFO "):
                    return json.loads(line[5:])
                if line == b"PING":
                    self.sock.sendall(b"PONG\r\n")
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            self.buf += data
        raise TimeoutError("no INFO")

    def wait_info(self, pred, timeout: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self._next_info(max(0.05, deadline - time.monotonic()))
            self.infos.append(info)
            if pred(info):
                return info
        raise TimeoutError(f"no matching INFO; last: {self.infos[-1]}")

    def close(self) -> None:
        self.sock.close()


def _hp(node: LocalNode) -> str:
    return f"127.0.0.1:{node.port}"


async def test_discovery_failover_and_info_updates(seeded: LocalCluster) -> None:
    n1, n2, n3 = seeded.nodes
    # Gossip linked the two nodes that were only told about n1.
    assert {r["remote_name"] for r in n2.get("/routez")["routes"]} == {"n1", "n3"}

    raw = RawClient(n1)
    assert raw.infos[0]["cluster"] == "disc"
    assert sorted(raw.infos[0]["connect_urls"]) == sorted(_hp(n) for n in seeded.nodes)

    reconnected = asyncio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    client = await nats.connect(servers=[n2.url], reconnect_time_wait=0.2,
                                max_reconnect_attempts=-1, reconnected_cb=on_reconnect,
                                connect_timeout=2)
    assert sorted(u.netloc for u in client.discovered_servers) == sorted([_hp(n1), _hp(n3)])
    got: list[bytes] = []

    async def cb(m):
        got.append(m.data)

    await client.subscribe("after.failover", cb=cb)
    await client.flush()

    seeded.stop_node(n2, signal.SIGKILL)
    await asyncio.wait_for(reconnected.wait(), 15)
    assert client.connected_url.netloc in (_hp(n1), _hp(n3))

    # Node n1 tells its clients that n2 is gone.
    info = raw.wait_info(lambda i: _hp(n2) not in i.get("connect_urls", []))
    assert sorted(info["connect_urls"]) == sorted([_hp(n1), _hp(n3)])

    pub = await nats.connect(n3.url, allow_reconnect=False)
    async with asyncio.timeout(10):
        while not got:
            await pub.publish("after.failover", b"hello")
            await pub.flush()
            await asyncio.sleep(0.05)
    assert set(got) == {b"hello"}

    # Lame duck: n3's clients are told (ldm), n1 drops n3 from connect_urls.
    raw3 = RawClient(n3)
    assert n3.proc is not None
    n3.proc.send_signal(signal.SIGUSR2)
    ldm = raw3.wait_info(lambda i: i.get("ldm") is True)
    assert ldm["ldm"] is True
    info = raw.wait_info(lambda i: _hp(n3) not in i.get("connect_urls", []))
    assert info["connect_urls"] == [_hp(n1)]
    for c in (client, pub):
        await c.close()
    raw.close()
    raw3.close()

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

    # n2 comes back: n1's clients learn its URL again (an INFO update on join).
    seeded.start_node(n2)
    info = raw.wait_info(lambda i: _hp(n2) in i.get("connect_urls", []))
    assert sorted(info["connect_urls"]) == sorted(_hp(n) for n in seeded.nodes)

    # Lame duck: n3's clients are told (ldm), n1 drops n3 from connect_urls.
    raw3 = RawClient(n3)
    assert n3.proc is not None
    n3.proc.send_signal(signal.SIGUSR2)
    ldm = raw3.wait_info(lambda i: i.get("ldm") is True)
    assert ldm["ldm"] is True
    info = raw.wait_info(lambda i: _hp(n3) not in i.get("connect_urls", []))
    assert sorted(info["connect_urls"]) == sorted([_hp(n1), _hp(n2)])
    for c in (client, pub):
        await c.close()
    raw.close()
    raw3.close()


async def test_five_nodes_from_one_seed_queue_group_exactly_once(tmp_path) -> None:
    c = LocalCluster(tmp_path, 5, name="five", jetstream=False, routes_to="first")
    try:
        c.start()  # waits for the full mesh: 4 routes on each node, found by gossip
        clients = [await nats.connect(n.url, allow_reconnect=False) for n in c.nodes]
        seen: list[bytes] = []
        plain: list[bytes] = []
        probes: list[str] = []  # apart: on a loaded machine some land after the test's

        async def on_q(m):
            if m.data == b"probe":
                probes.append("queue")
            else:
                seen.append(m.data)

        async def on_plain(m):
            if m.data == b"probe":
                probes.append("plain")
            else:
                plain.append(m.data)

        for cl in clients[1:]:
            await cl.subscribe("five.work", queue="g", cb=on_q)
        await clients[4].subscribe("five.work", cb=on_plain)
        for cl in clients:
            await cl.flush()
        async with asyncio.timeout(10):
            while "plain" not in probes:
                await clients[0].publish("five.work", b"probe")
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # most nodes' queue interest in place (any member will do)
        n = 400
        for i in range(n):
            await clients[0].publish("five.work", str(i).encode())
        await clients[0].flush()
        async with asyncio.timeout(15):
            while len(seen) < n or len(plain) < n:
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)
        assert sorted(seen) == sorted(str(i).encode() for i in range(n))  # each exactly once
        assert len(plain) == n
        for cl in clients:
            await cl.close()
    finally:
        c.stop()


def test_cluster_up_status_down_commands(tmp_path) -> None:
    import subprocess
    import sys

    from node.cluster.local import REPO_ROOT

    env = {"PYTHONPATH": REPO_ROOT, "PATH": "/usr/bin:/bin"}
    d = str(tmp_path / "lc")

    def jetraft(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "node.cli", "cluster", *args],
                              capture_output=True, text=True, timeout=60, env=env)

    up = jetraft("up", "-n", "3", "--no-js", "--detach", "--dir", d, "--tags", "az:1,az:2")
    try:
        assert up.returncode == 0, up.stderr
        assert "3 nodes up" in up.stdout and "tags=az:2" in up.stdout
        st = jetraft("status", "--dir", d)
        assert st.returncode == 0, st.stdout + st.stderr
        rows = [line.split() for line in st.stdout.splitlines()[1:]]
        assert [(r[0], r[1], r[3]) for r in rows] == [("n1", "yes", "2"), ("n2", "yes", "2"),
                                                       ("n3", "yes", "2")]
    finally:
        down = jetraft("down", "--dir", d)
    assert down.returncode == 0 and down.stdout.count("stopped") == 3
    time.sleep(1.0)
    st = jetraft("status", "--dir", d)
    assert st.returncode == 3 and st.stdout.count(" no ") == 3


def test_cluster_up_in_the_foreground_stops_on_ctrl_c(tmp_path) -> None:
    import json as _json
    import os
    import subprocess
    import sys

    from node.cluster.local import REPO_ROOT

    p = subprocess.Popen([sys.executable, "-m", "node.cli", "cluster", "up", "-n", "3", "--no-js",
                          "--dir", str(tmp_path)], stdout=subprocess.PIPE, text=True,
                         env={"PYTHONPATH": REPO_ROOT, "PATH": "/usr/bin:/bin"})
    try:
        assert p.stdout is not None
        lines = []
        for line in p.stdout:
            lines.append(line)
            if "Ctrl-C" in line:
                break
        pids = [n["pid"] for n in _json.loads((tmp_path / "cluster.json").read_text())["nodes"]]
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

"""A node that is not a member cannot join: cluster authorization and mutual
TLS on the cluster port. Settings Jetraft cannot enforce stop the node."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest

from node.cluster.local import REPO_ROOT, LocalCluster, LocalNode
from tests import certs

AUTH = "authorization { user: route, password: s3cret }"


def _routes(node: LocalNode) -> set[str]:
    return {r["remote_name"] for r in node.get("/routez")["routes"]}


async def _isolated(member: LocalNode, intruder: LocalNode) -> None:
    """Nothing published on the intruder reaches a member's subscriber, and the
    member's subscription interest never reaches the intruder."""
    sub = await nats.connect(member.url, allow_reconnect=False)
    pub = await nats.connect(intruder.url, allow_reconnect=False)
    got: list = []

    async def cb(m):
        got.append(m)

    await sub.subscribe("secret.>", cb=cb)
    await sub.flush()
    for _ in range(20):
        await pub.publish("secret.x", b"leak")
        await asyncio.sleep(0.05)
    await pub.flush()
    await asyncio.sleep(0.3)
    assert got == []
    await sub.close()
    await pub.close()


async def _routes_messages(a: LocalNode, b: LocalNode) -> None:
    """The members themselves route: a message from a reaches b's subscriber."""
    sub = await nats.connect(b.url, allow_reconnect=False)
    pub = await nats.connect(a.url, allow_reconnect=False)
    got: list = []

    async def cb(m):
        got.append(m.data)

    await sub.subscribe("members.ok", cb=cb)
    await sub.flush()
    async with asyncio.timeout(10):
        while not got:
            await pub.publish("members.ok", b"yes")
            await pub.flush()
            await asyncio.sleep(0.05)
    await sub.close()
    await pub.close()


def _refused(c: LocalCluster, members: list[LocalNode], intruder: LocalNode,
             marker: str) -> None:
    c.wait_routes(members)
    deadline = time.monotonic() + 2.0  # a few redial rounds of the intruder
    while time.monotonic() < deadline:
        for m in members:
            assert intruder.name not in _routes(m)
        assert _routes(intruder) == set()
        time.sleep(0.2)
    assert any(marker in m.log_text() for m in members), [m.log_text()[-800:] for m in members]


async def test_wrong_cluster_password_cannot_join(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, 4, name="sec", jetstream=False, cluster_extra=AUTH)
    n1, n2, bad, other = c.nodes
    try:
        c.start_node(n1)
        c.start_node(n2)
        c.start_node(bad, config=c.config_for(bad).replace("s3cret", "wrong"))
        # The right secret but another cluster's name: refused at Hello.
        c.start_node(other, config=c.config_for(other).replace("name: sec", "name: other"))
        # Members dial it (it is in their routes) but it cannot prove it knows the
        # secret, so they never send it theirs; it refuses them for the same reason.
        _refused(c, [n1, n2], bad, "is not a cluster member")
        assert "is not a cluster member" in bad.log_text()
        # ...and never offered it a credential to check (nor to steal).
        assert "authorization failed" not in bad.log_text()
        await _isolated(n1, bad)
        await _routes_messages(n1, n2)
        assert other.name not in _routes(n1) and _routes(other) == set()
        assert "does not match this node's 'sec': not joining" in n1.log_text()
    finally:
        c.stop()


async def test_no_credentials_cannot_join(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, 3, name="sec", jetstream=False, cluster_extra=AUTH)
    n1, n2, bad = c.nodes
    try:
        c.start_node(n1)
        c.start_node(n2)
        c.start_node(bad, config=c.config_for(bad).replace(AUTH, ""))
        _refused(c, [n1, n2], bad, "authorization failed")
        assert "refused by the peer (cluster authorization)" in bad.log_text()
        await _isolated(n2, bad)
    finally:
        c.stop()


def _tls_block(d: Path, name: str) -> str:
    return (f'tls {{ cert_file: "{d / name}.pem", key_file: "{d / name}.key", '
            f'ca_file: "{d / "ca"}.pem", verify: true }}')


@pytest.mark.skipif(not certs.available(), reason="needs the openssl CLI")
async def test_certificate_from_another_ca_cannot_join(tmp_path: Path) -> None:
    d = tmp_path / "pki"
    d.mkdir()
    certs.make_ca(d, "ca")
    certs.make_ca(d, "other")
    ext = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    for name in ("n1", "n2"):
        certs.make_leaf(d, name, ext)
    certs.make_leaf(d, "bad", ext, ca="other")
    c = LocalCluster(tmp_path / "c", 3, name="tls", jetstream=False)
    n1, n2, bad = c.nodes
    try:
        for node, cert in ((n1, "n1"), (n2, "n2")):
            c.start_node(node, config=c.config_for(node).replace(
                "routes:", _tls_block(d, cert) + "\n  routes:"))
        # The intruder trusts the members' CA, but its own certificate is not theirs.
        bad_block = _tls_block(d, "bad")
        c.start_node(bad, config=c.config_for(bad).replace("routes:", bad_block + "\n  routes:"))
        c.wait_routes([n1, n2])
        time.sleep(2.0)
        assert bad.name not in _routes(n1) and bad.name not in _routes(n2)
        assert _routes(bad) == set()
        assert n1.get("/varz")["cluster"]["tls_required"] is True
        await _isolated(n1, bad)
        await _routes_messages(n2, n1)
    finally:
        c.stop()


@pytest.mark.parametrize("block, why", [
    ("permissions { import: \">\" }", "cluster.permissions"),
    ("authorization { users: [{user: a, password: b}] }", "cluster.authorization.users"),
    ('tls { cert_file: "x.pem", key_file: "x.key" }', "ca_file"),
    ('authorization { user: r, password: "$2a$11$abcdefghijklmnopqrstuv" }', "bcrypt"),
    ('routes: ["http://127.0.0.1:1"]', "unsupported scheme"),
    ('routes: ["nats-route://127.0.0.1"]', "expected nats-route://host:port"),
])
def test_unenforceable_cluster_settings_stop_the_node(tmp_path: Path, block: str,
                                                      why: str) -> None:
    (tmp_path / "x.pem").write_text("not used: the missing CA stops the node first")
    (tmp_path / "x.key").write_text("")
    conf = tmp_path / "n.conf"
    conf.write_text(f"listen: 127.0.0.1:-1\ncluster {{ listen: 127.0.0.1:-1\n {block} }}\n")
    r = subprocess.run([sys.executable, "-m", "node.cli", "serve", "-c", str(conf)],
                       capture_output=True, text=True, timeout=30, cwd=tmp_path,
                       env={"PYTHONPATH": REPO_ROOT, "PATH": "/usr/bin:/bin"})
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "[FTL]" in out and why in out, out

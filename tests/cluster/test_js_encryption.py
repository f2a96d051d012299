"""Encryption at rest in a 3-node cluster (docs/jetstream.md, "Encryption at rest"): an R3
stream on nodes with `jetstream { key, cipher }`. A follower is stopped while the leader goes
on and compacts (snapshot every 20 entries), so on its return it catches up from the leader's
sealed snapshot image, which it re-seals under its own store keys. Every replica then serves
every message, and no marker is readable in any file of any node's store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.errors import NoRespondersError, TimeoutError

from node.cluster.local import LocalNode
from node.jetstream import crypt
from tests.cluster.jshelp import JsCluster, connect, until
from tests.cluster.test_js_faults import last_seq_here, replica_contents

KEY = "c1uster-at-rest-key-5e0f2a91b7c3d846"
MARK = "CLUSTER-PAYLOAD-MARKER-9X4"
DESC = "CLUSTER-DESC-MARKER-2H7"


class CryptCluster(JsCluster):
    def config_for(self, node: LocalNode) -> str:
        conf = super().config_for(node)
        store = json.dumps(str(node.dir / "data"))
        plain = f"jetstream {{ store_dir: {store} }}"
        assert plain in conf
        return conf.replace(plain, f"jetstream {{ store_dir: {store}, key: {json.dumps(KEY)}, "
                                   "cipher: aes }")


@pytest.fixture
def crypt3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CryptCluster]:
    monkeypatch.setenv("JETRAFT_JS_SNAPSHOT_EVERY", "20")  # inherited by the nodes
    c = CryptCluster(tmp_path / "c", 3)
    try:
        c.start()
        c.wait_js()
        yield c
    finally:
        c.stop()


async def _publish(node: LocalNode, lo: int, hi: int) -> None:
    """Each message acked once at its own seq. A stopped peer may have led the stream: until
    a new leader is elected a publish times out, so it is retried under the same Msg-Id
    (deduplicated: the ack names the first copy's seq)."""
    nc = await connect(node)
    js = nc.jetstream(timeout=10)
    for i in range(lo, hi):
        headers = {"X-M": MARK, "Nats-Msg-Id": f"m{i}"}
        for attempt in range(6):
            try:
                ack = await js.publish("k", f"{MARK}-{i}".encode(), headers=headers)
                break
            except (TimeoutError, NoRespondersError):
                if attempt == 5:
                    raise
        assert ack.seq == i + 1
    await nc.close()


@pytest.mark.timeout(600)  # the audit at the end runs Spark jobs (and may start the session)
async def test_r3_encrypted_replicas_catch_up_and_leak_nothing(crypt3: CryptCluster,
                                                               audit_spark: Any) -> None:
    nc = await connect(crypt3.nodes[0])
    js = nc.jetstream(timeout=10)
    await js.add_stream(name="K", subjects=["k"], num_replicas=3, allow_direct=True,
                        description=DESC)
    await _publish(crypt3.nodes[0], 0, 40)
    leader = (await js.stream_info("K")).cluster.leader
    await nc.close()
    follower = next(n for n in crypt3.nodes if n.name != leader)
    others = [n for n in crypt3.nodes if n is not follower]
    crypt3.stop_node(follower)
    await _publish(others[0], 40, 120)  # the leader compacts past the follower
    crypt3.start_node(follower)
    crypt3.wait_js()
    want = [f"{MARK}-{i}" for i in range(120)]
    for node in crypt3.nodes:
        await until(lambda node=node: _holds(node, 120), timeout=40)
        assert await replica_contents(node, 120) == want, node.name
    crypt3.stop()
    leaks = []
    for node in crypt3.nodes:
        assert (node.dir / "data" / crypt.KEY_FILE).exists()
        for path in (node.dir / "data").rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                leaks += [(str(path), m) for m in (MARK, DESC) if m.encode() in data]
    assert leaks == []
    _audit_with_key(audit_spark, crypt3, crypt3.nodes[0].dir.parent)


def _audit_with_key(spark: Any, cluster: CryptCluster, work: Path) -> None:
    """The audit with the key from a key file (what `jetraft audit --key-file` reads) over
    the three stopped stores: each node seals with its own data keys and nonces, so only
    payloads opened before hashing agree across nodes; zero violations expected. It runs in
    the cluster tests' shared Spark session (conftest `audit_spark`: no JVM start of its own;
    the command line with a key runs in tests/audit/test_audit_encrypted.py). Skipped
    without the audit extra or Java (`audit_spark` is None)."""
    if spark is None:
        return
    from audit.job import run
    from audit.keyring import Keyring, load_key
    from audit.report import build
    from tests.cluster.audithelp import assert_clean, live

    key_file = work / "audit.key"
    key_file.write_text(KEY + "\n")
    loaded = load_key(str(key_file), None, None)
    assert loaded is not None
    key, cipher, prev = loaded
    dirs = [str(n.dir / "data") for n in cluster.nodes]
    report = build(run(live(spark), dirs, keyring=Keyring(key, cipher, prev_key=prev)))
    assert_clean(report)
    assert len(report["stats"]["encrypted_nodes"]) == 3


async def _holds(node: LocalNode, seq: int) -> bool:
    return await last_seq_here(node) >= seq


class MixedKeyCluster(CryptCluster):
    """Node 3 has a key of its own: its store works, but it cannot open a peer's image."""

    def config_for(self, node: LocalNode) -> str:
        conf = super().config_for(node)
        return conf.replace(json.dumps(KEY), json.dumps(KEY + "-other")) \
            if node is self.nodes[2] else conf


async def test_a_node_with_another_key_fails_on_a_peers_image(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETRAFT_JS_SNAPSHOT_EVERY", "20")
    c = MixedKeyCluster(tmp_path / "c", 3)
    try:
        c.start()
        c.wait_js()
        odd = c.nodes[2]
        nc = await connect(c.nodes[0])
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="K", subjects=["k"], num_replicas=3, allow_direct=True)
        await _publish(c.nodes[0], 0, 10)
        await nc.close()
        c.stop_node(odd)
        await _publish(c.nodes[0], 10, 90)  # compacted past the odd node: it needs an image
        c.start_node(odd, wait=False)
        # The sealed image does not open under its key: it stops (fail-stop), never
        # serving the stream from a half-installed or unreadable state.
        await until(lambda: not odd.alive() or "SealError" in odd.log_text(), timeout=60)
        assert "SealError" in odd.log_text(), odd.log_text()[-3000:]
        for node in c.nodes[:2]:  # the two with the shared key go on
            assert await replica_contents(node, 90) == [f"{MARK}-{i}" for i in range(90)]
    finally:
        c.stop()


NEW = "c1uster-rotated-key-0a7d3e58c9f21b64"


class RotatingCluster(CryptCluster):
    """Each node's (key, prev_key) is set per node: a rolling key rotation."""

    keys: dict[str, tuple[str, str | None]]

    def config_for(self, node: LocalNode) -> str:
        conf = super().config_for(node)
        key, prev = getattr(self, "keys", {}).get(node.name, (KEY, None))
        extra = f", prev_key: {json.dumps(prev)}" if prev else ""
        return conf.replace(f"key: {json.dumps(KEY)}", f"key: {json.dumps(key)}{extra}")


async def test_a_rolling_key_rotation_keeps_the_cluster_serving(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes rotated one at a time (`key: NEW, prev_key: KEY`) while the others still run
    under KEY, the stream published to in between. The last node to rotate is the one the
    leader compacts past: it catches up from a peer's sealed image after its rotation, so
    the image's key (the stores' shared secret) outlives the configured key. At the end every
    replica serves every message, and each store opens with NEW and no longer with KEY."""
    monkeypatch.setenv("JETRAFT_JS_SNAPSHOT_EVERY", "20")
    c = RotatingCluster(tmp_path / "c", 3)
    c.keys = {}
    try:
        c.start()
        c.wait_js()
        nc = await connect(c.nodes[0])
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="K", subjects=["k"], num_replicas=3, allow_direct=True)
        await nc.close()
        await _publish(c.nodes[0], 0, 20)
        total = 20
        for node in c.nodes:
            c.stop_node(node)
            other = next(n for n in c.nodes if n is not node)
            await _publish(other, total, total + 40)  # compacts past the stopped node
            total += 40
            c.keys[node.name] = (NEW, KEY)
            c.start_node(node)
            c.wait_js()
            assert "re-wrapped under the new jetstream.key" in node.log_text(), node.name
        want = [f"{MARK}-{i}" for i in range(total)]
        for node in c.nodes:
            await until(lambda node=node: _holds(node, total), timeout=40)
            assert await replica_contents(node, total) == want, node.name
    finally:
        c.stop()
    for node in c.nodes:
        store = str(node.dir / "data")
        assert crypt.open_readonly(store, NEW).cipher == "aes"
        with pytest.raises(crypt.KeyFileError, match="wrong key"):
            crypt.open_readonly(store, KEY)

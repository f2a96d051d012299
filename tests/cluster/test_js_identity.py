"""A node whose data directory was wiped must not rejoin under its old identity with a
forgotten vote. Put back only its identity file: it refuses to start ([FTL]). Without it: a
new peer id; the meta leader removes the old id and gives its replicas to the new peer,
which catches up (every message of the R3 stream on its own store)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from typing import Any

import pytest
from nats.js.errors import ServiceUnavailableError

from tests.cluster.jshelp import JsCluster, connect, until
from tests.cluster.test_js_faults import audit_after, last_seq_here, replica_contents


@pytest.mark.timeout(600)  # the audit at the end runs Spark jobs
async def test_wiped_node_rejoins_only_as_a_new_peer(js3: JsCluster, audit_spark,
                                                     tmp_path) -> None:
    n1, _, n3 = js3.nodes
    nc = await connect(n1)
    js = nc.jetstream(timeout=10)
    await js.add_stream(name="W", subjects=["w"], num_replicas=3, allow_direct=True)
    for i in range(100):
        await js.publish("w", f"m{i:03d}".encode())
    old_peer = n3.get("/jsz")["meta_cluster"]["peer"]
    identity = (n3.dir / "data" / "cluster" / "identity").read_bytes()
    js3.stop_node(n3)
    shutil.rmtree(n3.dir / "data")
    # 1. The old identity with no Raft state: refused.
    (n3.dir / "data" / "cluster").mkdir(parents=True)
    (n3.dir / "data" / "cluster" / "identity").write_bytes(identity)
    js3.start_node(n3, wait=False)
    assert n3.proc is not None
    deadline = time.monotonic() + 30
    while n3.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert n3.proc.poll() is not None, "a node with a forgotten vote rejoined"
    assert "refusing to rejoin under the old identity" in n3.log_text()
    # 2. Wiped for real: a new peer, the old one removed, its replica moved to the new one.
    shutil.rmtree(n3.dir / "data")
    js3.start_node(n3)
    js3.wait_js()
    new_peer = n3.get("/jsz")["meta_cluster"]["peer"]
    assert new_peer != old_peer
    await until(lambda: n1.get("/jsz")["meta_cluster"].get("cluster_size") == 3, timeout=30)

    async def moved() -> bool:
        try:
            info = await js.stream_info("W")
        except ServiceUnavailableError:
            return False  # 10008 while the replica set changes: asked again
        names = {info.cluster.leader, *(r.name for r in info.cluster.replicas or [])}
        return names == {"n1", "n2", "n3"} and all(r.current for r in info.cluster.replicas)
    await until(moved, timeout=60)
    await until(lambda: _holds(n3, 100), timeout=30)
    assert await replica_contents(n3, 100, "W") == [f"m{i:03d}" for i in range(100)]
    assert (await js.publish("w", b"after")).seq == 101
    # 3. Wiped twice in a row (the second time before it could catch up): the stream keeps
    # a leader and ends with three current replicas holding everything.
    for _ in range(2):
        js3.stop_node(n3, sig=signal.SIGKILL)
        shutil.rmtree(n3.dir / "data")
        js3.start_node(n3)
        await asyncio.sleep(0.5)
    js3.wait_js()
    await until(moved, timeout=60)
    assert (await js.publish("w", b"again")).seq == 102
    await until(lambda: _holds(n3, 102), timeout=30)
    assert (await replica_contents(n3, 102, "W"))[100:] == ["after", "again"]
    await nc.close()
    # The audit over every node's data (n3's is its third life: a new peer, caught up by
    # snapshot): no violation, every acked message committed once at its seq.
    acked = [("W", f"m{i:03d}", i + 1) for i in range(100)] + [("W", "after", 101),
                                                               ("W", "again", 102)]
    audit_after(audit_spark, js3, acked, tmp_path)


async def _holds(node: Any, seq: int) -> bool:
    try:
        return await last_seq_here(node, "W", "w") >= seq
    except Exception:  # noqa: BLE001 (503 while the new replica opens its group)
        return False

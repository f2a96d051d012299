"""Scaling a stream R1 -> R3 -> R1 on stream update while a publisher keeps publishing; the
replicas added later catch up from their leader; peer removal moves a replica. The checker:
every acknowledged message is on every final replica, once, at its acknowledged sequence."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import pytest

from tests.cluster.jshelp import JsCluster, api, connect, errors_in_logs, until
from tests.cluster.test_js_faults import last_seq_here, publisher, replica_contents


async def _replicas(js: Any, want: int) -> Any:
    info = await js.stream_info("K")
    reps = info.cluster.replicas or []
    if len(reps) == want - 1 and all(r.current for r in reps):
        return info
    return None


async def test_scale_r1_r3_r1_under_load_and_peer_remove(js3: JsCluster) -> None:
    nc = await connect(js3.nodes[0])
    js = nc.jetstream(timeout=10)
    info = await js.add_stream(name="K", subjects=["k"], num_replicas=1, allow_direct=True)
    assert not info.cluster.replicas
    acked: list[tuple[str, int]] = []
    pub = await connect(js3.nodes[1])
    task = asyncio.ensure_future(publisher(pub, 1, 400, acked, asyncio.Event()))
    await until(lambda: len(acked) > 50)
    cfg = info.config
    cfg.num_replicas = 3
    up = await js.update_stream(cfg)
    assert up.config.num_replicas == 3
    full = await until(lambda: _replicas(js, 3), timeout=30)
    hosts = {full.cluster.leader, *(r.name for r in full.cluster.replicas)}
    assert hosts == {"n1", "n2", "n3"}
    await until(lambda: len(acked) > 200, timeout=60)
    # Peer removal: a follower's replica goes; with 3 nodes there is nowhere to move it,
    # so the stream runs on the two left (nats-server does the same without a spare node).
    victim = full.cluster.replicas[0].name
    r = await api(nc, "STREAM.PEER.REMOVE.K", {"peer": victim})
    assert r == {"type": "io.nats.jetstream.api.v1.stream_remove_peer_response",
                 "success": True}
    await until(lambda: _replicas(js, 2), timeout=30)
    cfg.num_replicas = 1
    down = await js.update_stream(cfg)
    assert down.config.num_replicas == 1
    final = await until(lambda: _replicas(js, 1), timeout=30)
    await asyncio.wait_for(task, 120)
    await pub.close()
    top = max(seq for _, seq in acked)
    node = next(n for n in js3.nodes if n.name == final.cluster.leader)
    assert await last_seq_here(node) == top
    stored = await replica_contents(node, top)
    position = {d: i + 1 for i, d in enumerate(stored)}
    assert len(position) == len(stored)
    assert all(position.get(d) == seq for d, seq in acked)
    # The other nodes let go of the group.
    await until(lambda: all(len([g for g in n.get("/jsz?raft=1")["raft"] if g != "$js"]) ==
                            (1 if n is node else 0) for n in js3.nodes), timeout=30)
    await nc.close()
    assert errors_in_logs(js3) == []


async def test_catch_up_by_snapshot_after_compaction(tmp_path: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With compaction every 50 entries, members added by scaling R1 -> R3 and a member killed
    (kill -9) while the leader compacted can only catch up from the leader's snapshot image;
    afterwards every replica holds every acknowledged message."""
    monkeypatch.setenv("JETRAFT_JS_SNAPSHOT_EVERY", "50")
    c = JsCluster(tmp_path / "c", 3)
    try:
        c.start()
        c.wait_js()
        nc = await connect(c.nodes[0])
        js = nc.jetstream(timeout=10)
        info = await js.add_stream(name="K", subjects=["k"], num_replicas=1, allow_direct=True)
        await js.add_consumer("K", durable_name="d", ack_policy="explicit")
        for i in range(200):
            await js.publish("k", f"a{i:04d}".encode())
        cfg = info.config
        cfg.num_replicas = 3
        await js.update_stream(cfg)
        full = await until(lambda: _replicas(js, 3), timeout=30)
        follower = next(n for n in c.nodes[1:]  # not the node the client is connected to
                        if n.name in {r.name for r in full.cluster.replicas})
        c.stop_node(follower, sig=signal.SIGKILL)
        for i in range(200):
            await js.publish("k", f"b{i:04d}".encode())
        c.start_node(follower)
        c.wait_js()
        await until(lambda: _replicas(js, 3), timeout=30)
        want = [f"a{i:04d}" for i in range(200)] + [f"b{i:04d}" for i in range(200)]
        for n in c.nodes:
            await until(lambda n=n: _holds(n, 400), timeout=30)
            assert await replica_contents(n, 400) == want, n.name
        ci = await js.consumer_info("K", "d")
        assert ci.num_pending == 400
        await nc.close()
        assert errors_in_logs(c) == []
    finally:
        c.stop()


async def _holds(node: Any, seq: int) -> bool:
    return await last_seq_here(node) >= seq

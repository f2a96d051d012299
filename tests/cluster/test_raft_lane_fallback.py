"""Raft's direct lane is the default, with the gRPC lanes as its fallback: a real 3-node
cluster (node processes, nats-py clients) whose cluster traffic crosses test-controlled
CONNECT proxies (tests/cluster/netcut.py). One node's direct lane port is firewalled (only
its cluster port passes): its peers reach it over gRPC, an R3 stream still commits and
serves, every replica (the firewalled one included) holds every message; the two others
keep their direct lane. Once the port opens, the lanes move back.
What carries Raft to each peer is read from /jsz?raft=1 (`raft_transport`)."""

from __future__ import annotations

from typing import Any

import pytest
from nats.js.errors import APIError

from tests.cluster.jshelp import JsCluster, connect, until
from tests.cluster.netcut import ProxiedCluster
from tests.cluster.test_js_faults import last_seq_here

pytestmark = pytest.mark.timeout(300)


def _lanes(node: Any) -> dict[str, Any]:
    try:
        return node.get("/jsz?raft=1").get("raft_transport") or {}
    except (OSError, ValueError):
        return {}


def _ids(c: JsCluster) -> dict[str, str]:
    """Node name -> its Raft peer id (hex), from the others' lane tables."""
    seen = {n.name: set(_lanes(n).get("peers", {})) for n in c.nodes}
    out = {}
    for n in c.nodes:
        others = [seen[o.name] for o in c.nodes if o is not n]
        common = set.intersection(*others) - seen[n.name]
        if len(common) == 1:
            out[n.name] = common.pop()
    return out


def _kinds(c: JsCluster, ids: dict[str, str]) -> dict[tuple[str, str], tuple[str, str]]:
    """(node, peer) -> (priority lane, bulk lane) as the node sees it."""
    out = {}
    for n in c.nodes:
        peers = _lanes(n).get("peers", {})
        for name, pid in ids.items():
            if name != n.name and pid in peers:
                out[n.name, name] = (peers[pid]["priority"], peers[pid]["bulk"])
    return out


async def _holds(node: Any, stream: str, count: int) -> bool:
    try:
        return await last_seq_here(node, stream, stream.lower()) == count
    except Exception:  # noqa: BLE001 (no answer yet: ask again)
        return False


async def _r3_serves(c: JsCluster, stream: str, count: int) -> None:
    """An R3 stream created, published to from every node (PubAck = committed on a
    majority), and read back in order through a pull consumer on the last node."""
    nc = await connect(c.nodes[0])
    js = nc.jetstream(timeout=10)

    async def created() -> bool:
        try:
            await js.add_stream(name=stream, subjects=[stream.lower()], num_replicas=3,
                                allow_direct=True)
        except APIError as exc:  # a restarted peer counts as offline until it beats again
            if exc.err_code not in (10005, 10008):  # no suitable peers / temporarily unavailable
                raise
            return False
        return True

    await until(created, timeout=30, every=0.5)
    await nc.close()
    seqs = []
    for k in range(count):
        nc = await connect(c.nodes[k % 3])
        ack = await nc.jetstream(timeout=10).publish(stream.lower(), str(k).encode())
        seqs.append(ack.seq)
        await nc.close()
    assert seqs == list(range(1, count + 1))
    # Every replica holds them, the firewalled one included (read from its own store).
    for node in c.nodes:
        await until(lambda node=node: _holds(node, stream, count), timeout=30)
    nc = await connect(c.nodes[2])
    sub = await nc.jetstream(timeout=10).pull_subscribe(stream.lower(), "d")
    got: list[bytes] = []
    while len(got) < count:
        got += [m.data for m in await sub.fetch(count - len(got), timeout=10)]
    assert got == [str(k).encode() for k in range(count)]
    await nc.close()


async def test_firewalled_direct_lane_falls_back_to_grpc_and_returns(tmp_path) -> None:
    c = ProxiedCluster(tmp_path / "c", 3)
    try:
        c.start()
        c.wait_js()
        ids = await until(lambda: (lambda d: d if len(d) == 3 else None)(_ids(c)), timeout=30)
        # The direct lane is the default: every pair talks over it.
        await until(lambda: set(_kinds(c, ids).values()) == {("direct", "direct")}
                    and len(_kinds(c, ids)) == 6, timeout=60)
        # Firewall the lane of the node with the highest id: every other node dials it
        # (the lower id dials), so each of them must fall back.
        far = max(ids, key=lambda name: int(ids[name], 16))
        c.net.block_lane(far)
        near = [n.name for n in c.nodes if n.name != far]
        await until(lambda: all(_kinds(c, ids).get((n, far)) == ("grpc", "grpc") for n in near)
                    and _kinds(c, ids).get((near[0], near[1])) == ("direct", "direct"),
                    timeout=60)
        fell = [_lanes(n)["direct_fallbacks"] for n in c.nodes if n.name in near]
        assert all(f >= 1 for f in fell), fell
        await _r3_serves(c, "FW", 30)
        # The far node's view too: its peers' streams came in over gRPC.
        assert {_kinds(c, ids)[far, n] for n in near} == {("grpc", "grpc")}
        # The port opens: a probe moves both lanes back to it.
        c.net.block_lane(far, on=False)
        await until(lambda: set(_kinds(c, ids).values()) == {("direct", "direct")}, timeout=60)
        assert all(_lanes(n)["direct_restored"] >= 2 for n in c.nodes if n.name in near)
        await _r3_serves(c, "BACK", 10)
    finally:
        c.close()


async def test_a_node_on_raft_lane_grpc_talks_grpc_to_every_peer(tmp_path) -> None:
    """`cluster { raft_lane: grpc }` picks the gRPC lanes explicitly, on one node of a
    default cluster (a node that announces no lane, as an older version): it opens no
    listener and dials no lane, its peers reach it over gRPC, the two others keep their
    direct lane. The node with the lowest id (it dials both others) is the one restarted
    so: without its own choice it would dial their lanes."""
    c = JsCluster(tmp_path / "c", 3)
    try:
        c.start()
        c.wait_js()
        ids = await until(lambda: (lambda d: d if len(d) == 3 else None)(_ids(c)), timeout=30)
        low = next(n for n in c.nodes if ids[n.name] == min(ids.values(), key=lambda i: int(i, 16)))
        c.stop_node(low)
        c.start_node(low, config=c.config_for(low).replace(
            "  routes:", "  raft_lane: grpc\n  routes:"))
        c.wait_js()
        assert "Listening for Raft direct lanes" not in low.log_text()  # since the restart
        rest = [n.name for n in c.nodes if n is not low]
        await until(lambda: len(_kinds(c, ids)) == 6 and all(
            kind == (("grpc", "grpc") if low.name in pair else ("direct", "direct"))
            for pair, kind in _kinds(c, ids).items()), timeout=60)
        await _r3_serves(c, "G", 6)
        assert _lanes(low)["direct_fallbacks"] == 0
        assert {_kinds(c, ids)[low.name, n] for n in rest} == {("grpc", "grpc")}
    finally:
        c.stop()

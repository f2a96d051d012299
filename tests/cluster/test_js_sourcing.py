"""Mirrors and sources across nodes (issue 9), on three real node processes.

The origin's leader and the mirror's / source's leader live on different nodes: the target's
leader sends CONSUMER.CREATE through `$JS.API` (forwarded to the origin's leader), the origin's
leader delivers over the routes, and the target proposes what arrived to its own group. The
tests move both leaders (stepdown, kill -9) while a publisher keeps publishing, then a checker
compares every message: the mirror holds each origin message at the origin's sequence with
its subject and data; the source holds each origin sequence exactly once, in order (its
`Nats-Stream-Source` header names the origin sequence), with the transformed subject.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import nats
import pytest

from tests.cluster.jshelp import JsCluster, api, connect, errors_in_logs, until

TAGS = [["node:1"], ["node:2"], ["node:3"]]
LONG = bool(os.environ.get("JETRAFT_LONG"))


async def _publisher(nodes: list[Any], count: int, acked: list[int], stop: asyncio.Event,
                     prefix: str = "m") -> None:
    """Publish `count` messages to O through the nodes in turn, each retried with its
    Nats-Msg-Id until acknowledged (a node may be down meanwhile)."""
    ncs: list[nats.NATS | None] = [None] * len(nodes)
    try:
        for i in range(count):
            if stop.is_set():
                return
            data = f"{prefix}{i:05d}".encode()
            k = i
            while True:
                k += 1
                j = k % len(nodes)
                if not nodes[j].alive():
                    ncs[j] = None
                    await asyncio.sleep(0.01)
                    continue
                try:
                    if ncs[j] is None or ncs[j].is_closed:  # type: ignore[union-attr]
                        ncs[j] = await asyncio.wait_for(connect(nodes[j]), 5)
                    msg = await ncs[j].request(f"o.{i % 3}", data, timeout=2.0,  # type: ignore[union-attr]
                                               headers={"Nats-Msg-Id": data.decode()})
                    ack = json.loads(msg.data)
                    if "seq" in ack and "error" not in ack:
                        acked.append(ack["seq"])
                        break
                except (TimeoutError, nats.errors.Error, OSError):
                    ncs[j] = None
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.005)
    finally:
        for nc in ncs:
            if nc is not None and not nc.is_closed:
                await nc.close()


async def _contents(node: Any, stream: str, last: int) -> list[tuple[int, str, bytes, Any]]:
    """(seq, subject, data, headers) of 1..last as this node's replica holds them."""
    nc = await connect(node)
    try:
        out = []
        for seq in range(1, last + 1):
            msg = await nc.request(f"$JS.API.DIRECT.GET.{stream}",
                                   json.dumps({"seq": seq}).encode(), timeout=5)
            hdrs = msg.headers or {}
            if hdrs.get("Status") == "404":
                continue  # a gap (none expected here; the checker counts them)
            assert hdrs.get("Nats-Sequence") == str(seq), (node.name, stream, seq, hdrs)
            out.append((seq, hdrs.get("Nats-Subject", ""), msg.data, hdrs))
        return out
    finally:
        await nc.close()


async def _last(node: Any, stream: str) -> int:
    nc = await connect(node)
    try:
        r = await api(nc, f"STREAM.INFO.{stream}")
        return int(r.get("state", {}).get("last_seq", 0))
    finally:
        await nc.close()


async def _replicas_of(c: JsCluster, stream: str) -> list[Any]:
    nc = await connect(next(n for n in c.nodes if n.alive()))
    try:
        r = await api(nc, f"STREAM.INFO.{stream}")
    finally:
        await nc.close()
    names = {r["cluster"]["leader"], *(x["name"] for x in r["cluster"].get("replicas", []))}
    return [n for n in c.nodes if n.name in names]


async def _check(c: JsCluster, top: int, origin_r: int, target_r: int) -> None:
    """Every replica of M equals O message by message; every replica of S holds origin
    seqs 1..top once each, in order."""
    o_nodes, m_nodes, s_nodes = [await _replicas_of(c, s) for s in ("O", "M", "S")]
    assert (len(o_nodes), len(m_nodes), len(s_nodes)) == (origin_r, target_r, target_r)
    await until(lambda: _all_at(o_nodes, "O", top), timeout=60)
    await until(lambda: _all_at(m_nodes, "M", top), timeout=60)
    origin = await _contents(o_nodes[0], "O", top)
    assert [m[0] for m in origin] == list(range(1, top + 1))
    for node in o_nodes:
        assert await _contents(node, "O", top) == origin, f"O differs on {node.name}"
    for node in m_nodes:
        mirror = await _contents(node, "M", top)
        assert [(s, subj, d) for s, subj, d, _ in mirror] == \
            [(s, subj, d) for s, subj, d, _ in origin], f"M differs from O on {node.name}"
    await until(lambda: _all_at(s_nodes, "S", top), timeout=60)
    for node in s_nodes:
        source = await _contents(node, "S", top + 5)  # more than top would be a duplicate
        seqs = [int(h["Nats-Stream-Source"].split(" ")[1]) for _, _, _, h in source]
        assert seqs == list(range(1, top + 1)), f"S on {node.name}: {_diff(seqs, top)}"
        _same_identity(source)
        for (_, subj, data, _), (_, osubj, odata, _) in zip(source, origin, strict=True):
            assert data == odata and subj == "s." + osubj.split(".", 1)[1]


def _same_identity(source: list[Any]) -> None:
    """Every source header names the origin's incarnation (its last token), the same one
    whichever node wrote it: the target learns it from the catalogue, not from a local
    replica of the origin it may not have."""
    idents = {(h["Nats-Stream-Source"].split(" ") + [""] * 6)[5] for _, _, _, h in source}
    assert len(idents) == 1 and all(idents), idents


def _diff(seqs: list[int], top: int) -> str:
    missing = sorted(set(range(1, top + 1)) - set(seqs))
    dups = sorted({s for s in seqs if seqs.count(s) > 1})
    return f"{len(seqs)} msgs, missing {missing[:10]}, duplicated {dups[:10]}"


async def _all_at(nodes: list[Any], stream: str, top: int) -> bool:
    for node in nodes:
        try:
            if await _last(node, stream) < top:
                return False
        except (TimeoutError, nats.errors.Error, OSError):
            return False
    return True


def _node(c: JsCluster, name: str) -> Any:
    return next(n for n in c.nodes if n.name == name)


async def _leader(nc: nats.NATS, stream: str) -> str:
    async def got() -> str:
        r = await api(nc, f"STREAM.INFO.{stream}")
        return str(r.get("cluster", {}).get("leader") or "")
    return str(await until(got, timeout=30))


async def _create(nc: nats.NATS, origin_r: int, target_r: int) -> None:
    r = await api(nc, "STREAM.CREATE.O", {"name": "O", "subjects": ["o.>"],
                                         "num_replicas": origin_r, "allow_direct": True})
    assert "error" not in r, r
    r = await api(nc, "STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"},
                                         "num_replicas": target_r, "allow_direct": True})
    assert "error" not in r, r
    r = await api(nc, "STREAM.CREATE.S", {
        "name": "S", "num_replicas": target_r, "allow_direct": True,
        "sources": [{"name": "O", "subject_transforms": [{"src": "o.>", "dest": "s.>"}]}]})
    assert "error" not in r, r


async def test_r1_mirror_and_source_on_other_nodes_than_their_origin(tmp_path: Any) -> None:
    """R1 origin on n1, its R1 mirror on n2, its R1 source on n3: they catch up with what
    was published before they existed, follow, and survive kill -9 of the mirror's node and
    of the origin's node (restarted), with no gap and no duplicate."""
    c = JsCluster(tmp_path / "c", 3, tags=TAGS)
    try:
        c.start()
        c.wait_js()
        nc = await connect(c.nodes[2])
        r = await api(nc, "STREAM.CREATE.O", {"name": "O", "subjects": ["o.>"],
                                             "allow_direct": True,
                                             "placement": {"tags": ["node:1"]}})
        assert r["cluster"]["leader"] == "n1", r
        for i in range(150):  # before the mirror and the source exist: they catch up
            await nc.request(f"o.{i % 3}", f"pre{i:05d}".encode(), timeout=5)
        for name, tag, extra in (
                ("M", "node:2", {"mirror": {"name": "O"}}),
                ("S", "node:3", {"sources": [{"name": "O", "subject_transforms": [
                    {"src": "o.>", "dest": "s.>"}]}]})):
            r = await api(nc, f"STREAM.CREATE.{name}", {
                "name": name, "allow_direct": True, "placement": {"tags": [tag]}, **extra})
            assert "error" not in r, r
        assert await _leader(nc, "M") == "n2" and await _leader(nc, "S") == "n3"
        await until(lambda: _all_at([c.nodes[1]], "M", 150), timeout=30)
        await until(lambda: _all_at([c.nodes[2]], "S", 150), timeout=30)
        acked: list[int] = []
        stop = asyncio.Event()
        task = asyncio.ensure_future(_publisher(c.nodes, 300, acked, stop))
        await until(lambda: len(acked) > 60, timeout=60)
        c.stop_node(c.nodes[1], sig=signal.SIGKILL)  # the mirror's only replica
        await until(lambda: len(acked) > 120, timeout=60)
        c.start_node(c.nodes[1])
        await until(lambda: len(acked) > 180, timeout=60)
        c.stop_node(c.nodes[0], sig=signal.SIGKILL)  # the origin's only replica
        await asyncio.sleep(1.0)
        c.start_node(c.nodes[0])
        await asyncio.wait_for(task, 180)
        c.wait_js()
        top = 150 + 300
        assert max(acked) == top
        await _check_r1(c, top)
        await nc.close()
        assert errors_in_logs(c) == []
    finally:
        c.stop()


async def _check_r1(c: JsCluster, top: int) -> None:
    n1, n2, n3 = c.nodes
    await until(lambda: _all_at([n2], "M", top), timeout=60)
    await until(lambda: _all_at([n3], "S", top), timeout=60)
    origin = await _contents(n1, "O", top)
    assert [m[0] for m in origin] == list(range(1, top + 1))
    mirror = await _contents(n2, "M", top)
    assert [m[:3] for m in mirror] == [m[:3] for m in origin], "M differs from O"
    source = await _contents(n3, "S", top + 5)
    seqs = [int(h["Nats-Stream-Source"].split(" ")[1]) for _, _, _, h in source]
    assert seqs == list(range(1, top + 1)), _diff(seqs, top)
    _same_identity(source)
    for (_, subj, data, _), (_, osubj, odata, _) in zip(source, origin, strict=True):
        assert data == odata and subj == "s." + osubj.split(".", 1)[1]


async def _split_leaders(nc: nats.NATS, movable: bool) -> None:
    """Move M's and S's leaders off O's leader's node: R3 targets step down to another
    peer; R1 targets stay, and O's leader moves to a node that leads neither."""
    lo = await _leader(nc, "O")
    if not movable:
        taken = {await _leader(nc, "M"), await _leader(nc, "S")}
        if lo in taken:
            other = next(n for n in ("n1", "n2", "n3") if n not in taken)
            r = await api(nc, "STREAM.LEADER.STEPDOWN.O", {"placement": {"preferred": other}})
            assert r.get("success"), r
            await until(lambda: _leader_is_not(nc, "O", lo), timeout=30)
        return
    for name in ("M", "S"):
        if await _leader(nc, name) != lo:
            continue
        other = next(n for n in ("n1", "n2", "n3") if n != lo)
        r = await api(nc, f"STREAM.LEADER.STEPDOWN.{name}", {"placement": {"preferred": other}})
        assert r.get("success"), r
        await until(lambda name=name: _leader_is_not(nc, name, lo), timeout=30)


async def _leader_is_not(nc: nats.NATS, stream: str, name: str) -> bool:
    return await _leader(nc, stream) not in ("", name)


@pytest.mark.parametrize(("origin_r", "target_r"), [(3, 3), (1, 3), (3, 1)])
async def test_mirror_and_source_follow_leader_changes_of_both_sides(
        js3: JsCluster, origin_r: int, target_r: int) -> None:
    """R3 (or R1) origin, R3 (or R1) mirror and source, leaders on different nodes; while a
    publisher publishes: the mirror's leader steps down (R3), the mirror's leader is killed
    (-9) and restarted, the origin's leader steps down (R3), the origin's leader is killed
    and restarted. Every replica of M equals O; every replica of S holds each origin seq
    once, in order."""
    c = js3
    nc = await connect(c.nodes[0])
    await _create(nc, origin_r, target_r)
    await _split_leaders(nc, target_r > 1)
    acked: list[int] = []
    stop = asyncio.Event()
    count = (900 if LONG else 400) if origin_r == target_r else (600 if LONG else 250)
    task = asyncio.ensure_future(_publisher(c.nodes, count, acked, stop))
    steps = count // 5

    async def admin() -> nats.NATS:
        for n in c.nodes:
            if n.alive():
                try:
                    return await connect(n)
                except (nats.errors.Error, OSError):
                    continue
        raise AssertionError("no node up")

    for k, action in enumerate(("stepdown M", "kill M", "stepdown O", "kill O")):
        await until(lambda k=k: len(acked) > (k + 1) * steps, timeout=90)
        if nc.is_closed:
            nc = await admin()
        what, stream = action.split()
        if what == "stepdown" and (origin_r if stream == "O" else target_r) == 1:
            continue  # one replica: no other leader to step down to
        if what == "stepdown":
            r = await api(nc, f"STREAM.LEADER.STEPDOWN.{stream}")
            assert r.get("success"), r
        else:
            victim = _node(c, await _leader(nc, stream))
            await nc.close()
            c.stop_node(victim, sig=signal.SIGKILL)
            await asyncio.sleep(0.5)
            c.start_node(victim)
            nc = await admin()
    await asyncio.wait_for(task, 240)
    await nc.close()
    c.wait_js()
    assert len(acked) == count and max(acked) == count
    await _check(c, count, origin_r, target_r)
    assert errors_in_logs(c) == []


async def test_kv_bucket_mirrored_and_sourced_on_other_nodes(tmp_path: Any) -> None:
    """A KV bucket on n1 (R1), its mirror (mirror_direct) on n2 and a bucket sourced from
    it on n3, read with nats-py's KV API through every node."""
    c = JsCluster(tmp_path / "c", 3, tags=TAGS)
    try:
        c.start()
        c.wait_js()
        nc = await connect(c.nodes[0])
        js = nc.jetstream(timeout=10)
        r = await api(nc, "STREAM.CREATE.KV_KO", {
            "name": "KV_KO", "subjects": ["$KV.KO.>"], "max_msgs_per_subject": 5,
            "allow_rollup_hdrs": True, "deny_delete": True, "allow_direct": True,
            "discard": "new", "placement": {"tags": ["node:1"]}})
        assert "error" not in r, r
        kv = await js.key_value("KO")
        for i in range(20):
            await kv.put(f"k{i % 4}", f"v{i}".encode())
        r = await api(nc, "STREAM.CREATE.KV_KM", {
            "name": "KV_KM", "mirror": {"name": "KV_KO"}, "mirror_direct": True,
            "max_msgs_per_subject": 5, "allow_direct": True, "allow_rollup_hdrs": True,
            "deny_delete": True, "discard": "new", "placement": {"tags": ["node:2"]}})
        assert "error" not in r, r
        r = await api(nc, "STREAM.CREATE.KV_KS", {
            "name": "KV_KS", "subjects": ["$KV.KS.>"], "max_msgs_per_subject": 5,
            "allow_rollup_hdrs": True, "deny_delete": True, "allow_direct": True,
            "discard": "new", "placement": {"tags": ["node:3"]},
            "sources": [{"name": "KV_KO", "subject_transforms": [
                {"src": "$KV.KO.>", "dest": "$KV.KS.>"}]}]})
        assert "error" not in r, r
        await until(lambda: _all_at([c.nodes[1]], "KV_KM", 20), timeout=30)
        await kv.put("k0", b"later")
        for node in c.nodes:
            cn = await connect(node)
            ks = await cn.jetstream(timeout=10).key_value("KS")
            await until(lambda ks=ks: _kv_is(ks, "k0", b"later"), timeout=30)
            assert (await ks.get("k3")).value == b"v19"
            assert sorted(await ks.keys()) == ["k0", "k1", "k2", "k3"]
            km = await cn.request("$JS.API.DIRECT.GET.KV_KM",
                                  json.dumps({"last_by_subj": "$KV.KO.k1"}).encode(), timeout=5)
            assert km.data == b"v17", (node.name, km.headers)
            await cn.close()
        # The origin bucket goes: its mirror (mirror_direct, on n2) answers direct gets for it
        # through every node, as nats-server's mirror answers in the origin's queue group.
        r = await api(nc, "STREAM.DELETE.KV_KO")
        assert r.get("success"), r
        for node in c.nodes:
            cn = await connect(node)

            async def from_mirror(cn: Any = cn, name: str = node.name) -> bool:
                # The origin's host drops its direct-get listener when it applies the meta
                # group's delete, a moment after the reply: until then the origin answers.
                got = await cn.request("$JS.API.DIRECT.GET.KV_KO", json.dumps(
                    {"last_by_subj": "$KV.KO.k0"}).encode(), timeout=5)
                assert got.data == b"later", (name, got.headers)
                return bool(got.headers and got.headers.get("Nats-Stream") == "KV_KM")
            await until(from_mirror, timeout=30)
            await cn.close()
        await nc.close()
        assert errors_in_logs(c) == []
    finally:
        c.stop()


async def _kv_is(kv: Any, key: str, value: bytes) -> bool:
    try:
        return bool((await kv.get(key)).value == value)
    except Exception:  # noqa: BLE001 (not there yet)
        return False

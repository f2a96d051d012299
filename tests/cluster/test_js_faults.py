"""Fault tests for clustered JetStream on three real node processes, each with a checker
comparing what the publishers saw acknowledged with what EVERY replica finally holds (read
from each node's own store through DIRECT.GET, which every replica serves itself).

Default run: one kill -9 of the stream leader while two publishers (connected to the other
nodes) publish with Nats-Msg-Id and retry until acknowledged. JETRAFT_LONG=1: more rounds.

After each fault test the nodes stop (SIGTERM) and the audit (`jetraft audit`, issue 10) runs
over the three data directories with the acked-writes file of every PubAck the clients got:
no violation, every acked message committed once at its seq (skipped without pyspark/Java).
One Spark session serves the test run (conftest `audit_spark`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from tests.cluster.audithelp import assert_clean, audit_cluster, write_acked
from tests.cluster.jshelp import JsCluster, api, connect, errors_in_logs, until

pytestmark = pytest.mark.timeout(600)  # the audit at the end of each test runs Spark jobs

ROUNDS = 3 if os.environ.get("JETRAFT_LONG") else 1
PER_PUBLISHER = 150


def audit_after(spark, cluster: JsCluster, acked: list[tuple[str, str, int]], tmp: Any) -> None:
    """Stop the nodes, audit their data directories with the acked writes: no violation."""
    if spark is None:
        return
    path = write_acked(tmp / "acked.jsonl", acked)
    report = audit_cluster(spark, cluster, path)
    assert_clean(report)
    assert report["stats"]["replayed_groups"], report["stats"]


async def publisher(nc: nats.NATS, pid: int, count: int, acked: list[tuple[str, int]],
                    progress: asyncio.Event) -> None:
    """Publish `count` messages in order; each is retried (same Nats-Msg-Id) until acked."""
    for i in range(count):
        data = f"p{pid}-{i:05d}".encode()
        while True:
            try:
                msg = await nc.request("k", data, timeout=2.0,
                                       headers={"Nats-Msg-Id": data.decode()})
                ack = json.loads(msg.data)
                if "seq" in ack and "error" not in ack:
                    acked.append((data.decode(), ack["seq"]))
                    break
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                pass
            await asyncio.sleep(0.05)
        if len(acked) >= 60:
            progress.set()


async def replica_contents(node: Any, last: int, stream: str = "K") -> list[str]:
    nc = await connect(node)
    try:
        out = []
        for seq in range(1, last + 1):
            msg = await nc.request(f"$JS.API.DIRECT.GET.{stream}",
                                   json.dumps({"seq": seq}).encode(), timeout=5)
            assert msg.headers is not None and msg.headers.get("Nats-Sequence") == str(seq), \
                (node.name, seq, msg.headers)
            out.append(msg.data.decode())
        return out
    finally:
        await nc.close()


async def last_seq_here(node: Any, stream: str = "K", subject: str = "k") -> int:
    """The last sequence this replica holds (DIRECT.GET last_by_subj, answered locally)."""
    nc = await connect(node)
    try:
        msg = await nc.request(f"$JS.API.DIRECT.GET.{stream}",
                               json.dumps({"last_by_subj": subject}).encode(), timeout=5)
        return int(msg.headers.get("Nats-Sequence", "0")) if msg.headers else 0
    finally:
        await nc.close()


async def test_kill_9_of_the_stream_leader_while_publishing(js3: JsCluster, audit_spark,
                                                            tmp_path) -> None:
    admin = await connect(js3.nodes[0])
    js = admin.jetstream(timeout=10)
    await js.add_stream(name="K", subjects=["k"], num_replicas=3, allow_direct=True)
    acked: list[tuple[str, int]] = []
    for _round in range(ROUNDS):
        info = await js.stream_info("K")
        leader = next(n for n in js3.nodes if n.name == info.cluster.leader)
        others = [n for n in js3.nodes if n is not leader]
        pubs = [await connect(n) for n in others]
        progress = asyncio.Event()
        base = len(acked)
        tasks = [asyncio.ensure_future(publisher(nc, _round * 10 + i, PER_PUBLISHER, acked,
                                                 progress)) for i, nc in enumerate(pubs)]
        await asyncio.wait_for(progress.wait(), 60)
        js3.stop_node(leader, sig=signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        assert len(acked) - base == 2 * PER_PUBLISHER
        js3.start_node(leader)
        js3.wait_js()
        for nc in pubs:
            await nc.close()
        if admin.is_closed or leader is js3.nodes[0]:
            await admin.close()
            admin = await connect(others[0])
            js = admin.jetstream(timeout=10)
    await admin.close()
    # The checker.
    top = max(seq for _, seq in acked)
    for node in js3.nodes:
        await until(lambda node=node: last_seq_here(node), timeout=30)
        await until(lambda node=node: _at_least(node, top), timeout=30)
    contents = [await replica_contents(n, top) for n in js3.nodes]
    assert contents[0] == contents[1] == contents[2], "replicas differ"
    stored = contents[0]
    assert len(stored) == len(set(stored)), "a message stored twice"
    position = {data: i + 1 for i, data in enumerate(stored)}
    for data, seq in acked:
        assert position.get(data) == seq, f"acked {data} at {seq}, stored at {position.get(data)}"
    for pid in {d.split("-")[0] for d, _ in acked}:  # each publisher's order kept
        mine = [d for d in stored if d.startswith(pid + "-")]
        assert mine == sorted(mine)
    nc = await connect(js3.nodes[1])
    r = await api(nc, "STREAM.INFO.K")
    assert r["state"]["messages"] == len(stored) == top
    await nc.close()
    assert errors_in_logs(js3) == []
    audit_after(audit_spark, js3, [("K", d, seq) for d, seq in acked], tmp_path)


async def _at_least(node: Any, seq: int) -> bool:
    try:
        return await last_seq_here(node) >= seq
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        return False  # the replica is still opening its group after a restart or a heal


async def test_meta_leader_killed_during_stream_creation(js3: JsCluster, audit_spark,
                                                        tmp_path) -> None:
    """Creates in flight while the meta leader is killed: every create that was answered
    with success survives (on every node, after the restart), a retried create succeeds
    (identical config), and every stream takes publishes."""
    meta = js3.nodes[0].get("/jsz")["meta_cluster"]["leader"]
    leader = next(n for n in js3.nodes if n.name == meta)
    other = next(n for n in js3.nodes if n is not leader)
    nc = await connect(other)
    names = [f"M{i}" for i in range(8)]

    async def create(name: str) -> bool:
        try:
            r = await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [name.lower()],
                                                        "num_replicas": 3}, timeout=8)
        except Exception:  # noqa: BLE001 (no answer: outcome unknown)
            return False
        return "error" not in r

    tasks = [asyncio.ensure_future(create(n)) for n in names]
    await asyncio.sleep(0.05)
    js3.stop_node(leader, sig=signal.SIGKILL)
    answered = dict(zip(names, await asyncio.gather(*tasks), strict=True))
    js3.start_node(leader)
    js3.wait_js()
    for n in js3.nodes:
        c = await connect(n)
        for name, ok in answered.items():
            if ok:  # acknowledged: never forgotten
                r = await until(lambda c=c, name=name: _found(c, name), timeout=20)
                assert r["config"]["name"] == name, (n.name, r)
        await c.close()
    acked = []
    for name in names:  # a retry converges (identical config: success, did_create)
        r = await until(lambda name=name: create(name), timeout=30)
        assert r
        ack = json.loads((await nc.request(name.lower(), name.encode(), timeout=5)).data)
        assert ack["stream"] == name and ack["seq"] >= 1
        acked.append((name, name, ack["seq"]))
    r = await api(nc, "STREAM.NAMES")
    assert sorted(r["streams"]) == names
    await nc.close()
    assert errors_in_logs(js3) == []
    audit_after(audit_spark, js3, acked, tmp_path)


async def _found(nc: nats.NATS, name: str) -> dict[str, Any] | None:
    r = await api(nc, f"STREAM.INFO.{name}")
    return None if "error" in r else r


async def _check_replicas(js3: JsCluster, acked: list[tuple[str, int]]) -> None:
    """Every replica holds the same messages; each acked one once at its acked seq; each
    publisher's messages in the order it sent them."""
    top = max(seq for _, seq in acked)
    for node in js3.nodes:
        await until(lambda node=node: _at_least(node, top), timeout=30)
    contents = [await replica_contents(n, top) for n in js3.nodes]
    assert contents[0] == contents[1] == contents[2], "replicas differ"
    stored = contents[0]
    assert len(stored) == len(set(stored)), "a message stored twice"
    position = {data: i + 1 for i, data in enumerate(stored)}
    for data, seq in acked:
        assert position.get(data) == seq, f"acked {data} at {seq}, stored at {position.get(data)}"
    for pid in {d.split("-")[0] for d, _ in acked}:
        mine = [d for d in stored if d.startswith(pid + "-")]
        assert mine == sorted(mine)


@pytest.mark.skipif(not os.environ.get("JETRAFT_LONG"), reason="long tier: JETRAFT_LONG=1")
@pytest.mark.parametrize("fault", ["kill_follower", "sigstop_leader"])
async def test_fault_while_publishing(js3: JsCluster, fault: str, audit_spark, tmp_path) -> None:
    admin = await connect(js3.nodes[0])
    js = admin.jetstream(timeout=10)
    await js.add_stream(name="K", subjects=["k"], num_replicas=3, allow_direct=True)
    await js.add_consumer("K", durable_name="d", ack_policy="explicit")
    await admin.close()
    info_nc = await connect(js3.nodes[1])
    info = await info_nc.jetstream(timeout=10).stream_info("K")
    await info_nc.close()
    leader = next(n for n in js3.nodes if n.name == info.cluster.leader)
    followers = [n for n in js3.nodes if n is not leader]
    victim = followers[0] if fault == "kill_follower" else leader
    clients = [n for n in js3.nodes if n is not victim]
    pubs = [await connect(n) for n in clients]
    acked: list[tuple[str, int]] = []
    progress = asyncio.Event()
    tasks = [asyncio.ensure_future(publisher(nc, i, PER_PUBLISHER, acked, progress))
             for i, nc in enumerate(pubs)]
    await asyncio.wait_for(progress.wait(), 60)
    if fault == "kill_follower":
        js3.stop_node(victim, sig=signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        js3.start_node(victim)
    else:
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGSTOP)
        await asyncio.sleep(3.0)  # the others elect a new leader meanwhile
        victim.proc.send_signal(signal.SIGCONT)
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    js3.wait_js()
    for nc in pubs:
        await nc.close()
    assert len(acked) == 2 * PER_PUBLISHER
    await _check_replicas(js3, acked)
    assert errors_in_logs(js3) == []
    audit_after(audit_spark, js3, [("K", d, seq) for d, seq in acked], tmp_path)


async def test_kill_9_of_every_node_then_restart(js3: JsCluster, audit_spark, tmp_path) -> None:
    """All three nodes killed at once: after the restart every stream, message and consumer
    acknowledged before is back on every replica (no stream forgotten)."""
    nc = await connect(js3.nodes[1])
    js = nc.jetstream(timeout=10)
    await js.add_stream(name="K", subjects=["k"], num_replicas=3, allow_direct=True)
    await js.add_stream(name="R1", subjects=["r1"], num_replicas=1)
    await js.add_consumer("K", durable_name="d", ack_policy="explicit")
    acked = []
    for i in range(100):
        ack = await js.publish("k", f"p0-{i:05d}".encode())
        acked.append((f"p0-{i:05d}", ack.seq))
    sub = await js.pull_subscribe_bind("d", stream="K")
    for m in await sub.fetch(40, timeout=5):
        await m.ack_sync()
    await nc.close()
    for node in js3.nodes:
        js3.stop_node(node, sig=signal.SIGKILL)
    for node in js3.nodes:
        js3.start_node(node, wait=False)
    for node in js3.nodes:
        js3.wait_ready(node)
    js3.wait_js()
    await _check_replicas(js3, acked)
    nc = await connect(js3.nodes[2])
    js = nc.jetstream(timeout=10)
    assert sorted((await api(nc, "STREAM.NAMES"))["streams"]) == ["K", "R1"]
    ci = await until(lambda: js.consumer_info("K", "d"), timeout=20)
    assert ci.ack_floor.stream_seq == 40 and ci.num_pending == 60
    assert (await js.publish("k", b"after")).seq == 101
    await nc.close()
    assert errors_in_logs(js3) == []
    audit_after(audit_spark, js3, [("K", d, seq) for d, seq in acked] + [("K", "after", 101)],
                tmp_path)


async def test_a_follower_direct_get_sees_what_it_holds(tmp_path, monkeypatch) -> None:
    """Followers hold committed publishes back (raft/multigroup.py FOLLOWER_DEFER_*; here
    for a minute): a DIRECT.GET answered by a follower applies what it holds first, so
    every acked message is readable on every replica well before the hold's deadline."""
    async with _holding_cluster(tmp_path, monkeypatch) as (c, admin):
        js = admin.jetstream(timeout=10)
        await js.add_stream(name="K", subjects=["k"], num_replicas=3, allow_direct=True)
        acks = [await js.publish("k", f"h{i}".encode()) for i in range(2)]
        for node in c.nodes:
            # The commit of the last entry reaches a follower with the leader's next
            # (lazy) append: a moment, not the hold's minute.
            await until(lambda node=node: _at_least(node, acks[-1].seq), timeout=10)
            assert await replica_contents(node, acks[-1].seq) == ["h0", "h1"], node.name


@contextlib.asynccontextmanager
async def _holding_cluster(tmp_path, monkeypatch) -> AsyncIterator[tuple[JsCluster, nats.NATS]]:
    """Three nodes whose stream followers hold committed entries back for a minute, and a
    client of the first."""
    monkeypatch.setenv("JETRAFT_FOLLOWER_DEFER_S", "60")  # inherited by the nodes
    c = JsCluster(tmp_path / "c", 3)
    try:
        c.start()
        c.wait_js()
        admin = await connect(c.nodes[0])
        try:
            yield c, admin
        finally:
            await admin.close()
    finally:
        c.stop()


async def test_a_followers_info_and_stream_list_count_what_it_holds(tmp_path, monkeypatch
                                                                     ) -> None:
    """INFO and STREAM.LIST are answered by the node asked, from its own replicas: on a
    follower holding committed entries back (here for a minute) they apply what it holds
    first, so every node counts the created consumer (INFO), then the acked message
    (STREAM.LIST), well before the hold's deadline (they counted neither until it: a
    client asking another node right after its CONSUMER.CREATE reply or its PubAck saw
    them missing). Each phase asks only its own request: neither releases the other's."""
    async with _holding_cluster(tmp_path, monkeypatch) as (c, admin):
        js = admin.jetstream(timeout=10)
        await js.add_stream(name="L", subjects=["l"], num_replicas=3)
        await js.add_consumer("L", durable_name="c")
        await _on_every_node(c, _info_counts_the_consumer)
        await js.publish("l", b"one")
        await _on_every_node(c, _list_counts_the_message)


async def _on_every_node(c: JsCluster, pred: Any) -> None:
    for node in c.nodes:
        nc = await connect(node)
        try:
            # (the commit reaches a follower with the leader's next append: a moment)
            await until(lambda nc=nc: pred(nc), timeout=10)
        finally:
            await nc.close()


async def _info_counts_the_consumer(nc: nats.NATS) -> bool:
    return (await api(nc, "INFO")).get("consumers") == 1


async def _list_counts_the_message(nc: nats.NATS) -> bool:
    listed = (await api(nc, "STREAM.LIST"))["streams"]
    return [s["state"]["messages"] for s in listed] == [1]

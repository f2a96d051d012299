"""Consumer groups on three real node processes (node/jetstream/cgroup.py): a consumer whose
replicas or storage differ from its stream's gets a Raft group of its own, placed by the meta
leader on some of the stream's peers, with its own leader; its deliveries and acks go
through that group, from whichever node the client uses; killing that group's leader keeps
its ack floor (nothing acked is redelivered, nothing unacked skipped)."""

from __future__ import annotations

import signal
from typing import Any

import nats
import pytest

from tests.cluster.jshelp import JsCluster, api, connect, errors_in_logs, until

pytestmark = pytest.mark.timeout(300)


async def _stream(nc: nats.NATS, name: str = "CG", retention: str = "limits") -> None:
    r = await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [name.lower()],
                                               "num_replicas": 3, "retention": retention,
                                               "allow_direct": True})
    assert "error" not in r, r


async def _consumer(nc: nats.NATS, stream: str, name: str, **cfg: Any) -> dict[str, Any]:
    r = await api(nc, f"CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": {
        "durable_name": name, "ack_policy": "explicit", **cfg}})
    assert "error" not in r, r
    return r


async def _infos(cluster: JsCluster, stream: str, name: str) -> list[dict[str, Any]]:
    out = []
    for node in cluster.nodes:
        if not node.alive():
            continue
        nc = await connect(node)
        try:
            out.append(await api(nc, f"CONSUMER.INFO.{stream}.{name}"))
        finally:
            await nc.close()
    return out


async def _fetch(nc: nats.NATS, stream: str, name: str, n: int, timeout: float = 3.0
                 ) -> list[Any]:
    sub = await nc.jetstream().pull_subscribe_bind(name, stream)
    try:
        return await sub.fetch(n, timeout=timeout)
    except nats.errors.TimeoutError:
        return []
    finally:
        await sub.unsubscribe()


async def test_r1_consumer_on_an_r3_stream_has_its_own_group(js3: JsCluster) -> None:
    nc = await connect(js3.nodes[0])
    try:
        await _stream(nc)
        js = nc.jetstream()
        for i in range(10):
            await js.publish("cg", b"m%d" % i)
        one = await _consumer(nc, "CG", "one", num_replicas=1)
        same = await _consumer(nc, "CG", "same")  # replicas 0: the stream's own group
        stream_group = (await api(nc, "STREAM.INFO.CG"))["cluster"]["raft_group"]
    finally:
        await nc.close()
    assert same["cluster"]["raft_group"] == stream_group
    # R1: shown as nats-server shows it ({name, leader}); the group is on that node only
    assert sorted(one["cluster"]) == ["leader", "name"]
    hosts = [n.name for n in js3.nodes
             if any(g.startswith("jc.CG.one.") for g in n.get("/jsz?raft=1")["raft"])]
    assert hosts == [one["cluster"]["leader"]]
    # every node answers CONSUMER.INFO from the consumer group's leader
    infos = await _infos(js3, "CG", "one")
    assert {i["cluster"]["leader"] for i in infos} == {one["cluster"]["leader"]}
    # deliveries and acks through the group, from each node in turn
    got: list[int] = []
    for k, node in enumerate(js3.nodes):
        c = await connect(node)
        try:
            msgs = await _fetch(c, "CG", "one", 3)
            for m in msgs:
                got.append(m.metadata.sequence.stream)
                if k < 2:
                    await m.ack_sync(timeout=5)  # confirmed by the consumer group's leader
        finally:
            await c.close()
    assert got == list(range(1, 10))
    infos = await _infos(js3, "CG", "one")
    assert {(i["delivered"]["stream_seq"], i["ack_floor"]["stream_seq"], i["num_ack_pending"],
             i["num_pending"]) for i in infos} == {(9, 6, 3, 1)}
    # the stream's own consumer never saw any of that
    assert {(i["delivered"]["stream_seq"], i["num_pending"])
            for i in await _infos(js3, "CG", "same")} == {(0, 10)}
    await _stepdown_moves_the_consumer_groups_leader(js3)
    assert errors_in_logs(js3) == []


async def _stepdown_moves_the_consumer_groups_leader(js3: JsCluster) -> None:
    """CONSUMER.LEADER.STEPDOWN of an R3 mem_storage consumer (its own group) moves that
    group's leader, not the stream's (run inside the test above: one cluster less)."""
    nc = await connect(js3.nodes[1])
    try:
        await _consumer(nc, "CG", "mem", mem_storage=True)  # R3 like its stream, in memory
        before = await api(nc, "CONSUMER.INFO.CG.mem")
        stream_leader = (await api(nc, "STREAM.INFO.CG"))["cluster"]["leader"]
        r = await api(nc, "CONSUMER.LEADER.STEPDOWN.CG.mem")
        assert r.get("success") is True, r
        after = await until(lambda: _moved(nc, before["cluster"]["leader"]), timeout=20)
        assert (await api(nc, "STREAM.INFO.CG"))["cluster"]["leader"] == stream_leader
    finally:
        await nc.close()
    assert before["cluster"]["raft_group"].startswith("jc.")
    assert len(after["cluster"]["replicas"]) == 2




async def test_killing_the_consumer_groups_leader_keeps_its_ack_floor(js3: JsCluster) -> None:
    """An R3 mem_storage consumer on an R3 file stream (its own group): 8 of 10 fetched
    messages acked, then kill -9 of the consumer group's leader. The consumer goes on from
    another node: no acked message comes again, the two unacked ones come back (after
    ack_wait), then the rest. The ack floor and delivered counts survive the restart of the
    killed node too."""
    nc = await connect(js3.nodes[0])
    try:
        await _stream(nc)
        js = nc.jetstream()
        for i in range(20):
            await js.publish("cg", b"m%d" % i)
        await _consumer(nc, "CG", "two", mem_storage=True, ack_wait=2_000_000_000)
        msgs = await _fetch(nc, "CG", "two", 10)
        assert [m.metadata.sequence.stream for m in msgs] == list(range(1, 11))
        for m in msgs[:8]:
            await m.ack_sync(timeout=5)
        info = await api(nc, "CONSUMER.INFO.CG.two")
    finally:
        await nc.close()
    assert len(info["cluster"].get("replicas", [])) == 2
    assert info["cluster"]["raft_group"].startswith("jc.")
    leader = next(n for n in js3.nodes if n.name == info["cluster"]["leader"])
    js3.stop_node(leader, sig=signal.SIGKILL)
    other = next(n for n in js3.nodes if n.alive())
    c = await connect(other)
    try:
        seen: list[tuple[int, int]] = []  # (stream seq, delivery count)

        async def more() -> bool:
            for m in await _fetch(c, "CG", "two", 12, timeout=2.0):
                seen.append((m.metadata.sequence.stream, m.metadata.num_delivered))
                await m.ack_sync(timeout=5)
            return len(seen) >= 12

        await until(more, timeout=60, every=0.2)
        info = await api(c, "CONSUMER.INFO.CG.two")
    finally:
        await c.close()
    assert all(s > 8 for s, _ in seen), seen  # acked before the kill: never again
    assert sorted(s for s, _ in seen) == list(range(9, 21)), seen  # none skipped
    assert dict(seen)[9] == 2 and dict(seen)[10] == 2 and dict(seen)[11] == 1
    assert info["ack_floor"]["stream_seq"] == 20 and info["num_ack_pending"] == 0
    assert info["cluster"]["leader"] != leader.name
    js3.start_node(leader)
    js3.wait_js()
    for i in await until(lambda: _agreed(js3), timeout=30):
        assert i["ack_floor"]["stream_seq"] == 20 and i["num_redelivered"] == 0


async def _agreed(cluster: JsCluster) -> list[dict[str, Any]] | None:
    infos = await _infos(cluster, "CG", "two")
    return infos if all("error" not in i for i in infos) and \
        all(len(i["cluster"].get("replicas", [])) == 2 for i in infos) else None


async def _moved(nc: nats.NATS, old: str) -> dict[str, Any] | None:
    info = await api(nc, "CONSUMER.INFO.CG.mem")
    leader = info.get("cluster", {}).get("leader")
    return info if leader and leader != old else None


async def test_workqueue_acks_in_a_consumer_group_remove_messages_on_every_replica(
        js3: JsCluster) -> None:
    """A mem_storage consumer on a file workqueue stream has its own group; its acks reach
    the stream's group (CONSUMER_GROUP_STATE), so every stream replica drops them."""
    nc = await connect(js3.nodes[0])
    try:
        await _stream(nc, "WQ", "workqueue")
        js = nc.jetstream()
        for i in range(6):
            await js.publish("wq", b"m%d" % i)
        await _consumer(nc, "WQ", "w", mem_storage=True)
        msgs = await _fetch(nc, "WQ", "w", 6)
        for m in msgs[:4]:
            await m.ack_sync(timeout=5)
    finally:
        await nc.close()
    for node in js3.nodes:  # each replica answers DIRECT.GET from its own store
        c = await connect(node)
        try:
            await until(lambda c=c: _first_is(c, 5), timeout=20)
        finally:
            await c.close()


async def _first_is(nc: nats.NATS, seq: int) -> bool:
    msg = await nc.request("$JS.API.DIRECT.GET.WQ", b'{"seq": 1, "next_by_subj": "wq"}',
                           timeout=5)
    return msg.headers is not None and msg.headers.get("Nats-Sequence") == str(seq)

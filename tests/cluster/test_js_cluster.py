"""Clustered JetStream on five real node processes (tags az:a, az:b, az:c, az:a, az:b):
R1/R3/R5 streams created on one node and used from every other, KV on R3, placement tags,
stepdowns, STREAM.INFO's `cluster`, /jsz and /healthz."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest

from tests.cluster.jshelp import JsCluster, api, connect, errors_in_logs, until
from tests.integration.jsdiff import kv_history, kv_keys

TAGS = [["az:a"], ["az:b"], ["az:c"], ["az:a"], ["az:b"]]


@pytest.fixture(scope="module")
def js5(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JsCluster]:
    c = JsCluster(tmp_path_factory.mktemp("js5"), 5, tags=TAGS)
    try:
        c.start()
        c.wait_js()
        yield c
    finally:
        c.stop()
    assert errors_in_logs(c) == []


@pytest.mark.parametrize("replicas", [1, 3, 5])
async def test_stream_created_on_one_node_used_from_every_other(js5: JsCluster,
                                                               replicas: int) -> None:
    ncs = [await connect(n) for n in js5.nodes]
    try:
        js = [nc.jetstream(timeout=10) for nc in ncs]
        name = f"R{replicas}_{uuid.uuid4().hex[:6]}"
        info = await js[0].add_stream(name=name, subjects=[f"{name}.>"], num_replicas=replicas)
        assert info.cluster is not None and info.cluster.name == "C1"
        assert len(info.cluster.replicas or []) == replicas - 1
        seqs = []
        for i, j in enumerate(js):  # every node publishes
            for k in range(3):
                ack = await j.publish(f"{name}.n{i}", f"{i}-{k}".encode())
                assert ack.stream == name
                seqs.append(ack.seq)
        assert seqs == list(range(1, 16))
        await js[1].add_consumer(name, durable_name="d", ack_policy="explicit")
        got = []
        for j in js:  # every node fetches and acks
            sub = await j.pull_subscribe_bind("d", stream=name)
            for m in await sub.fetch(3, timeout=5):
                got.append(m.data.decode())
                await m.ack_sync()
        assert got == [f"{i}-{k}" for i in range(5) for k in range(3)]
        for j in js:
            si = await j.stream_info(name)
            assert si.state.messages == 15 and si.state.last_seq == 15
            ci = await j.consumer_info(name, "d")
            assert ci.ack_floor.stream_seq == 15 and ci.num_pending == 0
            assert ci.num_ack_pending == 0
        await js[4].delete_stream(name)
        for nc in ncs:  # every node applies the delete (the meta leader answered first)
            async def gone(nc=nc) -> bool:
                r = await api(nc, f"STREAM.INFO.{name}")
                return r.get("error", {}).get("err_code") == 10059
            await until(gone)
    finally:
        for nc in ncs:
            await nc.close()


async def test_a_core_publish_with_a_plain_subscriber_elsewhere_is_stored_once(
        js5: JsCluster) -> None:
    """Each node captures its own clients' publishes; a plain subscriber on another node
    makes the publish cross the route, and that copy must not be captured again there
    (it was: every message stored twice; now `deliver_routed` skips `local_only` subs)."""
    a, b = await connect(js5.nodes[0]), await connect(js5.nodes[1])
    name = f"ONCE_{uuid.uuid4().hex[:6]}"
    try:
        got: list[str] = []

        async def cb(msg) -> None:  # noqa: ANN001
            got.append(msg.subject)

        await b.subscribe(f"{name}.>", cb=cb)
        await b.flush()
        await a.jetstream(timeout=10).add_stream(name=name, subjects=[f"{name}.>"],
                                                  num_replicas=1)
        await asyncio.sleep(0.5)  # b's interest has reached node 0 (and the capture is set)
        for i in range(5):  # core publishes: no PubAck awaited
            await a.publish(f"{name}.{i}", b"x")
        await a.flush()
        await until(lambda: len(got) == 5)
        await asyncio.sleep(1.0)  # a second capture would have landed by now

        async def stored() -> int:
            return (await api(a, f"STREAM.INFO.{name}"))["state"]["messages"]
        await until(lambda: stored())
        assert await stored() == 5
        await api(a, f"STREAM.DELETE.{name}")
    finally:
        await a.close()
        await b.close()


async def test_kv_on_r3_from_every_node(js5: JsCluster) -> None:
    ncs = [await connect(n) for n in js5.nodes]
    try:
        js = [nc.jetstream(timeout=10) for nc in ncs]
        bucket = f"kv{uuid.uuid4().hex[:6]}"
        kv0 = await js[0].create_key_value(bucket=bucket, replicas=3, history=5)
        for i, j in enumerate(js):
            kv = await j.key_value(bucket)
            await kv.put("k", f"v{i}".encode())
            await kv.put(f"own{i}", b"x")
        for j in js:
            kv = await j.key_value(bucket)
            assert (await kv.get("k")).value == b"v4"
            assert len(await kv_history(kv, "k")) == 5
        assert sorted(await kv_keys(kv0)) == ["k", "own0", "own1", "own2", "own3", "own4"]
        await kv0.delete("k")
        kv3 = await js[3].key_value(bucket)
        with pytest.raises(Exception):  # noqa: B017 (KeyDeletedError or KeyNotFoundError)
            await kv3.get("k")
        await js[2].delete_key_value(bucket)
    finally:
        for nc in ncs:
            await nc.close()


async def test_placement_tags(js5: JsCluster) -> None:
    nc = await connect(js5.nodes[1])
    try:
        js = nc.jetstream(timeout=10)
        from nats.js.api import Placement, StreamConfig

        info = await js.add_stream(StreamConfig(name="TAGC", subjects=["tagc"], num_replicas=1,
                                                placement=Placement(tags=["az:c"])))
        assert info.cluster.leader == "n3"
        info = await js.add_stream(StreamConfig(name="TAGA", subjects=["taga"], num_replicas=2,
                                                placement=Placement(tags=["az:a"])))
        names = {info.cluster.leader, *(r.name for r in info.cluster.replicas)}
        assert names == {"n1", "n4"}
        r = await api(nc, "STREAM.CREATE.TAGZ", {"name": "TAGZ", "num_replicas": 1,
                                                 "placement": {"tags": ["zz:q"]}})
        assert r["error"] == {"code": 400, "err_code": 10005, "description":
                              "no suitable peers for placement, tags not matched ['zz:q']"}
        r = await api(nc, "STREAM.CREATE.TAGA3", {"name": "TAGA3", "num_replicas": 3,
                                                  "placement": {"tags": ["az:a"]}})
        assert r["error"]["err_code"] == 10005
        r = await api(nc, "STREAM.CREATE.R7", {"name": "R7", "num_replicas": 7})
        assert "error" in r
        for name in ("TAGC", "TAGA"):
            await js.delete_stream(name)
    finally:
        await nc.close()


async def test_publishes_reach_a_moved_leader_through_any_node(js5: JsCluster) -> None:
    """An R3 stream on five nodes: the two nodes without a replica send their publishes to
    one of its peers, which passes them on when it is not the leader (a second hop). The
    leader moves once, so in one of the two rounds the peer they pick does not lead. Every
    publish from every node gets its PubAck, with sequences in publishing order."""
    ncs = [await connect(n) for n in js5.nodes]
    try:
        js = [nc.jetstream(timeout=5) for nc in ncs]
        name = f"HOP_{uuid.uuid4().hex[:6]}"
        await js[0].add_stream(name=name, subjects=[f"{name}.>"], num_replicas=3)
        seq = 0
        for rnd in range(2):
            if rnd:
                before = (await js[0].stream_info(name)).cluster.leader
                assert (await api(ncs[1], f"STREAM.LEADER.STEPDOWN.{name}"))["success"]

                async def moved(before: str = before) -> bool:
                    return (await js[0].stream_info(name)).cluster.leader not in (None, before)
                await until(moved)
            for i, j in enumerate(js):
                for k in range(2):
                    seq += 1
                    ack = await j.publish(f"{name}.n{i}", f"{rnd}-{i}-{k}".encode())
                    assert (ack.stream, ack.seq) == (name, seq)
        assert (await js[3].stream_info(name)).state.messages == seq == 20
        await js[2].delete_stream(name)
    finally:
        for nc in ncs:
            await nc.close()


async def test_concurrent_publishes_through_any_node_each_get_their_own_answer(
        js5: JsCluster) -> None:
    """Publishes in flight from every node at once (the leader's node, the other peers,
    the nodes without a replica): the leader merges what queued into STREAM_MSGS entries;
    each publish still gets its own PubAck, duplicate flag or error, and every node serves
    the same stream."""
    from tests.integration.test_jetstream_merged import MAX_SIZE, run_concurrent_publishes

    ncs = [await connect(n) for n in js5.nodes]
    try:
        js = [nc.jetstream(timeout=20) for nc in ncs]
        name = f"MRG_{uuid.uuid4().hex[:6]}"
        await js[0].add_stream(name=name, subjects=[f"{name}.>"], num_replicas=3,
                               max_msg_size=MAX_SIZE)
        stored = await run_concurrent_publishes(js, name, 120)
        for j in js:
            async def caught_up(j=j) -> bool:
                st = (await j.stream_info(name)).state
                return st.messages == st.last_seq == stored
            await until(caught_up)
        await js[2].delete_stream(name)
    finally:
        for nc in ncs:
            await nc.close()


async def test_leader_stepdowns_and_info(js5: JsCluster) -> None:
    ncs = [await connect(n) for n in js5.nodes]
    try:
        js = ncs[2].jetstream(timeout=10)
        await js.add_stream(name="SD", subjects=["sd"], num_replicas=3)
        await js.publish("sd", b"1")
        before = (await js.stream_info("SD")).cluster.leader
        r = await api(ncs[4], "STREAM.LEADER.STEPDOWN.SD")
        assert r == {"type": "io.nats.jetstream.api.v1.stream_leader_stepdown_response",
                     "success": True}

        async def moved() -> bool:
            info = await js.stream_info("SD")
            return info.cluster.leader not in (None, before)
        await until(moved)
        assert (await js.publish("sd", b"2")).seq == 2
        await js.add_consumer("SD", durable_name="c", ack_policy="explicit")
        r = await api(ncs[0], "CONSUMER.LEADER.STEPDOWN.SD.c")
        assert r["success"] is True
        sub = await js.pull_subscribe_bind("c", stream="SD")
        msgs = await until(lambda: sub.fetch(2, timeout=3), timeout=20)
        assert [m.data for m in msgs] == [b"1", b"2"]
        # META.LEADER.STEPDOWN with a preferred server.
        meta = js5.nodes[0].get("/jsz")["meta_cluster"]
        target = next(n.name for n in js5.nodes if n.name != meta["leader"])
        r = await api(ncs[1], "META.LEADER.STEPDOWN", {"placement": {"preferred": target}})
        assert r == {"type": "io.nats.jetstream.api.v1.meta_leader_stepdown_response",
                     "success": True}
        # every node, n3 included (the one read below): a node that has not heard of the new
        # leader yet counts every voter as a replica
        await until(lambda: all(n.get("/jsz")["meta_cluster"].get("leader") == target
                                for n in js5.nodes))
        jsz = js5.nodes[2].get("/jsz?raft=1")
        assert jsz["meta_cluster"]["cluster_size"] == 5
        assert len(jsz["meta_cluster"]["replicas"]) == 4
        assert "$js" in jsz["raft"]
        await js.delete_stream("SD")
        await asyncio.sleep(0)
    finally:
        for nc in ncs:
            await nc.close()


async def test_placement_change_moves_the_stream_without_losing_a_message(js5: JsCluster
                                                                           ) -> None:
    nc = await connect(js5.nodes[0])
    try:
        js = nc.jetstream(timeout=10)
        from nats.js.api import Placement, StreamConfig

        cfg = StreamConfig(name="MOVE", subjects=["move"], num_replicas=2, allow_direct=True,
                           placement=Placement(tags=["az:a"]))
        info = await js.add_stream(cfg)
        assert {info.cluster.leader, *(r.name for r in info.cluster.replicas)} == {"n1", "n4"}
        for i in range(50):
            await js.publish("move", f"m{i}".encode())
        cfg.placement = Placement(tags=["az:b"])
        await js.update_stream(cfg)

        async def moved() -> bool:
            i = await js.stream_info("MOVE")
            names = {i.cluster.leader, *(r.name for r in i.cluster.replicas or [])}
            return names == {"n2", "n5"} and all(r.current for r in i.cluster.replicas)
        await until(moved, timeout=40)
        for i in range(50, 60):
            await js.publish("move", f"m{i}".encode())
        for node in (js5.nodes[1], js5.nodes[4]):
            got = []
            c = await connect(node)
            for seq in range(1, 61):
                m = await c.request("$JS.API.DIRECT.GET.MOVE",
                                    f'{{"seq":{seq}}}'.encode(), timeout=5)
                got.append(m.data.decode())
            await c.close()
            assert got == [f"m{i}" for i in range(60)], node.name
        await js.delete_stream("MOVE")
    finally:
        await nc.close()


async def test_object_store_on_r3_from_every_node(js5: JsCluster) -> None:
    ncs = [await connect(n) for n in js5.nodes]
    try:
        js = [nc.jetstream(timeout=10) for nc in ncs]
        bucket = f"ob{uuid.uuid4().hex[:6]}"
        await js[0].create_object_store(bucket, replicas=3)
        blob = bytes(range(256)) * 2000  # 512 KB: several chunks
        ob1 = await js[1].object_store(bucket)
        await ob1.put("blob", blob)
        for j in js:
            ob = await j.object_store(bucket)
            got = await ob.get("blob")
            assert got.data == blob
        ob4 = await js[4].object_store(bucket)
        await ob4.delete("blob")
        ob2 = await js[2].object_store(bucket)
        with pytest.raises(Exception):  # noqa: B017 (ObjectNotFoundError / ObjectDeletedError)
            await ob2.get("blob")
    finally:
        for nc in ncs:
            await nc.close()


async def test_bad_cluster_requests_are_answered_and_nodes_stay_up(js5: JsCluster) -> None:
    nc = await connect(js5.nodes[3])
    try:
        await nc.jetstream(timeout=10).add_stream(name="BAD", subjects=["bad"], num_replicas=3)
        bodies = [b"not json", b"[1,2]", b'{"peer": 12}', b'{"placement": {"tags": "x"}}',
                  b'{"placement": {"preferred": "nobody"}}', b'{"peer": "nobody"}', b"\xff\xfe"]
        subjects = ["META.LEADER.STEPDOWN", "SERVER.REMOVE", "STREAM.PEER.REMOVE.BAD",
                    "STREAM.PEER.REMOVE.NOPE", "STREAM.LEADER.STEPDOWN.NOPE",
                    "CONSUMER.LEADER.STEPDOWN.BAD.nope", "STREAM.CREATE.BAD2",
                    "STREAM.UPDATE.BAD"]
        for subject in subjects:
            for body in bodies:
                msg = await nc.request("$JS.API." + subject, body, timeout=10)
                r = json.loads(msg.data)
                assert "type" in r, (subject, body, r)
                if subject != "STREAM.CREATE.BAD2" and subject != "META.LEADER.STEPDOWN":
                    assert "error" in r, (subject, body, r)
        assert all(n.alive() for n in js5.nodes)
        info = await nc.jetstream(timeout=10).stream_info("BAD")
        assert info.config.num_replicas == 3
        await nc.jetstream(timeout=10).delete_stream("BAD")
    finally:
        await nc.close()

"""Consumers follow replica changes (three real node processes): a consumer's state moves
between its stream's group and a group of its own, and its own group is re-placed, when
the stream is scaled or the consumer's `num_replicas` is updated, as nats-server 2.15 does
(probed on a 3-node nats-server cluster, docs/notes/consumers.md):

* R1 stream, consumer with explicit `num_replicas: 1`, stream scaled to R3: the consumer
  stays R1 (ours: it leaves the stream's group for an R1 group of its own, with its state);
* consumer updated to `num_replicas: 3`: its group grows to three members (its log compacted
  before: the new members install the leader's snapshot image);
* stream scaled back to R1: the consumer's explicit replicas are lowered to 1.

After every step CONSUMER.INFO (from every node) says what the client acked: ack floor,
delivered, redelivery counts; no acked message is delivered again, none is skipped.

Then the audit (Spark local mode) replays the consumer group's log into consumer state from
the state its meta entry carried and finds every node's record equal; with one node's ack
floor moved in its LMDB record, it reports that node's consumer group."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from audit.model import STORE_MISMATCH
from tests.cluster.auditfaults import move_ack_floor
from tests.cluster.audithelp import (
    ArchiveCluster,
    node_dirs,
    run_audit,
    small_segments,
    violations,
)
from tests.cluster.jshelp import JsCluster, api, connect, errors_in_logs, until

pytestmark = pytest.mark.timeout(300)

WAIT_NS = 30_000_000_000  # no redelivery by ack_wait during the test


@pytest.fixture
def js3(tmp_path: Path) -> Iterator[JsCluster]:
    """Three nodes that compact every group's log after 8 applied entries (archiving the
    segments for the audit): a member added to the consumer group later cannot replay its
    log from the start, it installs the leader's snapshot image."""
    with small_segments(snapshot_every=8):
        with ArchiveCluster(tmp_path / "c", 3).running() as c:
            yield c


async def _update_stream(nc: nats.NATS, replicas: int) -> None:
    cfg = (await api(nc, "STREAM.INFO.MV"))["config"] | {"num_replicas": replicas}
    r = await api(nc, "STREAM.UPDATE.MV", cfg, timeout=30)
    assert "error" not in r, r


async def _update_consumer(nc: nats.NATS, **changes: Any) -> dict[str, Any]:
    cfg = (await api(nc, "CONSUMER.INFO.MV.c"))["config"] | changes
    r = await api(nc, "CONSUMER.CREATE.MV.c", {"stream_name": "MV", "config": cfg}, timeout=30)
    assert "error" not in r, r
    return r


def _state(info: dict[str, Any]) -> tuple[Any, ...]:
    return (info["delivered"]["stream_seq"], info["delivered"]["consumer_seq"],
            info["ack_floor"]["stream_seq"], info["num_ack_pending"], info["num_redelivered"],
            info["config"].get("num_replicas", 0))


async def _everywhere(js3: JsCluster, pred: Any) -> list[dict[str, Any]]:
    last: list[Any] = []

    async def look() -> list[dict[str, Any]] | None:
        out = last
        out.clear()
        for node in js3.nodes:
            c = await connect(node)
            try:
                out.append(await api(c, "CONSUMER.INFO.MV.c"))
            finally:
                await c.close()
        return list(out) if all("error" not in i and pred(i) for i in out) else None
    try:
        return await until(look, timeout=40, every=0.3)
    except TimeoutError:
        logs = [f"{n.name}: {ln}" for n in js3.nodes for ln in n.log_text().splitlines()
                if "jc." in ln or "consumer" in ln or "WRN" in ln]
        raise AssertionError(f"not everywhere: {last}\n" + "\n".join(logs)) from None


async def _fetch(nc: nats.NATS, n: int) -> list[Any]:
    sub = await nc.jetstream().pull_subscribe_bind("c", "MV")
    try:
        return await sub.fetch(n, timeout=5)
    finally:
        await sub.unsubscribe()


async def test_a_consumer_follows_replica_changes_with_its_state(js3: JsCluster,
                                                                 audit_spark: Any,
                                                                 tmp_path: Path) -> None:
    nc = await connect(js3.nodes[0])
    try:
        r = await api(nc, "STREAM.CREATE.MV", {"name": "MV", "subjects": ["mv"],
                                              "num_replicas": 1})
        assert "error" not in r, r
        js = nc.jetstream()
        for i in range(12):
            await js.publish("mv", b"m%d" % i)
        r = await api(nc, "CONSUMER.CREATE.MV.c", {"stream_name": "MV", "config": {
            "durable_name": "c", "ack_policy": "explicit", "ack_wait": WAIT_NS,
            "num_replicas": 1}})
        assert "error" not in r, r
        msgs = await _fetch(nc, 5)
        for m in msgs[:3]:
            await m.ack_sync(timeout=5)
        await msgs[3].nak()
        await api(nc, "CONSUMER.INFO.MV.c")  # the nak applied before the next pull
        again = await _fetch(nc, 1)  # 4 again: redelivered once
        assert [(m.metadata.sequence.stream, m.metadata.num_delivered) for m in again] == \
            [(4, 2)]
        before = await api(nc, "CONSUMER.INFO.MV.c")
        assert _state(before) == (5, 6, 3, 2, 1, 1)

        # 1. the stream goes R3: the R1 consumer keeps its state in an R1 group of its own
        await _update_stream(nc, 3)
        infos = await _everywhere(js3, lambda i: i["cluster"].get("raft_group", "jc.")
                                  .startswith("jc."))
        assert {_state(i) for i in infos} == {(5, 6, 3, 2, 1, 1)}
        assert all(sorted(i["cluster"]) == ["leader", "name"] for i in infos)  # R1's shape
        for _ in range(5):  # 6..10, one entry each for delivery and ack: its log compacts
            for m in await _fetch(nc, 1):
                await m.ack_sync(timeout=5)

        # 2. the consumer is updated to R3: its group grows, the new members install the
        # leader's image (the log is compacted)
        await _update_consumer(nc, num_replicas=3)
        infos = await _everywhere(js3, lambda i: len(i["cluster"].get("replicas", [])) == 2)
        assert {_state(i) for i in infos} == {(10, 11, 3, 2, 1, 3)}
        old = infos[0]["cluster"]["leader"]
        r = await api(nc, "CONSUMER.LEADER.STEPDOWN.MV.c")
        assert r.get("success") is True, r
        infos = await _everywhere(js3, lambda i: i["cluster"].get("leader") not in (None, old))
        assert {_state(i) for i in infos} == {(10, 11, 3, 2, 1, 3)}  # a new member leads

        # 3. the stream goes back to R1: the consumer's explicit replicas follow (1)
        await _update_stream(nc, 1)
        infos = await _everywhere(js3, lambda i: i["config"].get("num_replicas") == 1 and
                                  "replicas" not in i["cluster"])
        assert {_state(i)[:5] for i in infos} == {(10, 11, 3, 2, 1)}
        assert all(sorted(i["cluster"]) == ["leader", "name"] for i in infos)  # R1's shape

        # the acks of 4 and 5 (delivered before the moves) reach the consumer where it is
        # now; nothing acked comes again, nothing is skipped
        for m in (again[0], msgs[4]):
            await m.ack_sync(timeout=5)
        rest = await _fetch(nc, 2)
        assert [m.metadata.sequence.stream for m in rest] == [11, 12]
        for m in rest:
            await m.ack_sync(timeout=5)
        final = await api(nc, "CONSUMER.INFO.MV.c")
    finally:
        await nc.close()
    assert final["ack_floor"]["stream_seq"] == 12 and final["num_ack_pending"] == 0
    assert errors_in_logs(js3) == []
    if audit_spark is None:
        return  # no pyspark / Java here: the audit step is .ci/run's
    host = next(n for n in js3.nodes if n.name == final["cluster"]["leader"])
    group = next(g for g in host.get("/jsz?raft=1")["raft"] if g.startswith("jc.MV.c."))
    js3.stop()
    # one audit over the three nodes and a copy of the host with its record damaged: the
    # nodes are clean, the copy is named (one Spark run: the audit is the slow part here)
    bad = tmp_path / "bad"
    shutil.copytree(host.dir / "data", bad / "data")
    move_ack_floor(bad, group, "c", 1)
    report = run_audit(audit_spark, [*node_dirs(js3), bad])
    found = {(f["kind"], f.get("node"), f.get("group")) for f in violations(report)}
    assert found == {(STORE_MISMATCH, "bad", group)}, violations(report)
    assert [f for f in report["findings"] if f.get("node") != "bad"] == [], \
        report["findings"][:5]
    assert group in report["stats"]["replayed_groups"]


async def test_peer_removal_moves_the_consumer_group_with_its_state(js3: JsCluster) -> None:
    """STREAM.PEER.REMOVE of the node hosting an R1 consumer's group: the group is
    re-placed on a remaining stream peer (it joins, installs the state, takes over), with
    its ack floor and pending messages; acks go on there."""
    nc = await connect(js3.nodes[0])
    try:
        r = await api(nc, "STREAM.CREATE.P", {"name": "P", "subjects": ["p"],
                                             "num_replicas": 3})
        assert "error" not in r, r
        js = nc.jetstream()
        for _ in range(6):
            await js.publish("p", b"x")
        r = await api(nc, "CONSUMER.CREATE.P.c", {"stream_name": "P", "config": {
            "durable_name": "c", "ack_policy": "explicit", "ack_wait": WAIT_NS,
            "num_replicas": 1}})
        assert "error" not in r, r
        host = r["cluster"]["leader"]
        sub = await js.pull_subscribe_bind("c", "P")
        msgs = await sub.fetch(4, timeout=5)
        for m in msgs[:2]:
            await m.ack_sync(timeout=5)
        r = await api(nc, "STREAM.PEER.REMOVE.P", {"peer": host}, timeout=20)
        assert r.get("success") is True, r

        async def moved() -> dict[str, Any] | None:
            i = await api(nc, "CONSUMER.INFO.P.c")
            return i if "error" not in i and i["cluster"].get("leader") not in (None, host) \
                else None
        info = await until(moved, timeout=40, every=0.3)
        assert (info["ack_floor"]["stream_seq"], info["num_ack_pending"],
                info["delivered"]["stream_seq"]) == (2, 2, 4)
        await msgs[2].ack_sync(timeout=5)
        info = await api(nc, "CONSUMER.INFO.P.c")
        await sub.unsubscribe()
    finally:
        await nc.close()
    assert info["ack_floor"]["stream_seq"] == 3 and info["num_ack_pending"] == 1

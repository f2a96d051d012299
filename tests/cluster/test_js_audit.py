"""`jetraft audit` (issue 10) over the logs and stores of a real 3-node JetStream cluster.

One history, made once per module by real node processes in the audit retention mode
(`audit_archive: true`, 32 KiB WAL segments, a snapshot every 100 entries, so compaction
archives segments): an R3 stream with a pull consumer, a stream leader stepdown, kill -9 of
the stream leader while two publishers publish through the other nodes (then a restart),
fetch + ack, an R1 stream scaled to R3 (membership change, catch-up by snapshot), a meta
leader stepdown, more publishes, SIGTERM.

- Healthy: the audit over the three data directories (with the acked-writes file of every
  PubAck the clients got) reports no finding at all; the meta group and every stream group
  were replayed; segments were archived; the leader changes and the membership change are
  in the logs.
- Faults, injected into a copy of the three directories, each reported as exactly the
  finding it should be (kind, node, group, index): see test_injected_faults_are_each_found.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from pathlib import Path
from typing import Any

import nats
import pytest

from audit import model
from tests.cluster.audithelp import (
    ArchiveCluster,
    run_audit,
    small_segments,
    violations,
    write_acked,
)
from tests.cluster.jshelp import api, connect, until
from tests.cluster.test_js_faults import publisher

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def spark(audit_spark):
    if audit_spark is None:
        pytest.skip("the audit needs pyspark, matplotlib and Java (see .ci/run)")
    return audit_spark


@pytest.fixture(scope="module")
def history(tmp_path_factory, spark) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("audit3")
    with small_segments(segment_bytes=32 << 10):
        return asyncio.run(_make_history(root))


async def _publish(js: Any, stream: str, subject: str, tag: str, n: int,
                   acked: list[tuple[str, str, int]]) -> None:
    for i in range(n):
        data = f"{tag}-{i:05d}"
        ack = await js.publish(subject, data.encode(), headers={"Nats-Msg-Id": data})
        acked.append((stream, data, ack.seq))


async def _leader(nc: Any, stream: str) -> str:
    r = await api(nc, f"STREAM.INFO.{stream}")
    return (r.get("cluster") or {}).get("leader") or ""


async def _make_history(root: Path) -> dict[str, Any]:
    c = ArchiveCluster(root / "c", 3)
    acked: list[tuple[str, str, int]] = []
    try:
        c.start()
        c.wait_js()
        nc = await connect(c.nodes[0])
        js = nc.jetstream(timeout=10)
        await _placed(lambda: js.add_stream(name="A", subjects=["k"], num_replicas=3,
                                            allow_direct=True))
        await js.add_consumer("A", durable_name="w", ack_policy="explicit")
        await _publish(js, "A", "k", "s0", 150, acked)
        # Leader change 1: a stepdown.
        first = await _leader(nc, "A")
        r = await api(nc, "STREAM.LEADER.STEPDOWN.A")
        assert r.get("success"), r
        await until(lambda: _new_leader(nc, "A", first), timeout=30)
        await _publish(js, "A", "k", "s1", 150, acked)
        # Leader change 2: kill -9 of the stream leader while two publishers publish.
        name = await until(lambda: _leader(nc, "A"), timeout=30)
        leader = next(n for n in c.nodes if n.name == name)
        others = [n for n in c.nodes if n is not leader]
        pubs = [await connect(n) for n in others]
        got: list[tuple[str, int]] = []
        progress = asyncio.Event()
        tasks = [asyncio.ensure_future(publisher(p, i, 150, got, progress))
                 for i, p in enumerate(pubs)]
        await asyncio.wait_for(progress.wait(), 60)
        c.stop_node(leader, sig=signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*tasks), 180)
        acked += [("A", data, seq) for data, seq in got]
        c.start_node(leader)
        c.wait_js()
        for p in pubs:
            await p.close()
        if leader is c.nodes[0]:
            await nc.close()
            nc = await connect(others[0])
            js = nc.jetstream(timeout=10)
        # The consumer: 100 fetched, 80 acked (ack floor and pending in every store).
        sub = await js.pull_subscribe_bind("w", stream="A")
        msgs: list[Any] = []
        while len(msgs) < 100:
            msgs += await sub.fetch(100 - len(msgs), timeout=10)
        for m in msgs[:80]:
            await m.ack_sync()
        # Membership change: an R1 stream scaled to R3 (the new replicas catch up by snapshot).
        info = await _placed(lambda: js.add_stream(name="B", subjects=["b"], num_replicas=1,
                                                    allow_direct=True))
        await _publish(js, "B", "b", "b0", 120, acked)
        cfg = info.config
        cfg.num_replicas = 3
        await _placed(lambda: js.update_stream(cfg))
        await until(lambda: _replicas_current(js, "B", 2), timeout=60)
        await _publish(js, "B", "b", "b1", 60, acked)
        # A meta leader change.
        r = await api(nc, "META.LEADER.STEPDOWN", {})
        assert r.get("success"), r
        await until(lambda: _meta_leader(c), timeout=30)
        await _publish(js, "A", "k", "s2", 100, acked)
        await nc.close()
    finally:
        c.stop()
    path = write_acked(root / "acked.jsonl", acked)
    return {"dirs": [n.dir for n in c.nodes], "acked": path, "count": len(acked),
            "groups": _groups(c.nodes[0].dir)}


async def _placed(call: Any, timeout: float = 60.0) -> Any:
    """A create/update that needs every peer up: the meta leader may still see the node
    restarted a moment ago as offline (10005 "peer offline"), so it is retried."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await call()
        except nats.js.errors.BadRequestError as e:
            if e.err_code != 10005 or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _new_leader(nc: Any, stream: str, old: str) -> bool:
    now = await _leader(nc, stream)
    return bool(now) and now != old


async def _replicas_current(js: Any, stream: str, followers: int) -> bool:
    info = await js.stream_info(stream)
    reps = info.cluster.replicas or []
    return len(reps) == followers and all(r.current for r in reps)


def _meta_leader(c: ArchiveCluster) -> str:
    try:
        return c.nodes[0].get("/jsz")["meta_cluster"].get("leader") or ""
    except (OSError, ValueError, KeyError):
        return ""


def _groups(node_dir: Path) -> dict[str, str]:
    from audit.jsstore import NodeStore, find_lmdb

    store = NodeStore(find_lmdb(str(node_dir)))
    try:
        return {name: e["group"] for name, e in store.catalogue().items()}
    finally:
        store.close()


def _copy(history: dict[str, Any], tmp: Path) -> list[Path]:
    out = []
    for d in history["dirs"]:
        dst = tmp / d.name
        shutil.copytree(d / "data", dst / "data")
        out.append(dst)
    return out


def test_healthy_three_node_history_has_no_finding(spark, history, tmp_path):
    dirs = _copy(history, tmp_path)
    report = run_audit(spark, dirs, history["acked"])
    assert report["findings"] == [], json.dumps(report["findings"], indent=1)[:6000]
    assert report["verdict"]["ok"]
    groups = history["groups"]
    assert set(groups) == {"A", "B"}
    assert {"$js", groups["A"], groups["B"]} <= set(report["stats"]["replayed_groups"])
    assert report["stats"]["archived_segments"] > 0  # compaction archived, the audit read them
    a = report["groups"][groups["A"]]
    assert len(a["term_starts"]) >= 2  # the stepdown and the kill -9 each start a term
    assert {c["node"] for c in a["logs"]} == {"n1", "n2", "n3"}
    b = report["groups"][groups["B"]]
    assert max(c["conf_changes"] for c in b["logs"]) >= 2  # R1 -> R3: two members added
    # The first term is no "start" in the report: the meta stepdown adds one (kill -9 of a
    # stream leader that also led the meta group adds another).
    assert len(report["groups"]["$js"]["term_starts"]) >= 1


def test_injected_faults_are_each_found(spark, history, tmp_path):
    """Six faults in one copy of the three directories; each is exactly one violation
    naming the right node, group and index (and nothing else is reported):

    - n3: a payload byte of a committed stream-A entry changed, CRC fixed -> log_matching;
    - n1: its last stream-B entry given another term -> committed_mismatch;
    - n2: a committed meta-group entry deleted -> committed_missing;
    - n2: a stored message's byte altered in LMDB -> store_mismatch (at n2's applied index);
    - n3: the consumer's ack floor moved in LMDB -> store_mismatch (at n3's applied index);
    - every node: an acknowledged message rewritten to other bytes, in the WAL and the
      store alike (the replicas still agree) -> acked_missing, from the acked file alone.
    """
    from tests.cluster import auditfaults as f

    n1, n2, n3 = dirs = _copy(history, tmp_path)
    ga, gb = history["groups"]["A"], history["groups"]["B"]
    acked = [json.loads(x) for x in history["acked"].read_text().splitlines()]
    lost = next(a for a in acked if a["stream"] == "A" and a["seq"] == 20)
    # The acked message lost on every node (same length: nothing else moves).
    for d in dirs:
        assert f.rewrite_message_data(d, ga, lost["data"].encode(), b"X" * len(lost["data"]))
        f.replace_message_data(d, ga, lost["seq"], b"X" * len(lost["data"]))
    # n3: a payload byte of a committed stream-A publish that n1 and n2 hold too.
    held = [{(r.index, r.term) for r in f.entries(d, ga)} for d in (n1, n2)]
    flip = next(r for r in f.entries(n3, ga)[40:] if r.payload and r.entry_type == 0
                and r.index <= f.commit_of(n3, ga) and all((r.index, r.term) in h for h in held)
                and r.index not in _indexes_of(n3, ga, b"X" * len(lost["data"])))
    f.flip_payload_byte(n3, ga, flip.index)
    # n1: its last stream-B entry re-termed.
    last = f.entries(n1, gb)[-1]
    assert last.index <= f.commit_of(n1, gb)
    f.set_term(n1, gb, last.index, last.term + 1)
    # n2: a committed meta entry (stream B's create) deleted.
    gone = next(r for r in f.entries(n2, "$js") if r.payload
                and json.loads(r.payload).get("op") == "create"
                and json.loads(r.payload).get("name") == "B")
    assert gone.index <= f.commit_of(n2, "$js")
    f.delete_entry(n2, "$js", gone.index)
    # LMDB: a message altered on n2, the consumer's ack floor moved on n3.
    f.alter_message_byte(n2, ga, 30)
    f.move_ack_floor(n3, ga, "w", 3)

    report = run_audit(spark, dirs, history["acked"])
    got = sorted((v["kind"], v.get("node"), v.get("group"), v.get("index"))
                 for v in violations(report))
    assert got == sorted([
        (model.LOG_MATCHING, "n3", ga, flip.index),
        (model.COMMITTED_MISMATCH, "n1", gb, last.index),
        (model.COMMITTED_MISSING, "n2", "$js", gone.index),
        (model.STORE_MISMATCH, "n2", ga, f.applied(n2, ga)),
        (model.STORE_MISMATCH, "n3", ga, f.applied(n3, ga)),
        (model.ACKED_MISSING, None, ga, None),
    ]), json.dumps(report["findings"], indent=1)[:6000]
    by_kind = {v["kind"]: v for v in violations(report)}
    assert by_kind[model.LOG_MATCHING]["term"] == flip.term
    assert by_kind[model.COMMITTED_MISMATCH]["term"] == last.term + 1
    assert f"line {acked.index(lost) + 1}" in by_kind[model.ACKED_MISSING]["detail"]
    details = sorted(v["detail"] for v in violations(report) if v["kind"] == model.STORE_MISMATCH)
    assert details[0].startswith("consumer 'w' state differs from the replay (ack floor")
    assert details[1].startswith("message seq 30 differs from the replay")
    assert not report["verdict"]["ok"]


def _indexes_of(node_dir: Path, group: str, data: bytes) -> set[int]:
    from node.jetstream import ops
    from tests.cluster.auditfaults import _decoded, entries

    return {r.index for r in entries(node_dir, group)
            if isinstance(op := _decoded(r.payload), ops.StreamMsg) and op.data == data}

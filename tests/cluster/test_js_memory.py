"""R>1 memory streams (issue 8, "Memory storage is defined"): a publish is acknowledged once a
quorum holds it, so a replica that catches up by snapshot must receive the messages, not a
marker. Three real node processes, compaction every 50 entries."""

from __future__ import annotations

import shutil
import signal
from typing import Any

import pytest

from tests.cluster.jshelp import JsCluster, api, connect, errors_in_logs, until
from tests.cluster.test_js_faults import replica_contents


async def _current(js: Any) -> Any:
    info = await js.stream_info("K")
    reps = info.cluster.replicas or []
    return info if len(reps) == 2 and all(r.current for r in reps) else None


async def _leads(js: Any, name: str) -> bool:
    return bool((await js.stream_info("K")).cluster.leader == name)


async def test_memory_r3_follower_catches_up_by_snapshot_then_leads(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower of a memory R3 stream is killed (-9) while the leader takes 200 more
    publishes and compacts its log past them; restarted, it restores its own image and
    installs the leader's: it holds all 400 messages. Then leadership moves to it and it
    serves them all (INFO, DIRECT.GET, the consumer's pending). Then another follower is
    wiped: as a new peer it gets the replica from the leader's image, and leads too."""
    monkeypatch.setenv("JETRAFT_JS_SNAPSHOT_EVERY", "50")
    c = JsCluster(tmp_path / "c", 3)
    try:
        c.start()
        c.wait_js()
        nc = await connect(c.nodes[0])
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="K", subjects=["k"], num_replicas=3, storage="memory",
                            allow_direct=True)
        await js.add_consumer("K", durable_name="d", ack_policy="explicit")
        for i in range(200):
            await js.publish("k", f"a{i:04d}".encode())
        info = await until(lambda: _current(js), timeout=30)
        follower = next(n for n in c.nodes[1:] if n.name != info.cluster.leader)
        c.stop_node(follower, sig=signal.SIGKILL)
        for i in range(200):
            await js.publish("k", f"b{i:04d}".encode())
        c.start_node(follower)
        c.wait_js()
        await until(lambda: _current(js), timeout=30)
        want = [f"a{i:04d}" for i in range(200)] + [f"b{i:04d}" for i in range(200)]
        assert await replica_contents(follower, 400) == want
        # leadership moves to the follower that caught up (nats-server 2.11+'s preferred)
        r = await api(nc, "STREAM.LEADER.STEPDOWN.K", {"placement": {"preferred": follower.name}})
        assert r.get("success"), r
        await until(lambda: _leads(js, follower.name), timeout=30)
        await until(lambda: _current(js), timeout=30)
        info = await js.stream_info("K")
        assert info.cluster.leader == follower.name
        assert info.state.messages == 400 and info.state.last_seq == 400
        ci = await js.consumer_info("K", "d")
        assert ci.num_pending == 400
        msg = await js.get_msg("K", 400)
        assert msg.data == b"b0199"
        # A wiped follower comes back as a new peer; the replica moves to it and it can only
        # catch up from the leader's image (the log was compacted long before); then it leads.
        wiped = next(n for n in c.nodes[1:] if n is not follower)
        c.stop_node(wiped, sig=signal.SIGKILL)
        shutil.rmtree(wiped.dir / "data")
        c.start_node(wiped)
        c.wait_js()

        async def moved() -> bool:
            info = await js.stream_info("K")
            names = {info.cluster.leader, *(r.name for r in info.cluster.replicas or [])}
            return names == {"n1", "n2", "n3"} and all(r.current for r in info.cluster.replicas)
        await until(moved, timeout=60)
        assert await replica_contents(wiped, 400) == want
        r = await api(nc, "STREAM.LEADER.STEPDOWN.K", {"placement": {"preferred": wiped.name}})
        assert r.get("success"), r
        await until(lambda: _leads(js, wiped.name), timeout=30)
        info = await js.stream_info("K")
        assert info.cluster.leader == wiped.name and info.state.messages == 400
        assert (await js.publish("k", b"after")).seq == 401
        await nc.close()
        assert errors_in_logs(c) == []
    finally:
        c.stop()

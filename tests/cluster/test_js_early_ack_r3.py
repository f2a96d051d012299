"""A clustered leader sends a lone publish's PubAck before its store commit, as a single
node does (`JetStreamService._early_replies`, inline apply of a committed entry): what a
client sees must not change for it. A real 3-node cluster, nats-py over TCP, an R3 stream:
(1) after each sync publish (to the leader, and through another node) returns, the
message is readable from the leader and counted; (2) PubAcks keep the stream's order when
runs acked early (lone publishes) and runs acked after their commit (bursts) mix."""

from __future__ import annotations

from typing import Any

import pytest
from nats.js.api import DiscardPolicy
from nats.js.errors import APIError

from tests.cluster.jshelp import JsCluster, connect, until
from tests.puback_order import pubacks_keep_stream_order

pytestmark = pytest.mark.timeout(240)
COUNT = 30


async def _leader_node(c: JsCluster, stream: str) -> Any:
    nc = await connect(c.nodes[0])
    try:
        name = await until(lambda: _named_leader(nc, stream), timeout=30)
    finally:
        await nc.close()
    return next(n for n in c.nodes if n.name == name)


async def _named_leader(nc: Any, stream: str) -> str:
    try:
        return (await nc.jetstream(timeout=5).stream_info(stream)).cluster.leader or ""
    except Exception:  # noqa: BLE001 (no leader yet)
        return ""


async def test_r3_pubacks_early_readable_counted_and_in_order(tmp_path) -> None:
    c = JsCluster(tmp_path / "c", 3)
    with c.running():
        admin = await connect(c.nodes[0])
        await admin.jetstream(timeout=10).add_stream(name="EA", subjects=["ea.>"],
                                                     num_replicas=3)
        await admin.close()
        leader = await _leader_node(c, "EA")
        other = next(n for n in c.nodes if n is not leader)
        nc = await connect(leader)
        far = await connect(other)
        try:
            js = nc.jetstream(timeout=10)
            for k in range(1, 2 * COUNT + 1):
                via = js if k % 2 else far.jetstream(timeout=10)
                ack = await via.publish(f"ea.{k}", str(k).encode())
                assert ack.seq == k
                # On the leader, the stream holds it already: read and counted.
                got = await js.get_msg("EA", k)
                assert got.data == str(k).encode() and got.subject == f"ea.{k}"
                assert (await js.stream_info("EA")).state.messages == k
            await pubacks_keep_stream_order(nc, js, rounds=30, timeout=60, replicas=3)
            await _refusals(js, far.jetstream(timeout=10))
        finally:
            await nc.close()
            await far.close()


async def _refusals(js: Any, far: Any) -> None:
    """Lone publishes the apply refuses or deduplicates (their PubAcks take the early path
    too) answer as nats-server does, never with a fresh OK: a wrong expected last sequence
    (10071), a subject over max_msgs_per_subject with discard new per subject (10077), a
    repeated Nats-Msg-Id (duplicate, the first sequence). Nothing extra is stored."""
    await js.add_stream(name="RF", subjects=["rf.>"], num_replicas=3, max_msgs_per_subject=1,
                        discard=DiscardPolicy.NEW, discard_new_per_subject=True)
    for via in (js, far):  # to the leader, and through another node
        first = await via.publish("rf.a", b"1", headers={"Nats-Msg-Id": "m1"})
        assert first.seq == 1
        dup = await via.publish("rf.a", b"1", headers={"Nats-Msg-Id": "m1"})
        assert dup.duplicate and dup.seq == 1
        with pytest.raises(APIError) as err:
            await via.publish("rf.b", b"x", headers={"Nats-Expected-Last-Sequence": "7"})
        assert err.value.err_code == 10071
        with pytest.raises(APIError) as err:
            await via.publish("rf.a", b"2")
        assert err.value.err_code == 10077
    assert (await js.stream_info("RF")).state.messages == 1

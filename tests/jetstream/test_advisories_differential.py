"""Advisories: the stream/consumer actions and the consumer events of one scenario, as
nats-server publishes them vs the builders fed by our state machines. `id` and `timestamp`
differ by nature; API audit advisories (client details) are the node's and left out."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats

from node.jetstream import advisories, config, consumer_config, ops
from node.jetstream.consumer import AckKind, Delivery, Drop, StreamView, parse_ack_body
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import ConsumerEvent, Stream

MS = 1_000_000
# The +TERM and -NAK must reach nats-server within ack_wait of the fetch, or its ack timer
# drops those messages first (200 ms did not hold at load 20); message 3 runs out then.
ACK_WAIT = 2000 * MS
CONSUMER = {"durable_name": "c", "ack_policy": "explicit", "ack_wait": ACK_WAIT,
            "max_deliver": 1}


def _norm(subject: str, data: bytes) -> tuple[str, dict[str, Any]]:
    body = json.loads(data)
    body.pop("id")
    body.pop("timestamp")
    return subject, body


MAX_DELIVERIES = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ADV.c"


async def _until_advised(got: list[Any], subject: str, count: int) -> None:
    """Until `count` advisories on `subject` arrived (at most 20 s)."""
    async with asyncio.timeout(20):
        while sum(s == subject for s, _ in got) < count:
            await asyncio.sleep(0.02)


async def _oracle(port: int) -> list[Any]:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    got: list[Any] = []

    async def collect(msg: Any) -> None:
        if not msg.subject.endswith(".API"):
            got.append(_norm(msg.subject, msg.data))

    try:
        await nc.subscribe("$JS.EVENT.ADVISORY.>", cb=collect)
        await nc.flush()
        await nc.request("$JS.API.STREAM.CREATE.ADV", json.dumps(
            {"name": "ADV", "subjects": ["adv.>"]}).encode(), timeout=5)
        for i in range(3):
            await nc.request("adv.a", b"%d" % i, timeout=5)
        await nc.request("$JS.API.CONSUMER.CREATE.ADV.c", json.dumps(
            {"stream_name": "ADV", "config": CONSUMER}).encode(), timeout=5)
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.ADV.c", b'{"batch":3,"no_wait":true}',
                         reply=inbox)
        msgs = [await sub.next_msg(timeout=5) for _ in range(3)]
        await nc.request(msgs[0].reply, b"+TERM because", timeout=5)
        await nc.request(msgs[1].reply, b"-NAK", timeout=5)
        # after ack_wait message 3 runs out of deliveries (a loaded nats-server's timer and
        # advisory can come well after it: wait for the advisory, not a fixed time)
        await _until_advised(got, MAX_DELIVERIES, 1)
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.ADV.c", b'{"batch":3,"no_wait":true}',
                         reply=inbox)
        await _until_advised(got, MAX_DELIVERIES, 2)  # the nak'd message 2's, on this pull
        await nc.request("$JS.API.STREAM.UPDATE.ADV", json.dumps(
            {"name": "ADV", "subjects": ["adv.>"], "max_msgs": 10}).encode(), timeout=5)
        await nc.request("$JS.API.CONSUMER.DELETE.ADV.c", b"", timeout=5)
        await nc.request("$JS.API.STREAM.DELETE.ADV", b"", timeout=5)
        # a loaded nats-server sends the deletion's advisory after its reply
        await _until_advised(got, "$JS.EVENT.ADVISORY.STREAM.DELETED.ADV", 1)
        await asyncio.sleep(0.3)  # and nothing more may come
        return got
    finally:
        await nc.close()


def _ours() -> list[Any]:
    out: list[Any] = []

    def emit(item: tuple[str, bytes]) -> None:
        out.append(_norm(*item))

    cfg, pedantic = config.parse_request(b'{"name":"ADV","subjects":["adv.>"]}')
    stream = Stream(config.check_create("ADV", cfg, pedantic, {})[0], MemStore("ADV"))
    emit(advisories.stream_action("create", "ADV", "id", "ts"))
    now = 10**18
    for i in range(3):
        stream.apply(ops.StreamMsg(now, "adv.a", "", b"", b"%d" % i))
    req = consumer_config.parse_request(json.dumps({"stream_name": "ADV",
                                                    "config": CONSUMER}).encode())
    ccfg, _, _ = consumer_config.check_create("$JS.API.CONSUMER.CREATE.ADV.c", req,
                                              stream.cfg, {})
    consumer = stream.attach_consumer("c", ccfg)
    emit(advisories.consumer_action("create", "ADV", "c", "id", "ts"))
    view = StreamView(stream.store, [])
    for _ in range(3):
        plan = consumer.plan(now, view)
        assert isinstance(plan, Delivery)
        stream.apply(ops.ConsumerDelivered(now, "c", plan.sseq))
    for sseq, cseq, body in ((1, 1, b"+TERM because"), (2, 2, b"-NAK")):
        kind, delay, _ = parse_ack_body(body)
        for effect in stream.apply(ops.ConsumerAck(now, "c", kind, sseq, delay)):
            if isinstance(effect, ConsumerEvent):
                a = effect.advisory
                if kind == AckKind.TERM:
                    emit(advisories.terminated("ADV", "c", cseq, a.sseq, a.deliveries,
                                               advisories.term_reason(body), "id", "ts"))
                else:
                    emit(advisories.naked("ADV", "c", cseq, a.sseq, a.deliveries, "id", "ts"))
    # the ack timer at ack_wait drops message 3 (its one delivery is used up); the nak'd
    # message 2 waits for the next pull, after it
    drops = [(ACK_WAIT, d) for d in consumer.timer_drops(now + ACK_WAIT)]
    drops.append((ACK_WAIT + 400 * MS, consumer.plan(now + ACK_WAIT + 400 * MS, view)))
    for at, plan in drops:
        assert isinstance(plan, Drop), plan
        for effect in stream.apply(ops.ConsumerAck(now + at, "c", plan.kind, plan.sseq)):
            if isinstance(effect, ConsumerEvent):
                emit(advisories.max_deliveries("ADV", "c", effect.advisory.sseq,
                                               effect.advisory.deliveries, "id", "ts"))
    emit(advisories.stream_action("modify", "ADV", "id", "ts"))
    emit(advisories.consumer_action("delete", "ADV", "c", "id", "ts"))
    emit(advisories.stream_action("delete", "ADV", "id", "ts"))
    return out


async def test_advisories_match_nats_server(js_oracle_port: int) -> None:
    theirs = await _oracle(js_oracle_port)
    assert _ours() == theirs

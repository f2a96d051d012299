"""Pull consumers: nats-server vs the pure Stream + Consumer machines, step by step.

The script publishes, fetches, acks, naks (without delay, so no timing is involved) and
terminates. For every fetched message the ack reply subject's numbers (deliveries, stream seq,
consumer seq, pending) are compared, and after each script the consumer's counters and the
stream state. Only times may differ (ALLOWED_TO_DIFFER).
"""

from __future__ import annotations

import json
import time
from typing import Any

import nats
import pytest

from node.jetstream import config, ops, replies
from node.jetstream.consumer import Delivery, StreamView, parse_ack_body, parse_ack_subject
from node.jetstream.store.base import file_size
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Stream

ALLOWED_TO_DIFFER = ("ts", "first_ts", "last_ts")

Step = tuple[Any, ...]
SCRIPTS: dict[str, tuple[dict[str, Any], dict[str, Any], list[Step]]] = {
    "explicit": ({}, {}, [
        ("pub", "q.a", 5), ("fetch", 3), ("ack", 0, b"+ACK"), ("ack", 2, b"+ACK"),
        ("fetch", 2), ("ack", 1, b"-NAK"), ("fetch", 2), ("ack", 3, b"+TERM"),
        ("ack", 0, b"+ACK")]),
    "filtered": ({}, {"filter_subject": "q.b"}, [
        ("pub", "q.a", 2), ("pub", "q.b", 3), ("pub", "q.a", 1), ("fetch", 2),
        ("ack", 1, b"+ACK"), ("pub", "q.b", 1), ("fetch", 5), ("ack", 0, b"+ACK")]),
    "workqueue": ({"retention": "workqueue"}, {}, [
        ("pub", "q.a", 4), ("fetch", 4), ("ack", 1, b"+ACK"), ("ack", 3, b"+TERM"),
        ("ack", 0, b"-NAK"), ("fetch", 1), ("ack", 4, b"+ACK")]),
    "interest": ({"retention": "interest"}, {}, [
        ("pub", "q.a", 3), ("fetch", 2), ("ack", 0, b"+ACK"), ("ack", 1, b"+ACK")]),
    "ack_all": ({}, {"ack_policy": "all"}, [
        ("pub", "q.a", 5), ("fetch", 4), ("ack", 2, b"+ACK"), ("fetch", 3)]),
    "max_ack_pending": ({}, {"max_ack_pending": 2}, [
        ("pub", "q.a", 5), ("fetch", 5), ("ack", 0, b"+ACK"), ("fetch", 5)]),
}


async def _oracle(port: int, name: str, scfg: dict[str, Any], ccfg: dict[str, Any],
                  steps: list[Step]) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        await nc.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(
            {"name": name, "subjects": ["q.>"], **scfg}).encode(), timeout=5)
        body = {"stream_name": name, "config": {"durable_name": "c", "ack_policy": "explicit",
                                                **ccfg}}
        created = await nc.request(f"$JS.API.CONSUMER.CREATE.{name}.c",
                                   json.dumps(body).encode(), timeout=5)
        assert "error" not in json.loads(created.data), created.data
        seen: list[Any] = []
        fetched: list[str] = []
        for step in steps:
            seen.append(await _oracle_step(nc, name, step, fetched))
        info = json.loads((await nc.request(f"$JS.API.CONSUMER.INFO.{name}.c", b"",
                                            timeout=5)).data)
        state = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{name}", b"",
                                             timeout=5)).data)["state"]
        await nc.request(f"$JS.API.STREAM.DELETE.{name}", b"", timeout=5)
        return seen, _counters(info), state
    finally:
        await nc.close()


async def _oracle_step(nc: Any, name: str, step: Step, fetched: list[str]) -> Any:
    if step[0] == "pub":
        for _ in range(step[2]):
            await nc.request(step[1], b"x", timeout=5)
        return None
    if step[0] == "ack":
        await nc.request(fetched[step[1]], step[2], timeout=5)  # acks with a reply: synced
        return None
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{name}.c",
                     json.dumps({"batch": step[1], "no_wait": True}).encode(), reply=inbox)
    got = []
    while True:
        try:
            msg = await sub.next_msg(timeout=1)
        except nats.errors.TimeoutError:
            break  # max_ack_pending reached: nats-server sends nothing more for this request
        if not msg.reply:  # the 404 status that ends a no_wait request
            break
        fetched.append(msg.reply)
        info = parse_ack_subject(msg.reply)
        got.append((info.deliveries, info.sseq, info.cseq, info.pending))
        if len(got) == step[1]:
            break
    await sub.unsubscribe()
    return got


def _counters(info: dict[str, Any]) -> dict[str, Any]:
    return {
        "delivered": [info["delivered"]["consumer_seq"], info["delivered"]["stream_seq"]],
        "ack_floor": [info["ack_floor"]["consumer_seq"], info["ack_floor"]["stream_seq"]],
        "num_ack_pending": info["num_ack_pending"], "num_redelivered": info["num_redelivered"],
        "num_pending": info["num_pending"]}


def _ours(name: str, scfg: dict[str, Any], ccfg: dict[str, Any], steps: list[Step]
          ) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    cfg, pedantic = config.parse_request(json.dumps(
        {"name": name, "subjects": ["q.>"], **scfg}).encode())
    stream = Stream(config.check_create(name, cfg, pedantic, {})[0],
                    MemStore(name, sizer=file_size))
    consumer = stream.attach_consumer("c", {"ack_policy": "explicit", **ccfg})
    view = StreamView(stream.store, consumer.filters())
    seen: list[Any] = []
    fetched: list[int] = []
    for step in steps:
        now = time.time_ns()
        if step[0] == "pub":
            for _ in range(step[2]):
                stream.apply(ops.StreamMsg(now, step[1], "", b"", b"x"))
            seen.append(None)
        elif step[0] == "ack":
            kind, delay, _next = parse_ack_body(step[2])
            stream.apply(ops.ConsumerAck(now, "c", kind, fetched[step[1]], delay))
            seen.append(None)
        else:
            got = []
            while len(got) < step[1]:
                plan = consumer.plan(now, view)
                if not isinstance(plan, Delivery):
                    break
                stream.apply(ops.ConsumerDelivered(now, "c", plan.sseq))
                fetched.append(plan.sseq)
                got.append((plan.deliveries, plan.sseq, consumer.state.delivered_cseq,
                            view.count_matching(consumer.state.delivered_sseq)))
            seen.append(got)
    info = replies.consumer_info("consumer_info_response", name, "c", {}, consumer, view, "", "")
    return seen, _counters(info), stream.state(consumers=1)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
async def test_pull_consumer_matches_nats_server(js_oracle_port: int, script: str) -> None:
    scfg, ccfg, steps = SCRIPTS[script]
    name = "C_" + script.upper()
    ours = _ours(name, scfg, ccfg, steps)
    strip = lambda s: {k: v for k, v in s.items() if k not in ALLOWED_TO_DIFFER}  # noqa: E731
    # Ours is pure and deterministic; nats-server applies acks on another goroutine, so on a
    # loaded machine a later delivery can show a pending count from before an ack. The
    # oracle gets three runs to show its settled answer; the last one is compared in full.
    for _ in range(3):
        theirs = await _oracle(js_oracle_port, name, scfg, ccfg, steps)
        if (ours[0], ours[1], strip(ours[2])) == (theirs[0], theirs[1], strip(theirs[2])):
            break
    for step, mine, their in zip(steps, ours[0], theirs[0], strict=True):
        assert mine == their, f"{step}: ours {mine} theirs {their}"
    assert ours[1] == theirs[1]
    assert strip(ours[2]) == strip(theirs[2])

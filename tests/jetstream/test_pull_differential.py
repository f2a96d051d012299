"""Pull requests (MSG.NEXT): nats-server's deliveries and statuses vs Consumer + PullQueue.

Timed outcomes are compared too: the oracle is given the time to expire a request or send its
heartbeats; our side ticks the queue at the matching instants (time is an argument here).
Only the order and content of what reaches the reply subject is compared, never timings.
"""

from __future__ import annotations

import json
import time
from typing import Any

import nats

from node.jetstream import config, consumer_config, ops
from node.jetstream.consumer import Delivery, StreamView
from node.jetstream.pull import PullQueue
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Stream

MS = 1_000_000
CONSUMER = {"durable_name": "c", "ack_policy": "explicit", "max_waiting": 2, "max_batch": 5,
            "max_expires": 2000 * MS, "max_bytes": 1000}
# (request body, ms the oracle listens after the last frame, our tick instants in ms)
REQUESTS: list[tuple[bytes, int, list[int]]] = [
    (b'{"batch":2,"no_wait":true}', 300, []),
    (b'{"batch":5,"no_wait":true}', 300, []),
    (b'{"batch":5,"no_wait":true}', 300, []),
    (b'{"batch":10}', 300, []),
    (b'{"batch":1,"expires":5000000000}', 300, []),
    (b'{"batch":1,"max_bytes":5000}', 300, []),
    (b'{"batch":2,"expires":300000000}', 600, [300]),
    # 100 ms between a heartbeat and the expiry: the oracle's timers are not exact
    (b'{"batch":1,"expires":500000000,"idle_heartbeat":200000000}', 800, [200, 400, 500]),
]


def _frame(headers: dict[str, str] | None, reply: str | None, data: bytes) -> Any:
    if reply:
        return ("msg", data)
    return ("status", {getattr(k, "value", k): v for k, v in (headers or {}).items()})


async def _oracle(port: int) -> list[list[Any]]:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        await nc.request("$JS.API.STREAM.CREATE.PQ", json.dumps(
            {"name": "PQ", "subjects": ["pq.>"]}).encode(), timeout=5)
        for i in range(3):
            await nc.request("pq.a", b"m%d" % i, timeout=5)
        await nc.request("$JS.API.CONSUMER.CREATE.PQ.c", json.dumps(
            {"stream_name": "PQ", "config": CONSUMER}).encode(), timeout=5)
        out = []
        for body, listen_ms, _ in REQUESTS:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            await nc.publish("$JS.API.CONSUMER.MSG.NEXT.PQ.c", body, reply=inbox)
            frames = []
            while True:
                try:
                    msg = await sub.next_msg(timeout=listen_ms / 1000)
                except nats.errors.TimeoutError:
                    break
                frames.append(_frame(msg.headers, msg.reply, msg.data))
                status = (msg.headers or {}).get("Status")
                if status and status != "100":
                    break
            await sub.unsubscribe()
            out.append(frames)
        await nc.request("$JS.API.STREAM.DELETE.PQ", b"", timeout=5)
        return out
    finally:
        await nc.close()


def _parse_status(hdr: bytes) -> dict[str, str]:
    lines = hdr.decode().split("\r\n")
    _, code, text = lines[0].split(" ", 2)
    out = {"Status": code, "Description": text}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(": ")
            out[k] = v
    return out


def _ours() -> list[list[Any]]:
    cfg, pedantic = config.parse_request(b'{"name":"PQ","subjects":["pq.>"]}')
    stream = Stream(config.check_create("PQ", cfg, pedantic, {})[0], MemStore("PQ"))
    for i in range(3):
        stream.apply(ops.StreamMsg(time.time_ns(), "pq.a", "", b"", b"m%d" % i))
    req = consumer_config.parse_request(json.dumps({"stream_name": "PQ",
                                                    "config": CONSUMER}).encode())
    ccfg, _, _ = consumer_config.check_create("$JS.API.CONSUMER.CREATE.PQ.c", req,
                                              stream.cfg, {})
    consumer = stream.attach_consumer("c", ccfg)
    view = StreamView(stream.store, [])
    queue = PullQueue(ccfg)
    out = []
    for body, _listen, ticks in REQUESTS:
        now = 10**18
        frames: list[Any] = []
        statuses = queue.add(now, "r", body)
        frames += [("status", _parse_status(s.hdr)) for s in statuses]
        while not statuses:
            plan = consumer.plan(now, view)
            if not isinstance(plan, Delivery):
                frames += [("status", _parse_status(s.hdr)) for s in queue.nothing_pending()]
                break
            msg = stream.store.load(plan.sseq)
            target, refused = queue.take(len(msg.data))
            frames += [("status", _parse_status(s.hdr)) for s in refused]
            if target is None:
                break
            stream.apply(ops.ConsumerDelivered(now, "c", plan.sseq))
            frames.append(("msg", msg.data))
        for at in ticks:
            st = consumer.state
            frames += [("status", _parse_status(s.hdr))
                       for s in queue.tick(now + at * MS, st.delivered_cseq, st.delivered_sseq)]
        out.append(frames)
    return out


async def test_pull_requests_match_nats_server(js_oracle_port: int) -> None:
    theirs = await _oracle(js_oracle_port)
    for (body, _, _), mine, their in zip(REQUESTS, _ours(), theirs, strict=True):
        assert mine == their, body


def test_no_idle_heartbeat_while_a_delivery_round_is_in_flight() -> None:
    """A round's messages count as delivered in the applied state before they are sent: a
    heartbeat then would name sequences the client has not got (ordered consumers reset on
    that). The tick of a round in flight skips the heartbeat and restarts its wait."""
    queue = PullQueue({"ack_policy": "explicit"})
    now = 10**18
    assert queue.add(now, "r", json.dumps({"batch": 5, "idle_heartbeat": 500 * MS,
                                           "expires": 60_000 * MS}).encode()) == []
    assert queue.tick(now + 600 * MS, 3, 3, beat=False) == []  # in flight: skipped
    assert queue.tick(now + 1000 * MS, 3, 3) == []  # the wait restarted at 600 ms
    beats = queue.tick(now + 1100 * MS, 3, 3)
    assert [_parse_status(s.hdr) for s in beats] == \
        [_parse_status(b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 3\r\n"
                       b"Nats-Last-Stream: 3\r\n\r\n")]

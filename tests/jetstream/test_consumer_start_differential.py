"""Where a new consumer starts, per deliver policy: nats-server vs initial_position + plan.

A stream gets messages on several subjects (and a purge, so it no longer starts at 1); then a
consumer per policy is created and drained with no_wait fetches. The create reply's
delivered / ack_floor / num_pending and the (deliveries, stream seq, consumer seq, pending) of
every fetched message must match.
"""

from __future__ import annotations

import json
import time
from typing import Any

import nats
import pytest

from node.jetstream import config, consumer_config, ops, replies
from node.jetstream.consumer import Delivery, StreamView, initial_position, parse_ack_subject
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Stream

SUBJECTS = ["s.a", "s.b", "s.a", "s.c", "s.b", "s.a", "s.d.x", "s.c", "s.a", "s.b"]
POLICIES: dict[str, dict[str, Any]] = {
    "all": {},
    "all_filtered": {"filter_subject": "s.a"},
    "last": {"deliver_policy": "last"},
    "last_filtered": {"deliver_policy": "last", "filter_subject": "s.c"},
    "new": {"deliver_policy": "new"},
    "by_seq": {"deliver_policy": "by_start_sequence", "opt_start_seq": 6},
    "by_seq_before_first": {"deliver_policy": "by_start_sequence", "opt_start_seq": 1},
    "lps": {"deliver_policy": "last_per_subject", "filter_subject": "s.*"},
    "lps_many": {"deliver_policy": "last_per_subject", "filter_subjects": ["s.a", "s.d.>"]},
    "wildcard_filter": {"filter_subject": "s.*"},
}


async def _oracle(port: int, name: str, ccfg: dict[str, Any]) -> tuple[Any, list[Any]]:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        await nc.request(f"$JS.API.STREAM.CREATE.{name}",
                         json.dumps({"name": name, "subjects": ["s.>"]}).encode(), timeout=5)
        for subject in SUBJECTS:
            await nc.request(subject, b"x", timeout=5)
        await nc.request(f"$JS.API.STREAM.PURGE.{name}", json.dumps({"seq": 3}).encode(),
                         timeout=5)
        body = {"stream_name": name, "config": {"durable_name": "c", "ack_policy": "explicit",
                                                **ccfg}}
        created = json.loads((await nc.request(f"$JS.API.CONSUMER.CREATE.{name}.c",
                                               json.dumps(body).encode(), timeout=5)).data)
        assert "error" not in created, created
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{name}.c",
                         json.dumps({"batch": 50, "no_wait": True}).encode(), reply=inbox)
        got = []
        while True:
            msg = await sub.next_msg(timeout=5)
            if not msg.reply:
                break
            info = parse_ack_subject(msg.reply)
            got.append((info.deliveries, info.sseq, info.cseq, info.pending))
        await nc.request(f"$JS.API.STREAM.DELETE.{name}", b"", timeout=5)
        return _summary(created), got
    finally:
        await nc.close()


def _summary(reply: dict[str, Any]) -> dict[str, Any]:
    return {k: reply[k] for k in ("delivered", "ack_floor", "num_pending")}


def _ours(name: str, ccfg: dict[str, Any]) -> tuple[Any, list[Any]]:
    cfg, pedantic = config.parse_request(json.dumps({"name": name,
                                                     "subjects": ["s.>"]}).encode())
    stream = Stream(config.check_create(name, cfg, pedantic, {})[0], MemStore(name))
    for subject in SUBJECTS:
        stream.apply(ops.StreamMsg(time.time_ns(), subject, "", b"", b"x"))
    stream.apply(ops.Purge(time.time_ns(), seq=3))
    req = consumer_config.parse_request(json.dumps(
        {"stream_name": name, "config": {"durable_name": "c", "ack_policy": "explicit",
                                         **ccfg}}).encode())
    ccfg_full, _, _ = consumer_config.check_create(f"$JS.API.CONSUMER.CREATE.{name}.c", req,
                                                   stream.cfg, {})
    filters = list(ccfg_full["filter_subjects"]) or (
        [ccfg_full["filter_subject"]] if ccfg_full["filter_subject"] else [])
    view = StreamView(stream.store, filters)
    start, lps_until = initial_position(ccfg_full, view, stream.last_seq)
    consumer = stream.attach_consumer("c", ccfg_full, start_sseq=start, lps_until=lps_until)
    summary = _summary(replies.consumer_info("consumer_create_response", name, "c", {},
                                             consumer, view, "", ""))
    got = []
    while True:
        plan = consumer.plan(time.time_ns(), view)
        if not isinstance(plan, Delivery):
            break
        stream.apply(ops.ConsumerDelivered(time.time_ns(), "c", plan.sseq))
        got.append((plan.deliveries, plan.sseq, consumer.state.delivered_cseq,
                    consumer.num_pending(view)))
    return summary, got


@pytest.mark.parametrize("policy", sorted(POLICIES))
async def test_consumer_start_matches_nats_server(js_oracle_port: int, policy: str) -> None:
    name = "ST_" + policy.upper()
    theirs = await _oracle(js_oracle_port, name, POLICIES[policy])
    ours = _ours(name, POLICIES[policy])
    assert ours[1] == theirs[1], f"deliveries: ours {ours[1]} theirs {theirs[1]}"
    assert ours[0] == theirs[0]

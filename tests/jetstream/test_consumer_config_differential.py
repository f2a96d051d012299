"""CONSUMER.CREATE / DURABLE.CREATE: the same requests to nats-server and to the pure checks.

Streams are created first (same bodies on both sides); then every case goes, in order, to a
live `nats-server -js` and to `consumer_config.check_create`, which keeps created consumers in
a dict per stream as the stream will. The whole reply JSON is compared except the fields in
ALLOWED_TO_DIFFER; an ephemeral consumer's generated name is compared by shape only.
"""

from __future__ import annotations

import json
from typing import Any

import nats

from node.jetstream import config, consumer_config, replies
from node.jetstream.consumer import StreamView, initial_position
from node.jetstream.errors import ApiError
from node.jetstream.store.memstore import MemStore

ALLOWED_TO_DIFFER = ("created", "ts", "pause_remaining")
GENERATED = "<generated>"

STREAMS = [
    {"name": "CS", "subjects": ["cs.>"]},
    {"name": "WQ", "subjects": ["wq.>"], "retention": "workqueue"},
    {"name": "LIM", "subjects": ["lim.>"],
     "consumer_limits": {"max_ack_pending": 50, "inactive_threshold": 60_000_000_000}},
]


def _j(obj: Any) -> str:
    return json.dumps(obj)


def _c(stream: str, cfg: dict[str, Any] | None = None, **extra: Any) -> str:
    body: dict[str, Any] = {"stream_name": stream, **extra}
    if cfg is not None:
        body["config"] = cfg
    return _j(body)


C = "$JS.API.CONSUMER.CREATE."
D = "$JS.API.CONSUMER.DURABLE.CREATE."
CASES: list[tuple[str, str]] = [
    (C + "CS.d1", _c("CS", {"durable_name": "d1"})),
    (C + "CS.d2", _c("CS", {"name": "d2", "deliver_subject": "out", "ack_policy": "explicit",
                            "deliver_policy": "last", "filter_subject": "cs.a", "max_deliver": 5,
                            "backoff": [1_000_000_000, 2_000_000_000],
                            "idle_heartbeat": 5_000_000_000, "flow_control": True,
                            "headers_only": True, "metadata": {"k": "v"}, "description": "x",
                            "sample_freq": "50%", "inactive_threshold": 60_000_000_000})),
    (C + "CS", _c("CS", {})),
    (D + "CS.d3", _c("CS", {"durable_name": "d3", "ack_policy": "all",
                            "replay_policy": "original", "deliver_policy": "by_start_sequence",
                            "opt_start_seq": 3, "max_waiting": 10, "max_batch": 5,
                            "max_expires": 1_000_000_000, "max_bytes": 100, "mem_storage": True,
                            "filter_subjects": ["cs.a", "cs.b"]})),
    (C + "CS.d4.cs.x", _c("CS", {"name": "d4", "filter_subject": "cs.x",
                                 "priority_groups": ["g1"], "priority_policy": "pinned_client"})),
    (C + "CS.d5", _c("CS", {"durable_name": "d5", "ack_policy": "explicit",
                            "max_ack_pending": -5, "max_waiting": -1, "max_deliver": -9})),
    (C + "CS.p1", _c("CS", {"name": "p1", "deliver_subject": "o1", "deliver_group": "g",
                            "opt_start_time": "2024-01-01T00:00:00Z",
                            "deliver_policy": "by_start_time", "rate_limit_bps": 1000,
                            "ack_policy": "explicit", "max_ack_pending": 5,
                            "replay_policy": "original", "idle_heartbeat": 1_000_000_000,
                            "mem_storage": True, "num_replicas": 1})),
    (C + "CS.x3", _c("CS")),
    (C + "WQ.w1", _c("WQ", {"durable_name": "w1", "ack_policy": "explicit"})),
    (C + "LIM.l1", _c("LIM", {"durable_name": "l1", "ack_policy": "explicit"})),
    (C + "LIM.l2", _c("LIM", {"durable_name": "l2", "ack_policy": "explicit",
                              "max_ack_pending": 51})),
    (C + "LIM.l3", _c("LIM", {"durable_name": "l3", "inactive_threshold": 61_000_000_000})),
    # -- existing consumers: create / update actions --
    (C + "CS.d1", _c("CS", {"durable_name": "d1"}, action="create")),
    (C + "CS.d1", _c("CS", {"durable_name": "d1", "ack_policy": "explicit"}, action="create")),
    (C + "CS.d1", _c("CS", {"durable_name": "d1", "ack_policy": "explicit"})),
    (C + "CS.d1", _c("CS", {"durable_name": "d1", "deliver_policy": "new"})),
    (C + "CS.d1", _c("CS", {"durable_name": "d1", "deliver_subject": "push.here"})),
    (C + "CS.d1", _c("CS", {"durable_name": "d1", "max_waiting": 7})),
    (C + "CS.d1", _c("CS", {"durable_name": "d1", "description": "new"})),
    (C + "CS.nope", _c("CS", {"durable_name": "nope"}, action="update")),
    # -- subject forms --
    (C + "CS.x1", _c("CS", {"durable_name": "zz"})),
    (C + "CS.x1", _c("CT", {"durable_name": "x1"})),
    (C + "CT.x1", _c("CT", {"durable_name": "x1"})),
    (C + "CS", _c("CS", {"durable_name": "x2"})),
    (C + "CS.x3.cs.y", _c("CS", {"name": "x3", "filter_subject": "cs.z"})),
    (C + "CS.x4.cs.y", _c("CS", {"name": "x4", "filter_subjects": ["cs.y", "cs.z"]})),
    (C + "CS.x5.cs.y", _c("CS", {"name": "x5"})),
    (D + "CS.x6", _c("CS", {})),
    (D + "CS.x6", _c("CS", {"durable_name": "x7"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "durable_name": "x9"})),
    (C + "CS.x8", _c("CS", {"name": "other"})),
    # -- invalid JSON --
    (C + "CS.x8", _c("CS", {"name": "x8", "bogus": 1})),
    (C + "CS.x8", _c("CS", {"name": "x8", "ack_policy": "bad"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "deliver_policy": "bad"})),
    (C + "CS.x8", _c("CS", {"name": "x8"}, action="bad")),
    (C + "CS.x8", _c("CS", {"name": "x8", "max_deliver": "5"})),
    (C + "CS.x8", '{"stream_name":"CS","config":{"name":"x8",}}'),
    # -- invalid configs --
    (C + "CS.x8", _c("CS", {"name": "x8", "max_waiting": 5, "deliver_subject": "o"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "deliver_subject": "o.*"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "deliver_subject": "cs.a"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "deliver_subject": "o",
                            "idle_heartbeat": 50_000_000})),
    (C + "CS.x8", _c("CS", {"name": "x8", "deliver_subject": "o", "max_ack_pending": 3})),
    (C + "CS.x8", _c("CS", {"name": "x8", "idle_heartbeat": 1_000_000_000})),
    (C + "CS.x8", _c("CS", {"name": "x8", "flow_control": True, "deliver_subject": "o"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "flow_control": True})),
    (C + "CS.x8", _c("CS", {"name": "x8", "rate_limit_bps": 5})),
    (C + "CS.x8", _c("CS", {"name": "x8", "deliver_policy": "by_start_sequence"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "opt_start_seq": 4})),
    (C + "CS.x8", _c("CS", {"name": "x8", "deliver_policy": "new",
                            "opt_start_time": "2024-01-01T00:00:00Z"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "deliver_policy": "by_start_time"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "deliver_policy": "last_per_subject"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "backoff": [1, 2, 3], "max_deliver": 2})),
    (C + "CS.x8", _c("CS", {"name": "x8", "backoff": [1, -2]})),
    (C + "CS.x8", _c("CS", {"name": "x8", "ack_wait": -1})),
    (C + "CS.x8", _c("CS", {"name": "x8", "filter_subjects": ["cs.a", "cs.*"]})),
    (C + "CS.x8", _c("CS", {"name": "x8", "filter_subjects": ["cs.a", ""]})),
    (C + "CS.x8", _c("CS", {"name": "x8", "filter_subject": "a", "filter_subjects": ["b"]})),
    (C + "CS.x8", _c("CS", {"name": "x8", "filter_subject": "a..b"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "sample_freq": "abc"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "priority_groups": ["a"]})),
    (C + "CS.x8", _c("CS", {"name": "x8", "priority_timeout": 5})),
    (C + "CS.x8", _c("CS", {"name": "x8", "priority_policy": "overflow"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "priority_policy": "overflow",
                            "priority_groups": ["bad group"]})),
    (C + "CS.x8", _c("CS", {"name": "x8", "priority_policy": "overflow",
                            "priority_groups": [""]})),
    (C + "CS.x8", _c("CS", {"name": "x8", "priority_policy": "overflow",
                            "priority_groups": ["g"], "deliver_subject": "o"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "num_replicas": 3})),
    (C + "CS.x8", _c("CS", {"name": "x8", "num_replicas": -1})),
    (C + "CS.x8", _c("CS", {"name": "x8", "max_expires": 10})),
    (C + "CS.x8", _c("CS", {"name": "x8", "description": "d" * 4097})),
    (C + "CS.x8", _c("CS", {"name": "x8", "direct": True})),
    (C + "WQ.x8", _c("WQ", {"name": "x8"})),
    (C + "CS.x8", _c("CS", {"name": "x8", "filter_subject": "zz"})),
]


async def _oracle(port: int) -> list[dict[str, Any]]:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        for s in STREAMS:
            reply = await nc.request(f"$JS.API.STREAM.CREATE.{s['name']}", _j(s).encode(),
                                     timeout=5)
            assert "error" not in json.loads(reply.data), reply.data
        out = []
        for subject, body in CASES:
            msg = await nc.request(subject, body.encode(), timeout=5)
            out.append(json.loads(msg.data))
        for s in STREAMS:
            await nc.request(f"$JS.API.STREAM.DELETE.{s['name']}", b"", timeout=5)
        return out
    finally:
        await nc.close()


def _ours() -> list[dict[str, Any]]:
    streams: dict[str, config.Config] = {}
    for s in STREAMS:
        cfg, pedantic = config.parse_request(_j(s).encode())
        streams[s["name"]] = config.check_create(s["name"], cfg, pedantic, streams)[0]
    consumers: dict[str, dict[str, config.Config]] = {name: {} for name in streams}
    out = []
    for subject, body in CASES:
        kind = "consumer_create_response"
        try:
            req = consumer_config.parse_request(body.encode())
            api = consumer_config.parse_api_subject(subject)
            stream = streams.get(api.stream)
            cfg, name, _created = consumer_config.check_create(
                subject, req, stream, consumers.get(api.stream, {}),
                name_source=lambda: GENERATED)
        except ApiError as err:
            out.append(replies.error_reply(kind, err))
            continue
        consumers[api.stream][name] = cfg
        start, _ = initial_position(cfg, StreamView(MemStore(api.stream), []), last_seq=0)
        out.append(replies.consumer_reply(kind, api.stream, name, consumer_config.to_wire(cfg),
                                          "", "", delivered=(0, start - 1),
                                          ack_floor=(0, start - 1)))
    return out


def _strip(reply: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in reply.items() if k not in ALLOWED_TO_DIFFER}
    if out.get("name") and "name" not in out.get("config", {"name": ""}):
        assert len(out["name"]) == 8 or out["name"] == GENERATED, out["name"]
        out["name"] = GENERATED  # a generated ephemeral name: 8 random characters
    return out


async def test_consumer_create_replies_match_nats_server(js_oracle_port: int) -> None:
    assert len(CASES) >= 50
    theirs = await _oracle(js_oracle_port)
    ours = _ours()
    mismatches = [f"{subject} {body[:150]}\n  ours:   {_j(_strip(o))}\n  theirs: {_j(_strip(t))}"
                  for (subject, body), o, t in zip(CASES, ours, theirs, strict=True)
                  if _strip(o) != _strip(t)]
    assert not mismatches, f"{len(mismatches)} of {len(CASES)} differ:\n" + "\n".join(mismatches)

"""PURGE, MSG.DELETE, DELETE, NAMES, LIST request handling: nats-server vs `requests` + the
stream machine, in one scripted sequence on a fresh server."""

from __future__ import annotations

import json
import time
from typing import Any

import nats

from node.jetstream import config, requests
from node.jetstream.errors import ApiError
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Result, Stream

STREAMS = [{"name": "PU", "subjects": ["pu.>"]}, {"name": "QQ", "subjects": ["qq.*", "zz"]}]
STEPS: list[tuple[str, str, bytes]] = [
    ("NAMES", "", b""), ("NAMES", "", b'{"subject":"pu.1"}'), ("NAMES", "", b'{"offset":1}'),
    ("NAMES", "", b"bad"), ("NAMES", "", b'{"subject":"nothing"}'),
    ("NAMES", "", b'{"offset":5}'), ("NAMES", "", b'{"bogus":1}'),
    ("LIST", "", b""), ("LIST", "", b'{"subject":"zz"}'),
    ("PURGE", "PU", b'{"seq":2,"keep":1}'), ("PURGE", "PU", b'{"filter":"pu.1","keep":1}'),
    ("PURGE", "PU", b'{"filter":"a..b"}'), ("PURGE", "PU", b'{"bogus":1}'),
    ("PURGE", "PU", b'{"seq":3}'), ("PURGE", "NOPE", b""),
    ("MSG.DELETE", "PU", b"{}"), ("MSG.DELETE", "PU", b""), ("MSG.DELETE", "PU", b"bad"),
    ("MSG.DELETE", "PU", b'{"seq":0}'), ("MSG.DELETE", "PU", b'{"seq":"x"}'),
    ("MSG.DELETE", "PU", b'{"seq":1}'), ("MSG.DELETE", "PU", b'{"seq":5}'),
    ("MSG.DELETE", "PU", b'{"seq":5}'), ("MSG.DELETE", "PU", b'{"seq":7,"no_erase":true}'),
    ("MSG.DELETE", "PU", b'{"seq":99}'), ("MSG.DELETE", "NOPE", b'{"seq":1}'),
    ("PURGE", "PU", b"bad"), ("DELETE", "NOPE", b""), ("DELETE", "PU", b"x"),
]
PUBS = ["pu.0", "pu.1", "pu.0", "pu.1", "pu.0", "pu.1", "pu.0", "pu.1"]


def _strip_list(reply: dict[str, Any]) -> dict[str, Any]:
    if reply.get("type", "").endswith("stream_list_response"):
        reply = dict(reply)
        reply["streams"] = [s["config"]["name"] for s in reply["streams"] or []]
    return reply


async def _oracle(port: int) -> list[dict[str, Any]]:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        for s in STREAMS:
            await nc.request(f"$JS.API.STREAM.CREATE.{s['name']}", json.dumps(s).encode(),
                             timeout=5)
        for subject in PUBS:
            await nc.request(subject, b"x", timeout=5)
        out = []
        for verb, name, body in STEPS:
            subject = f"$JS.API.STREAM.{verb}" + (f".{name}" if name else "")
            out.append(_strip_list(json.loads((await nc.request(subject, body, timeout=5)).data)))
        return out
    finally:
        await nc.close()


def _ours() -> list[dict[str, Any]]:
    cfgs: dict[str, config.Config] = {}
    streams: dict[str, Stream] = {}
    for s in STREAMS:
        cfg, pedantic = config.parse_request(json.dumps(s).encode())
        cfgs[s["name"]] = config.check_create(s["name"], cfg, pedantic, cfgs)[0]
        streams[s["name"]] = Stream(cfgs[s["name"]], MemStore(s["name"]))
    for subject in PUBS:
        streams["PU"].apply(_msg(subject))
    return [_strip_list(_step(verb, name, body, cfgs, streams)) for verb, name, body in STEPS]


def _msg(subject: str) -> Any:
    from node.jetstream import ops
    return ops.StreamMsg(time.time_ns(), subject, "", b"", b"x")


def _step(verb: str, name: str, body: bytes, cfgs: dict[str, config.Config],
          streams: dict[str, Stream]) -> dict[str, Any]:
    kinds = {"NAMES": "stream_names_response", "LIST": "stream_list_response",
             "PURGE": "stream_purge_response", "MSG.DELETE": "stream_msg_delete_response",
             "DELETE": "stream_delete_response"}
    kind = "io.nats.jetstream.api.v1." + kinds[verb]
    extra = {"purged": 0} if verb == "PURGE" else {}
    try:
        if verb == "NAMES":
            return requests.names_reply(cfgs, body)
        if verb == "LIST":
            return requests.list_reply(cfgs, body, {})
        if name not in streams and verb != "DELETE":
            raise ApiError.of("JSStreamNotFoundErr")
        if verb == "DELETE":
            if name not in streams:
                raise ApiError.of("JSStreamNotFoundErr")
            requests.check_stream_delete(body)
            return {"type": kind, "success": True}
        op = (requests.parse_purge(body, time.time_ns()) if verb == "PURGE"
              else requests.parse_msg_delete(body, time.time_ns()))
        results = [e for e in streams[name].apply(op) if isinstance(e, Result)]
        return {"type": kind, **results[-1].payload}
    except ApiError as err:
        return {"type": kind, **err.to_dict(), **extra}


async def test_requests_match_nats_server(js_oracle_port: int) -> None:
    theirs = await _oracle(js_oracle_port)
    ours = _ours()
    for step, mine, their in zip(STEPS, ours, theirs, strict=True):
        assert mine == their, f"{step}: ours {mine} theirs {their}"

"""STREAM.MSG.GET and DIRECT.GET: nats-server's replies vs `node.jetstream.get`.

The same messages are stored on both sides; every request's reply is compared whole, except
the message time (`time`, `Nats-Time-Stamp`), which is each server's clock.
"""

from __future__ import annotations

import json
import time
from typing import Any

import nats
import pytest

from node.jetstream import config, get, ops
from node.jetstream.store import CorruptRecordError, StoredMsg
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Stream

NAME = "GETS"
PUBS = [("g.a", {"K": "v"}, b"one"), ("g.b", {}, b"two"), ("g.a", {}, b"three"),
        ("g.c.x", {}, b""), ("g.b", {}, b"five")]
REQUESTS: list[dict[str, Any] | str] = [
    {"seq": 1}, {"seq": 2}, {"seq": 4}, {"seq": 9}, {"seq": 6}, {"last_by_subj": "g.a"},
    {"last_by_subj": "g.z"}, {"last_by_subj": "g.*"}, {"last_by_subj": "g.>"},
    {"next_by_subj": "g.a", "seq": 2}, {"next_by_subj": "g.*", "seq": 3},
    {"next_by_subj": "g.a"}, {"next_by_subj": "g.zz", "seq": 1}, {"seq": 0}, {},
    {"seq": 1, "last_by_subj": "g.a"}, {"seq": 1, "no_hdr": True}, "bad", "",
]
DIRECT: list[dict[str, Any] | str] = REQUESTS + [
    {"batch": 10, "seq": 1}, {"batch": 2, "seq": 1}, {"batch": 2, "seq": 2, "next_by_subj": "g.a"},
    {"batch": 3, "seq": 1, "next_by_subj": "g.*"}, {"batch": 2, "seq": 50},
    {"multi_last": ["g.a", "g.b", "g.z"]}, {"multi_last": ["g.>"]}, {"multi_last": ["g.z"]},
]


def _body(req: dict[str, Any] | str) -> bytes:
    return req.encode() if isinstance(req, str) else json.dumps(req).encode()


def _hdrs(headers: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (headers or {}).items() if k != "Nats-Time-Stamp"}


async def _oracle(port: int) -> tuple[list[Any], list[Any]]:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        await nc.request(f"$JS.API.STREAM.CREATE.{NAME}", json.dumps(
            {"name": NAME, "subjects": ["g.>"], "allow_direct": True}).encode(), timeout=5)
        for subject, hdrs, data in PUBS:
            await nc.request(subject, data, headers=hdrs or None, timeout=5)
        await nc.request(f"$JS.API.STREAM.MSG.DELETE.{NAME}", b'{"seq":4}', timeout=5)
        gets = []
        for req in REQUESTS:
            msg = await nc.request(f"$JS.API.STREAM.MSG.GET.{NAME}", _body(req), timeout=5)
            gets.append(_strip_time(json.loads(msg.data)))
        directs = []
        for req in DIRECT:
            directs.append(await _direct(nc, _body(req)))
        directs.append(await _direct(nc, b"", suffix=".g.a"))
        await nc.request(f"$JS.API.STREAM.DELETE.{NAME}", b"", timeout=5)
        return gets, directs
    finally:
        await nc.close()


async def _direct(nc: Any, body: bytes, suffix: str = "") -> list[Any]:
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(f"$JS.API.DIRECT.GET.{NAME}{suffix}", body, reply=inbox)
    frames = []
    while True:
        msg = await sub.next_msg(timeout=5)
        frames.append((_hdrs(msg.headers), msg.data))
        status = (msg.headers or {}).get("Status")
        if status is not None or "Nats-Num-Pending" not in (msg.headers or {}):
            break
    await sub.unsubscribe()
    return frames


def _strip_time(reply: dict[str, Any]) -> dict[str, Any]:
    if "message" in reply:
        reply["message"].pop("time")
    return reply


def _parse_frame(frame: get.Frame) -> tuple[dict[str, str], bytes]:
    if not frame.hdr:
        return {}, frame.data
    lines = frame.hdr.decode().split("\r\n")
    out: dict[str, str] = {}
    first = lines[0].split(" ", 2)
    if len(first) > 1:
        out["Status"] = first[1]
        out["Description"] = first[2]
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            out[k.strip()] = v.strip()
    return _hdrs(out), frame.data


def _ours() -> tuple[list[Any], list[Any]]:
    cfg, pedantic = config.parse_request(json.dumps(
        {"name": NAME, "subjects": ["g.>"], "allow_direct": True}).encode())
    stream = Stream(config.check_create(NAME, cfg, pedantic, {})[0], MemStore(NAME))
    for subject, hdrs, data in PUBS:
        hdr = b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in hdrs.items()) \
            + b"\r\n" if hdrs else b""
        stream.apply(ops.StreamMsg(time.time_ns(), subject, "", hdr, data))
    stream.apply(ops.DeleteMsg(time.time_ns(), 4))
    gets = [_strip_time(get.msg_get(stream.store, _body(r))) for r in REQUESTS]
    directs = [[_parse_frame(f) for f in get.direct_get(stream.store, NAME, _body(r))]
               for r in DIRECT]
    directs.append([_parse_frame(f) for f in get.direct_get(stream.store, NAME, b"", "g.a")])
    return gets, directs


async def test_gets_match_nats_server(js_oracle_port: int) -> None:
    theirs = await _oracle(js_oracle_port)
    ours = _ours()
    for req, mine, their in zip(REQUESTS, ours[0], theirs[0], strict=True):
        assert mine == their, f"MSG.GET {req}"
    for req, mine, their in zip(DIRECT + ["suffix g.a"], ours[1], theirs[1], strict=True):
        assert mine == their, f"DIRECT.GET {req}"


class _CorruptStore(MemStore):
    def load(self, seq: int) -> StoredMsg | None:
        raise CorruptRecordError(self.name, seq, "crc mismatch")


@pytest.mark.parametrize("body", [b'{"seq":1}', b'{"last_by_subj":"a"}'])
def test_corrupt_records_are_refused_not_served(body: bytes) -> None:
    store = _CorruptStore("S")
    store.store(StoredMsg(1, "a", b"", b"secret", 1))
    reply = get.msg_get(store, body)
    assert reply["error"]["err_code"] == 10051 and "corrupt record" in \
        reply["error"]["description"] and "message" not in reply
    frames = get.direct_get(store, "S", body)
    assert frames == [get.Frame(b"NATS/1.0 500 Corrupt Message\r\n\r\n", b"")]

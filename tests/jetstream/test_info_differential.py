"""STREAM.INFO with subjects_filter / deleted_details / offset: nats-server vs
`replies.stream_info` over the same messages and deletes."""

from __future__ import annotations

import json
import time
from typing import Any

import nats

from node.jetstream import config, ops, replies
from node.jetstream.store.base import file_size
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Stream

NAME = "SI"
PUBS = ["si.a", "si.b", "si.a", "si.c.x", "si.b", "si.a"]
DELETES = [2, 4]
BODIES = [b"", b'{"subjects_filter":">"}', b'{"subjects_filter":"si.a"}',
          b'{"subjects_filter":"si.*"}', b'{"subjects_filter":"zz"}', b'{"deleted_details":true}',
          b'{"deleted_details":true,"subjects_filter":"si.b","offset":0}',
          b'{"offset":1,"subjects_filter":">"}', b'{"offset":9,"subjects_filter":">"}', b"bad",
          b'{"bogus":1}']
ALLOWED_TO_DIFFER = ("created", "ts", "cluster")


def _strip(reply: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in reply.items() if k not in ALLOWED_TO_DIFFER}
    if "state" in out:
        out["state"] = {k: v for k, v in out["state"].items() if k not in ("first_ts", "last_ts")}
    return out


async def _oracle(port: int) -> list[dict[str, Any]]:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        await nc.request(f"$JS.API.STREAM.CREATE.{NAME}", json.dumps(
            {"name": NAME, "subjects": ["si.>"]}).encode(), timeout=5)
        for subject in PUBS:
            await nc.request(subject, b"x", timeout=5)
        for seq in DELETES:
            await nc.request(f"$JS.API.STREAM.MSG.DELETE.{NAME}",
                             json.dumps({"seq": seq}).encode(), timeout=5)
        return [_strip(json.loads((await nc.request(f"$JS.API.STREAM.INFO.{NAME}", body,
                                                    timeout=5)).data)) for body in BODIES]
    finally:
        await nc.close()


def _ours() -> list[dict[str, Any]]:
    cfg, pedantic = config.parse_request(json.dumps({"name": NAME,
                                                     "subjects": ["si.>"]}).encode())
    stream = Stream(config.check_create(NAME, cfg, pedantic, {})[0],
                    MemStore(NAME, sizer=file_size))
    for subject in PUBS:
        stream.apply(ops.StreamMsg(time.time_ns(), subject, "", b"", b"x"))
    for seq in DELETES:
        stream.apply(ops.DeleteMsg(time.time_ns(), seq))
    return [_strip(replies.stream_info(stream, body, "", "")) for body in BODIES]


async def test_stream_info_matches_nats_server(js_oracle_port: int) -> None:
    theirs = await _oracle(js_oracle_port)
    for body, mine, their in zip(BODIES, _ours(), theirs, strict=True):
        assert mine == their, body

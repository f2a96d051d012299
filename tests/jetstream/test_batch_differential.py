"""Atomic batch publish: nats-server's replies vs BatchCollector + Stream (STREAM_BATCH
entries), over one script; then the stream state and stored messages."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import nats

from node.jetstream import config, ops
from node.jetstream.batch import BatchCollector
from node.jetstream.store.base import file_size
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Reply, Stream

NAME = "AB"


def B(batch: str, seq: int | None, commit: str | None = None, **extra: str) -> dict[str, str]:
    hdrs = {"Nats-Batch-Id": batch}
    if seq is not None:
        hdrs["Nats-Batch-Sequence"] = str(seq)
    if commit is not None:
        hdrs["Nats-Batch-Commit"] = commit
    return {**hdrs, **{k.replace("_", "-"): v for k, v in extra.items()}}


STEPS: list[tuple[str, dict[str, str], bytes]] = [
    ("ab.a", {"Nats-Msg-Id": "z"}, b"0"),
    ("ab.a", B("b1", 1), b"1"), ("ab.b", B("b1", 2), b"2"), ("ab.c", B("b1", 3, "1"), b"3"),
    ("ab.a", B("b2", 2), b"x"), ("ab.a", B("b3", 1, "1"), b"4"), ("ab.a", B("b4", None), b"x"),
    ("ab.a", B("b5", 1), b"x"), ("ab.a", B("b5", 3, "1"), b"x"),
    ("ab.a", B("b6", 1), b"5"), ("ab.a", B("b6", 2, "eob"), b"dropped"),
    ("ab.a", B("b7", 1), b"x"),
    ("ab.a", B("b7", 2, "1", Nats_Expected_Last_Sequence="99"), b"x"),
    ("ab.a", B("b8", 1, Nats_Msg_Id="d"), b"x"), ("ab.a", B("b8", 2, "1", Nats_Msg_Id="d"), b"x"),
    ("ab.a", B("b9", 1, "bad"), b"x"), ("ab.a", B("c1", 1, "1", Nats_Msg_Id="z"), b"x"),
    ("ab.a", B("c2", 1, "1", Nats_Expected_Last_Msg_Id="z"), b"x"),
    ("ab.a", B("c3", 1), b"x"), ("ab.b", B("c3", 2, Nats_Expected_Last_Subject_Sequence="2"), b"x"),
    ("ab.a", B("c3", 3, "1", Nats_Expected_Last_Subject_Sequence="5"), b"x"),
    ("ab.a", B("x" * 65, 1, "1"), b"x"), ("ab.a", B("c4", 0), b"x"),
    ("ab.a", B("c5", 1, "1", Nats_Rollup="sub"), b"x"),
    ("ab.a", B("c6", 1), b"6"), ("ab.b", B("c6", 2, Nats_Expected_Last_Sequence="6"), b"7"),
    ("ab.c", B("c6", 3, "1", Nats_Expected_Last_Subject_Sequence="3"), b"8"),
]


async def _oracle(port: int) -> tuple[list[bytes], dict[str, Any]]:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        await nc.request(f"$JS.API.STREAM.CREATE.{NAME}", json.dumps(
            {"name": NAME, "subjects": ["ab.>"], "allow_atomic": True}).encode(), timeout=5)
        out = []
        for subject, hdrs, data in STEPS:
            out.append((await nc.request(subject, data, headers=hdrs, timeout=5)).data)
        state = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{NAME}", b"",
                                             timeout=5)).data)["state"]
        stored = []
        for seq in range(state["first_seq"], state["last_seq"] + 1):
            got = json.loads((await nc.request(f"$JS.API.STREAM.MSG.GET.{NAME}",
                                               json.dumps({"seq": seq}).encode(), timeout=5)).data)
            m = got["message"]
            stored.append((seq, m["subject"], base64.b64decode(m.get("hdrs", "")),
                           base64.b64decode(m.get("data", ""))))
        return out, {**_strip(state), "stored": stored}
    finally:
        await nc.close()


def _strip(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k not in ("first_ts", "last_ts")}


def _hdr(hdrs: dict[str, str]) -> bytes:
    return b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in hdrs.items()) + \
        b"\r\n"


def _ours() -> tuple[list[bytes], dict[str, Any]]:
    cfg, pedantic = config.parse_request(json.dumps(
        {"name": NAME, "subjects": ["ab.>"], "allow_atomic": True}).encode())
    stream = Stream(config.check_create(NAME, cfg, pedantic, {})[0],
                    MemStore(NAME, sizer=file_size))
    collector = BatchCollector(allow_atomic=True)
    out: list[bytes] = []
    for subject, hdrs, data in STEPS:
        op = ops.StreamMsg(time.time_ns(), subject, "r", _hdr(hdrs), data)
        if not collector.is_batch(op):
            effects = stream.apply(op)
        else:
            got = collector.add(op)
            if got.error is not None:
                body = {**got.error.to_dict(), "stream": NAME, "seq": 0}
                out.append(json.dumps(body, separators=(",", ":")).encode())
                continue
            if got.ack_empty:
                out.append(b"")
                continue
            effects = stream.apply(ops.StreamBatch(op.now_ns, got.batch_id,
                                                   tuple(got.committed)))
        out.append([e for e in effects if isinstance(e, Reply)][0].payload)
    stored = [(m.seq, m.subject, m.hdr, m.data)
              for m in (stream.store.load(s) for s in stream.store.seqs()) if m is not None]
    return out, {**_strip(stream.state()), "stored": stored}


def _norm(payload: bytes) -> Any:
    return json.loads(payload) if payload else b""


async def test_atomic_batches_match_nats_server(js_oracle_port: int) -> None:
    theirs, their_state = await _oracle(js_oracle_port)
    ours, our_state = _ours()
    for step, mine, their in zip(STEPS, ours, theirs, strict=True):
        assert _norm(mine) == _norm(their), step
    assert our_state == their_state

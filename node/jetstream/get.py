"""STREAM.MSG.GET and DIRECT.GET: reading stored messages, as nats-server answers, pure.

Both read the store only (no Raft entry): by sequence, last by subject, next by subject from
a sequence; DIRECT.GET also in batches and as `multi_last`. A record that fails its CRC is
never served: MSG.GET answers err_code 10051 with the store's description, DIRECT.GET a
`500 Corrupt Message` status.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from node.jetstream import gojson
from node.jetstream.errors import ApiError
from node.jetstream.gojson import BOOL, STRING, GoJsonError
from node.jetstream.store import CorruptRecordError, StoredMsg, StreamStore
from node.jetstream.stream import rfc3339
from node.subject import compile_matcher, is_literal

MAX_BATCH = 1000

GET_REQUEST = gojson.struct("server.JSApiMsgGetRequest", {
    "seq": gojson.scalar("uint64"), "last_by_subj": STRING, "next_by_subj": STRING,
    "batch": gojson.scalar("int"), "max_bytes": gojson.scalar("int"),
    "start_time": STRING, "multi_last": gojson.slice_of(STRING),
    "up_to_seq": gojson.scalar("uint64"), "up_to_time": STRING, "no_hdr": BOOL,
})


@dataclass(frozen=True, slots=True)
class Frame:
    """One DIRECT.GET reply message: a header block and a payload."""
    hdr: bytes
    data: bytes


def _status(code: int, text: str, pairs: list[tuple[str, str]] | None = None) -> Frame:
    extra = "".join(f"{k}: {v}\r\n" for k, v in pairs or [])
    return Frame(f"NATS/1.0 {code} {text}\r\n{extra}\r\n".encode(), b"")


# ---------------------------------------------------------------------------------------------
# Lookups


def last_by_subject(store: StreamStore, pattern: str) -> int:
    if is_literal(pattern):
        return store.last_for_subject(pattern)
    match = compile_matcher(pattern)
    return max((store.last_for_subject(s) for s, _ in store.subjects() if match(s)), default=0)


def lasts_per_subject(store: StreamStore, pattern: str) -> list[int]:
    """The last sequence of every subject `pattern` matches (multi_last)."""
    if is_literal(pattern):
        last = store.last_for_subject(pattern)
        return [last] if last else []
    match = compile_matcher(pattern)
    return [store.last_for_subject(s) for s, _ in store.subjects() if match(s)]


def next_by_subject(store: StreamStore, pattern: str, start: int) -> int:
    if is_literal(pattern):
        return store.first_for_subject(pattern, start)
    match = compile_matcher(pattern)
    for seq in store.seqs(start):
        msg = store.load(seq)
        if msg is not None and match(msg.subject):
            return seq
    return 0


def _single(store: StreamStore, req: dict[str, Any]) -> int:
    if req.get("last_by_subj"):
        return last_by_subject(store, req["last_by_subj"])
    if req.get("next_by_subj"):
        return next_by_subject(store, req["next_by_subj"], max(req.get("seq", 0), 1))
    return req.get("seq", 0)


def _conflicting(req: dict[str, Any]) -> bool:
    return bool(req.get("last_by_subj")) and (bool(req.get("seq"))
                                              or bool(req.get("next_by_subj")))


# ---------------------------------------------------------------------------------------------
# STREAM.MSG.GET


def msg_get(store: StreamStore, body: bytes) -> dict[str, Any]:
    """The reply body of `$JS.API.STREAM.MSG.GET.<stream>`."""
    kind = "io.nats.jetstream.api.v1.stream_msg_get_response"
    try:
        req = _decode(body)
        empty = not req.get("seq") and not req.get("last_by_subj") and \
            not req.get("next_by_subj")
        if empty or _conflicting(req):
            raise ApiError.of("JSBadRequestErr")
        seq = _single(store, req)
        msg = store.load(seq) if seq else None
        if msg is None:
            raise ApiError.of("JSNoMessageFoundErr")
    except ApiError as err:
        return {"type": kind, **err.to_dict()}
    except CorruptRecordError as exc:
        return {"type": kind, **ApiError.of("JSStreamGeneralErrorF", err=str(exc)).to_dict()}
    return {"type": kind, "message": _message(msg, no_hdr=req.get("no_hdr", False))}


def _decode(body: bytes) -> dict[str, Any]:
    try:
        return gojson.decode(body or b"{}", GET_REQUEST)
    except GoJsonError as exc:
        raise ApiError.of("JSInvalidJSONErr", err=str(exc)) from exc


def _message(msg: StoredMsg, no_hdr: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"subject": msg.subject, "seq": msg.seq}
    if msg.hdr and not no_hdr:
        out["hdrs"] = base64.b64encode(msg.hdr).decode()
    if msg.data:
        out["data"] = base64.b64encode(msg.data).decode()
    out["time"] = rfc3339(msg.ts_ns)
    return out


# ---------------------------------------------------------------------------------------------
# DIRECT.GET


def direct_get(store: StreamStore, stream: str, body: bytes,
               subject_suffix: str = "") -> list[Frame]:
    """The reply messages of `$JS.API.DIRECT.GET.<stream>[.<last-by-subject>]`."""
    if subject_suffix:
        req: dict[str, Any] = {"last_by_subj": subject_suffix}
    else:
        try:
            req = gojson.decode(body, GET_REQUEST) if body.strip() else {}
        except GoJsonError:
            return [_status(408, "Malformed Request")]
    try:
        return _direct(store, stream, req)
    except CorruptRecordError:
        return [_status(500, "Corrupt Message")]


def _direct(store: StreamStore, stream: str, req: dict[str, Any]) -> list[Frame]:
    if req.get("multi_last"):
        seqs = sorted({s for p in req["multi_last"] for s in lasts_per_subject(store, p)})
        return _batch(store, stream, seqs, up_to=_last_seq(store)) if seqs else \
            [_status(404, "No Results")]
    if not req.get("seq") and not req.get("last_by_subj") and not req.get("next_by_subj"):
        return [_status(408, "Empty Request")]
    if _conflicting(req):
        return [_status(408, "Bad Request")]
    if req.get("batch", 0) > 0:
        seqs = _batch_seqs(store, req)
        return _batch(store, stream, seqs) if seqs else [_status(404, "Message Not Found")]
    seq = _single(store, req)
    msg = store.load(seq) if seq else None
    if msg is None:
        return [_status(404, "Message Not Found")]
    if req.get("no_hdr"):
        return [Frame(b"", msg.data)]  # sent as a plain MSG, without any header
    return [Frame(_with_headers(msg, stream, []), msg.data)]


def _last_seq(store: StreamStore) -> int:
    return next(store.seqs_desc(), 0)


def _batch_seqs(store: StreamStore, req: dict[str, Any]) -> list[int]:
    """All matching sequences from the start (the pending counts need them all); bounded by
    MAX_BATCH beyond the requested batch."""
    pattern = req.get("next_by_subj", "")
    match = compile_matcher(pattern) if pattern else None
    seqs = []
    for seq in store.seqs(max(req.get("seq", 0), 1)):
        msg = store.load(seq)
        if msg is not None and (match is None or match(msg.subject)):
            seqs.append(seq)
        if len(seqs) >= req["batch"] + MAX_BATCH:
            break
    return seqs[:req["batch"]] + [-s for s in seqs[req["batch"]:]]


def _batch(store: StreamStore, stream: str, seqs: list[int], up_to: int = 0) -> list[Frame]:
    sent = [s for s in seqs if s > 0]
    remaining = len(seqs)
    frames, previous = [], 0
    for seq in sent:
        remaining -= 1
        msg = store.load(seq)
        if msg is None:
            continue
        pairs = [("Nats-Num-Pending", str(remaining)), ("Nats-Last-Sequence", str(previous))]
        frames.append(Frame(_with_headers(msg, stream, pairs), msg.data))
        previous = seq
    eob = [("Nats-Num-Pending", str(remaining)), ("Nats-Last-Sequence", str(previous))]
    if up_to:
        eob.append(("Nats-UpTo-Sequence", str(up_to)))
    return frames + [_status(204, "EOB", eob)]


def _with_headers(msg: StoredMsg, stream: str, extra: list[tuple[str, str]]) -> bytes:
    pairs = [("Nats-Stream", stream), ("Nats-Subject", msg.subject),
             ("Nats-Sequence", str(msg.seq)), ("Nats-Time-Stamp", rfc3339(msg.ts_ns)), *extra]
    lines = [line for line in msg.hdr.split(b"\r\n")[1:] if line] if msg.hdr else []
    return b"NATS/1.0\r\n" + b"".join(line + b"\r\n" for line in lines) + b"".join(
        f"{k}: {v}\r\n".encode() for k, v in pairs) + b"\r\n"

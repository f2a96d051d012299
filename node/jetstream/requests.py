"""Small stream API requests: PURGE, MSG.DELETE, DELETE, NAMES and LIST, as nats-server reads
them (its quirks included) and the replies NAMES/LIST build. Pure.

nats-server treats a request body as empty when it is blank, `{}`, or not JSON at all; only a
body that is JSON is decoded strictly (unknown fields refused).
"""

from __future__ import annotations

import json
from typing import Any

from node.jetstream import gojson
from node.jetstream.config import Config, to_wire
from node.jetstream.errors import ApiError
from node.jetstream.gojson import BOOL, STRING, GoJsonError
from node.jetstream.ops import DeleteMsg, Purge
from node.subject import subjects_collide

NAMES_LIMIT = 1024
LIST_LIMIT = 256

PURGE_REQUEST = gojson.struct("server.JSApiStreamPurgeRequest", {
    "seq": gojson.scalar("uint64"), "filter": STRING, "keep": gojson.scalar("uint64")})
DELETE_REQUEST = gojson.struct("server.JSApiMsgDeleteRequest", {
    "seq": gojson.scalar("uint64"), "no_erase": BOOL})
NAMES_REQUEST = gojson.struct("server.JSApiStreamNamesRequest", {
    "offset": gojson.scalar("int"), "subject": STRING})


def is_empty_request(body: bytes) -> bool:
    """nats-server's isEmptyRequest: blank, `{}`, or not JSON."""
    text = body.strip()
    if not text:
        return True
    try:
        value = json.loads(text)
    except ValueError:
        return True
    except RecursionError:
        return False  # deeply nested JSON is not empty: decoding it refuses it
    return value == {}


def _decode(body: bytes, schema: gojson.GoType) -> dict[str, Any]:
    try:
        return gojson.decode(body, schema)
    except GoJsonError as exc:
        raise ApiError.of("JSInvalidJSONErr", err=str(exc)) from exc


def parse_purge(body: bytes, now_ns: int) -> Purge:
    """STREAM.PURGE body -> the PURGE entry to propose (or ApiError)."""
    if is_empty_request(body):
        return Purge(now_ns)
    req = _decode(body, PURGE_REQUEST)
    if req.get("seq") and req.get("keep"):
        raise ApiError.of("JSBadRequestErr")
    return Purge(now_ns, req.get("filter", ""), req.get("seq", 0), req.get("keep", 0))


def parse_msg_delete(body: bytes, now_ns: int) -> DeleteMsg:
    """STREAM.MSG.DELETE body -> the DELETE_MSG entry to propose (or ApiError)."""
    if not body.strip() or body.strip() == b"{}":
        raise ApiError.of("JSBadRequestErr")
    req = _decode(body, DELETE_REQUEST)
    return DeleteMsg(now_ns, req.get("seq", 0), bool(req.get("no_erase", False)))


def check_stream_delete(body: bytes) -> None:
    if body.strip():
        raise ApiError.of("JSNotEmptyRequestErr")


def names_reply(streams: dict[str, Config], body: bytes) -> dict[str, Any]:
    kind = "io.nats.jetstream.api.v1.stream_names_response"
    try:
        offset, subject = _names_args(body)
    except ApiError as err:
        return {"type": kind, **err.to_dict(), "total": 0, "offset": 0, "limit": 0,
                "streams": None}
    names = sorted(n for n, cfg in streams.items() if _has_subject(cfg, subject))
    offset = min(offset, len(names))  # nats-server clamps the offset to the total
    return {"type": kind, "total": len(names),
            "offset": offset, "limit": NAMES_LIMIT,
            "streams": names[offset:offset + NAMES_LIMIT] or None}


def list_reply(streams: dict[str, Config], body: bytes, infos: dict[str, dict[str, Any]]
               ) -> dict[str, Any]:
    """`infos` maps a name to the rest of its stream info (created, state, ts, ...)."""
    kind = "io.nats.jetstream.api.v1.stream_list_response"
    try:
        offset, subject = _names_args(body)
    except ApiError as err:
        return {"type": kind, **err.to_dict(), "total": 0, "offset": 0, "limit": 0,
                "streams": None}
    names = sorted(n for n, cfg in streams.items() if _has_subject(cfg, subject))
    offset = min(offset, len(names))
    page = [{"config": stored_config(to_wire(streams[n])), **infos.get(n, {})}
            for n in names[offset:offset + LIST_LIMIT]]
    return {"type": kind, "total": len(names),
            "offset": offset, "limit": LIST_LIMIT, "streams": page}


def stored_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A config as STREAM.LIST / CONSUMER.LIST show it: nats-server lists the stored config,
    whose metadata lacks the `_nats.level` / `_nats.ver` that INFO and CREATE add when they
    answer (only `_nats.req.level` is stored)."""
    meta = cfg.get("metadata")
    if not meta:
        return cfg
    kept = {k: v for k, v in meta.items() if k not in ("_nats.level", "_nats.ver")}
    return {**cfg, "metadata": kept}


def _names_args(body: bytes) -> tuple[int, str]:
    if is_empty_request(body):
        return 0, ""
    req = _decode(body, NAMES_REQUEST)
    return max(req.get("offset", 0), 0), req.get("subject", "")


def _has_subject(cfg: Config, subject: str) -> bool:
    return not subject or any(subjects_collide(subject, s) for s in cfg["subjects"])

"""JSON replies of the stream API, in nats-server's field order.

Pure builders: the caller passes the config, the state and the times (RFC 3339 strings), so a
reply is a function of data and can be compared field by field with nats-server's.
"""

from __future__ import annotations

from typing import Any

from node.jetstream import gojson
from node.jetstream.config import Config, to_wire
from node.jetstream.consumer import Consumer, StreamView
from node.jetstream.errors import ApiError
from node.jetstream.requests import is_empty_request
from node.jetstream.stream import Stream
from node.subject import compile_matcher

ZERO_TIME = "0001-01-01T00:00:00Z"
TYPE_PREFIX = "io.nats.jetstream.api.v1."


def error_reply(kind: str, err: ApiError) -> dict[str, Any]:
    return {"type": TYPE_PREFIX + kind, **err.to_dict()}


def empty_state(cfg: Config, consumers: int = 0) -> dict[str, Any]:
    """The state of a stream that never held a message (`first_seq` honoured)."""
    first = max(cfg.get("first_seq", 0), 1) if cfg.get("first_seq") else 0
    return {"messages": 0, "bytes": 0, "first_seq": first, "first_ts": ZERO_TIME,
            "last_seq": first - 1 if first else 0, "last_ts": ZERO_TIME,
            "consumer_count": consumers}


def _source_info(src: Config, mirror: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": src["name"]}
    if src.get("external"):
        out["external"] = src["external"]
    out.update(lag=0, active=-1)
    # nats-server's create/update replies leave out a mirror's filter_subject but show its
    # transforms (checked, 2.15.1)
    if src.get("filter_subject") and not mirror:
        out["filter_subject"] = src["filter_subject"]
    if src.get("subject_transforms"):
        out["subject_transforms"] = src["subject_transforms"]
    return out


def stream_reply(kind: str, cfg: Config, state: dict[str, Any], created: str, now: str,
                 did_create: bool = False) -> dict[str, Any]:
    """`stream_create_response` / `stream_update_response` / `stream_info_response` body."""
    out: dict[str, Any] = {"type": TYPE_PREFIX + kind}
    if kind == "stream_info_response":
        out.update(total=0, offset=0, limit=0)
    out["config"] = to_wire(cfg)
    out["created"] = created
    out["state"] = state
    if cfg.get("mirror"):
        out["mirror"] = _source_info(cfg["mirror"], mirror=True)
    if cfg.get("sources"):
        out["sources"] = [_source_info(s) for s in cfg["sources"]]
    out["ts"] = now
    if did_create:
        out["did_create"] = True
    return out


def consumer_reply(kind: str, stream: str, name: str, wire_config: dict[str, Any],
                   created: str, now: str, delivered: tuple[int, int] = (0, 0),
                   ack_floor: tuple[int, int] = (0, 0), num_ack_pending: int = 0,
                   num_redelivered: int = 0, num_waiting: int = 0,
                   num_pending: int = 0, delivered_at: str = "", acked_at: str = "",
                   push_bound: bool = False, paused_ns: int = 0,
                   pinned: dict[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """`consumer_create_response` / `consumer_info_response` body; `delivered` and
    `ack_floor` are (consumer_seq, stream_seq). `delivered_at` / `acked_at` (the last
    delivery / ack, RFC 3339) become their `last_active`, omitted when empty as nats-server
    omits a zero time; `push_bound`: someone listens on a push consumer's deliver subject."""
    out: dict[str, Any] = {
        "type": TYPE_PREFIX + kind, "stream_name": stream, "name": name, "created": created,
        "config": wire_config,
        "delivered": {"consumer_seq": delivered[0], "stream_seq": delivered[1]},
        "ack_floor": {"consumer_seq": ack_floor[0], "stream_seq": ack_floor[1]},
        "num_ack_pending": num_ack_pending, "num_redelivered": num_redelivered,
        "num_waiting": num_waiting, "num_pending": num_pending,
    }
    if delivered_at:
        out["delivered"]["last_active"] = delivered_at
    if acked_at:
        out["ack_floor"]["last_active"] = acked_at
    if push_bound:
        out["push_bound"] = True
    if paused_ns > 0:  # nats-server says paused only while the pause lasts
        out["paused"] = True
        out["pause_remaining"] = paused_ns
    out["ts"] = now
    if wire_config.get("priority_groups"):
        groups: list[dict[str, Any]] = []
        for g in wire_config["priority_groups"]:
            pin_id, since = (pinned or {}).get(g, ("", ZERO_TIME))
            groups.append({"group": g, "pinned_client_id": pin_id, "pinned_ts": since}
                          if pin_id else {"group": g, "pinned_ts": ZERO_TIME})
        out["priority_groups"] = groups
    return out


def consumer_info(kind: str, stream: str, name: str, wire_config: dict[str, Any],
                  consumer: Consumer, view: StreamView, created: str, now: str,
                  num_waiting: int = 0, delivered_at: str = "", acked_at: str = "",
                  push_bound: bool = False, paused_ns: int = 0,
                  pinned: dict[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """CONSUMER.INFO / CREATE reply from a consumer's state."""
    st = consumer.state
    return consumer_reply(kind, stream, name, wire_config, created, now,
                          delivered=(st.delivered_cseq, st.delivered_sseq),
                          ack_floor=(st.floor_cseq, st.floor_sseq),
                          num_ack_pending=consumer.num_ack_pending(),
                          num_redelivered=consumer.num_redelivered(),
                          num_waiting=num_waiting, num_pending=consumer.num_pending(view),
                          delivered_at=delivered_at, acked_at=acked_at, push_bound=push_bound,
                          paused_ns=paused_ns, pinned=pinned)


SUBJECTS_LIMIT = 100_000
INFO_REQUEST = gojson.struct("server.JSApiStreamInfoRequest", {
    "deleted_details": gojson.BOOL, "subjects_filter": gojson.STRING,
    "offset": gojson.scalar("int")})


def stream_info(stream: Stream, body: bytes, created: str, now: str,
                consumers: int = 0) -> dict[str, Any]:
    """STREAM.INFO's reply: `subjects_filter` adds per-subject counts (paged by `offset`),
    `deleted_details` the interior deleted sequences. A body that is not JSON counts as
    empty, as in nats-server."""
    kind = "stream_info_response"
    try:
        req = {} if is_empty_request(body) else gojson.decode(body, INFO_REQUEST)
    except gojson.GoJsonError as exc:
        err = ApiError.of("JSInvalidJSONErr", err=str(exc))
        return {**error_reply(kind, err), "total": 0, "offset": 0, "limit": 0}
    state = stream.state(consumers)
    subjects = _filtered_subjects(stream, req.get("subjects_filter", ""))
    offset = max(req.get("offset", 0), 0)  # echoed as given (NAMES clamps, INFO does not)
    page = dict(subjects[offset:offset + SUBJECTS_LIMIT])
    state = _with_details(state, page, _deleted(stream) if req.get("deleted_details") else None)
    out = stream_reply(kind, stream.cfg, state, created, now)
    out["total"] = len(subjects)
    out["offset"] = offset if subjects else 0
    out["limit"] = SUBJECTS_LIMIT if subjects else 0
    return out


def _filtered_subjects(stream: Stream, pattern: str) -> list[tuple[str, int]]:
    if not pattern:
        return []
    match = compile_matcher(pattern)
    return [(s, n) for s, n in stream.store.subjects() if match(s)]


def _deleted(stream: Stream) -> list[int]:
    first, last = stream.store.first_seq(), stream.last_seq
    if not first:
        return []
    present = set()
    for seq in stream.store.seqs(first):
        present.add(seq)
    return [s for s in range(first, last + 1) if s not in present]


def _with_details(state: dict[str, Any], subjects: dict[str, int],
                  deleted: list[int] | None) -> dict[str, Any]:
    """Insert `subjects` and `deleted` where nats-server writes them."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if key == "num_deleted" and subjects:
            out["subjects"] = subjects
        if key == "consumer_count":
            if subjects and "subjects" not in out:
                out["subjects"] = subjects
            if deleted:
                out["deleted"] = deleted
        out[key] = value
    return out

"""Mirrors and sources, the pure part: what a sourcing stream asks its origin for, how a
delivery from the origin is read, and how a SOURCE_MSGS entry is applied.

    key = source_key(src)                       # "" for the mirror
    done = progress(store, key)                 # last origin seq already stored
    req = consumer_request(src, name, deliver, done, mirror=...)
    ...                                         # deliveries -> SourceMsgs entry -> Raft
    effects = apply_sourced(stream, op)         # inside Stream.apply

A mirror stores each message at the origin's sequence with the origin's timestamp (gaps the
origin has stay gaps); a source stores it at its own next sequence, its subject passed through
the source's transforms, with a `Nats-Stream-Source` header naming origin and origin seq, as
nats-server 2.15 writes it: `<name> <seq> <filters> <destinations> <original subject> <ident>`.

Progress (the last origin seq per source) is written with the messages in the same store
batch, so after a restart the sourcing resumes at `progress + 1`: nothing twice, nothing
skipped. An entry whose messages are at or below the progress (a re-delivery after a
reconnect) stores nothing.
"""

from __future__ import annotations

import hashlib
import re
import struct
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from node.jetstream import headers as h
from node.jetstream import ops
from node.jetstream.config import wire_external
from node.jetstream.errors import ApiError
from node.jetstream.store import StoredMsg
from node.jetstream.transform import apply_mapping
from node.subject import compile_matcher

if TYPE_CHECKING:
    from node.jetstream.stream import Effect, Stream

MIRROR_KEY = ""
PROGRESS_PREFIX = "source:"   # store meta key: "source:<key>" -> origin seq (u64)
_LONG_KEY = 200  # longer source keys are hashed (`_progress_key`)
STREAM_SOURCE = "Nats-Stream-Source"
FWC = ">"
_U64 = struct.Struct("<Q")
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def source_key(src: dict[str, Any]) -> str:
    """A source's index name, nats-server's `iname`: origin name (with a hash of an external
    API prefix), its filters and its destinations. Two sources of one origin differ by it."""
    srcs, dests = _filters_and_dests(src)
    return f"{_origin_name(src)} {srcs} {dests}"


def _origin_name(src: dict[str, Any]) -> str:
    """The origin's name, with a hash of its API prefix when it is external."""
    api = (src.get("external") or {}).get("api")
    return f"{src['name']}:{_server_hash(api)}" if api else src["name"]


def _server_hash(text: str) -> str:
    """nats-server's 8-character name hash (its `getHash`): each of the first 8 bytes of
    the SHA-256, modulo 62, picks a digit. Source index names and headers carry it."""
    return "".join(_B62[b % 62] for b in hashlib.sha256(text.encode()).digest()[:8])


def _filters_and_dests(src: dict[str, Any]) -> tuple[str, str]:
    transforms = src.get("subject_transforms") or []
    if not transforms:
        return src.get("filter_subject") or FWC, FWC
    return ("\f".join(t.get("src") or FWC for t in transforms),
            "\f".join(t.get("dest") or FWC for t in transforms))


def filters(src: dict[str, Any]) -> list[str]:
    """The subjects the origin consumer delivers (none: everything)."""
    if src.get("filter_subject"):
        return [src["filter_subject"]]
    out = [t.get("src") or FWC for t in src.get("subject_transforms") or []]
    return [] if FWC in out else out


def map_subject(src: dict[str, Any], subject: str) -> str:
    """A source's subject transforms: the first whose filter matches the subject maps it."""
    for tr in src.get("subject_transforms") or []:
        pattern = tr.get("src") or FWC
        if not compile_matcher(pattern)(subject):
            continue
        dest = tr.get("dest") or ""
        if not dest or dest == FWC:
            return subject
        mapped = apply_mapping(pattern, dest, subject)
        return subject if mapped is None else mapped
    return subject


def identity(group: str) -> str:
    """The origin's identity in a source header: 8 characters naming this incarnation of the
    origin (its Raft group includes its creation time), so a re-created origin differs."""
    return _hash(group)


def _hash(text: str) -> str:
    n = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    out = []
    for _ in range(8):
        n, r = divmod(n, 62)
        out.append(_B62[r])
    return "".join(out)


def source_header(src: dict[str, Any], origin_seq: int, subject: str, ident: str) -> str:
    srcs, dests = _filters_and_dests(src)
    value = f"{_origin_name(src)} {origin_seq} {srcs} {dests} {subject}"
    return f"{value} {ident}" if ident else value


def listen_subjects(cfg: dict[str, Any], name: str) -> list[str]:
    """The subjects a stream captures: a mirror, or a stream with sources and no subjects,
    captures none (nats-server: a publish to its name finds no responders)."""
    if cfg.get("subjects"):
        return list(cfg["subjects"])
    return [] if cfg.get("mirror") or cfg.get("sources") else [name]


def progress(store: Any, key: str) -> int:
    return progress_of(store, key)[0]


def progress_of(store: Any, key: str) -> tuple[int, str]:
    """(last origin seq stored, the identity of the origin it came from)."""
    raw = store.get_meta(_progress_key(key))
    if not raw:
        return 0, ""
    return _U64.unpack_from(raw)[0], raw[_U64.size:].decode()


def _progress_key(key: str) -> str:
    """The store's meta key of a source's progress. A source's long transform makes its
    index name too long for an LMDB key (511 bytes with the stream's prefix): a hash of it
    then (such a source stopped the node before, so no store holds the long form)."""
    if len(key.encode()) <= _LONG_KEY:
        return PROGRESS_PREFIX + key
    return PROGRESS_PREFIX + "#" + hashlib.sha256(key.encode()).hexdigest()


def resume_after(store: Any, key: str, ident: str) -> int:
    """The origin seq a source resumes after. A source whose origin was re-created (its
    identity changed) starts over, as nats-server 2.15 does; a mirror never rewrites a
    sequence, so it goes on after its last one."""
    done, seen = progress_of(store, key)
    if key != MIRROR_KEY and seen and ident and seen != ident:
        return 0
    return done


# ------------------------------------------------------------------------------------------
# The origin consumer


def parse_time(text: str) -> int:
    """RFC 3339 (Go's form, any number of fraction digits) -> ns since the epoch."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    base = datetime.fromisoformat(m.group(1) + zone).astimezone(UTC)
    frac = (m.group(2) or "0")[:9].ljust(9, "0")
    return int(base.timestamp()) * 1_000_000_000 + int(frac)


def consumer_request(src: dict[str, Any], name: str, deliver: str, done: int,
                     mirror: bool, heartbeat_ns: int) -> dict[str, Any]:
    """CONSUMER.CREATE body of the origin consumer, nats-server's form: a `direct`
    consumer (leader-local, not replicated, not listed), push with flow control and idle
    heartbeats, no acks. It starts after `done`, else where the source config says."""
    cfg: dict[str, Any] = {"name": name}
    if done:
        cfg.update(deliver_policy="by_start_sequence", opt_start_seq=done + 1)
    elif src.get("opt_start_seq"):
        cfg.update(deliver_policy="by_start_sequence", opt_start_seq=src["opt_start_seq"])
    elif src.get("opt_start_time"):
        cfg.update(deliver_policy="by_start_time", opt_start_time=src["opt_start_time"])
    else:
        cfg["deliver_policy"] = "all"
    cfg.update(ack_policy="none", max_deliver=1, replay_policy="instant")
    subjects = filters(src)
    if len(subjects) == 1:
        cfg["filter_subject"] = subjects[0]
    elif subjects:
        cfg["filter_subjects"] = subjects
    cfg.update(flow_control=True, deliver_subject=deliver, idle_heartbeat=heartbeat_ns,
               inactive_threshold=10 * 1_000_000_000, num_replicas=0, direct=True,
               sourcing=True)
    cfg["metadata"] = {"_nats.mirror" if mirror else "_nats.src": "true"}
    return {"stream_name": src["name"], "config": cfg}


_DIRECT_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,), "deliver_subject": (str,), "deliver_policy": (str,),
    "filter_subject": (str,), "filter_subjects": (list,), "opt_start_seq": (int,),
    "opt_start_time": (str,), "idle_heartbeat": (int,), "inactive_threshold": (int,),
    "flow_control": (bool,),
}
_POLICIES = ("all", "by_start_sequence", "by_start_time")


def check_direct(cfg: dict[str, Any]) -> None:
    """The origin side's checks of a sourcing consumer config: types, a name and a deliver
    subject, a start position it can serve. Refusals are API errors, never exceptions."""
    for key, types in _DIRECT_FIELDS.items():
        value = cfg.get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)
                                  and bool not in types):
            raise ApiError.of("JSInvalidJSONErr", err=f"sourcing consumer field {key!r} "
                              f"has the wrong type")
    if not cfg.get("name") or not cfg.get("deliver_subject"):
        raise ApiError.of("JSConsumerCreateErrF",
                          err="sourcing consumer needs a name and a deliver subject")
    if any(not isinstance(f, str) or not f for f in cfg.get("filter_subjects") or []):
        raise ApiError.of("JSInvalidJSONErr", err="sourcing consumer filter_subjects")
    policy = cfg.get("deliver_policy", "all")
    if policy not in _POLICIES:
        raise ApiError.of("JSConsumerInvalidPolicyErrF",
                          err=f"sourcing consumer deliver policy {policy!r}")
    if policy == "by_start_time":
        try:
            parse_time(cfg.get("opt_start_time") or "")
        except ValueError as exc:
            raise ApiError.of("JSConsumerInvalidPolicyErrF", err=str(exc)) from exc
    if any(int(cfg.get(k) or 0) < 0 for k in ("opt_start_seq", "idle_heartbeat",
                                               "inactive_threshold")):
        raise ApiError.of("JSConsumerCreateErrF", err="sourcing consumer negative value")


def parse_delivery(reply: str) -> tuple[int, int, int, int] | None:
    """(origin seq, delivery seq, timestamp ns, pending) from a v1 ack subject
    `$JS.ACK.<stream>.<consumer>.<n>.<sseq>.<dseq>.<ts>.<pending>`."""
    tokens = reply.split(".")
    if len(tokens) != 9 or tokens[0] != "$JS" or tokens[1] != "ACK":
        return None
    try:
        return int(tokens[5]), int(tokens[6]), int(tokens[7]), int(tokens[8])
    except ValueError:
        return None


def start_seq(cfg: dict[str, Any], view: Any) -> int:
    """Where a direct consumer begins reading its stream (0: after the end)."""
    policy = cfg.get("deliver_policy", "all")
    if policy == "by_start_sequence":
        return max(int(cfg.get("opt_start_seq") or 1), 1)
    if policy == "by_start_time":
        return view.first_at_or_after_time(parse_time(cfg["opt_start_time"])) or 0
    return 1


# ------------------------------------------------------------------------------------------
# Applying SOURCE_MSGS (called by Stream.apply: deterministic, no clock)


def find_source(cfg: dict[str, Any], key: str) -> dict[str, Any] | None:
    if key == MIRROR_KEY:
        return cfg.get("mirror")
    for src in cfg.get("sources") or []:
        if source_key(src) == key:
            return src
    return None


def apply_sourced(stream: Stream, op: ops.SourceMsgs) -> list[Effect]:
    """Store what the origin delivered (in origin order) and move the source's progress.
    A source no longer configured (a promoted mirror, a removed source) stores nothing. A
    target with `discard: new` that is full stores nothing more from the entry and keeps its
    progress before the refused message (the link sees that and retries later, as
    nats-server's source retries)."""
    from node.jetstream.stream import Removed, Stored

    effects: list[Effect] = list(stream._expire(op.now_ns))
    src = find_source(stream.cfg, op.key)
    if src is None or stream.cfg["sealed"]:
        return effects  # a sealed target takes nothing in (nats-server: the same)
    mirror = op.key == MIRROR_KEY
    done = resume_after(stream.store, op.key, op.ident)
    removed: list[int] = []
    for m in op.msgs:
        if m.origin_seq <= done:
            continue  # stored before (a re-delivery after a reconnect or a restart)
        done = m.origin_seq
        if mirror:
            if m.origin_seq <= stream.last_seq:
                continue  # the origin went back (re-created): a mirror never rewrites a seq
            seq, ts, hdr = m.origin_seq, m.origin_ts, without_expected(m.hdr)
            subject = map_subject(src, m.subject)  # a mirror's transforms apply too
        else:
            msg_id = h.get(m.hdr, h.MSG_ID) or ""
            if msg_id and _duplicate(stream, msg_id, op.now_ns):
                continue
            seq, ts, subject = stream._next_seq(), op.now_ns, map_subject(src, m.subject)
            hdr = _with_source_header(without_expected(m.hdr),
                                      source_header(src, m.origin_seq, m.subject, op.ident))
        try:
            stream._check_key_sizes(subject, hdr)
        except ApiError:
            # Too long for a store key once transformed (nats-server stores it): skipped
            # for good, the same on every replica and on replay, instead of stopping the node.
            continue
        try:
            stream._check_discard_new(ops.StreamMsg(ts, subject, "", hdr, m.data))
        except ApiError:
            done = m.origin_seq - 1
            break
        previous = stream.store.last_for_subject(subject)
        stream._put(StoredMsg(seq, subject, hdr, m.data, ts))
        stream.last_seq, stream.last_ts = seq, ts
        msg_id = h.get(m.hdr, h.MSG_ID) or ""
        stream.last_msg_id = msg_id
        if msg_id and not mirror:
            stream.store.put_dedup(msg_id, seq, op.now_ns)
        effects.append(Stored(seq, subject))
        removed += stream._enforce_limits(subject)
        if stream.cfg["retention"] == "interest" and not stream._interested(subject):
            stream._remove(seq)
            removed.append(seq)
        effects.extend(stream._republish(seq, subject, ops.StreamMsg(ts, subject, "", hdr,
                                                                     m.data), previous))
    stream.store.put_meta(_progress_key(op.key), _U64.pack(done) + op.ident.encode())
    if removed:
        effects.append(Removed(tuple(removed)))
    return effects


def _duplicate(stream: Stream, msg_id: str, now_ns: int) -> bool:
    seen = stream.store.get_dedup(msg_id)
    return seen is not None and now_ns - seen[1] <= stream.cfg["duplicate_window"]


EXPECTED_PREFIX = b"Nats-Expected-"


def without_expected(hdr: bytes) -> bytes:
    """`hdr` without its `Nats-Expected-*` lines (the prefix as written, case-sensitive), as
    nats-server stores a mirrored or sourced message: the origin checked them, here they
    would mean nothing (a KV `create` over a delete carries the origin's revision). No line
    left: no header block at all."""
    if EXPECTED_PREFIX not in hdr:
        return hdr
    lines = hdr.split(b"\r\n")
    kept = [x for x in lines[1:] if x and not x.startswith(EXPECTED_PREFIX)]
    if not kept:
        return b""
    return lines[0] + b"\r\n" + b"".join(x + b"\r\n" for x in kept) + b"\r\n"


def _with_source_header(hdr: bytes, value: str) -> bytes:
    """`hdr` with its `Nats-Stream-Source` (an earlier hop's) replaced by ours, last."""
    line = f"{STREAM_SOURCE}: {value}\r\n".encode()
    if not hdr:
        return b"NATS/1.0\r\n" + line + b"\r\n"
    needle = STREAM_SOURCE.lower().encode() + b":"
    lines = [x for x in hdr.split(b"\r\n")[1:] if x and not x.lower().startswith(needle)]
    first = hdr.split(b"\r\n", 1)[0]
    return first + b"\r\n" + b"".join(x + b"\r\n" for x in lines) + line + b"\r\n"


# ------------------------------------------------------------------------------------------
# STREAM.INFO blocks


def info_block(src: dict[str, Any], lag: int, active_ns: int, error: dict[str, Any] | None,
               seq: int, mirror: bool) -> dict[str, Any]:
    """A `mirror` / `sources[i]` block in nats-server's field order; `active` is the time
    since the origin was last heard from (-1: never), `seq` (sources only) the last origin
    sequence stored."""
    out: dict[str, Any] = {"name": src["name"]}
    if src.get("external"):
        out["external"] = wire_external(src["external"])
    out["lag"] = lag
    if seq and not mirror:
        out["seq"] = seq
    out["active"] = active_ns
    if error:
        out["error"] = error
    if src.get("filter_subject"):
        out["filter_subject"] = src["filter_subject"]
    if src.get("subject_transforms"):
        out["subject_transforms"] = src["subject_transforms"]
    return out

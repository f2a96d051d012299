"""Message tracing (`Nats-Trace-Dest`), as nats-server 2.15 does it: pure event building.

A message published with the header `Nats-Trace-Dest: <subject>` makes the server
record what it did with that message at each hop of its routing, and publish one
JSON document on `<subject>`, in the publisher's account, once routing is over:

    {"server": <$SYS server info>, "request": {"header": {...}, "msgsize": n},
     "events": [{"type": "in", ...}, {"type": "sm", ...}, {"type": "eg", ...}, ...]}

Event types: `in` ingress (who published, in which account, on which subject,
and an `error` when the publish was refused), `sm` subject mapping, `si` service
import, `se` stream export, `eg` egress (one per subscription the message would
reach, with an `error` when it was not delivered), `js` a JetStream stream that
captures it (the document is sent at once, not after the store: a store error is
not reported). With `Nats-Trace-Only` set to
1/true/on (any case) the events are built but the message reaches nobody.

The header name is matched case-sensitively and a destination that is not a
literal subject disables tracing (the message then goes on untraced), as
nats-server does. The trace follows a service import into the exporter only when
the export has `allow_trace`, and a stream import into the importer only when the
import has it; otherwise the hop's `si`/`se` event ends that branch.

Routing code finds the trace of the message being published in `active`: set by
the publishing client around its synchronous publish, read only when a message
has headers, so header-less traffic never looks at it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from node.subject import valid_literal_subject

TRACE_DEST = "Nats-Trace-Dest"
TRACE_ONLY = "Nats-Trace-Only"
TRACE_PARENT = "traceparent"  # W3C trace context, matched in any case
# Added to each copy a traced message gets over a route: the hop number ("1", "2", ...
# one per peer; "<hop>.<n>" for a copy of a copy). Its presence is what makes the
# receiving node trace the copy (node/cluster/service.py).
TRACE_HOP = "Nats-Trace-Hop"
TRACE_HOP_MARK = b"\r\n" + TRACE_HOP.encode() + b":"
# Added to a route copy that travels in another account than the trace's own (a
# stream import with allow_trace): the peer sends its document in that account.
TRACE_ORIGIN = "Nats-Trace-Origin-Account"
TRACE_ORIGIN_MARK = b"\r\n" + TRACE_ORIGIN.encode() + b":"
# Cheap pre-check on the raw header block before any parsing (a header line
# always follows a CRLF: the status line comes first).
TRACE_DEST_MARK = b"\r\n" + TRACE_DEST.encode() + b":"
# The value nats-server gives the header in a copy that crossed an account
# boundary the trace may not follow.
TRACE_DISABLED = "trace disabled"
_ONLY_VALUES = ("1", "true", "on")

# nats-server's client kinds as numbers (the `kind` member of in/eg events).
KIND_NUMBERS = {"Client": 0, "Router": 1, "Gateway": 2, "System": 3, "Leafnode": 4,
                "JetStream": 5, "Account": 6}

# Egress errors, nats-server's texts.
NO_ECHO = "Not delivered because of no echo"
SUB_DENIED = "Not delivered because subscription denies this subject"
CLIENT_CLOSED = "Not delivered because client is closed"

# The trace of the message being routed right now (see module docstring).
active: MsgTrace | None = None


def parse_headers(raw: bytes) -> dict[str, list[str]]:
    """A NATS header block (`NATS/1.0...\\r\\nKey: value\\r\\n...\\r\\n\\r\\n`) as
    key -> values, keys as sent, values stripped."""
    out: dict[str, list[str]] = {}
    for line in raw.decode("utf-8", "replace").split("\r\n")[1:]:
        key, sep, value = line.partition(":")
        if sep and key:
            out.setdefault(key, []).append(value.strip())
    return out


def start(headers: bytes, payload_size: int, account_trace: Any = None,
          rng: random.Random | None = None, resample: bool = True) -> MsgTrace | None:
    """The trace a message asks for, or None (no header, or a destination that
    is not a literal subject). `account_trace` (accountconf.MsgTraceConfig, the
    account's `msg_trace`): without `Nats-Trace-Dest`, a W3C `traceparent` header
    (any case) whose flags say sampled is traced there, `sampling` percent of the
    time; `Nats-Trace-Only` does not apply to it (nats-server delivers it).
    `resample=False` for a copy that came over a route: its origin already
    sampled it, so every node's document of one message is sent or none is."""
    if TRACE_DEST_MARK in headers:
        header = parse_headers(headers)
        dest = (header.get(TRACE_DEST) or [""])[0]
        if not valid_literal_subject(dest):
            return None
        only = (header.get(TRACE_ONLY) or [""])[0].lower() in _ONLY_VALUES
        mt = MsgTrace(dest, only, header, len(headers) + payload_size)
    else:
        mt = _sampled_trace(headers, payload_size, account_trace, rng, resample)
    return mt


def _sampled_trace(headers: bytes, payload_size: int, account_trace: Any,
                   rng: random.Random | None, resample: bool) -> MsgTrace | None:
    """The account's `msg_trace` for a message with a sampled W3C `traceparent`."""
    if account_trace is None or b"raceparent" not in headers.lower():
        return None
    header = parse_headers(headers)
    parent = next((v[0] for k, v in header.items() if k.lower() == TRACE_PARENT), "")
    if not _sampled(parent):
        return None
    if resample and account_trace.sampling < 100 and \
            (rng or random).randint(1, 100) > account_trace.sampling:
        return None
    return MsgTrace(account_trace.dest, False, header, len(headers) + payload_size)


def _sampled(traceparent: str) -> bool:
    """W3C trace context `version-traceid-parentid-flags`: bit 0 of flags = sampled."""
    parts = traceparent.split("-")
    if len(parts) != 4:
        return False
    try:
        return bool(int(parts[3], 16) & 1)
    except ValueError:
        return False


def with_hop(headers: bytes, hop: str) -> bytes:
    """`headers` (a complete block, ending in an empty line) with `Nats-Trace-Hop: hop`
    as its last header, where nats-server puts it (one the publisher set is
    replaced where it stands, as nats-server does)."""
    line = TRACE_HOP.encode() + b": " + hop.encode()
    if TRACE_HOP_MARK in headers:
        return _replace(headers, TRACE_HOP, line)
    return headers[:-2] + line + b"\r\n\r\n"


def without_hop(headers: bytes) -> bytes:
    """`headers` without `Nats-Trace-Hop`: a copy sent untraced must not make the
    peer trace it (a publisher may have set the header itself)."""
    return _without(headers, TRACE_HOP)


def _replace(headers: bytes, key: str, line: bytes) -> bytes:
    """The first `key` header replaced by `line`, any later ones dropped."""
    mark = key.encode() + b":"
    out: list[bytes] = []
    for old in headers.split(b"\r\n"):
        if old.startswith(mark):
            if line:
                out.append(line)
                line = b""
            continue
        out.append(old)
    return b"\r\n".join(out)


def origin_disabled(headers: bytes) -> bytes:
    """A publisher's message that names a trace account itself is not traced:
    nats-server delivers it with `Nats-Trace-Dest: trace disabled` as its last header."""
    if TRACE_DEST_MARK in headers:
        headers = _without(headers, TRACE_DEST)
    return headers[:-2] + f"{TRACE_DEST}: {TRACE_DISABLED}\r\n\r\n".encode()


def _without(headers: bytes, key: str) -> bytes:
    mark = key.encode() + b":"
    return b"\r\n".join(line for line in headers.split(b"\r\n") if not line.startswith(mark))


def route_copy(mt: MsgTrace, account: str, headers: bytes, hop: str) -> bytes:
    """The headers of a traced message's copy for a peer, sent in `account`: its
    hop, and the trace's own account when the copy travels in another one and
    still names the trace's destination (a service import's copy names a `_R_.`
    subject of its own account instead). A publisher's own origin header never
    passes."""
    if TRACE_ORIGIN_MARK in headers:
        headers = _without(headers, TRACE_ORIGIN)
    if account != mt.account and (TRACE_DEST_MARK not in headers or (
            parse_headers(headers).get(TRACE_DEST) or [""])[0] == mt.dest):
        headers = headers[:-2] + f"{TRACE_ORIGIN}: {mt.account}\r\n\r\n".encode()
    return with_hop(headers, hop)


def disabled_headers(headers: bytes) -> bytes:
    """`headers` with the trace destination replaced by `trace disabled`: the copy a
    service import hands the exporter (which may not continue the trace)."""
    return with_dest(headers, TRACE_DISABLED)


def with_dest(headers: bytes, dest: str) -> bytes:
    """`headers` with the trace destination replaced by `dest`."""
    lines = headers.split(b"\r\n")
    mark = TRACE_DEST.encode() + b":"
    for i, line in enumerate(lines):
        if line.startswith(mark):
            lines[i] = mark + b" " + dest.encode()
    return b"\r\n".join(lines)


def _ts() -> str:
    return datetime.fromtimestamp(time.time(), UTC).isoformat().replace("+00:00", "Z")


class MsgTrace:
    """The events of one traced message, in the order they happened."""

    __slots__ = ("dest", "only", "header", "msgsize", "events", "account", "shadow", "hop",
                 "hops", "export")

    def __init__(self, dest: str, only: bool, header: dict[str, list[str]],
                 msgsize: int) -> None:
        self.dest = dest
        self.only = only
        self.header = header
        self.msgsize = msgsize
        self.events: list[dict[str, Any]] = []
        self.account = ""  # the ingress account: egress elsewhere names its account
        # While a stream import delivers (allow_trace): nats-server names the importer's
        # subscription in the exporter's subject space (its shadow subscription).
        self.shadow: Callable[[str], str] | None = None
        # While a stream import delivers: its accountconf.StreamDelivery (each importer
        # subscription reached gets a `se` event first).
        self.export: Any = None
        self.hop = ""  # the Nats-Trace-Hop this copy came with ("" at the origin)
        self.hops = 0  # copies sent over routes

    def ingress(self, kind: str, cid: int, name: str, account: str, subject: str,
                error: str | None = None) -> None:
        ev: dict[str, Any] = {"type": "in", "ts": _ts(), "kind": KIND_NUMBERS.get(kind, 0),
                              "cid": cid}
        if name:
            ev["name"] = name
        ev["acc"] = self.account = account
        ev["subj"] = subject
        if error:
            ev["error"] = error
        self.events.append(ev)

    def mapping(self, to: str) -> None:
        self.events.append({"type": "sm", "ts": _ts(), "to": to})

    def service_import(self, account: str, from_subject: str, to: str) -> None:
        self.events.append({"type": "si", "ts": _ts(), "acc": account, "from": from_subject,
                            "to": to})

    def stream_export(self, account: str, to: str) -> None:
        self.events.append({"type": "se", "ts": _ts(), "acc": account, "to": to})

    def egress(self, kind: str, cid: int, name: str, sub: str, queue: str | None = None,
               error: str | None = None, account: str = "") -> None:
        ev: dict[str, Any] = {"type": "eg", "ts": _ts(), "kind": KIND_NUMBERS.get(kind, 0),
                              "cid": cid}
        if name:
            ev["name"] = name
        if account and account != self.account:
            ev["acc"] = account
        if self.shadow is not None:
            sub = self.shadow(sub)
        ev["sub"] = sub
        if queue:
            ev["queue"] = queue
        if error:
            ev["error"] = error
        self.events.append(ev)

    def route_egress(self, cid: int, name: str) -> str:
        """A copy goes to the peer `name` over a route; returns its hop number (the
        copy's `Nats-Trace-Hop`). The event names no subscription."""
        self.hops += 1
        hop = f"{self.hop}.{self.hops}" if self.hop else str(self.hops)
        ev: dict[str, Any] = {"type": "eg", "ts": _ts(), "kind": KIND_NUMBERS["Router"],
                              "cid": cid}
        if name:
            ev["name"] = name
        ev["hop"] = hop
        self.events.append(ev)
        return hop

    def jetstream(self, stream: str, subject: str) -> None:
        """A stream captured the message (stored later, off the publisher's turn: a
        store error is not reported here, unlike nats-server's `error` member)."""
        self.events.append({"type": "js", "ts": _ts(), "stream": stream, "subject": subject})

    def document(self, server: dict[str, Any]) -> dict[str, Any]:
        """The JSON document published on `dest`."""
        # nats-server's header map is a Go map: JSON with its keys sorted.
        header = dict(sorted(self.header.items()))
        doc: dict[str, Any] = {"server": server,
                               "request": {"header": header, "msgsize": self.msgsize}}
        if self.hops:
            doc["hops"] = self.hops
        doc["events"] = self.events
        return doc

"""Pure encoders for what a server sends to a NATS client.

msg()/hmsg() run once per delivered message, so each is a single bytes %-format: one
allocation, one copy of the payload. Subjects, sids and replies may be given as str or
as already-encoded bytes (a subscription can cache its encoded sid).
"""

from __future__ import annotations

import json
from typing import Any

PING = b"PING\r\n"
PONG = b"PONG\r\n"
OK = b"+OK\r\n"
CRLF = b"\r\n"

# Go's encoding/json escapes these inside strings; nats-server's INFO goes through it.
_GO_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
               ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def _b(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def go_json(value: Any) -> str:
    """Compact JSON the way Go's json.Marshal writes it (raw UTF-8, HTML-safe escapes)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for raw, escaped in _GO_ESCAPES:
        if raw in text:  # these characters can only occur inside JSON strings
            text = text.replace(raw, escaped)
    return text


def info(d: dict[str, Any]) -> bytes:
    """INFO {json} \\r\\n: compact JSON, and the space before CRLF that nats-server sends
    (it joins "INFO", the JSON and CRLF with spaces)."""
    return b"INFO " + go_json(d).encode() + b" \r\n"


def msg(subject: str | bytes, sid: str | bytes, reply: str | bytes | None,
        payload: bytes) -> bytes:
    """MSG <subject> <sid> [reply] <#bytes>\\r\\n<payload>\\r\\n"""
    if reply:
        return b"MSG %b %b %b %d\r\n%b\r\n" % (
            _b(subject), _b(sid), _b(reply), len(payload), payload)
    return b"MSG %b %b %d\r\n%b\r\n" % (_b(subject), _b(sid), len(payload), payload)


def hmsg(subject: str | bytes, sid: str | bytes, reply: str | bytes | None,
         headers: bytes, payload: bytes) -> bytes:
    """HMSG <subject> <sid> [reply] <#header bytes> <#total bytes>\\r\\n<hdr><payload>\\r\\n"""
    hlen = len(headers)
    total = hlen + len(payload)
    if reply:
        return b"HMSG %b %b %b %d %d\r\n%b%b\r\n" % (
            _b(subject), _b(sid), _b(reply), hlen, total, headers, payload)
    return b"HMSG %b %b %d %d\r\n%b%b\r\n" % (
        _b(subject), _b(sid), hlen, total, headers, payload)


def err(text: str) -> bytes:
    """-ERR '<text>'\\r\\n"""
    return b"-ERR '" + text.encode() + b"'\r\n"

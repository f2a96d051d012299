"""NATS message headers (`NATS/1.0` blocks): read the JetStream ones, build new blocks."""

from __future__ import annotations

import re

MSG_ID = "Nats-Msg-Id"
EXPECTED_STREAM = "Nats-Expected-Stream"
EXPECTED_LAST_SEQ = "Nats-Expected-Last-Sequence"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
ROLLUP = "Nats-Rollup"
TTL = "Nats-TTL"
MARKER_REASON = "Nats-Marker-Reason"
KV_OPERATION = "KV-Operation"
INCR = "Nats-Incr"

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
            "m": 60_000_000_000, "h": 3_600_000_000_000}


# The block `get` parsed last and its first values: an applied message asks for ten or more
# headers of the same block, and splitting it again for each cost more than the rest of the
# checks. The cached block itself is held, so an identity match is the same bytes object.
_last: tuple[bytes, dict[bytes, bytes]] = (b"", {})


def get(hdr: bytes, key: str) -> str | None:
    """The first value of `key` (exact, case-sensitive match as nats-server's lookup), or None."""
    global _last
    if not hdr:
        return None
    held, first = _last
    if held is not hdr:
        first = {}
        for line in hdr.split(b"\r\n")[1:]:
            name, colon, _ = line.partition(b":")
            if colon and name not in first:
                first[name] = line
        _last = (hdr, first)
    name = key.encode()
    line = first.get(name)
    return None if line is None else line[len(name) + 1:].strip().decode(errors="replace")


def build(pairs: list[tuple[str, str]]) -> bytes:
    if not pairs:
        return b""
    return b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in pairs) + b"\r\n"


def parse_ttl(value: str) -> int | None:
    """A Nats-TTL value -> nanoseconds; -1 for `never`; None when invalid.

    Accepts Go duration strings (`90s`, `1h30m`) and a bare integer count of seconds."""
    value = value.strip()
    if value == "never":
        return -1
    if value.isdigit():
        return int(value) * 1_000_000_000
    return parse_go_duration(value)


def parse_go_duration(value: str) -> int | None:
    """Go's time.ParseDuration for non-negative values (`1h30m`, `1.5s`, `250ms`)."""
    if not value:
        return None
    total, at = 0.0, 0
    for match in _DURATION_PART.finditer(value):
        if match.start() != at:
            return None
        total += float(match.group(1)) * _UNIT_NS[match.group(2)]
        at = match.end()
    if at != len(value):
        return None
    return int(total)


def format_go_duration(ns: int) -> str:
    """Go's Duration.String() for the whole-second and sub-second values TTLs use."""
    if ns % 1_000_000_000:
        return f"{ns / 1_000_000_000:g}s" if ns >= 1_000_000_000 else f"{ns / 1_000_000:g}ms"
    seconds = ns // 1_000_000_000
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    out = (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "")
    return out + f"{seconds}s"


def is_delete_marker(hdr: bytes) -> bool:
    """A subject delete marker: a server-made one (a non-empty `Nats-Marker-Reason`) or a KV
    purge (`KV-Operation: PURGE`, exactly). When one expires, nats-server places no new
    marker on its subject; a KV delete (`DEL`) is not one and does leave a marker."""
    return bool(get(hdr, MARKER_REASON)) or get(hdr, KV_OPERATION) == "PURGE"

"""CONSUMER.PAUSE and CONSUMER.UNPIN requests and replies, pure (time comes in as `now_ns`).

    until_ns = parse_pause(body)                 # 0: resume now
    reply = pause_reply(cfg_pause_until, until_ns, now_ns)
    group = parse_unpin(body, consumer_cfg)      # the priority group to unpin, or ApiError

A pause is a consumer config change (`pause_until`), replicated like any other; the consumer
delivers nothing while `now < pause_until`. Times are RFC 3339 with up to nanoseconds, as Go
writes `time.Time`.
"""

from __future__ import annotations

import calendar
import re
from typing import Any

from node.jetstream import gojson
from node.jetstream.errors import ApiError
from node.jetstream.stream import rfc3339

ZERO_TIME = "0001-01-01T00:00:00Z"
TYPE = "io.nats.jetstream.api.v1.consumer_pause_response"
UNPIN_TYPE = "io.nats.jetstream.api.v1.consumer_unpin_response"
PAUSE_REQUEST = gojson.struct("server.JSApiConsumerPauseRequest",
                              {"pause_until": gojson.STRING})
UNPIN_REQUEST = gojson.struct("server.JSApiConsumerUnpinRequest", {"group": gojson.STRING})
_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?"
                   r"(?:([Zz])|([+-])(\d\d):(\d\d))$")


def parse_time(text: str) -> int:
    """RFC 3339 -> ns since the epoch (negative before 1970; the zero time is very negative)."""
    m = _TIME.match(text)
    if m is None:
        raise ValueError(f"bad time {text!r}")
    year, month, day, hour, minute, sec = (int(g) for g in m.groups()[:6])
    frac = int((m.group(7) or "0").ljust(9, "0"))
    secs = calendar.timegm((year, month, day, hour, minute, sec, 0, 0, 0))
    if m.group(9):
        offset = (int(m.group(10)) * 60 + int(m.group(11))) * 60
        secs -= offset if m.group(9) == "+" else -offset
    return secs * 1_000_000_000 + frac


def parse_pause(body: bytes) -> str:
    """The requested `pause_until` as sent ("" : resume). Go parses the time while decoding,
    so a bad time is an invalid JSON error too."""
    if not body.strip():
        return ""
    try:
        req = gojson.decode(body, PAUSE_REQUEST)
    except gojson.GoJsonError as exc:
        raise ApiError.of("JSInvalidJSONErr", err=str(exc)) from exc
    until = req.get("pause_until") or ""
    if until:
        why = go_time_error(until)
        if why:
            raise ApiError.of("JSInvalidJSONErr", err=why)
    return until


_LAYOUT = "2006-01-02T15:04:05Z07:00"
# (layout element, what the value must hold there: a digit count, or a literal)
_ELEMENTS: list[tuple[str, int | str]] = [
    ("2006", 4), ("-", "-"), ("01", 2), ("-", "-"), ("02", 2), ("T", "T"), ("15", 2),
    (":", ":"), ("04", 2), (":", ":"), ("05", 2)]


def go_time_error(value: str) -> str:
    """Go's time.Parse(time.RFC3339, value) error text ("" when it parses), for the cases a
    client meets: a wrong element (`cannot parse "<rest>" as "<element>"`), a value out of
    range, extra text."""
    head = f"parsing time {json_quote(value)} as {json_quote(_LAYOUT)}"
    rest = value
    for element, want in _ELEMENTS:
        if isinstance(want, int):
            if len(rest) < want or not rest[:want].isdigit():
                return f"{head}: cannot parse {json_quote(rest)} as {json_quote(element)}"
            rest = rest[want:]
        else:
            if not rest.startswith(want):
                return f"{head}: cannot parse {json_quote(rest)} as {json_quote(element)}"
            rest = rest[len(want):]
    if rest.startswith("."):
        digits = len(rest) - len(rest[1:].lstrip("0123456789"))
        rest = rest[digits:]
    if rest in ("Z", "z") or re.fullmatch(r"[+-]\d\d:\d\d", rest):
        year, month, day = int(value[0:4]), int(value[5:7]), int(value[8:10])
        checks = [("month", 1 <= month <= 12),
                  ("day", 1 <= day <= (calendar.monthrange(year, month)[1]
                                       if 1 <= month <= 12 else 31)),
                  ("hour", int(value[11:13]) <= 23), ("minute", int(value[14:16]) <= 59),
                  ("second", int(value[17:19]) <= 59)]
        for what, ok in checks:
            if not ok:
                return f"parsing time {json_quote(value)}: {what} out of range"
        return ""
    return f"{head}: cannot parse {json_quote(rest)} as \"Z07:00\""


def json_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

def paused_for(pause_until: str, now_ns: int) -> int:
    """ns of pause left (0: not paused)."""
    if not pause_until:
        return 0
    return max(parse_time(pause_until) - now_ns, 0)


def pause_reply(until: str, now_ns: int) -> dict[str, Any]:
    left = paused_for(until, now_ns)
    out: dict[str, Any] = {"type": TYPE, "paused": left > 0, "pause_until": until or ZERO_TIME}
    if left:
        out["pause_remaining"] = left
    return out


def pause_error(err: ApiError) -> dict[str, Any]:
    return {"type": TYPE, "error": err.to_dict()["error"], "paused": False,
            "pause_until": ZERO_TIME}


def parse_unpin(body: bytes, cfg: dict[str, Any]) -> str:
    """The group of an UNPIN request; it must be one of the consumer's priority groups."""
    try:
        req = gojson.decode(body if body.strip() else b"", UNPIN_REQUEST)
    except gojson.GoJsonError as exc:
        why = "unexpected end of JSON input" if str(exc) == "unexpected EOF" else str(exc)
        raise ApiError.of("JSInvalidJSONErr", err=why) from exc
    group = req.get("group") or ""
    if group not in (cfg.get("priority_groups") or []):
        raise ApiError.of("JSConsumerInvalidPriorityGroupErr")
    return group


def format_time(ns: int) -> str:
    return rfc3339(ns)

"""Message schedules (ADR-51, `allow_msg_schedules`): parsing the `Nats-Schedule*` headers
and computing fire times. Pure: time comes in as nanoseconds, nothing reads the clock.

A schedule is a stored message whose `Nats-Schedule` header says when the stream publishes
its body (or the last message of `Nats-Schedule-Source`) to `Nats-Schedule-Target`:
`@at <RFC3339>` once, `@every <Go duration>` (at least 1 s) or a 6-field cron
(seconds first, names for months and weekdays, `@hourly` and friends), in UTC or in the IANA
zone of `Nats-Schedule-Time-Zone` (cron only)."""

from __future__ import annotations

import calendar
import datetime as dt
import zoneinfo
from dataclasses import dataclass

from node.jetstream import headers as h
from node.jetstream.errors import ApiError
from node.subject import is_literal

SCHEDULE = "Nats-Schedule"
TARGET = "Nats-Schedule-Target"
SOURCE = "Nats-Schedule-Source"
TTL = "Nats-Schedule-TTL"
TIME_ZONE = "Nats-Schedule-Time-Zone"
ROLLUP = "Nats-Schedule-Rollup"
SCHEDULER = "Nats-Scheduler"
NEXT = "Nats-Schedule-Next"
NEXT_PURGE = "purge"

_S = 1_000_000_000
_MIN_EVERY_NS = _S
_MIN_TTL_NS = _S
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_PREDEFINED = {
    "@yearly": "0 0 0 1 1 *", "@annually": "0 0 0 1 1 *", "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0", "@daily": "0 0 0 * * *", "@midnight": "0 0 0 * * *",
    "@hourly": "0 0 * * * *",
}
# (low, high, names offset by low) for seconds, minutes, hours, day of month, month, weekday
_FIELDS: tuple[tuple[int, int, list[str]], ...] = (
    (0, 59, []), (0, 59, []), (0, 23, []), (1, 31, []), (1, 12, _MONTHS), (0, 6, _DAYS))
_HORIZON_DAYS = 366 * 5  # a cron that matches no date in five years never fires


@dataclass(frozen=True, slots=True)
class Cron:
    fields: tuple[frozenset[int], ...]  # seconds, minutes, hours, days, months, weekdays
    dom_any: bool  # day of month is `*` or `?`: the day matches by weekday alone
    dow_any: bool
    zone: str


@dataclass(frozen=True, slots=True)
class Schedule:
    at_ns: int = 0       # `@at`: the one fire time
    every_ns: int = 0    # `@every`: the interval
    cron: Cron | None = None

    @property
    def repeats(self) -> bool:
        return not self.at_ns

    def first(self, now_ns: int) -> int:
        """The first fire time of a schedule stored at `now_ns` (a past `@at` fires at once)."""
        if self.at_ns:
            return self.at_ns
        return self.next_after(now_ns, now_ns)

    def next_after(self, fired_ns: int, now_ns: int) -> int:
        """The fire after the one due at `fired_ns`, never at or before `now_ns` (fires missed
        while no leader ran are not made up)."""
        if self.every_ns:
            nxt = fired_ns + self.every_ns
            return nxt if nxt > now_ns else now_ns + self.every_ns
        assert self.cron is not None
        return _cron_next(self.cron, max(fired_ns, now_ns))


@dataclass(frozen=True, slots=True)
class Checked:
    """A schedule message's headers, checked at publish."""
    schedule: Schedule
    target: str
    source: str
    ttl: str     # the generated message's Nats-TTL, as given ("" for none)
    rollup: str  # the generated message's Nats-Rollup ("" or "sub")


def parse(value: str, zone: str | None) -> Schedule:
    """A `Nats-Schedule` value (and the optional time zone) -> Schedule; 10189 / 10223."""
    value = value.strip()
    if value.startswith("@at "):
        if zone is not None:
            raise ApiError.of("JSMessageSchedulesPatternInvalidErr")
        return Schedule(at_ns=_parse_rfc3339(value[4:].strip()))
    if value.startswith("@every "):
        every = h.parse_go_duration(value[7:].strip())
        if zone is not None or every is None or every < _MIN_EVERY_NS:
            raise ApiError.of("JSMessageSchedulesPatternInvalidErr")
        return Schedule(every_ns=every)
    cron = _parse_cron(_PREDEFINED.get(value.lower(), value))
    if zone is not None:
        _check_zone(zone)
    return Schedule(cron=Cron(cron[0], cron[1], cron[2], zone or "UTC"))


def check(hdr: bytes, subject: str, in_stream, allow_ttl: bool) -> Checked | None:
    """The `Nats-Schedule*` headers of a message about to be stored, in nats-server's order
    of refusals; None when the message is no schedule. `in_stream(subject)` says whether the
    stream captures a subject."""
    value = h.get(hdr, SCHEDULE)
    if not value:
        return None
    sched = parse(value, h.get(hdr, TIME_ZONE))
    target = h.get(hdr, TARGET) or ""
    if not _is_subject(target) or target == subject or not in_stream(target):
        raise ApiError.of("JSMessageSchedulesTargetInvalidErr")
    source = h.get(hdr, SOURCE)
    if source is not None and (not _is_subject(source) or source in (subject, target)
                               or not in_stream(source)):
        raise ApiError.of("JSMessageSchedulesSourceInvalidErr")
    ttl = h.get(hdr, TTL)
    if ttl is not None:
        if not allow_ttl:
            raise ApiError.of("JSMessageTTLDisabledErr")
        parsed = h.parse_ttl(ttl)
        if parsed is None or (parsed != -1 and parsed < _MIN_TTL_NS):
            raise ApiError.of("JSMessageSchedulesTTLInvalidErr")
    rollup = h.get(hdr, ROLLUP)
    if rollup is not None and rollup != "sub":
        raise ApiError.of("JSMessageSchedulesRollupInvalidErr")
    return Checked(sched, target, source or "", ttl or "", rollup or "")


def check_cancel(hdr: bytes, subject: str) -> str:
    """A client's `Nats-Schedule-Next: purge` + `Nats-Scheduler: <subject>` cancels that
    schedule. -> the scheduler subject to purge, or "" (10212 for a malformed pair)."""
    nxt, scheduler = h.get(hdr, NEXT), h.get(hdr, SCHEDULER)
    if nxt is None:
        if scheduler:
            raise ApiError.of("JSMessageSchedulesSchedulerInvalidErr")
        return ""
    if nxt != NEXT_PURGE or not scheduler or scheduler == subject or not _is_subject(scheduler):
        raise ApiError.of("JSMessageSchedulesSchedulerInvalidErr")
    return scheduler


def generated_headers(hdr: bytes, scheduler: str, nxt: str, ttl: str, rollup: str) -> bytes:
    """The headers of a message a schedule publishes: the user's own (no `Nats-` ones), then
    the scheduler, the next fire (or `purge`), the TTL and the rollup, as nats-server orders
    them."""
    kept = [line for line in hdr.split(b"\r\n")[1:]
            if line and b":" in line and not line.startswith(b"Nats-")] if hdr else []
    pairs = [(SCHEDULER, scheduler), (NEXT, nxt)]
    if ttl:
        pairs.append((h.TTL, ttl))
    if rollup:
        pairs.append((h.ROLLUP, rollup))
    return (b"NATS/1.0\r\n" + b"".join(line + b"\r\n" for line in kept)
            + b"".join(f"{k}: {v}\r\n".encode() for k, v in pairs) + b"\r\n")


def _is_subject(subject: str) -> bool:
    return bool(subject) and " " not in subject and is_literal(subject)


def format_next(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns // _S, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_rfc3339(text: str) -> int:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ApiError.of("JSMessageSchedulesPatternInvalidErr") from None
    if when.tzinfo is None or "T" not in text.upper():
        raise ApiError.of("JSMessageSchedulesPatternInvalidErr")
    return calendar.timegm(when.utctimetuple()) * _S + when.microsecond * 1000


def _check_zone(zone: str) -> None:
    try:
        zoneinfo.ZoneInfo(zone)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        raise ApiError.of("JSMessageSchedulesTimeZoneInvalidErr") from None


def _parse_cron(text: str) -> tuple[tuple[frozenset[int], ...], bool, bool]:
    parts = text.split()
    if len(parts) != 6:
        raise ApiError.of("JSMessageSchedulesPatternInvalidErr")
    fields = tuple(_parse_field(p, *spec) for p, spec in zip(parts, _FIELDS, strict=True))
    return fields, parts[3][:1] in "*?", parts[5][:1] in "*?"


def _parse_field(text: str, low: int, high: int, names: list[str]) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        span, _, step_text = item.partition("/")
        step = _number(step_text, 1, 1 << 16, []) if step_text else 1
        if span in ("*", "?"):
            first, last = low, high
        elif "-" in span:
            a, _, b = span.partition("-")
            first, last = _number(a, low, high, names), _number(b, low, high, names)
        else:
            first = _number(span, low, high, names)
            last = high if step_text else first
        if first > last:
            raise ApiError.of("JSMessageSchedulesPatternInvalidErr")
        values.update(range(first, last + 1, step))
    return frozenset(values)


def _number(text: str, low: int, high: int, names: list[str]) -> int:
    lowered = text.lower()
    if lowered in names:
        return names.index(lowered) + low
    if not text.isdigit() or not low <= int(text) <= high:
        raise ApiError.of("JSMessageSchedulesPatternInvalidErr")
    return int(text)


def _cron_next(cron: Cron, after_ns: int) -> int:
    """The first whole second strictly after `after_ns` that the cron matches, in its zone."""
    zone = zoneinfo.ZoneInfo(cron.zone)
    at = dt.datetime.fromtimestamp(after_ns // _S + 1, zone).replace(tzinfo=None)
    end = at + dt.timedelta(days=_HORIZON_DAYS)
    secs, mins, hours, _days, months, _dows = cron.fields
    while at < end:
        if at.month not in months:
            at = (at.replace(day=1) + dt.timedelta(days=32)).replace(day=1, hour=0, minute=0,
                                                                     second=0)
        elif not _day_matches(cron, at):
            at = (at + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0)
        elif at.hour not in hours:
            at = (at + dt.timedelta(hours=1)).replace(minute=0, second=0)
        elif at.minute not in mins:
            at = (at + dt.timedelta(minutes=1)).replace(second=0)
        elif at.second not in secs:
            at += dt.timedelta(seconds=1)
        else:
            return int(at.replace(tzinfo=zone).timestamp()) * _S
    return after_ns + _HORIZON_DAYS * 86_400 * _S


def _day_matches(cron: Cron, at: dt.datetime) -> bool:
    dom = at.day in cron.fields[3]
    dow = (at.isoweekday() % 7) in cron.fields[5]
    if cron.dom_any or cron.dow_any:
        return dom and dow
    return dom or dow

"""node/jetstream/schedule.py: schedule parsing and fire times (pure), and a schedule held
by the Stream machine over a MemStore: stored, fired by EXPIRE entries, re-armed, cancelled."""

from __future__ import annotations

import calendar
import datetime as dt
import json

import pytest

from node.jetstream import config, ops
from node.jetstream import schedule as sch
from node.jetstream.errors import ApiError
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Reply, Stream

S = 1_000_000_000


def ns(text: str) -> int:
    return calendar.timegm(dt.datetime.fromisoformat(text).utctimetuple()) * S


@pytest.mark.parametrize(("pattern", "zone", "after", "want"), [
    ("@hourly", None, "2026-11-27T08:46:20", "2026-11-27T09:00:00"),
    ("@daily", None, "2026-12-31T23:59:59", "2027-01-01T00:00:00"),
    ("@weekly", None, "2026-11-27T08:00:00", "2026-11-29T00:00:00"),  # a Friday -> Sunday
    ("@yearly", None, "2026-11-27T08:00:00", "2027-01-01T00:00:00"),
    ("*/15 * * * * *", None, "2026-11-27T08:46:20", "2026-11-27T08:46:30"),
    ("0 30 4 1,15 * *", None, "2026-11-15T04:30:00", "2026-12-01T04:30:00"),
    # both day fields restricted: either matches (the 1st, the 15th, or any Friday)
    ("0 30 4 1,15 * fri", None, "2026-11-16T00:00:00", "2026-11-20T04:30:00"),
    ("0 0 12 * feb-mar mon", None, "2026-11-27T00:00:00", "2027-02-01T12:00:00"),
    ("0 0 0 29 feb *", None, "2026-11-27T00:00:00", "2028-02-29T00:00:00"),
    # 09:00 in Amsterdam is 08:00 UTC in winter
    ("0 0 9 * * *", "Europe/Amsterdam", "2026-11-27T08:30:00", "2026-11-28T08:00:00"),
])
def test_cron_next(pattern: str, zone: str | None, after: str, want: str) -> None:
    schedule = sch.parse(pattern, zone)
    assert schedule.next_after(ns(after), ns(after)) == ns(want)


def test_every_and_at() -> None:
    every = sch.parse("@every 1m30s", None)
    assert every.first(10 * S) == 100 * S
    assert every.next_after(100 * S, 101 * S) == 190 * S
    assert every.next_after(100 * S, 500 * S) == 590 * S  # missed fires are not made up
    at = sch.parse("@at 2030-01-01T10:00:00+02:00", None)
    assert at.first(0) == ns("2030-01-01T08:00:00") and not at.repeats


@pytest.mark.parametrize(("pattern", "zone", "code"), [
    ("daily", None, 10189), ("* * * * *", None, 10189), ("0 61 * * * *", None, 10189),
    ("5-1 * * * * *", None, 10189), ("@every 100ms", None, 10189), ("@every x", None, 10189),
    ("@at tomorrow", None, 10189), ("@at 2030-01-01", None, 10189),
    ("@at 2030-01-01T10:00:00Z", "CET", 10189), ("@every 1s", "CET", 10189),
    ("0 0 * * * *", "Nowhere/None", 10223), ("0 0 * * * *", "", 10223),
])
def test_bad_patterns(pattern: str, zone: str | None, code: int) -> None:
    with pytest.raises(ApiError) as err:
        sch.parse(pattern, zone)
    assert err.value.to_dict()["error"]["err_code"] == code


def _stream() -> Stream:
    cfg, pedantic = config.parse_request(json.dumps(
        {"name": "S", "subjects": ["s.>", "t.>"], "allow_msg_schedules": True}).encode())
    return Stream(config.check_create("S", cfg, pedantic, {})[0], MemStore("S"))


def _hdr(**pairs: str) -> bytes:
    return b"NATS/1.0\r\n" + b"".join(
        f"{k.replace('_', '-')}: {v}\r\n".encode() for k, v in pairs.items()) + b"\r\n"


def _subjects(stream: Stream) -> list[str]:
    return [stream.store.load(q).subject for q in stream.store.seqs()]


def test_machine_fires_rearms_and_cancels() -> None:
    stream = _stream()
    t0 = ns("2026-11-27T08:00:00")
    hdr = _hdr(Nats_Schedule="@every 10s", Nats_Schedule_Target="t.a")
    effects = stream.apply(ops.StreamMsg(t0, "s.a", "r", hdr, b"body"))
    assert [e for e in effects if isinstance(e, Reply)][0].payload == b'{"stream":"S","seq":1}'
    stream.apply(ops.Expire(t0 + 9 * S))
    assert _subjects(stream) == ["s.a"]                # not due yet
    stream.apply(ops.Expire(t0 + 10 * S))
    stream.apply(ops.Expire(t0 + 21 * S))
    assert _subjects(stream) == ["s.a", "t.a", "t.a"]  # fired twice, the schedule stays
    fired = stream.store.load(3)
    assert b"Nats-Scheduler: s.a\r\nNats-Schedule-Next: 2026-11-27T08:00:30Z" in fired.hdr
    stream.apply(ops.StreamMsg(t0 + 22 * S, "s.stop", "", _hdr(
        Nats_Schedule_Next="purge", Nats_Scheduler="s.a"), b""))
    stream.apply(ops.Expire(t0 + 60 * S))              # the stale key finds no schedule
    assert _subjects(stream) == ["t.a", "t.a", "s.stop"]


def test_machine_refuses_before_storing() -> None:
    stream = _stream()
    for hdr, code in [(_hdr(Nats_Schedule="@hourly"), 10190),
                      (_hdr(Nats_Schedule="@hourly", Nats_Schedule_Target="x.y"), 10190),
                      (_hdr(Nats_Schedule="@hourly", Nats_Schedule_Target="t.a",
                            Nats_Schedule_TTL="5m"), 10166),
                      (_hdr(Nats_Scheduler="s.a"), 10212),
                      (_hdr(Nats_Schedule_Next="purge", Nats_Scheduler="s.x"), 10212)]:
        effects = stream.apply(ops.StreamMsg(1, "s.x", "r", hdr, b""))
        assert f'"err_code":{code}'.encode() in effects[-1].payload
    assert list(stream.store.seqs()) == []

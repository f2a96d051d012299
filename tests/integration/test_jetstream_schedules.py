"""Message schedules (`allow_msg_schedules`, ADR-51) against nats-server 2.15: the same
nats-py script on both, comparing every PubAck (seqs and error codes) and, once the one-shot
schedules have fired, every stored message (subject, headers, data) in order. Repeating
schedules fire on both at times neither controls, so their messages are checked by shape."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import nats

CREATE = {"name": "S", "subjects": ["sch.>", "tgt.>", "src.>", "cancel.>"],
          "allow_msg_schedules": True, "allow_msg_ttl": True}


def _steps(soon: str) -> list[tuple[str, dict[str, str], bytes]]:
    at = "@at " + soon
    return [
        ("sch.a", {"Nats-Schedule": at, "Nats-Schedule-Target": "tgt.a", "X-Mine": "kept",
                   "Nats-Msg-Id": "m1"}, b"a"),
        ("sch.b", {"Nats-Schedule": at}, b"no target"),
        ("sch.c", {"Nats-Schedule": "bogus", "Nats-Schedule-Target": "tgt.c"}, b"x"),
        ("sch.d", {"Nats-Schedule": at, "Nats-Schedule-Target": "sch.d"}, b"x"),
        ("sch.e", {"Nats-Schedule": at, "Nats-Schedule-Target": "elsewhere"}, b"x"),
        ("sch.f", {"Nats-Schedule": at, "Nats-Schedule-Target": "tgt.*"}, b"x"),
        ("sch.g", {"Nats-Schedule": at, "Nats-Schedule-Target": "tgt.g",
                   "Nats-Schedule-TTL": "5m", "Nats-Schedule-Rollup": "sub"}, b"g"),
        ("sch.h", {"Nats-Schedule": at, "Nats-Schedule-Target": "tgt.h",
                   "Nats-Schedule-TTL": "zz"}, b"x"),
        ("sch.h", {"Nats-Schedule": at, "Nats-Schedule-Target": "tgt.h",
                   "Nats-Schedule-TTL": "500ms"}, b"x"),
        ("sch.i", {"Nats-Schedule": at, "Nats-Schedule-Target": "tgt.i",
                   "Nats-Schedule-Rollup": "all"}, b"x"),
        ("src.j", {"H1": "v1", "Nats-Msg-Id": "src"}, b"sampled"),
        ("sch.j", {"Nats-Schedule": at, "Nats-Schedule-Target": "tgt.j",
                   "Nats-Schedule-Source": "src.j", "X-Mine": "dropped"}, b"own"),
        ("sch.k", {"Nats-Schedule": at, "Nats-Schedule-Target": "tgt.k",
                   "Nats-Schedule-Source": "src.none"}, b"fallback"),
        ("sch.l", {"Nats-Schedule": at, "Nats-Schedule-Target": "tgt.l",
                   "Nats-Schedule-Source": "src.*"}, b"x"),
        ("sch.m", {"Nats-Schedule": at, "Nats-Schedule-Target": "tgt.m",
                   "Nats-Schedule-Time-Zone": "CET"}, b"x"),
        ("sch.n", {"Nats-Schedule": "0 0 * * * *", "Nats-Schedule-Target": "tgt.n",
                   "Nats-Schedule-Time-Zone": "Nowhere/None"}, b"x"),
        ("sch.n", {"Nats-Schedule": "0 30 4 1,15 jan-mar mon,wed",
                   "Nats-Schedule-Target": "tgt.n", "Nats-Schedule-Time-Zone": "Europe/Amsterdam"},
         b"n"),
        ("sch.o", {"Nats-Schedule": "* * * * *", "Nats-Schedule-Target": "tgt.o"}, b"x"),
        ("sch.o", {"Nats-Schedule": "@every 100ms", "Nats-Schedule-Target": "tgt.o"}, b"x"),
        ("sch.o", {"Nats-Schedule": "0 61 * * * *", "Nats-Schedule-Target": "tgt.o"}, b"x"),
        ("sch.o", {"Nats-Schedule": "@hourly", "Nats-Schedule-Target": "tgt.o"}, b"o1"),
        ("sch.o", {"Nats-Schedule": "@daily", "Nats-Schedule-Target": "tgt.o"}, b"o2"),
        ("sch.p", {"Nats-Schedule": "@at 2099-01-01T10:00:00+02:00",
                   "Nats-Schedule-Target": "tgt.p"}, b"p"),
        ("cancel.p", {"Nats-Schedule-Next": "purge", "Nats-Scheduler": "sch.p"}, b""),
        ("cancel.q", {"Nats-Schedule-Next": "later", "Nats-Scheduler": "sch.p"}, b""),
        ("cancel.q", {"Nats-Scheduler": "sch.p"}, b""),
        ("cancel.q", {"Nats-Schedule-Next": "purge", "Nats-Scheduler": "cancel.q"}, b""),
        ("sch.r", {"Nats-Schedule": "", "Nats-Schedule-Target": "tgt.r"}, b"plain"),
        # last: a past time fires at once, and when exactly is each server's own timing
        ("sch.past", {"Nats-Schedule": "@at 2009-11-10T23:00:00Z",
                      "Nats-Schedule-Target": "tgt.past"}, b"past"),
    ]


async def _script(port: int) -> dict[str, Any]:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        out: dict[str, Any] = {}
        out["create_plain"] = await _api(nc, "STREAM.CREATE.N", {"name": "N", "subjects": ["n.>"]})
        out["disabled"] = await _pub(nc, "n.a", {"Nats-Schedule": "@hourly",
                                                 "Nats-Schedule-Target": "n.b"})
        created = await _api(nc, "STREAM.CREATE.S", CREATE)
        out["create"] = {k: created["config"][k] for k in ("allow_msg_schedules",
                                                           "allow_rollup_hdrs")}
        # The steps must all be stored before `soon` fires, or its targets land between them
        # and move the later steps' sequences (2 s was too little at load 30: 27 requests).
        soon_at = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=8)).replace(microsecond=0)
        soon = soon_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        out["acks"] = [await _pub(nc, *step) for step in _steps(soon)]
        assert dt.datetime.now(dt.UTC) < soon_at, "the steps outlasted the schedule time"
        await asyncio.sleep((soon_at - dt.datetime.now(dt.UTC)).total_seconds() + 2)
        # then until two reads 1 s apart agree (a loaded server fires late), at most 10 s
        out["stored"] = await _stored(nc)
        for _ in range(10):
            await asyncio.sleep(1)
            again = await _stored(nc)
            if again == out["stored"]:
                break
            out["stored"] = again
        return out
    finally:
        await nc.close()


async def _repeating(port: int) -> list[tuple[str, dict[str, str], bytes]]:
    """An `@every 1s` and a cron that fires every second, for three seconds, then a cancel."""
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        await _api(nc, "STREAM.CREATE.R", {"name": "R", "subjects": ["r.>"],
                                           "allow_msg_schedules": True})
        await _pub(nc, "r.every", {"Nats-Schedule": "@every 1s", "Nats-Schedule-Target": "r.t1"})
        await _pub(nc, "r.cron", {"Nats-Schedule": "* * * * * *", "Nats-Schedule-Target": "r.t2",
                                  "X-Mine": "kept"})
        await asyncio.sleep(3.5)
        for scheduler in ("r.every", "r.cron"):
            await _pub(nc, "r.stop", {"Nats-Schedule-Next": "purge", "Nats-Scheduler": scheduler})
        await asyncio.sleep(1.5)
        return [(s, h, d) for _seq, s, h, d in await _stored(nc, "R")]
    finally:
        await nc.close()


async def _api(nc: Any, op: str, body: Any) -> Any:
    msg = await nc.request(f"$JS.API.{op}", json.dumps(body).encode(), timeout=5)
    return json.loads(msg.data)


async def _pub(nc: Any, subject: str, hdrs: dict[str, str], data: bytes = b"x") -> Any:
    return json.loads((await nc.request(subject, data, headers=hdrs, timeout=5)).data)


async def _stored(nc: Any, stream: str = "S") -> list[tuple[int, str, dict[str, str], bytes]]:
    state = (await _api(nc, f"STREAM.INFO.{stream}", {}))["state"]
    out = []
    for seq in range(state["first_seq"], state["last_seq"] + 1):
        got = await _api(nc, f"STREAM.MSG.GET.{stream}", {"seq": seq})
        if "message" in got:
            m = got["message"]
            out.append((seq, m["subject"], _headers(m.get("hdrs", "")),
                        base64.b64decode(m.get("data", ""))))
    return out


def _headers(b64: str) -> dict[str, str]:
    lines = base64.b64decode(b64).decode().split("\r\n")[1:] if b64 else []
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def _normalise(stored: list[tuple[int, str, dict[str, str], bytes]]) -> list[Any]:
    """A repeating schedule's `Nats-Schedule-Next` is a time: keep only its shape."""
    out = []
    for seq, subject, hdrs, data in stored:
        nxt = hdrs.get("Nats-Schedule-Next")
        if nxt not in (None, "purge"):
            hdrs = {**hdrs, "Nats-Schedule-Next": "<time>"}
        out.append((seq, subject, hdrs, data))
    return out


def test_one_shot_schedules_cancels_and_refusals_as_nats_server(servers: Any,
                                                               tmp_path: Path) -> None:
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    want, got = asyncio.run(_both(theirs.port, ours.port))
    assert got["disabled"] == want["disabled"]
    assert got["create"] == want["create"] == {"allow_msg_schedules": True,
                                               "allow_rollup_hdrs": True}
    for step, (mine, oracle) in enumerate(zip(got["acks"], want["acks"], strict=True)):
        assert mine == oracle, f"step {step}: {mine} != {oracle}"
    assert _normalise(got["stored"]) == _normalise(want["stored"])
    fired = {s for _q, s, _h, _d in want["stored"] if s.startswith("tgt.")}
    assert {"tgt.a", "tgt.past", "tgt.g", "tgt.j", "tgt.k"} <= fired


async def _both(theirs: int, ours: int) -> tuple[dict[str, Any], dict[str, Any]]:
    return await asyncio.gather(_script(theirs), _script(ours))


def test_repeating_schedules_fire_until_cancelled(servers: Any, tmp_path: Path) -> None:
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    for stored in asyncio.run(_both_repeating(theirs.port, ours.port)):
        made = [(s, h, d) for s, h, d in stored if s in ("r.t1", "r.t2")]
        by_target = {t: [m for m in made if m[0] == t] for t in ("r.t1", "r.t2")}
        assert 2 <= len(by_target["r.t1"]) <= 5 and 2 <= len(by_target["r.t2"]) <= 5, stored
        for subject, hdrs, data in made:
            assert data == b"x"
            assert hdrs["Nats-Scheduler"] == {"r.t1": "r.every", "r.t2": "r.cron"}[subject]
            dt.datetime.strptime(hdrs["Nats-Schedule-Next"], "%Y-%m-%dT%H:%M:%SZ")
        assert by_target["r.t2"][0][1]["X-Mine"] == "kept"
        # cancelled: both schedule subjects are gone, the cancels themselves are stored
        assert [s for s, _h, _d in stored if s in ("r.every", "r.cron")] == []
        assert [s for s, _h, _d in stored if s == "r.stop"] == ["r.stop", "r.stop"]


async def _both_repeating(theirs: int, ours: int) -> list[Any]:
    return list(await asyncio.gather(_repeating(theirs), _repeating(ours)))


def test_a_schedule_survives_kill_9_and_fires_after_restart(servers: Any, tmp_path: Path) -> None:
    """The schedule and its next fire are in the store (the TTL index), not in a timer: a
    one-shot due while the node is down fires once it is back, and a cron keeps its place."""
    import signal

    store = tmp_path / "js"
    node = servers.jetraft(args=["-js", "-sd", str(store)])

    async def arm() -> None:
        nc = await nats.connect(node.url)
        await _api(nc, "STREAM.CREATE.S", CREATE)
        soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert "seq" in await _pub(nc, "sch.once", {"Nats-Schedule": "@at " + soon,
                                                    "Nats-Schedule-Target": "tgt.once"})
        assert "seq" in await _pub(nc, "sch.cron", {"Nats-Schedule": "* * * * * *",
                                                    "Nats-Schedule-Target": "tgt.cron"})
        await nc.close()

    async def read() -> list[tuple[int, str, dict[str, str], bytes]]:
        nc = await nats.connect(node.url)
        try:
            return await _stored(nc)
        finally:
            await nc.close()

    asyncio.run(arm())
    node.stop(signal.SIGKILL)
    asyncio.run(asyncio.sleep(3))  # the one-shot falls due while no node runs
    node = servers.jetraft(args=["-js", "-sd", str(store)], port=node.port)
    # until both fired (a loaded machine restarts and recovers slowly; at most 30 s), then
    # a second more: the one-shot must not fire again
    deadline = time.monotonic() + 30
    while True:
        subjects = [s for _q, s, _h, _d in asyncio.run(read())]
        if {"tgt.once", "tgt.cron"} <= set(subjects) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    time.sleep(1.0)
    subjects = [s for _q, s, _h, _d in asyncio.run(read())]
    assert subjects.count("tgt.once") == 1 and "sch.once" not in subjects
    assert "sch.cron" in subjects and subjects.count("tgt.cron") >= 1

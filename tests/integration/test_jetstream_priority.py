"""Priority groups (pinned_client and overflow) over raw pull requests, next to nats-server:
the statuses (400 group missing / invalid, 408, 423 pin mismatch / wrong pin), which request
gets which message, the `Nats-Pin-Id` header, UNPIN, the pin's `priority_timeout`, the
consumer info's `priority_groups`, and the pinned / unpinned advisories. Pin ids are made up
by each server: compared by identity (same pin or a new one), not by value."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats

from tests.integration.conftest import Servers
from tests.integration.jsdiff import assert_same_steps

ALLOWED_TO_DIFFER = {"created", "ts", "last_active", "pinned_ts", "id", "timestamp"}
EXP = 300_000_000  # 0.3 s expiry for requests that wait in vain


class Pins:
    """Pin ids in order of appearance -> "pin1", "pin2", ...: the same pin compares equal."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def name(self, pin: str) -> str:
        return self.names.setdefault(pin, f"pin{len(self.names) + 1}")

    def scrub(self, obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: self.scrub(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.scrub(v) for v in obj]
        return self.names.get(obj, obj) if isinstance(obj, str) else obj


async def _api(nc: Any, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return json.loads((await nc.request("$JS.API." + subject, data, timeout=10)).data)


async def _pull(nc: Any, pins: Pins, consumer: str, req: dict[str, Any],
                wait: float = 0.15) -> list[Any]:
    inbox = nc.new_inbox()
    got: list[Any] = []

    async def cb(msg: Any) -> None:
        hdr = dict(msg.headers or {})
        if "Status" in hdr:
            got.append(("status", hdr["Status"], hdr.get("Description"),
                        hdr.get("Nats-Pending-Messages")))
        else:
            pin = hdr.get("Nats-Pin-Id")
            got.append((msg.subject, msg.data, pins.name(pin) if pin else None,
                        msg.reply.split(".")[5]))

    sub = await nc.subscribe(inbox, cb=cb)
    await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.PG.{consumer}", json.dumps(req).encode(),
                     reply=inbox)
    # Until the request is done: its batch filled or a status ended it (every request here
    # expires, so one always does); at least `wait`, at most 10 s. A fixed wait alone came
    # up short when a loaded server delivered late.
    await asyncio.sleep(wait)
    for _ in range(500):
        if any(g[0] == "status" for g in got) or \
                sum(g[0] != "status" for g in got) >= req.get("batch", 1):
            break
        await asyncio.sleep(0.02)
    await sub.unsubscribe()
    return got


def _pin_of(pins: Pins, name: str) -> str:
    return next(p for p, n in pins.names.items() if n == name)


async def _script(url: str) -> list[Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    pins = Pins()
    out: list[Any] = []
    events: list[Any] = []

    async def on_event(msg: Any) -> None:
        if ".PINNED." in msg.subject or ".UNPINNED." in msg.subject:
            events.append((msg.subject, json.loads(msg.data)))

    try:
        await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.>", cb=on_event)
        await js.add_stream(name="PG", subjects=["pg.>"])
        for i in range(8):
            await js.publish("pg.x", str(i).encode())
        out.append(await _api(nc, "CONSUMER.CREATE.PG.pin", {"stream_name": "PG", "config": {
            "durable_name": "pin", "ack_policy": "explicit", "priority_groups": ["g"],
            "priority_policy": "pinned_client", "priority_timeout": 2_000_000_000}}))
        out.append(await _pull(nc, pins, "pin", {"batch": 1, "expires": EXP}))
        out.append(await _pull(nc, pins, "pin", {"batch": 1, "group": "x", "expires": EXP}))
        out.append(await _pull(nc, pins, "pin", {"batch": 1, "group": "g", "expires": EXP}))
        out.append(await _pull(nc, pins, "pin", {"batch": 1, "group": "g", "expires": EXP},
                               wait=0.45))  # waits while another client is pinned: 408
        out.append(await _pull(nc, pins, "pin", {"batch": 1, "group": "g", "id": "nope",
                                                 "expires": EXP}))
        first = _pin_of(pins, "pin1")
        out.append(await _pull(nc, pins, "pin", {"batch": 2, "group": "g", "id": first,
                                                 "expires": EXP}))
        out.append(await _api(nc, "CONSUMER.INFO.PG.pin"))
        out.append(await _api(nc, "CONSUMER.UNPIN.PG.pin", {"group": "g"}))
        out.append(await _pull(nc, pins, "pin", {"batch": 1, "group": "g", "id": first,
                                                 "expires": EXP}))
        out.append(await _pull(nc, pins, "pin", {"batch": 1, "group": "g", "expires": EXP}))
        await asyncio.sleep(2.5)  # the pinned client is quiet past priority_timeout
        out.append(await _api(nc, "CONSUMER.INFO.PG.pin"))
        out.append(await _pull(nc, pins, "pin", {"batch": 1, "group": "g", "expires": EXP}))
        out.append(await _api(nc, "CONSUMER.CREATE.PG.ov", {"stream_name": "PG", "config": {
            "durable_name": "ov", "ack_policy": "explicit", "priority_groups": ["g"],
            "priority_policy": "overflow"}}))
        out.append(await _pull(nc, pins, "ov", {"batch": 1, "expires": EXP}))
        out.append(await _pull(nc, pins, "ov", {"batch": 1, "group": "g", "min_pending": 10,
                                                "expires": EXP}, wait=0.45))
        out.append(await _pull(nc, pins, "ov", {"batch": 2, "group": "g", "min_pending": 7,
                                                "expires": EXP}))
        out.append(await _pull(nc, pins, "ov", {"batch": 1, "group": "g", "expires": EXP}))
        out.append(await _pull(nc, pins, "ov", {"batch": 1, "group": "g",
                                                "min_ack_pending": 5, "expires": EXP},
                               wait=0.45))
        out.append(await _pull(nc, pins, "ov", {"batch": 1, "group": "g",
                                                "min_ack_pending": 2, "expires": EXP}))
        out.append(await _api(nc, "CONSUMER.INFO.PG.ov"))
        await asyncio.sleep(1.5)  # the last pin runs out too (priority_timeout)
        out.append(events)
    finally:
        await nc.close()
    return pins.scrub(out)


async def test_priority_groups_match_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    their, mine = await _script(theirs.url), await _script(ours.url)
    assert_same_steps(mine, their, ALLOWED_TO_DIFFER)
    assert their[3][0][2] == "pin1" and their[4][0][1] == "408"

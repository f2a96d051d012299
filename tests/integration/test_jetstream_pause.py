"""CONSUMER.PAUSE and CONSUMER.UNPIN next to nats-server: the replies (whole JSON, errors
included), the consumer info while paused and after, no deliveries during a pause, and
deliveries again once it ends (by a resume request or by the time running out). A pause is
a config change through the log, so it survives a restart (checked on our side)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import nats

from node.jetstream.stream import rfc3339
from tests.integration.conftest import Servers
from tests.integration.jsdiff import assert_same_steps

ALLOWED_TO_DIFFER = {"created", "ts", "last_active", "pause_remaining", "id", "timestamp"}
FAR = "2099-01-01T00:00:00Z"


async def _api(nc: Any, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return json.loads((await nc.request("$JS.API." + subject, data, timeout=10)).data)


async def _fetch(psub: Any, n: int, timeout: float) -> Any:
    try:
        return [(m.subject, m.data, m.metadata.sequence.stream)
                for m in await psub.fetch(n, timeout=timeout)]
    except nats.errors.TimeoutError:
        return "timeout"


async def _script(url: str) -> list[Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []
    events: list[Any] = []

    async def on_event(msg: Any) -> None:
        events.append((msg.subject, json.loads(msg.data)))

    try:
        await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.PAUSE.>", cb=on_event)
        await js.add_stream(name="P", subjects=["p.>"])
        for i in range(4):
            await js.publish(f"p.{i}", f"m{i}".encode())
        out.append(await _api(nc, "CONSUMER.CREATE.P.c", {"stream_name": "P", "config": {
            "durable_name": "c", "ack_policy": "explicit"}}))
        out.append(await _api(nc, "CONSUMER.PAUSE.P.c", {"pause_until": FAR}))
        out.append(await _api(nc, "CONSUMER.INFO.P.c"))
        psub = await js.pull_subscribe_bind("c", "P")
        out.append(await _fetch(psub, 1, 0.6))               # paused: nothing comes
        out.append(await _api(nc, "CONSUMER.PAUSE.P.c", {"pause_until": "2001-01-01T00:00:00Z"}))
        out.append(await _api(nc, "CONSUMER.INFO.P.c"))
        out.append(await _fetch(psub, 1, 2))                  # resumed
        out.append(await _api(nc, "CONSUMER.PAUSE.P.c", {"pause_until": FAR}))
        out.append(await _api(nc, "CONSUMER.PAUSE.P.c", b""))  # empty: resume
        out.append(await _api(nc, "CONSUMER.INFO.P.c"))
        out.append(await _fetch(psub, 1, 2))
        soon = rfc3339(time.time_ns() + 1_000_000_000)
        paused = await _api(nc, "CONSUMER.PAUSE.P.c", {"pause_until": soon})
        out.append((paused["paused"], paused["pause_until"] == soon))
        out.append(await _fetch(psub, 1, 3))                  # comes once the second is over
        out.append(await _api(nc, "CONSUMER.PAUSE.P.c", b"{bad"))
        out.append(await _api(nc, "CONSUMER.PAUSE.P.c", {"pause_until": "tomorrow"}))
        out.append(await _api(nc, "CONSUMER.PAUSE.P.nope", {"pause_until": FAR}))
        out.append(await _api(nc, "CONSUMER.PAUSE.NOPE.c", {"pause_until": FAR}))
        out.append(await _api(nc, "CONSUMER.UNPIN.P.c", {"group": "g"}))
        out.append(await _api(nc, "CONSUMER.CREATE.P.pin", {"stream_name": "P", "config": {
            "durable_name": "pin", "ack_policy": "explicit", "priority_groups": ["g"],
            "priority_policy": "pinned_client"}}))
        out.append(await _api(nc, "CONSUMER.UNPIN.P.pin", {"group": "g"}))
        out.append(await _api(nc, "CONSUMER.UNPIN.P.pin", {"group": "h"}))
        out.append(await _api(nc, "CONSUMER.UNPIN.P.pin", b""))
        out.append(await _api(nc, "CONSUMER.UNPIN.P.nope", {"group": "g"}))
        out.append(await _api(nc, "CONSUMER.CREATE.P.born", {"stream_name": "P", "config": {
            "durable_name": "born", "ack_policy": "explicit", "pause_until": FAR}}))
        out.append(await _api(nc, "CONSUMER.PAUSE.P.born", {"pause_until": FAR}))
        await nc.flush()
        out.append([(s, {k: v for k, v in e.items() if k != "pause_until" or v != soon})
                    for s, e in events])  # the pause advisories (a made-up time left out)
    finally:
        await nc.close()
    return out


async def test_pause_and_unpin_match_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    their, mine = await _script(theirs.url), await _script(ours.url)
    assert_same_steps(mine, their, ALLOWED_TO_DIFFER)
    assert their[3] == "timeout" and their[6] == [("p.0", b"m0", 1)]
    # a pause is replicated config: it is still there after a restart
    ours.stop()
    again = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    nc = await nats.connect(again.url)
    try:
        info = await _api(nc, "CONSUMER.INFO.P.born")
        assert info["config"]["pause_until"] == FAR and info["paused"] is True
    finally:
        await nc.close()


async def test_consumer_created_time_survives_restart(servers: Servers, tmp_path: Path) -> None:
    """CONSUMER.INFO's `created` comes from the creating entry, so a restart (SIGTERM or
    kill -9) shows the same time, as nats-server does; it used to be the restart's time."""
    import signal

    store = tmp_path / "ours"
    first = servers.jetraft(args=["-js", "-sd", str(store)])
    nc = await nats.connect(first.url)
    try:
        await nc.jetstream().add_stream(name="CR", subjects=["cr"])
        created = (await _api(nc, "CONSUMER.CREATE.CR.d", {"stream_name": "CR", "config": {
            "durable_name": "d"}}))["created"]
    finally:
        await nc.close()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        first.stop(sig)
        first = servers.jetraft(args=["-js", "-sd", str(store)])
        nc = await nats.connect(first.url)
        try:
            assert (await _api(nc, "CONSUMER.INFO.CR.d"))["created"] == created
        finally:
            await nc.close()

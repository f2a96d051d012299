"""API audit advisories (`$JS.EVENT.ADVISORY.API`) and sampled ack metrics
(`$JS.EVENT.METRIC.CONSUMER.ACK.>`) next to nats-server: the same requests, every event on
`$JS.EVENT.>` in order, whole JSON (the audit's embedded request and response decoded too).
May differ: ids, times, server names and the client's connection id / rtt / start
(ALLOWED_TO_DIFFER, values only: the keys must be the same)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
from nats.js.api import ConsumerConfig

from tests.integration.conftest import Servers

ALLOWED_TO_DIFFER = {"id", "timestamp", "server", "start", "rtt", "created", "ts", "ack_time",
                     "first_ts", "last_ts", "leader", "time"}


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: "*" if k in ALLOWED_TO_DIFFER else _strip(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strip(v) for v in obj]
    return obj


def _decode(subject: str, data: bytes) -> Any:
    body = json.loads(data)
    if body.get("type", "").endswith("api_audit"):
        for key in ("request", "response"):
            if key not in body:
                continue
            try:
                body[key] = json.loads(body[key])
            except ValueError:
                pass  # a request that is not JSON is compared as text
    return subject, body


def _deletion_advised(events: list[Any]) -> bool:
    return any(e[0] == "$JS.EVENT.ADVISORY.CONSUMER.DELETED.AU.n" for e in events) and any(
        e[0] == "$JS.EVENT.ADVISORY.API" and "CONSUMER.DELETE.AU.n" in json.dumps(e[1])
        for e in events)


async def _script(url: str) -> list[Any]:
    nc = await nats.connect(url, name="auditor")
    js = nc.jetstream()
    events: list[Any] = []

    async def on_event(msg: Any) -> None:
        events.append(_decode(msg.subject, msg.data))

    try:
        await nc.subscribe("$JS.EVENT.>", cb=on_event)
        await nc.flush()
        await js.add_stream(name="AU", subjects=["au.>"])
        await js.publish("au.x", b"1")
        await js.publish("au.y", b"2")
        await nc.request("$JS.API.STREAM.CREATE.BAD", b"{bad", timeout=5)
        await nc.request("$JS.API.STREAM.INFO.NOPE", b"", timeout=5)
        await js.stream_info("AU")
        await js.get_msg("AU", 1)  # not audited
        await js.add_consumer("AU", ConsumerConfig(durable_name="s", sample_freq="100%"))
        await js.add_consumer("AU", ConsumerConfig(durable_name="n"))
        psub = await js.pull_subscribe_bind("s", "AU")
        for m in await psub.fetch(2, timeout=5):
            await m.ack_sync()
        nsub = await js.pull_subscribe_bind("n", "AU")
        for m in await nsub.fetch(1, timeout=5):
            await m.ack_sync()  # no sample_freq: no metric
        await nc.request("$JS.API.INFO", b"", timeout=5)
        await js.delete_consumer("AU", "n")
        # the deletion's advisory and its API audit, then 0.3 s with nothing more: a loaded
        # server sends them after the reply (at most 20 s)
        for _ in range(1000):
            if _deletion_advised(events):
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
    finally:
        await nc.close()
    return events


def _audits(events: list[Any]) -> list[Any]:
    return [_strip(e) for e in events if e[0] == "$JS.EVENT.ADVISORY.API"
            or e[0].startswith("$JS.EVENT.METRIC.")]


async def test_api_audit_and_ack_metrics_match_nats_server(servers: Servers,
                                                           tmp_path: Path) -> None:
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    their, mine = await _script(theirs.url), await _script(ours.url)
    # nats-server publishes a stream's create advisory from another goroutine: it comes
    # before or after the create's audit. The events are compared as a multiset, and the
    # audits (and the metrics) in order.
    assert _audits(mine) == _audits(their)
    rest = [sorted(json.dumps(_strip(e), sort_keys=True) for e in run) for run in (mine, their)]
    diffs = [f"ours:   {a}\ntheirs: {b}" for a, b in zip(*rest, strict=True) if a != b]
    assert not diffs, "\n".join(diffs)
    kinds = [e[0] for e in their]
    assert kinds.count("$JS.EVENT.METRIC.CONSUMER.ACK.AU.s") == 2
    assert kinds.count("$JS.EVENT.ADVISORY.API") >= 8

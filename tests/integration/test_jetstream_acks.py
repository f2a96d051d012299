"""Every ack body over the wire, next to nats-server: `+ACK`, `-NAK` with a delay (JSON and
Go duration), `+WPI`, `+TERM`, `+NXT` (ack, then the next messages to the ack's reply),
bodies nats-server does not know, double acks (the empty reply), a MSG.NEXT to a push
consumer, and the consumer's state after each step (whole JSON)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats

from tests.integration.conftest import Servers
from tests.integration.jsdiff import assert_same_steps

ALLOWED_TO_DIFFER = {"created", "ts", "last_active", "time", "leader"}


async def _api(nc: Any, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return json.loads((await nc.request("$JS.API." + subject, data, timeout=10)).data)


def _frame(msg: Any) -> tuple[Any, ...]:
    """A delivery as (subject, data, deliveries, sseq, cseq, pending), a status as its code."""
    if msg.headers and msg.headers.get("Status"):
        return ("status", msg.headers["Status"], msg.headers.get("Description", ""))
    t = msg.reply.split(".")
    return (msg.subject, msg.data, int(t[4]), int(t[5]), int(t[6]), int(t[8]))


async def _collect(nc: Any, subject: str, wait: float, want: int) -> list[tuple[Any, ...]]:
    """What arrives on `subject` in `wait` seconds, and beyond that until `want` frames came
    (at most 10 s more: a loaded server delivers late; a short count shows in the diff)."""
    got: list[tuple[Any, ...]] = []

    async def cb(msg: Any) -> None:
        got.append(_frame(msg))

    sub = await nc.subscribe(subject, cb=cb)
    await asyncio.sleep(wait)
    for _ in range(500):
        if len(got) >= want:
            break
        await asyncio.sleep(0.02)
    await sub.unsubscribe()
    return got


async def _script(url: str) -> list[Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []
    info = "CONSUMER.INFO.ACKS.w"
    try:
        await js.add_stream(name="ACKS", subjects=["a.>"])
        for i in range(10):
            await js.publish(f"a.{i}", f"m{i}".encode())
        out.append(await _api(nc, "CONSUMER.CREATE.ACKS.w", {"stream_name": "ACKS", "config": {
            "durable_name": "w", "ack_policy": "explicit", "ack_wait": 5_000_000_000}}))
        inbox = nc.new_inbox()
        frames = asyncio.ensure_future(_collect(nc, inbox, 0.5, 7))
        await asyncio.sleep(0.05)
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.ACKS.w", b'{"batch":7}', reply=inbox)
        got = await frames
        out.append(got)
        def ack(seq: int, cseq: int) -> str:
            # nats-server reads the deliveries / stream / consumer tokens of an ack subject
            return f"$JS.ACK.ACKS.w.1.{seq}.{cseq}.0.0"

        async def send(subject: str, body: bytes) -> Any:
            try:
                reply = await nc.request(subject, body, timeout=1)
                return ("reply", reply.data)
            except nats.errors.TimeoutError:
                return ("no reply",)

        out.append(await send(ack(1, 1), b"+ACK"))
        out.append(await send(ack(1, 1), b"+ACK"))                    # double ack, again
        out.append(await send(ack(2, 2), b'-NAK {"delay": 5000000000}'))
        out.append(await send(ack(3, 3), b"+WPI"))
        out.append(await send(ack(4, 4), b"+TERM"))
        out.append(await send(ack(5, 5), b"+BOGUS"))                  # unknown body
        out.append(await send(ack(6, 6), b""))                        # empty: an ack
        out.append(await send(ack(7, 7), b"-NAK 300ms"))              # Go duration
        out.append(await _api(nc, info))
        nxt = asyncio.ensure_future(_collect(nc, "nxt.inbox", 1.0, 2))
        await asyncio.sleep(0.05)
        await nc.publish(ack(3, 3), b"+NXT 2", reply="nxt.inbox")     # ack 3, then 2 more
        out.append(await nxt)
        out.append(await _api(nc, info))
        await asyncio.sleep(0.3)
        out.append(await _api(nc, info))
        await js.add_consumer("ACKS", nats.js.api.ConsumerConfig(
            durable_name="push", deliver_subject="push.dlv"))
        push_next = asyncio.ensure_future(_collect(nc, "pn.inbox", 0.5, 1))
        await asyncio.sleep(0.05)
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.ACKS.push", b"", reply="pn.inbox")
        out.append(await push_next)
    finally:
        await nc.close()
    return out


async def test_ack_bodies_match_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    their, mine = await _script(theirs.url), await _script(ours.url)
    assert_same_steps(mine, their, ALLOWED_TO_DIFFER)

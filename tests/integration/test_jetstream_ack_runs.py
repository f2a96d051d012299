"""Acks that arrive together become ONE Raft entry (CONSUMER_ACKS); none of them may be lost.

A nats-py client fetches 40 messages and sends its acks without waiting between them (one
read of the socket then holds many: the node proposes them as one entry), with a NAK in the
middle (it ends the run: order kept), a message left unacked, and a burst of double acks
(`ack_sync`, all in flight at once: one entry, every confirmation answered). The consumer's
numbers must equal nats-server's for the same script, and stay so after kill -9: ack floor,
delivered, ack pending, redelivered, and what a fetch gets next.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import nats

from tests.integration.conftest import Servers

UNACKED = 7
NAKED = 12


async def _script(url: str) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        await js.add_stream(name="A", subjects=["a.*"])
        acks = await asyncio.gather(*[await js.publish_async("a.x", f"{i}".encode())
                                      for i in range(45)])
        assert [a.seq for a in acks] == list(range(1, 46))
        psub = await js.pull_subscribe("a.*", "w", stream="A")
        msgs = await psub.fetch(40, timeout=5)
        assert [m.metadata.sequence.stream for m in msgs] == list(range(1, 41))
        for m in msgs[:30]:  # plain acks, sent without waiting: runs of many
            seq = m.metadata.sequence.stream
            if seq == NAKED:
                await m.nak()
            elif seq != UNACKED:
                await m.ack()
        await nc.flush()
        await asyncio.gather(*(m.ack_sync(timeout=5) for m in msgs[30:35]))  # all confirmed
    finally:
        await nc.close()


async def _numbers(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        for _ in range(50):  # plain acks get no answer: wait until they are applied
            ci = await js.consumer_info("A", "w")
            if ci.num_ack_pending <= 7:
                break
            await asyncio.sleep(0.1)
        return {"floor": (ci.ack_floor.consumer_seq, ci.ack_floor.stream_seq),
                "delivered": (ci.delivered.consumer_seq, ci.delivered.stream_seq),
                "ack_pending": ci.num_ack_pending, "redelivered": ci.num_redelivered,
                "pending": ci.num_pending}
    finally:
        await nc.close()


async def _next(url: str) -> list[int]:
    """What the next fetch gets: the nak'd message again, then new ones (the unacked one
    waits for its ack_wait)."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        psub = await js.pull_subscribe("a.*", "w", stream="A")
        return [m.metadata.sequence.stream for m in await psub.fetch(3, timeout=5)]
    finally:
        await nc.close()


async def test_acks_read_together_are_all_applied_and_survive_kill_9(
        servers: Servers, tmp_path: Path) -> None:
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    await _script(theirs.url)
    want = await _numbers(theirs.url)
    assert want["floor"] == (UNACKED - 1, UNACKED - 1) and want["ack_pending"] == 7
    store = tmp_path / "ours"
    ours = servers.jetraft(args=["-js", "-sd", str(store)])
    await _script(ours.url)
    assert await _numbers(ours.url) == want
    ours.stop(signal.SIGKILL)
    again = servers.jetraft(args=["-js", "-sd", str(store)])
    assert await _numbers(again.url) == want
    assert await _next(again.url) == await _next(theirs.url) == [NAKED, 41, 42]


async def _ack_then_info(url: str) -> tuple[int, int]:
    """Plain acks (no confirmation), then at once CONSUMER.INFO."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        await js.add_stream(name="W", subjects=["w.*"])
        await asyncio.gather(*[await js.publish_async("w.x", b"m") for _ in range(20)])
        psub = await js.pull_subscribe("w.*", "q", stream="W")
        for m in await psub.fetch(20, timeout=5):
            await m.ack()
        ci = await js.consumer_info("W", "q")
        return ci.num_ack_pending, ci.ack_floor.stream_seq
    finally:
        await nc.close()


async def test_held_acks_show_in_the_next_consumer_info(servers: Servers,
                                                         tmp_path: Path) -> None:
    """Jetraft holds plain acks up to 5 ms to propose them as one entry; a CONSUMER.INFO
    proposes them and waits until they are applied, so it always reflects acks sent before
    it on the connection. (nats-server applies acks apart from API requests: the same
    script there answered 20 or 0 pending, so it is not compared.)"""
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    assert await _ack_then_info(ours.url) == (0, 20)

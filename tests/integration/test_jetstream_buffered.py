"""`jetstream { max_buffered_msgs, max_buffered_size }` as nats-server 2.15 answers them.

nats-server bounds each stream's ingest queue (defaults 100,000 messages / 128 MiB): a core
publish the full queue cannot take is dropped, answered 429 (10167) and a [WRN] logged.
Jetraft bounds the publishes a stream's leader holds proposed and not yet applied the same
way (node/jetstream/inflight.py). How many get through depends on each server's speed, so
the test compares the kinds of answers (whole reply JSON), the warning, and that what was
acked is exactly what was stored.

Mutation (docs/notes/acctlim.md): the `_too_many` check removed from `_accept_publish`
-> every publish is stored, no 429.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats

from tests.integration.conftest import Servers

CONF = 'jetstream: { store_dir: "%s", max_buffered_msgs: %s, max_buffered_size: %s }\n'
N = 600


async def _flood(url: str) -> tuple[set[bytes], int, int]:
    """N core publishes with replies, not awaited: the kinds of answer, acks, stored."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s"])
        answers: list[bytes] = []

        async def on_answer(msg: Any) -> None:
            answers.append(msg.data)
        inbox = nc.new_inbox()
        await nc.subscribe(inbox + ".*", cb=on_answer)
        for i in range(N):
            await nc.publish("s", b"x" * 100, reply=f"{inbox}.{i}")
        await nc.flush()
        for _ in range(100):
            if len(answers) == N:
                break
            await asyncio.sleep(0.05)
        kinds = {b"ack" if a.startswith(b'{"stream":"S","seq"') else a for a in answers}
        acked = sum(1 for a in answers if a.startswith(b'{"stream":"S","seq"'))
        return kinds, acked, (await js.stream_info("S")).state.messages
    finally:
        await nc.close()


async def test_a_full_buffer_drops_publishes_with_429_as_nats_server(servers: Servers) -> None:
    refused = b'{"error":{"code":429,"err_code":10167,"description":"too many requests"},' \
              b'"stream":"S","seq":0}'
    for msgs, size, why in (("1", "128MB", "len"), ("100000", "300", "size")):
        for name, start in (("nats-server", servers.nats_server),
                            ("jetraft", servers.jetraft)):
            store = servers.workdir / f"{name}-{why}"
            store.mkdir()
            proc = start(CONF % (store, msgs, size))
            kinds, acked, stored = await _flood(proc.url)
            assert kinds == {b"ack", refused}, (name, why, kinds)
            assert acked == stored, (name, why, acked, stored)
            assert "[WRN] Dropping messages due to excessive stream ingest rate on '$G' > " \
                   f"'S': IPQ {why} limit reached" in proc.log_text(), (name, why)
            proc.stop()

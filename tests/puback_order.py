"""Shared by the single-node and R3 early-PubAck tests: runs acked early (lone publishes)
and runs acked after their commit (bursts of 20) alternate; no PubAck may overtake an
earlier one."""

from __future__ import annotations

import asyncio
import json
from typing import Any


async def pubacks_keep_stream_order(nc: Any, js: Any, rounds: int, timeout: float,
                                    replicas: int = 1) -> None:
    await js.add_stream(name="OR", subjects=["or.>"], num_replicas=replicas)
    bursts = [20 if b % 2 == 0 else 1 + b % 3 for b in range(rounds)]
    total = sum(bursts)
    seqs: list[int] = []
    done = asyncio.Event()

    async def on_ack(msg: Any) -> None:
        seqs.append(json.loads(msg.data)["seq"])
        if len(seqs) == total:
            done.set()

    await nc.subscribe("acks.>", cb=on_ack)
    await nc.flush()
    k = 0
    for b, size in enumerate(bursts):
        for _ in range(size):
            k += 1
            await nc.publish("or.x", b"m", reply=f"acks.{k}")
        await nc.flush()
        await asyncio.sleep(0.001 * (b % 3))
    await asyncio.wait_for(done.wait(), timeout)
    assert seqs == list(range(1, total + 1))

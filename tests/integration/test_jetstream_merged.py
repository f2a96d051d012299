"""Many publishes in flight: the leader merges them into STREAM_MSGS entries, and each one
still gets its own answer (nats-py over TCP against `jetraft serve -js`).

`run_concurrent_publishes` is shared with tests/cluster/test_js_cluster.py (the same load
through a non-leader and to the leader of an R3 stream).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.errors import APIError

from tests.integration.conftest import Servers

MAX_SIZE = 64


async def run_concurrent_publishes(clients: list[Any], name: str, per_client: int = 300
                                   ) -> int:
    """Each client publishes `per_client` messages at once (no waiting between them): every
    4th carries a Nats-Msg-Id that another client also sends, every 25th is over
    max_msg_size. Checks each publish's own answer; returns how many were stored."""
    async def one(c: int, k: int) -> tuple[int, int, Any]:
        hdr = {"Nats-Msg-Id": f"id{k}"} if k % 4 == 0 else None
        data = b"x" * (MAX_SIZE + 1) if k % 25 == 1 else f"{c}:{k}".encode()
        try:
            return c, k, await clients[c].publish(f"{name}.s{k % 7}", data, headers=hdr,
                                                  timeout=20)
        except APIError as exc:
            return c, k, exc

    got = await asyncio.gather(*(one(c, k) for k in range(per_client)
                                 for c in range(len(clients))))
    by_id: dict[int, list[Any]] = {}
    stored = []
    for _c, k, ack in got:
        if k % 25 == 1:
            assert isinstance(ack, APIError) and ack.err_code == 10054, ack  # too big
            continue
        assert not isinstance(ack, APIError), ack
        assert ack.stream == name
        if k % 4 == 0:
            by_id.setdefault(k, []).append(ack)
        if not ack.duplicate:
            stored.append(ack.seq)
    for k, acks in by_id.items():  # one stored, the others its duplicates, same seq
        assert sorted(bool(a.duplicate) for a in acks) == [False] + [True] * (len(acks) - 1), k
        assert len({a.seq for a in acks}) == 1, k
    assert sorted(stored) == list(range(1, len(stored) + 1))  # no gap, no seq twice
    return len(stored)


def _applied(http: str) -> int:
    with urllib.request.urlopen(f"{http}/jsz?raft=1", timeout=10) as r:
        groups = json.loads(r.read())["raft"]
    return sum(g["applied"] for g in groups.values())


@pytest.mark.timeout(120)
async def test_concurrent_publishes_are_merged_and_each_gets_its_own_answer(
        servers: Servers, tmp_path: Path) -> None:
    proc = servers.jetraft(args=["-js", "-sd", str(tmp_path / "js")])
    ncs = [await nats.connect(proc.url) for _ in range(2)]
    try:
        js = [nc.jetstream(timeout=20) for nc in ncs]
        await js[0].add_stream(name="M", subjects=["M.>"], max_msg_size=MAX_SIZE)
        before = _applied(proc.http)
        stored = await run_concurrent_publishes(js, "M", 400)
        info = await js[1].stream_info("M")
        assert info.state.messages == info.state.last_seq == stored
        entries = _applied(proc.http) - before
        # one Raft entry per drain pass, not per publish (800 publishes in flight)
        assert 0 < entries < 400, entries
    finally:
        for nc in ncs:
            await nc.close()

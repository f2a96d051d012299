"""A network partition: the R3 stream's leader cut off from the majority, then healed, while
three publishers (one connected to each node, the cut-off leader included) publish with
Nats-Msg-Id and retry until acknowledged.

The cut is made by test-controlled CONNECT proxies that carry every node's outgoing cluster
connections (tests/cluster/netcut.py; no root, no network namespaces): the old leader keeps
its clients but loses every link to the two others, both ways; the two elect a new leader;
then the links come back.

The checker: every replica (read from its own store through DIRECT.GET) holds the same
messages in the same order; every acknowledged message is there once, at the seq its PubAck
gave; no message twice (the retries are absorbed by dedup); each publisher's order kept. Then
the nodes stop and the audit runs over their data with the acked writes: no violation.

`python -m tests.cluster.mutants ack-before-commit` runs this test against a node whose leader
answers PubAcks before the entry commits: it must fail (see docs/notes/claudit.md)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from tests.cluster.jshelp import connect, until
from tests.cluster.netcut import ProxiedCluster
from tests.cluster.test_js_faults import (
    _at_least,
    _check_replicas,
    audit_after,
    last_seq_here,
    publisher,
)

pytestmark = pytest.mark.timeout(600)
ROUNDS = 3 if os.environ.get("JETRAFT_LONG") else 1
PER_PUBLISHER = 120
CUT_S = 4.0


async def _leader(nc: Any, stream: str) -> str:
    try:
        info = await nc.jetstream(timeout=5).stream_info(stream)
    except Exception:  # noqa: BLE001 (no leader right now: ask again)
        return ""
    return info.cluster.leader or ""


async def test_stream_leader_cut_off_from_the_majority_then_healed(tmp_path, audit_spark
                                                                   ) -> None:
    c = ProxiedCluster(tmp_path / "c", 3)
    try:
        c.start()
        c.wait_js()
        admin = await connect(c.nodes[0])
        await admin.jetstream(timeout=10).add_stream(name="K", subjects=["k"], num_replicas=3,
                                                     allow_direct=True)
        await admin.close()
        acked: list[tuple[str, int]] = []
        for rnd in range(ROUNDS):
            await _round(c, rnd, acked)
        c.wait_js()
        assert len(acked) == 3 * PER_PUBLISHER * ROUNDS
        await _check(c, acked)
        audit_after(audit_spark, c, [("K", d, seq) for d, seq in acked], tmp_path)
    finally:
        c.close()


async def _round(c: ProxiedCluster, rnd: int, acked: list[tuple[str, int]]) -> None:
    watch = await connect(c.nodes[0])
    old = await until(lambda: _leader(watch, "K"), timeout=30)
    await watch.close()
    majority = [n for n in c.nodes if n.name != old]
    pubs = [await connect(n) for n in c.nodes]
    progress = asyncio.Event()
    base = len(acked)
    tasks = [asyncio.ensure_future(publisher(nc, 10 * rnd + i, PER_PUBLISHER, acked, progress))
             for i, nc in enumerate(pubs)]
    await until(lambda: len(acked) - base >= 60, timeout=120)
    refused = c.net.counts["refused"]
    c.net.cut(old)
    # The majority elects another leader while the old one is cut off.
    eyes = await connect(majority[0])
    new = await until(lambda: _other(eyes, old), timeout=90)
    assert new in {n.name for n in majority}
    during = len(acked)
    await until(lambda: len(acked) > during + 20, timeout=120)  # the majority takes writes
    await asyncio.sleep(CUT_S)
    assert c.net.counts["refused"] > refused, "the cut-off node never tried to redial?"
    c.net.heal()
    await eyes.close()
    await asyncio.wait_for(asyncio.gather(*tasks), 300)
    for nc in pubs:
        await nc.close()


async def _other(nc: Any, old: str) -> str:
    now = await _leader(nc, "K")
    return now if now and now != old else ""


async def _check(c: ProxiedCluster, acked: list[tuple[str, int]]) -> None:
    """The replica checker (test_js_faults._check_replicas) once every replica reached the
    highest acked seq; if one never does, the acked messages above it were lost."""
    top = max(seq for _, seq in acked)
    try:
        for node in c.nodes:
            await until(lambda node=node: _at_least(node, top), timeout=60)
    except TimeoutError:
        held = {n.name: await _last_or_none(n) for n in c.nodes}
        lost = sorted(d for d, seq in acked if any(h is None or seq > h for h in held.values()))
        raise AssertionError(f"acked seqs up to {top} but the replicas hold up to {held}: "
                             f"{len(lost)} acked messages missing, e.g. {lost[:3]}") from None
    await _check_replicas(c, acked)


async def _last_or_none(node: Any) -> int | None:
    try:
        return await last_seq_here(node)
    except Exception:  # noqa: BLE001 (no answer)
        return None

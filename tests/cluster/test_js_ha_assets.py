"""`jetstream { limits { max_ha_assets } }` on three nodes, as a 3-node nats-server 2.15.

nats-server counts each server's Raft groups (its meta group too) and places a replicated
stream or consumer only on servers not past the limit: with `max_ha_assets: 2` a server
takes two replicated assets. A third R3 stream gets 10005 `no suitable peers for placement,
miscellaneous issue`, an R3 durable consumer on a full stream 10023; an ephemeral consumer
is not counted (nor are R1 streams and consumers: checked by hand, not here, to keep the
test short: each group creation costs Jetraft ~2-3 s at load 20). The same script runs against both
clusters and every reply's error (or its absence) must be equal.

Mutation (docs/notes/acctlim.md): `placement.ha_over` always False -> the third R3 stream
and the third consumer are created.

The nodes' stream followers hold committed entries for 1 s (JETRAFT_FOLLOWER_DEFER_S): the
meta leader, a follower of S0, must count consumer c before it is due to apply it. Without
`apply_held_here` (the count read what was applied) S1 was created: CI saw it once with the
20 ms default.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.cluster.jshelp import JsCluster, api, first_create, nats_server_cluster3, until

LIMITS = ", limits: {max_ha_assets: 2}"


@pytest.fixture
def nats3(tmp_path: Path) -> Iterator[list[str]]:
    with nats_server_cluster3(tmp_path, LIMITS) as urls:
        yield urls


async def _script(url: str, after_s0: Callable[[nats.NATS], Awaitable[None]] | None = None
                  ) -> list[Any]:
    nc = await nats.connect(url)
    try:
        await first_create(nc, "STREAM.CREATE.Q", {"name": "Q", "subjects": ["q"]})
        steps: list[tuple[str, Any]] = [
            ("STREAM.CREATE.S0", {"name": "S0", "subjects": ["s0"], "num_replicas": 3}),
            ("CONSUMER.CREATE.S0.c", {"stream_name": "S0", "config": {
                "durable_name": "c", "num_replicas": 3}}),
            ("CONSUMER.CREATE.S0.e", {"stream_name": "S0", "config": {"durable_name": "e"}}),
            ("CONSUMER.CREATE.S0", {"stream_name": "S0", "config": {}}),
            ("STREAM.CREATE.S1", {"name": "S1", "subjects": ["s1"], "num_replicas": 3}),
        ]
        out = []
        for subject, body in steps:
            reply = await api(nc, subject, body)
            out.append((subject, reply.get("error")))
            if subject == "STREAM.CREATE.S0" and after_s0 is not None:
                await after_s0(nc)
        return out
    finally:
        await nc.close()


async def test_max_ha_assets_as_nats_server(nats3: list[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETRAFT_FOLLOWER_DEFER_S", "1")  # inherited by the nodes
    c = JsCluster(tmp_path / "jr", 3, js_extra=LIMITS)
    try:
        c.start()  # both clusters form at once
        theirs = await _script(nats3[0])
        c.wait_js()
        ours = await _script(c.nodes[0].url, lambda nc: _s0_led_off_the_meta_leader(c, nc))
    finally:
        c.stop()
    errors = dict(ours)
    assert errors["CONSUMER.CREATE.S0.e"]["err_code"] == 10023, ours
    assert errors["STREAM.CREATE.S1"]["err_code"] == 10005, ours
    assert ours == theirs


async def _s0_led_off_the_meta_leader(c: JsCluster, nc: nats.NATS) -> None:
    """The meta leader must be a follower of S0, holding what S0 commits."""
    meta = c.nodes[0].get("/jsz")["meta_cluster"]["leader"]
    info = await api(nc, "STREAM.INFO.S0")
    if info["cluster"]["leader"] == meta:
        await api(nc, "STREAM.LEADER.STEPDOWN.S0")
        await until(lambda: _s0_leader(nc, meta))


async def _s0_leader(nc: nats.NATS, not_this: str) -> bool:
    leader = (await api(nc, "STREAM.INFO.S0"))["cluster"].get("leader")
    return bool(leader) and leader != not_this

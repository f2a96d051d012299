"""JetStream per account on three nodes: the meta group's assignments carry the account, so
two accounts' streams of the same name are two Raft groups, each served in its own account
from every node (publishes, pull consumers and acks forwarded to the leaders), and an
account's limits are enforced by the meta leader whichever node the request came in on.

Mutation (docs/notes/jsacct.md): `jsaccount.key` returning the bare stream name fails this
test (the second create becomes the first stream's, and B sees A's messages)."""

from __future__ import annotations

import asyncio
import base64
import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.jshelp import JsCluster, api, connect, errors_in_logs, until

ACCOUNTS = """
accounts {
  A { users: [{user: a, password: p}], jetstream: enabled }
  B { users: [{user: b, password: p}], jetstream: { max_streams: 1, max_file: 300K } }
}
"""


@pytest.fixture
def js3acc(tmp_path: Path) -> Iterator[JsCluster]:
    c = JsCluster(tmp_path / "c", 3)
    c.extra_config = ACCOUNTS
    with c.running():
        yield c


async def test_two_accounts_same_stream_name_on_three_nodes(js3acc: JsCluster) -> None:
    n0, n1, n2 = js3acc.nodes
    a0 = await connect(n0, user="a", password="p")
    b1 = await connect(n1, user="b", password="p")
    a2 = await connect(n2, user="a", password="p")
    b2 = await connect(n2, user="b", password="p")
    try:
        made_a = await api(a0, "STREAM.CREATE.S", {"name": "S", "subjects": ["orders.>"],
                                                   "num_replicas": 3})
        made_b = await api(b1, "STREAM.CREATE.S", {"name": "S", "subjects": ["orders.>"],
                                                   "num_replicas": 3})
        assert "error" not in made_a and "error" not in made_b, (made_a, made_b)
        # B's limit, enforced by the meta leader whichever node B is connected to
        over = await api(b2, "STREAM.CREATE.T", {"name": "T", "subjects": ["t.>"]})
        assert over["error"] == {"code": 400, "err_code": 10027,
                                 "description": "maximum number of streams reached"}
        for i in range(3):  # publishes through every node, forwarded to each leader
            nc = (a0, a2)[i % 2]
            ack = await nc.request("orders.a", f"a{i}".encode(), timeout=10)
            assert b'"seq":%d' % (i + 1) in ack.data
        ack = await b2.request("orders.b", b"b0", timeout=10)
        assert b'"seq":1' in ack.data

        async def counts() -> bool:
            ia = await api(a2, "STREAM.INFO.S")
            ib = await api(b1, "STREAM.INFO.S")
            return ia["state"]["messages"] == 3 and ib["state"]["messages"] == 1
        await until(counts)
        got = await api(b2, "STREAM.MSG.GET.S", {"seq": 1})
        assert got["message"]["subject"] == "orders.b"
        assert (await api(a0, "STREAM.NAMES"))["streams"] == ["S"]
        info_b = await api(b1, "INFO")
        assert info_b["streams"] == 1 and info_b["limits"]["max_streams"] == 1
        # a pull consumer in A, acked through another node
        made = await api(a0, "CONSUMER.CREATE.S.d", {"stream_name": "S", "config": {
            "durable_name": "d", "ack_policy": "explicit", "num_replicas": 3}})
        assert "error" not in made, made
        sub = await a2.jetstream().pull_subscribe("orders.>", durable="d", stream="S")
        msgs = await sub.fetch(3, timeout=10)
        assert [m.data for m in msgs] == [b"a0", b"a1", b"a2"]
        for m in msgs:
            await m.ack_sync(timeout=10)
        assert (await api(b1, "CONSUMER.INFO.S.d"))["error"]["err_code"] == 10014

        async def acked() -> bool:
            return (await api(a0, "CONSUMER.INFO.S.d"))["ack_floor"]["stream_seq"] == 3
        await until(acked)
        await _burst_within_max_file(b1, b2)
        # deleting B's stream leaves A's
        assert (await api(b2, "STREAM.DELETE.S"))["success"] is True
        assert (await api(a2, "STREAM.INFO.S"))["state"]["messages"] == 3
        async def b_gone() -> bool:  # node 1 applies the meta group's delete a moment later
            return (await api(b1, "STREAM.INFO.S")).get("error", {}).get("err_code") == 10059
        await until(b_gone)
        # the account travels in the meta entries: a node restarted replays them
        js3acc.stop_node(n2)
        js3acc.start_node(n2)
        js3acc.wait_js()
        a2b = await connect(n2, user="a", password="p")
        b2b = await connect(n2, user="b", password="p")
        try:
            async def replayed() -> bool:
                ia = await api(a2b, "STREAM.INFO.S")
                return "error" not in ia and ia["state"]["messages"] == 3
            await until(replayed)
            assert (await api(b2b, "STREAM.NAMES"))["streams"] in (None, [])
        finally:
            await a2b.close()
            await b2b.close()
    finally:
        for nc in (a0, b1, a2, b2):
            if not nc.is_closed:
                await nc.close()
    assert not [e for e in errors_in_logs(js3acc) if "Traceback" in e]


async def _burst_within_max_file(b1: Any, b2: Any) -> None:
    """B's `max_file: 300K` holds an R3 stream (counted 3x) under 150 concurrent
    publishes of 1,000 bytes forwarded by a node that leads nothing of it or does: the
    leader counts what it proposed and has not applied (inflight.py). nats-server 2.15's R3
    acks all of such a burst (400 of 400, 4x the limit, docs/notes/acctlim.md); Jetraft
    refuses the surplus with the same 10002. Then, after a purge, what was in flight is no
    longer counted: 50 more fit."""
    async def burst(n: int) -> collections.Counter[str]:
        got = await asyncio.gather(*[b2.jetstream().publish("orders.b", b"x" * 1000,
                                                            timeout=20) for _ in range(n)],
                                   return_exceptions=True)
        return collections.Counter(getattr(r, "err_code", None) or type(r).__name__
                                   for r in got)
    got = await burst(150)
    stored = (await api(b1, "STREAM.INFO.S"))["state"]["bytes"]
    assert 3 * stored <= 300 * 1024 and got["PubAck"] + got[10002] == 150, (got, stored)
    assert got[10002] > 0, got
    assert (await api(b1, "STREAM.PURGE.S"))["success"] is True
    assert (await burst(50))["PubAck"] == 50


async def test_mirror_and_source_in_an_account_on_three_nodes(js3acc: JsCluster) -> None:
    """Account A's R3 mirror and R1 source of its R3 origin `O`, created through different
    nodes (the target's leader asks the origin's leader over the routes, in account A),
    while account B has its own `O` on the same subjects: only A's messages are copied."""
    n0, n1, n2 = js3acc.nodes
    a0 = await connect(n0, user="a", password="p")
    a1 = await connect(n1, user="a", password="p")
    a2 = await connect(n2, user="a", password="p")
    b1 = await connect(n1, user="b", password="p")
    try:
        made = await api(b1, "STREAM.CREATE.O", {"name": "O", "subjects": ["o.>"]})
        assert "error" not in made, made
        for i in range(2):
            await b1.request("o.b", f"b{i}".encode(), timeout=10)
        made = await api(a0, "STREAM.CREATE.O", {"name": "O", "subjects": ["o.>"],
                                                 "num_replicas": 3})
        assert "error" not in made, made
        made = await api(a1, "STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"},
                                                 "num_replicas": 3})
        assert "error" not in made, made
        made = await api(a2, "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"],
                                                 "sources": [{"name": "O"}]})
        assert "error" not in made, made
        for i in range(5):
            ack = await (a0, a1, a2)[i % 3].request("o.a", f"a{i}".encode(), timeout=10)
            assert b'"seq":%d' % (i + 1) in ack.data

        async def copied() -> bool:
            m = await api(a0, "STREAM.INFO.M")
            s = await api(a1, "STREAM.INFO.S")
            return m["state"]["messages"] == 5 and s["state"]["messages"] == 5
        await until(copied, timeout=30)
        for name in ("M", "S"):
            got = [(await api(a2, f"STREAM.MSG.GET.{name}", {"seq": q}))["message"]["data"]
                   for q in range(1, 6)]
            assert [base64.b64decode(d) for d in got] == [f"a{i}".encode() for i in range(5)]
        assert (await api(b1, "STREAM.INFO.O"))["state"]["messages"] == 2
    finally:
        for nc in (a0, a1, a2, b1):
            await nc.close()
    assert not [e for e in errors_in_logs(js3acc) if "Traceback" in e]

"""JetStream across accounts on three nodes: account B uses account A's stream through
imports (a pull consumer's MSG.NEXT and acks as services, a push consumer's deliver
subject as a stream) and sources it into its own R3 stream through an external API prefix,
from clients on every node, while the stream's leader sits on one of them. Deliveries to a
request made through an import travel back over the routes to the node that opened the
import's response route (`Account.deliver_routed` -> `Router.deliver_response`).

Mutation: `deliver_routed` ignoring the match subject of a forwarded JetStream delivery
(checking `subject` for `_R_.` as before) loses the fetches made on non-leader nodes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.jshelp import JsCluster, api, connect, errors_in_logs, until

ACCOUNTS = """
accounts {
  A { users: [{user: a, password: p}], jetstream: enabled,
      exports: [{service: "$JS.API.CONSUMER.MSG.NEXT.ORIGIN.C", response_type: stream},
                {service: "$JS.ACK.ORIGIN.C.>"},
                {service: "$JS.API.CONSUMER.CREATE.ORIGIN"},
                {service: "$JS.FC.ORIGIN.>"},
                {stream: "deliver.b.>"},
                {stream: "push.b.>"}] }
  B { users: [{user: b, password: p}], jetstream: enabled,
      imports: [{service: {account: A, subject: "$JS.API.CONSUMER.MSG.NEXT.ORIGIN.C"},
                 to: "fetch.orders"},
                {service: {account: A, subject: "$JS.ACK.ORIGIN.C.>"}},
                {service: {account: A, subject: "$JS.API.CONSUMER.CREATE.ORIGIN"},
                 to: "$JS.A.API.CONSUMER.CREATE.ORIGIN"},
                {service: {account: A, subject: "$JS.FC.ORIGIN.>"}},
                {stream: {account: A, subject: "deliver.b.>"}},
                {stream: {account: A, subject: "push.b.>"}}] }
}
"""


@pytest.fixture
def js3imp(tmp_path: Path) -> Iterator[JsCluster]:
    c = JsCluster(tmp_path / "c", 3)
    c.extra_config = ACCOUNTS
    with c.running():
        yield c


async def test_a_stream_used_and_sourced_through_imports_from_every_node(
        js3imp: JsCluster) -> None:
    nodes = js3imp.nodes
    a0 = await connect(nodes[0], user="a", password="p")
    bs = [await connect(n, user="b", password="p") for n in nodes]
    try:
        made = await api(a0, "STREAM.CREATE.ORIGIN", {"name": "ORIGIN", "subjects": ["o.>"]})
        assert "error" not in made, made
        for i in range(6):
            await a0.request(f"o.{i}", f"m{i}".encode(), timeout=10)
        made = await api(a0, "CONSUMER.CREATE.ORIGIN.C", {"stream_name": "ORIGIN", "config": {
            "durable_name": "C", "ack_policy": "explicit"}})
        assert "error" not in made, made
        got = []
        for b in bs:  # one message fetched and acked through each node
            inbox = b.new_inbox()
            sub = await b.subscribe(inbox)
            await b.publish("fetch.orders", json.dumps({"batch": 1, "expires": 5_000_000_000})
                            .encode(), reply=inbox)
            m = await sub.next_msg(10)
            got.append(m.data)
            await m.respond(b"")
            await sub.unsubscribe()
        assert got == [b"m0", b"m1", b"m2"]

        async def acked() -> bool:
            info = await api(a0, "CONSUMER.INFO.ORIGIN.C")
            return info["ack_floor"]["stream_seq"] == 3 and info["num_ack_pending"] == 0
        await until(acked)

        push = await bs[2].subscribe("push.b.x")
        await bs[2].flush()
        made = await api(a0, "CONSUMER.CREATE.ORIGIN.P", {"stream_name": "ORIGIN", "config": {
            "durable_name": "P", "ack_policy": "none", "deliver_subject": "push.b.x"}})
        assert "error" not in made, made
        pushed = [(await push.next_msg(10)).data for _ in range(6)]
        assert pushed == [f"m{i}".encode() for i in range(6)]

        made = await api(bs[1], "STREAM.CREATE.T", {"name": "T", "num_replicas": 3, "sources": [
            {"name": "ORIGIN", "external": {"api": "$JS.A.API", "deliver": "deliver.b"}}]})
        assert "error" not in made, made

        async def sourced() -> bool:
            return (await api(bs[0], "STREAM.INFO.T"))["state"]["messages"] == 6
        await until(sourced, timeout=30)
    finally:
        for nc in (a0, *bs):
            await nc.close()
    assert not [e for e in errors_in_logs(js3imp) if "Traceback" in e]

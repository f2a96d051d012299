"""Mirrors and sources from another account (`external`: an API prefix and a deliver
prefix), against nats-server with the same config.

Account A owns the origin and exports what a sourcing stream in B needs, the way a user
of nats-server writes it: the consumer-create API (as a service, which B imports under
`$JS.A.API`), the flow-control subjects (a service: B answers them) and the deliver
prefix (a stream). B's streams name the origin through `external`. The script compares
every API reply (times and ids masked) and every stored message, including the
`Nats-Stream-Source` header (whose index name hashes the API prefix), across more
messages than one flow-control window, so B's flow-control answers must reach A.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import nats

from tests.integration.conftest import Servers
from tests.integration.jsdiff import assert_same_steps
from tests.integration.test_jetstream_mirrors import ALLOWED_TO_DIFFER, _settle

CONF = """
jetstream { store_dir: "%s" }
accounts {
  A { users: [{user: a, password: p}], jetstream: enabled,
      exports: [{service: "$JS.API.CONSUMER.CREATE.ORIGIN"},
                {service: "$JS.API.CONSUMER.CREATE.ORIGIN.>"},
                {service: "$JS.FC.ORIGIN.>"},
                {stream: "deliver.b.>"}] }
  B { users: [{user: b, password: p}], jetstream: enabled,
      imports: [{service: {account: A, subject: "$JS.API.CONSUMER.CREATE.ORIGIN"},
                 to: "$JS.A.API.CONSUMER.CREATE.ORIGIN"},
                {service: {account: A, subject: "$JS.API.CONSUMER.CREATE.ORIGIN.>"},
                 to: "$JS.A.API.CONSUMER.CREATE.ORIGIN.>"},
                {service: {account: A, subject: "$JS.FC.ORIGIN.>"}},
                {stream: {account: A, subject: "deliver.b.>"}}] }
}
"""
EXT = {"api": "$JS.A.API", "deliver": "deliver.b"}
FIRST, MORE = 5, 700  # MORE crosses a flow-control window on both servers
SAMPLE = [*range(1, 11), *range(FIRST + MORE - 9, FIRST + MORE + 1)]


def _masked(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: ("*" if k in ALLOWED_TO_DIFFER else
                    (v >= 0 if k == "active" else _masked(v))) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_masked(v) for v in obj]
    return obj


async def _publish(js: Any, first: int, count: int) -> None:
    acks = [await js.publish_async(f"o.{i % 7}", f"m{i}".encode())
            for i in range(first, first + count)]
    await asyncio.gather(*acks)


def _source(hdrs: str | None) -> list[str]:
    """The Nats-Stream-Source header's origin (with the API hash), seq, filters,
    destinations and subject; a last token (the origin's incarnation) may differ."""
    text = base64.b64decode(hdrs or "").decode()
    line = next((x for x in text.split("\r\n") if x.startswith("Nats-Stream-Source:")), "")
    return line.split()[1:6]


async def _sample_one(nc: Any, name: str, seq: int) -> dict[str, Any] | None:
    reply = await nc.request(f"$JS.API.STREAM.MSG.GET.{name}",
                             json.dumps({"seq": seq}).encode(), timeout=10)
    return json.loads(reply.data).get("message")


async def _sample(nc: Any, name: str) -> list[Any]:
    out = []
    for seq in SAMPLE:
        m = await _sample_one(nc, name, seq)
        out.append(m and (m["seq"], m["subject"], m.get("data"), _source(m.get("hdrs"))))
    return out


async def _origin(port: int, count: int) -> tuple[Any, Any, Any]:
    """Clients of A and B, and A's ORIGIN stream holding `count` messages."""
    a = await nats.connect(f"nats://a:p@127.0.0.1:{port}")
    b = await nats.connect(f"nats://b:p@127.0.0.1:{port}")
    ja = a.jetstream()
    await ja.add_stream(name="ORIGIN", subjects=["o.>"])
    await _publish(ja, 0, count)
    return a, b, ja


async def _script(port: int) -> list[Any]:
    a, b, ja = await _origin(port, FIRST)
    out: list[Any] = []
    try:
        for cfg in ({"name": "T", "sources": [{"name": "ORIGIN", "external": EXT}]},
                    {"name": "F", "sources": [{"name": "ORIGIN", "filter_subject": "o.3",
                                               "external": EXT}]},
                    {"name": "M", "mirror": {"name": "ORIGIN", "external": EXT}}):
            reply = await b.request(f"$JS.API.STREAM.CREATE.{cfg['name']}",
                                    json.dumps(cfg).encode(), timeout=10)
            out.append(_masked(json.loads(reply.data)))
        out.append(_masked(await _settle(b, "T", FIRST)))
        await _publish(ja, FIRST, MORE)
        total = FIRST + MORE
        in_f = sum(1 for i in range(total) if i % 7 == 3)
        for name, last in (("T", total), ("M", total), ("F", in_f)):
            out.append(_masked(await _settle(b, name, last)))
        for name in ("T", "M", "F"):
            out.append(await _sample(b, name))
    finally:
        await a.close()
        await b.close()
    return out


async def test_sources_and_mirrors_from_another_account_as_nats_server(
        servers: Servers, tmp_path: Path) -> None:
    ours = servers.jetraft(CONF % (tmp_path / "ours"))
    theirs = servers.nats_server(CONF % (tmp_path / "theirs"))
    mine, their = await asyncio.gather(_script(ours.port), _script(theirs.port))
    assert_same_steps(mine, their, ())


async def test_a_recreated_external_origin_is_sourced_from_its_start(
        servers: Servers, tmp_path: Path) -> None:
    """The origin's incarnation reaches the target with the consumer it creates: after the
    origin is deleted and made again, the source starts over at its first message. (nats-
    server 2.15 gets there too, measured: about 16 s later, after its stall detection.)"""
    srv = servers.jetraft(CONF % (tmp_path / "ours"))
    a, b, ja = await _origin(srv.port, 4)
    try:
        cfg = {"name": "T", "sources": [{"name": "ORIGIN", "external": EXT}]}
        await b.request("$JS.API.STREAM.CREATE.T", json.dumps(cfg).encode(), timeout=10)
        await _settle(b, "T", 4)
        await ja.delete_stream("ORIGIN")
        await ja.add_stream(name="ORIGIN", subjects=["o.>"])
        await _publish(ja, 100, 2)
        info = await _settle(b, "T", 6)
        assert info["state"]["messages"] == 6
        got = [await _sample_one(b, "T", seq) for seq in (5, 6)]
        assert [(m["subject"], base64.b64decode(m["data"])) for m in got] == \
            [("o.2", b"m100"), ("o.3", b"m101")]
        assert [_source(m["hdrs"])[1] for m in got] == ["1", "2"]  # the new origin's seqs
    finally:
        await a.close()
        await b.close()


SHARE_CONF = """
jetstream { store_dir: "%s" }
accounts {
  A { users: [{user: a, password: p}], jetstream: enabled,
      exports: [{service: "$JS.API.CONSUMER.MSG.NEXT.ORIGIN.C", response_type: stream},
                {service: "$JS.ACK.ORIGIN.C.>"},
                {stream: "push.b.>"}] }
  B { users: [{user: b, password: p}],
      imports: [{service: {account: A, subject: "$JS.API.CONSUMER.MSG.NEXT.ORIGIN.C"},
                 to: "fetch.orders"},
                {service: {account: A, subject: "$JS.ACK.ORIGIN.C.>"}},
                {stream: {account: A, subject: "push.b.>"}}] }
}
"""


async def _consume_script(port: int) -> list[Any]:
    """B (no JetStream of its own) pulls from A's consumer through an imported MSG.NEXT,
    acks through an imported ack subject, and receives a push consumer's deliveries
    through a stream import of its deliver subject."""
    a, b, ja = await _origin(port, 6)
    out: list[Any] = []
    try:
        await ja.add_consumer("ORIGIN", durable_name="C", ack_policy="explicit")
        inbox = b.new_inbox()
        sub = await b.subscribe(inbox)
        await b.publish("fetch.orders", json.dumps({"batch": 3, "expires": 2_000_000_000})
                        .encode(), reply=inbox)
        for _ in range(3):
            m = await sub.next_msg(5)
            out.append((m.subject, m.data, m.reply.split(".")[:6]))
            await m.respond(b"")
        push = await b.subscribe("push.b.x")
        await ja.add_consumer("ORIGIN", durable_name="P", ack_policy="none",
                              deliver_subject="push.b.x")
        for _ in range(6):
            m = await push.next_msg(5)
            out.append((m.subject, m.data))
        await b.flush()
        for _ in range(50):  # the acks went through B's import: A's ack floor moves
            info = await ja.consumer_info("ORIGIN", "C")
            if info.ack_floor.stream_seq == 3:
                break
            await asyncio.sleep(0.1)
        out.append((info.ack_floor.stream_seq, info.num_ack_pending, info.num_pending))
        out.append((await ja.consumer_info("ORIGIN", "P")).push_bound)
    finally:
        await a.close()
        await b.close()
    return out


async def test_consuming_through_imports_as_nats_server(servers: Servers,
                                                        tmp_path: Path) -> None:
    ours = servers.jetraft(SHARE_CONF % (tmp_path / "ours"))
    theirs = servers.nats_server(SHARE_CONF % (tmp_path / "theirs"))
    mine, their = await asyncio.gather(_consume_script(ours.port),
                                       _consume_script(theirs.port))
    assert_same_steps(mine, their, ())

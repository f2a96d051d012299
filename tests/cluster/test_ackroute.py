"""Replies on the shortcut paths of core routing (docs/notes/ackroute.md), on three real
nodes with real nats-py clients: PubAcks to reply subjects that are new on every message
(the SubList's prefix cache, local and remote-interest sublists), a lone network
subscriber framed straight into its buffer on `Account.publish` (a PubAck, a request from
a client with per-message checks) and on `Account.deliver_routed` (a reply that crossed a
route). Each test pins a rule those shortcuts must keep: every subscriber a subject
matches (literal ones beside a `prefix.*` included), one member per queue group, the
subscriber's subscribe deny applied on delivery, allow_responses noting the reply subject
of what a responder received, no echo, no-responders, auto-unsubscribe.

Mutations, each FAILS a test here (docs/notes/ackroute.md): `Client.deliver_direct`
without its `delivery_checks` branch (the deny and allow_responses tests); the
prefix cache ignoring literal children (`match` returning the prefix entry whatever the
last token: the literal-subscriber test); `Account.publish`'s shortcut without its echo
condition (the no-echo test)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from nats.errors import NoRespondersError

from tests.cluster.jshelp import JsCluster, connect, errors_in_logs, until

ACCOUNTS = """
accounts {
  A {
    jetstream: enabled
    users: [
      {user: a, password: p}
      {user: d, password: p, permissions: {subscribe: {allow: [">"], deny: ["_INBOX.hidden.>"]}}}
      {user: r, password: p, permissions: {subscribe: "svc.>", publish: {deny: ">"},
                                           allow_responses: true}}
    ]
  }
}
"""


@pytest.fixture(scope="module")
def js3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JsCluster]:
    c = JsCluster(tmp_path_factory.mktemp("ackroute"), 3)
    c.extra_config = ACCOUNTS
    try:
        c.start()
        c.wait_js()
        yield c
    finally:
        c.stop()
    assert errors_in_logs(c) == []


async def _user(node: Any, user: str = "a", **kw: Any) -> nats.NATS:
    return await connect(node, user=user, password="p", **kw)


async def _stream(js3: JsCluster) -> tuple[str, int]:
    """A fresh R3 stream; returns its name and the index of its leader's node."""
    nc = await _user(js3.nodes[0])
    try:
        js = nc.jetstream(timeout=20)
        name = f"ACK_{uuid.uuid4().hex[:6]}"
        await js.add_stream(name=name, subjects=[f"{name}.>"], num_replicas=3)

        async def leader() -> str | None:
            return (await js.stream_info(name)).cluster.leader
        lead = await until(leader, timeout=30)
        return name, [n.name for n in js3.nodes].index(lead)
    finally:
        await nc.close()


class Inbox:
    """What one subscription received: (subject, data), in order."""

    def __init__(self) -> None:
        self.got: list[tuple[str, bytes]] = []

    async def cb(self, msg: Any) -> None:
        self.got.append((msg.subject, msg.data))

    def acks(self) -> list[tuple[str, int]]:
        return [(s, json.loads(d)["seq"]) for s, d in self.got if d.startswith(b"{")]

    def has(self, data: bytes) -> bool:
        return any(d == data for _, d in self.got)


@pytest.mark.parametrize("via", ["leader", "follower"])
async def test_pubacks_under_one_prefix_reach_every_subscriber_they_match(
        js3: JsCluster, via: str) -> None:
    """The publisher's `pfx.*` gets every PubAck; a literal `pfx.7` on a third node gets
    exactly that one (a literal child beside the prefix's `*`, in the leader's remote
    interest and in that node's sublist); a queue group on `pfx.*` with members on two
    nodes gets each PubAck once."""
    name, li = await _stream(js3)
    pi = li if via == "leader" else (li + 1) % 3
    ci = 3 - li - pi if pi != li else (li + 1) % 3  # a node other than the publisher's
    pfx = f"_AB.{uuid.uuid4().hex[:10]}"
    pub, other, lead = (await _user(js3.nodes[pi]), await _user(js3.nodes[ci]),
                        await _user(js3.nodes[li]))
    try:
        mine, lit, qa, qb = Inbox(), Inbox(), Inbox(), Inbox()
        await pub.subscribe(pfx + ".*", cb=mine.cb)
        await pub.subscribe(pfx + ".*", queue="g", cb=qa.cb)
        await other.subscribe(pfx + ".7", cb=lit.cb)
        # The probe's subject comes first under the prefix (the first one is also cached
        # by subject): `pfx.7` is then matched through the prefix's entry, whose literal
        # children it is in.
        await other.subscribe(pfx + ".probe", cb=lit.cb)
        await other.subscribe(pfx + ".*", queue="g", cb=qb.cb)
        await pub.flush()
        await other.flush()

        async def known() -> bool:  # the leader's node has heard of the third node's interest
            await lead.publish(pfx + ".probe", b"probe")
            await lead.flush()
            return lit.has(b"probe")
        await until(known)
        n = 40
        for i in range(n):
            await pub.publish(f"{name}.x", f"m{i}".encode(), reply=f"{pfx}.{i}")
        await pub.flush()
        await until(lambda: len(mine.acks()) == n, timeout=30)
        # Published after every PubAck left the leader, on the same route: when it is in,
        # so is everything the leader sent the third node before it.
        await lead.publish(pfx + ".7", b"end")
        await until(lambda: lit.has(b"end"))
        await pub.flush()
        await other.flush()
        acks = dict(mine.acks())
        assert sorted(acks) == sorted(f"{pfx}.{i}" for i in range(n))
        assert sorted(acks.values()) == list(range(1, n + 1))
        assert lit.acks() == [(f"{pfx}.7", acks[f"{pfx}.7"])]
        group = qa.acks() + qb.acks()
        assert sorted(group) == sorted(acks.items())  # each PubAck once in the group
    finally:
        for nc in (pub, other, lead):
            await nc.close()


@pytest.mark.parametrize("via", ["leader", "follower"])
async def test_a_pubacks_delivery_keeps_the_subscribers_deny(js3: JsCluster, via: str) -> None:
    """A user allowed to subscribe `_INBOX.>` but denied `_INBOX.hidden.>` gets no PubAck
    on a hidden reply subject (nats-server checks the deny on delivery), from the leader's
    node and across a route; the stream still stores those publishes."""
    name, li = await _stream(js3)
    pi = li if via == "leader" else (li + 2) % 3
    d, lead = await _user(js3.nodes[pi], "d"), await _user(js3.nodes[li])
    try:
        box = Inbox()
        await d.subscribe("_INBOX.>", cb=box.cb)
        await d.flush()
        for i in range(10):
            await d.publish(f"{name}.x", b"h", reply=f"_INBOX.hidden.{i}")
            await d.publish(f"{name}.x", b"o", reply=f"_INBOX.ok.{i}")
        await d.flush()
        await until(lambda: len(box.acks()) == 10, timeout=30)
        await lead.publish("_INBOX.ok.end", b"end")  # after every PubAck, on the same path
        await until(lambda: box.has(b"end"))
        assert [s for s, _ in box.acks()] == [f"_INBOX.ok.{i}" for i in range(10)]
        js = lead.jetstream(timeout=20)
        assert (await js.stream_info(name)).state.messages == 20
    finally:
        await d.close()
        await lead.close()


@pytest.mark.parametrize("same_node", [True, False])
async def test_a_responder_with_allow_responses_answers_across_a_route(js3: JsCluster,
                                                                      same_node: bool) -> None:
    """A responder whose only publish right is allow_responses answers a request from its
    own node and from another one (the request reached it through deliver_routed's
    shortcut, which must note the reply subject as deliver() does); a publish elsewhere
    is still refused."""
    errors: list[Exception] = []

    async def on_error(err: Exception) -> None:
        errors.append(err)

    r = await _user(js3.nodes[0], "r", error_cb=on_error)
    req = await _user(js3.nodes[0 if same_node else 1])
    try:
        async def echo(msg: Any) -> None:
            await msg.respond(b"re:" + msg.data)
        await r.subscribe("svc.echo", cb=echo)
        await r.flush()

        async def answered() -> bytes | None:
            try:
                return (await req.request("svc.echo", b"hi", timeout=1)).data
            except (TimeoutError, NoRespondersError, nats.errors.TimeoutError):
                return None
        assert await until(answered, timeout=20) == b"re:hi"
        for i in range(5):
            assert (await req.request("svc.echo", b"%d" % i, timeout=5)).data == b"re:%d" % i
        assert errors == []
        await r.publish("svc.other", b"x")
        await r.flush()
        await until(lambda: any("permissions violation" in str(e).lower() for e in errors))
    finally:
        await r.close()
        await req.close()


async def test_a_checked_publisher_keeps_echo_and_no_responders(js3: JsCluster) -> None:
    """A verbose, pedantic client's publishes take `Account.publish` (not the fast path):
    a request to one subscriber is answered; with no_echo it does not receive its own
    publish on a subject it alone subscribes; a request whose one subscriber may not
    receive it (deny on delivery) gets no-responders, as does one nobody subscribes."""
    node = js3.nodes[2]
    v = await _user(node, verbose=True, pedantic=True, no_echo=True)
    a, d = await _user(node), await _user(node, "d")
    try:
        async def echo(msg: Any) -> None:
            await msg.respond(b"re:" + msg.data)
        await a.subscribe("echo.one", cb=echo)
        await a.flush()
        assert (await v.request("echo.one", b"x", timeout=5)).data == b"re:x"
        own = Inbox()
        await v.subscribe("loop.x", cb=own.cb)
        await v.flush()
        await v.publish("loop.x", b"mine")
        await v.flush()
        await a.publish("loop.x", b"end")  # the same subject from another client
        await until(lambda: own.has(b"end"))
        assert own.got == [("loop.x", b"end")]
        await d.subscribe("_INBOX.>", cb=Inbox().cb)
        await d.flush()
        with pytest.raises(NoRespondersError):
            await v.request("_INBOX.hidden.q", b"x", timeout=5)
        with pytest.raises(NoRespondersError):
            await v.request(f"nobody.{uuid.uuid4().hex[:6]}", b"x", timeout=5)
    finally:
        for nc in (v, a, d):
            await nc.close()


@pytest.mark.parametrize("via", ["leader", "follower"])
async def test_old_style_requests_get_their_pubacks_and_unsubscribe(js3: JsCluster,
                                                                    via: str) -> None:
    """nats-py's old-style request: a unique inbox per request with auto-unsubscribe after
    one message (`_INBOX.<id>`: a literal last token under `_INBOX`). Each gets its own
    PubAck and no subscription is left behind."""
    name, li = await _stream(js3)
    node = js3.nodes[li if via == "leader" else (li + 1) % 3]
    nc = await _user(node)
    try:
        seqs = []
        for i in range(10):
            msg = await nc.request(f"{name}.x", b"%d" % i, timeout=20, old_style=True)
            seqs.append(json.loads(msg.data)["seq"])
        assert seqs == list(range(1, 11))

        def left() -> bool:
            conns = node.get("/connz?subs=1")["connections"]
            mine = [c for c in conns if c.get("authorized_user") == "a"]
            return len(mine) == 1 and not mine[0].get("subscriptions_list")
        await until(left)
    finally:
        await nc.close()

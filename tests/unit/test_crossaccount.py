"""node/crossaccount.py's Router on real Accounts and sublists: the reply
routes it opens for service imports (one use for Singleton, expiry, the
bound on open routes). Subscribers are recording clients: delivery is the
client's business, not the router's."""

from __future__ import annotations

import time

import pytest

from node import crossaccount
from node.account import Account
from node.accountconf import parse_accounts_config
from node.config import parse_config
from node.crossaccount import RESPONSE_PREFIX, Router
from node.message import Message, Subscription
from node.sublist import SubList

CONFIG = """
accounts {
  A: { exports: [{service: "one"}, {service: "many", response_type: stream, threshold: "1s"}] }
  B: { imports: [{service: {account: A, subject: "one"}}, {service: {account: A, subject: many}}] }
}
"""


class Recorder:
    echo = True
    no_responders = False

    def __init__(self) -> None:
        self.got: list[Message] = []

    def deliver(self, sub: Subscription, msg: Message) -> bool:
        self.got.append(msg)
        return True


def _world() -> tuple[Router, dict[str, Account], Recorder, Recorder]:
    conf = parse_accounts_config(parse_config(CONFIG))
    accounts = {name: Account(name) for name in conf.accounts}
    router = Router(conf, accounts)
    for account in accounts.values():
        account.router = router
    server, requester = Recorder(), Recorder()
    accounts["A"].subscribe(Subscription(">", None, "1", server))
    accounts["B"].subscribe(Subscription("inbox.>", None, "2", requester))
    return router, accounts, server, requester


def _request(accounts: dict[str, Account], server: Recorder, subject: str) -> str:
    accounts["B"].publish(None, subject, "inbox.1", None, b"q")
    reply = server.got[-1].reply
    assert reply is not None and reply.startswith(RESPONSE_PREFIX)
    return reply


def test_singleton_reply_passes_once() -> None:
    _, accounts, server, requester = _world()
    reply = _request(accounts, server, "one")
    for _ in range(3):
        accounts["A"].publish(None, reply, None, None, b"r")
    assert [m.subject for m in requester.got] == ["inbox.1"]


def test_stream_replies_pass_until_the_threshold() -> None:
    router, accounts, server, requester = _world()
    reply = _request(accounts, server, "many")
    for _ in range(3):
        accounts["A"].publish(None, reply, None, None, b"r")
    assert len(requester.got) == 3
    router.responses[reply].deadline = time.monotonic() - 0.001  # the threshold passed
    accounts["A"].publish(None, reply, None, None, b"late")
    assert len(requester.got) == 3 and reply not in router.responses


def test_open_reply_routes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crossaccount, "MAX_PENDING_RESPONSES", 5)
    router, accounts, server, _ = _world()
    for _ in range(20):
        _request(accounts, server, "one")  # never answered
    assert len(router.responses) <= 5


def test_plain_account_needs_no_router() -> None:
    router, _, _, _ = _world()
    assert router.needs_router("A") and router.needs_router("B")
    assert not router.needs_router("$G")


STREAMS = """
accounts {
  A: { exports: [{stream: "ev.>"}] }
  B: { imports: [{stream: {account: A, subject: "ev.>"}}] }
  C: { imports: [{stream: {account: A, subject: "ev.>"}, prefix: "from"}] }
}
"""


def test_a_subject_that_reached_nobody_reaches_a_later_subscriber() -> None:
    """A publish that reached nobody is remembered (the cheap path for exporters nobody
    listens to); any new subscription, in the exporter or in any importer, ends that."""
    conf = parse_accounts_config(parse_config(STREAMS))
    accounts = {name: Account(name) for name in conf.accounts}
    router = Router(conf, accounts)
    for account in accounts.values():
        account.router = router
    for _ in range(2):
        assert accounts["A"].publish(None, "ev.1", None, None, b"nobody") == 0
    assert router._plans[accounts["A"]]["ev.1"].quiet == SubList.changes  # remembered
    c = Recorder()
    accounts["C"].subscribe(Subscription("from.ev.1", None, "1", c))
    assert accounts["A"].publish(None, "ev.1", None, None, b"c") == 1
    a = Recorder()
    sub = Subscription("ev.*", None, "2", a)
    accounts["A"].subscribe(sub)
    assert accounts["A"].publish(None, "ev.1", None, None, b"a") == 2
    accounts["A"].unsubscribe(sub)
    assert accounts["A"].publish(None, "ev.1", None, None, b"c again") == 1
    assert [m.payload for m in c.got] == [b"c", b"a", b"c again"]
    assert [m.payload for m in a.got] == [b"a"]


def test_ack_subjects_keep_no_routing_plan() -> None:
    """Each `$JS.ACK.` subject is used by one message: routed (the subscriber gets it), but
    neither a routing plan nor a match cache entry is kept for it, while a subject that
    repeats keeps its plan."""
    router, accounts, server, _requester = _world()
    acks = [f"$JS.ACK.S.C.1.{i}.{i}.1795781188746700360.0" for i in range(1, 4)]
    for subject in acks:
        assert accounts["A"].publish(None, subject, None, None, b"+ACK") == 1
    accounts["A"].publish(None, "ev.1", None, None, b"x")
    assert [m.subject for m in server.got] == [*acks, "ev.1"]
    plans = router._plans[accounts["A"]]
    assert set(plans) == {"ev.1"}
    assert not any(s in accounts["A"].sublist._cache for s in acks)

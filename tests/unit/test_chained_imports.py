"""Chained service imports in node/crossaccount.py's Router: a request never
comes back into an account it passed, even where validation was bypassed and
the accounts import from each other (config and JWT loading refuse such cycles;
the router must not rely on that)."""

from __future__ import annotations

from node.account import Account
from node.accountconf import AccountConfig, AccountsConfig, ServiceExport, ServiceImport
from node.crossaccount import Router
from node.message import Message, Subscription


class Recorder:
    echo = True
    no_responders = False

    def __init__(self) -> None:
        self.got: list[Message] = []

    def deliver(self, sub: Subscription, msg: Message) -> bool:
        self.got.append(msg)
        return True


def test_a_cycle_of_service_imports_delivers_once_per_account() -> None:
    conf = AccountsConfig()
    for name, other in (("A", "B"), ("B", "A")):
        conf.accounts[name] = AccountConfig(
            name, service_exports=[ServiceExport("svc")],
            service_imports=[ServiceImport(other, "svc")])
    accounts = {name: Account(name) for name in conf.accounts}
    router = Router(conf, accounts)
    for account in accounts.values():
        account.router = router
    seen = {name: Recorder() for name in accounts}
    for name, account in accounts.items():
        account.subscribe(Subscription("svc", None, "1", seen[name]))
    accounts["A"].publish(None, "svc", "inbox", None, b"q")
    # B receives it through A's import; it is not sent back into A by B's import.
    assert len(seen["B"].got) == 1
    assert len(seen["A"].got) == 1  # A's own subscriber, once

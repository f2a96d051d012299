"""One route copy per peer for a publish that reaches several accounts. Pure.

A message published in an account that exports it as a stream reaches the
importers' subscribers too. Across a cluster it crosses each route ONCE, in the
exporter's account, and the receiving node applies the imports itself
(crossaccount.Router.deliver_imported), as nats-server forwards it: there an
importer's subscription is a shadow subscription in the exporter. A traced
message's events show it (the peer records the `se`), and no peer gets a copy per
account.
"""

from __future__ import annotations

from typing import Any

from node import msgtrace

# An importer's queue group in the queue list of a copy sent in the exporter's account.
IMPORTER_QUEUE = "\x00"


class Fanout:
    """The route copies of one publish in an exporting account (`routes`, its
    node/cluster/service.py AccountRoutes): each account's local delivery `add`s the peers its
    interest needs, then `send` sends one copy per peer in the exporter's account.
    An importer's queue group travels as
    `<importer>` NUL `<group>` (no account or queue name holds a NUL)."""

    __slots__ = ("routes", "targets")

    def __init__(self, routes: Any) -> None:
        self.routes = routes
        self.targets: dict[int, list[str]] = {}

    def add(self, routes: Any, subject: str, served: Any,
            match_subject: str | None = None) -> None:
        found = routes.remote.targets(routes.name, match_subject or subject, served)
        own = routes.name == self.routes.name
        for peer, queues in found.items():
            have = self.targets.setdefault(peer, [])
            have.extend(queues if own else [routes.name + IMPORTER_QUEUE + q for q in queues])

    def send(self, subject: str, reply: str | None, headers: bytes | None,
             payload: bytes, match_subject: str | None = None) -> int:
        if not self.targets:
            return 0
        mt = msgtrace.active if headers is not None else None
        if mt is not None:
            return self.routes.send_traced(mt, self.targets, subject, reply, headers, payload,
                                           match_subject)
        return self.routes.send(self.targets, subject, reply, headers, payload, match_subject)


def importer_queues(queues: Any, importer: str) -> list[str]:
    """The queue groups of `importer` in a Fanout copy's queue list."""
    mark = importer + IMPORTER_QUEUE
    return [q[len(mark):] for q in queues if q.startswith(mark)]

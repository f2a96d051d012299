"""What happens to a publish in an account that is not plain: subject
mappings, stream exports, service imports and the replies they route back.

An account without mappings, imports or exports has no `Router` and keeps
the fast path (`Account.fast_publisher`); every other account hands each
publish here (`Account.publish`). The order follows nats-server:

1. the account's mapping rewrites the subject, once, before any matching;
2. a reply to a service import (`_R_.<token>`, made in step 3) goes back to
   the requester's account on the requester's own reply subject;
3. a service import covering the subject forwards the request to the
   exporting account, its reply replaced by a fresh `_R_.<token>`;
4. the account's own subscribers receive it;
5. each stream import of the subject delivers it in the importing account.

Deliveries into another account go to that account's subscribers only; a
request follows chained service imports (A imports from B, which imports it
from C) at most MAX_SERVICE_HOPS deep and never back into an account it
passed, so no configuration can make it loop.
"""

from __future__ import annotations

import random
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from node import msgtrace
from node.accountconf import AccountsConfig, ImportIndex, ResponseType, ServiceRoute
from node.fanout import importer_queues
from node.jetstream.domain import merged
from node.mapping import MappingTable
from node.sublist import UNIQUE_HEAD, SubList

if TYPE_CHECKING:
    from node.account import Account

RESPONSE_PREFIX = "_R_."
# Subjects each used by one message: no routing plan is kept for them (it would only push
# out the plans of subjects that repeat).
_ONCE = (RESPONSE_PREFIX, UNIQUE_HEAD)
# nats-server keeps a streamed or chunked response route open this long
# unless the export names a response_threshold.
DEFAULT_RESPONSE_TTL = 120.0
# Bound on routes waiting for a reply: the oldest go first (a requester that
# never gets its singleton reply must not grow the table forever).
MAX_PENDING_RESPONSES = 100_000
# Service imports followed for one request (A -> B -> C ...).
MAX_SERVICE_HOPS = 8
# Routing plans remembered per account (the account's table is cleared when full).
PLANS_MAX = 4096


@dataclass
class ResponseRoute:
    """Where replies published on one `_R_.` subject go back to."""

    account: Account
    reply: str
    singleton: bool
    deadline: float


class _Plan:
    """Where a publish on one subject in one account goes beyond the account itself."""

    __slots__ = ("service", "deliveries", "quiet")

    def __init__(self, service: ServiceRoute | None,
                 deliveries: tuple[tuple[Account, str], ...]) -> None:
        self.service = service  # the service import serving it, if any
        self.deliveries = deliveries  # (importer, subject there) per stream import
        # SubList.changes when a publish reached nobody (valid until any subscription
        # changes); -1: not quiet; -2: never (a random transform takes part).
        self.quiet = -1


class Router:
    """Cross-account routing for every non-plain account of one server."""

    def __init__(self, conf: AccountsConfig, accounts: dict[str, Account],
                 cluster: str | None = None, rng: random.Random | None = None,
                 domain_table: MappingTable | None = None) -> None:
        self.conf = conf
        # The JetStream domain's mappings (node/jetstream/domain.py), which every account
        # gets after its own; per account, its own table merged with them.
        self.domain_table = domain_table or MappingTable()
        self._merged: dict[str, tuple[MappingTable | None, MappingTable | None]] = {}
        self.index = ImportIndex(conf)
        self.accounts = accounts
        self.cluster = cluster
        self.rng = rng or random.Random()
        self.responses: OrderedDict[str, ResponseRoute] = OrderedDict()
        # account -> subject -> _Plan: where a publish goes, memoised for this config.
        self._plans: dict[Account, dict[str, _Plan]] = {}

    def needs_router(self, name: str) -> bool:
        """Whether publishes in account `name` need more than its sublist (the domain's
        mappings alone do not: `Account.domain_prefix` routes only what they could map)."""
        if self.conf.mappings_for(name):
            return True
        acc = self.conf.accounts.get(name)
        if acc is None:
            return False
        return bool(acc.stream_imports or acc.service_imports or acc.stream_exports
                    or acc.service_exports)

    def mappings_of(self, account: Account) -> MappingTable | None:
        """The account's mappings, followed by the domain's (merged once per table)."""
        own: MappingTable | None = account.mappings
        if not self.domain_table:
            return own
        hit = self._merged.get(account.name)
        if hit is None or hit[0] is not own:
            hit = self._merged[account.name] = (own, merged(own, self.domain_table))
        return hit[1]

    # ------------------------------------------------------------------ publish

    def mapped(self, account: Account, subject: str) -> str:
        """The subject a publish on `subject` in `account` is routed on: its mapping
        applied, once (a weighted mapping draws at random). A publisher's permissions
        apply to this subject, as nats-server checks them after mapping; its publish
        then goes through `publish(..., premapped=True)`."""
        mappings = self.mappings_of(account)
        if mappings:
            out = mappings.apply(subject, self.rng, cluster=self.cluster)
            if out is not None:
                return out
        return subject

    def publish(self, account: Account, publisher: Any, subject: str, reply: str | None,
                headers: bytes | None, payload: bytes, premapped: bool = False) -> int:
        if headers is not None and msgtrace.active is not None:
            return self._publish_traced(msgtrace.active, account, publisher, subject, reply,
                                        headers, payload, premapped)
        mappings = self.mappings_of(account)
        if mappings and not premapped:
            mapped = mappings.apply(subject, self.rng, cluster=self.cluster)
            if mapped is not None:
                subject = mapped
        plans = self._plans.get(account)
        if plans is None:
            plans = self._plans[account] = {}
        plan = plans.get(subject)
        if plan is None:
            plan = self._plan(account, subject, plans)
        if plan.quiet == SubList.changes:
            count = 0  # nobody listens here or in an importer, and no service import
        else:
            count = self._route(plan, account, publisher, subject, reply, headers, payload,
                                not mappings)
        if count == 0 and reply and publisher is not None and publisher.no_responders:
            publisher.send_no_responders(subject, reply)
        return count

    def _plan(self, account: Account, subject: str, plans: dict[str, _Plan]) -> _Plan:
        """Where a publish on `subject` in `account` goes across accounts. Kept (in
        `plans`, this Router's: a config change builds a new Router) unless a random
        transform took part, which must be drawn again for each message."""
        service = self.index.service_route(account.name, subject)
        deliveries = []
        for delivery in self.index.stream_deliveries(account.name, subject):
            importer = self.accounts.get(delivery.account)
            if importer is not None:
                deliveries.append((importer, delivery.subject))
        plan = _Plan(service, tuple(deliveries))
        if self.index.settled(account.name, subject) \
                and not subject.startswith(_ONCE):  # a reply's token, an ack: used once
            if len(plans) >= PLANS_MAX:
                plans.clear()
            plans[subject] = plan
        else:
            plan.quiet = -2  # never remembered as quiet either
        return plan

    def _route(self, plan: _Plan, account: Account, publisher: Any, subject: str,
               reply: str | None, headers: bytes | None, payload: bytes,
               may_quiet: bool) -> int:
        """Steps 2-5 for one subject; a plan that reached nobody is remembered as quiet
        (`plan.quiet`) until any subscription changes, when nothing random took part."""
        count = 0
        if subject.startswith(RESPONSE_PREFIX):
            count += self._respond(publisher, subject, headers, payload)
            may_quiet = False
        if plan.service is not None:
            count += self._follow(account, publisher, subject, reply, headers, payload,
                                  plan.service, {account.name})
            may_quiet = False
        routes = account.routes
        fanout = routes.fanout() if routes is not None and plan.deliveries else None
        count += account.deliver_local(publisher, subject, reply, headers, payload, fanout)
        for importer, local in plan.deliveries:
            count += importer.deliver_local(publisher, local, reply, headers, payload, fanout)
        if fanout is not None:
            count += fanout.send(subject, reply, headers, payload)
        if count == 0 and may_quiet and plan.quiet != -2 and account.routes is None \
                and all(importer.routes is None for importer, _ in plan.deliveries):
            # Remote interest arrives without a local subscription change: clustered
            # accounts (routes) are never remembered as quiet.
            plan.quiet = SubList.changes
        return count

    def _publish_traced(self, mt: msgtrace.MsgTrace, account: Account, publisher: Any,
                        subject: str, reply: str | None, headers: bytes,
                        payload: bytes, premapped: bool = False) -> int:
        """`publish` for a traced message, step for step, recording the mapping,
        the service import and each stream export. The trace ends at an account
        boundary: the exporter receives the request with the trace disabled, the
        importer its copy untraced (so neither adds egress events) unless the export
        (service) or the import (stream) has `allow_trace`, and a trace-only message
        crosses no boundary the trace does not follow. A crossing it did not
        make counts for nothing: a trace-only request that only a service
        import would serve gets no-responders, as nats-server answers it."""
        mappings = self.mappings_of(account)
        if mappings and not premapped:  # premapped: the client recorded the `sm`
            mapped = mappings.apply(subject, self.rng, cluster=self.cluster)
            if mapped is not None:
                if mapped != subject:
                    mt.mapping(mapped)
                subject = mapped
        count = 0
        if subject.startswith(RESPONSE_PREFIX):
            count += self._untraced(self._respond, publisher, subject, headers, payload)
        service = self.index.service_route(account.name, subject)
        if service is not None and service.account != account.name \
                and self.accounts.get(service.account) is not None:
            mt.service_import(service.account, subject, service.subject)
            if service.export.allow_trace:
                # The trace goes on in the exporter (its egress events); a trace-only
                # request opens no response route.
                count += self._serve(account, publisher, subject, None if mt.only else reply,
                                     self._trace_return(account, mt, headers, service.export),
                                     payload)
            elif not mt.only:
                count += self._untraced(self._serve, account, publisher, subject, reply,
                                        msgtrace.disabled_headers(headers), payload)
        deliveries = self.index.stream_deliveries(account.name, subject)
        routes = account.routes
        fanout = routes.fanout() if routes is not None and deliveries else None
        count += account.deliver_local(publisher, subject, reply, headers, payload, fanout)
        for delivery in deliveries:
            importer = self.accounts.get(delivery.account)
            if importer is not None:
                count += self._exported(mt, delivery, importer.deliver_local, publisher,
                                        delivery.subject, reply, headers, payload, fanout)
        if fanout is not None:
            count += fanout.send(subject, reply, headers, payload)
        if count == 0 and reply and publisher is not None and publisher.no_responders:
            publisher.send_no_responders(subject, reply)
        return count

    @staticmethod
    def _exported(mt: msgtrace.MsgTrace, delivery: Any, step: Any, *args: Any) -> int:
        """One stream import's delivery of a traced message: each importer
        subscription reached records a `se` (node/account.py `_traced_delivery`), and
        with allow_trace its egress, naming the subscription in the exporter's
        subjects (nats-server's shadow subscription)."""
        mt.export = delivery
        if delivery.allow_trace:
            mt.shadow = delivery.source.exporter_subject if delivery.source else None
        try:
            return int(step(*args))
        finally:
            mt.export = mt.shadow = None

    def deliver_imported(self, account: Account, publisher: Any, subject: str,
                         reply: str | None, headers: bytes | None, payload: bytes,
                         queues: Any, match_subject: str | None = None) -> int:
        """A publish in `account` that a peer forwarded (node/fanout.py): each stream
        import of it delivers here too, to this node's subscribers in the importer (and
        the importer's queue groups the peer chose this node for). A JetStream delivery
        (`match_subject`: its route, `deliver_as`) keeps showing its stored subject.
        The plan lookup is `publish`'s (inlined there: the hot path makes no call)."""
        route = match_subject or subject
        plans = self._plans.get(account)
        if plans is None:
            plans = self._plans[account] = {}
        plan = plans.get(route)
        if plan is None:
            plan = self._plan(account, route, plans)
        if not plan.deliveries:
            return 0
        mt = msgtrace.active if headers is not None else None
        count = 0
        if mt is None:
            for importer, local in plan.deliveries:
                shown, via = (subject, local) if match_subject else (local, None)
                count += importer.deliver_routed(publisher, shown, reply, headers, payload,
                                                 importer_queues(queues, importer.name), via,
                                                 False)
            return count
        for delivery in self.index.stream_deliveries(account.name, route):
            importer = self.accounts.get(delivery.account)
            if importer is not None:
                shown, via = (subject, delivery.subject) if match_subject \
                    else (delivery.subject, None)
                count += self._exported(mt, delivery, importer.deliver_routed, publisher,
                                        shown, reply, headers, payload,
                                        importer_queues(queues, importer.name), via, False)
        return count

    def _trace_return(self, account: Account, mt: msgtrace.MsgTrace, headers: bytes,
                      export: Any) -> bytes:
        """The exporter's copy of a traced request names, as its trace destination,
        a fresh `_R_.` subject in the exporter that leads back to the destination in
        the requester's account, as nats-server does: a node the copy reaches over a
        route publishes its own document there, in the exporter's account, and it
        comes back like a reply (through `_respond` / `deliver_response`)."""
        now = time.monotonic()
        self._prune(now)
        ttl = export.response_threshold or DEFAULT_RESPONSE_TTL
        token = self._new_response_subject()
        self.responses[token] = ResponseRoute(account, mt.dest, False, now + ttl)
        return msgtrace.with_dest(headers, token)

    @staticmethod
    def _untraced(step: Any, *args: Any) -> int:
        """Run one routing step beyond the trace's reach, then resume tracing."""
        mt = msgtrace.active
        msgtrace.active = None
        try:
            return int(step(*args))
        finally:
            msgtrace.active = mt

    def _respond(self, publisher: Any, subject: str, headers: bytes | None,
                 payload: bytes) -> int:
        """A reply on a `_R_.` subject back to the requester: a chained import's reply
        passes back through each exporter's own response route until it reaches the
        requester's reply subject."""
        route = self._requester(subject)
        if route is None:
            return 0
        return route.account.deliver_local(publisher, route.reply, None, headers, payload)

    def _requester(self, subject: str, consume: bool = True) -> ResponseRoute | None:
        """The requester's end of the response route `subject`, through each exporter's
        own route of a chained import (`consume`: a singleton route is used up)."""
        route = self._response_route(subject, consume)
        for _ in range(MAX_SERVICE_HOPS):
            if route is None or not route.reply.startswith(RESPONSE_PREFIX):
                break
            back = self._response_route(route.reply, consume)
            if back is None:
                break
            route = back
        return route

    def deliver_as(self, account: Account, publisher: Any, route: str, subject: str,
                   reply: str | None, headers: bytes | None, payload: bytes) -> int:
        """A JetStream delivery (routed by `route`, showing the stored `subject`) from
        `account`: to a requester in another account when `route` is a service import's
        response subject (a pull request made through an import), else to `account`'s
        subscribers and those of every account importing `route` as a stream (a push
        consumer's deliver subject exported), as nats-server delivers them."""
        if route.startswith(RESPONSE_PREFIX):
            back = self._requester(route)
            if back is not None:
                return back.account.deliver_as_local(publisher, back.reply, subject, reply,
                                                     headers, payload)
            # opened on another node (the request came in there): its peer answers it
            return account.deliver_as_local(publisher, route, subject, reply, headers, payload)
        deliveries = self.index.stream_deliveries(account.name, route)
        routes = account.routes
        # One copy per peer, in this account; the peer applies the imports (node/fanout.py).
        fanout = routes.fanout() if routes is not None and deliveries else None
        count = account.deliver_as_local(publisher, route, subject, reply, headers, payload,
                                         fanout)
        for delivery in deliveries:
            importer = self.accounts.get(delivery.account)
            if importer is not None:
                count += importer.deliver_as_local(publisher, delivery.subject, subject, reply,
                                                   headers, payload, fanout)
        if fanout is not None:
            count += fanout.send(subject, reply, headers, payload, route)
        return count

    def importers_interested(self, account: Account, subject: str) -> bool:
        """Whether another account listens on `subject` of `account`: the requester of a
        service import's response subject, or an account importing it as a stream."""
        if subject.startswith(RESPONSE_PREFIX):
            back = self._requester(subject, consume=False)
            return back is not None and back.account.has_own_interest(back.reply)
        for delivery in self.index.stream_deliveries(account.name, subject):
            importer = self.accounts.get(delivery.account)
            if importer is not None and importer.has_own_interest(delivery.subject):
                return True
        return False

    def _serve(self, account: Account, publisher: Any, subject: str, reply: str | None,
               headers: bytes | None, payload: bytes) -> int:
        """Follow service imports: A's request goes to B; if B imports that subject
        in turn (a chained import), on to C, each hop with its own `_R_.` reply,
        at most MAX_SERVICE_HOPS deep (config cycles are refused at load anyway).
        Each exporter's own subscribers receive the request on its way."""
        service = self.index.service_route(account.name, subject)
        if service is None:
            return 0  # the usual case, decided before anything is allocated
        return self._follow(account, publisher, subject, reply, headers, payload, service,
                            {account.name})

    def _follow(self, account: Account, publisher: Any, subject: str, reply: str | None,
                headers: bytes | None, payload: bytes, service: ServiceRoute | None,
                seen: set[str]) -> int:
        """`_serve`'s walk from `service` on. A traced request gets an `si` event for
        each further hop of a chain; past an export without `allow_trace` the rest of
        the chain gets it untraced, with its destination disabled (as nats-server)."""
        count = 0
        mt = msgtrace.active if headers is not None else None
        for hop in range(MAX_SERVICE_HOPS):
            if hop:
                service = self.index.service_route(account.name, subject)
            if service is None or service.account in seen:
                break
            target = self.accounts.get(service.account)
            if target is None:
                break
            if hop and mt is not None and headers is not None:
                mt.service_import(service.account, subject, service.subject)
                if not service.export.allow_trace:
                    if mt.only:
                        break
                    return count + self._untraced(
                        self._follow, account, publisher, subject, reply,
                        msgtrace.disabled_headers(headers), payload, service, seen)
            reply = self._open_response(account, reply, service.export) if reply else None
            subject = service.subject
            seen.add(target.name)
            count += target.deliver_local(publisher, subject, reply, headers, payload)
            account = target
        return count

    # ------------------------------------------------------------------ responses

    def deliver_response(self, publisher: Any, route: str, subject: str, reply: str | None,
                         headers: bytes | None, payload: bytes) -> int:
        """A `_R_.` reply that came in over a route (the responder is on another
        node): back to the requester's account if this node opened that route. A plain
        reply (`subject` is `route`) arrives on the requester's reply subject; a
        JetStream delivery keeps its own subject and ack reply."""
        back = self._response_route(route)
        if back is None:
            return 0
        if subject == route:
            return back.account.deliver_local(publisher, back.reply, None, headers, payload)
        return back.account.deliver_as_local(publisher, back.reply, subject, reply, headers,
                                             payload)

    def _open_response(self, requester: Account, reply: str, export: Any) -> str:
        """A fresh subject in the exporter that leads back to `reply` in the
        requester's account."""
        now = time.monotonic()
        self._prune(now)
        token = self._new_response_subject()
        ttl = export.response_threshold or DEFAULT_RESPONSE_TTL
        singleton = export.response_type is ResponseType.SINGLETON
        self.responses[token] = ResponseRoute(requester, reply, singleton, now + ttl)
        return token

    @staticmethod
    def _new_response_subject() -> str:
        return RESPONSE_PREFIX + secrets.token_urlsafe(12).replace("-", "a").replace("_", "b")

    def _response_route(self, subject: str, consume: bool = True) -> ResponseRoute | None:
        route = self.responses.get(subject)
        if route is None:
            return None
        if route.deadline < time.monotonic():
            del self.responses[subject]
            return None
        if route.singleton and consume:
            del self.responses[subject]  # one reply only: a second is dropped
        return route

    def _prune(self, now: float) -> None:
        responses = self.responses
        while responses:
            key, route = next(iter(responses.items()))
            if route.deadline >= now and len(responses) < MAX_PENDING_RESPONSES:
                return
            del responses[key]

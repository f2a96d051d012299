"""An account: one subject space, and the one place a publish is processed.

Every publish in the node, from a network client or an internal one, goes
through `Account.publish` (or its fast path, `fast_publisher`): match the
account's sublist, deliver to each plain subscriber, give each queue group
to one member that may receive the message, answer no-responders when
nobody did, and reap auto-unsubscribed subscriptions afterwards. Changes to
the sublist go through `subscribe`/`unsubscribe`, which is where interest
changes are announced (to routes: node/cluster/).

In a cluster, `routes` (node/cluster/service.py AccountRoutes) forwards each
publish made on this node to the peers with interest, once per peer, after
local delivery. A queue group gets one member of the whole cluster, chosen
uniformly over its members (a peer weighs by its member count), as a
nats-server 2.15 cluster does; a group served here is not offered to peers,
and one no local member took goes to one peer. A message that came in over a
route (`deliver_routed`) reaches local subscribers only and never goes out
again (the one-hop rule).

An account with subject mappings, imports or exports has a `router`
(node/crossaccount.py) that every publish goes through instead; a plain
account (such as `$G` without mappings) never pays for it. Users outside any
configured account live in the global account `$G`, as in nats-server.

Delivery is the subscriber's business (`client.deliver(sub, msg) -> bool`):
False means it may not receive the message (closed, or its permissions deny
the subject), and the message then counts as not delivered to it. Internal
subscribers queue the message and run later, never on the publisher's stack.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from node import msgtrace
from node.message import Message, Subscription
from node.sublist import SubList

GLOBAL_ACCOUNT = "$G"

# Called with (subscription, +1 or -1) when a subscription enters or leaves the account.
InterestListener = Callable[[Subscription, int], None]


class Account:
    """A named subject space with its own sublist."""

    def __init__(self, name: str, limits: Any = None, mappings: Any = None) -> None:
        self.name = name
        self.set_limits(limits, mappings)
        self.connections = 0  # network clients logged into this account
        self.remote_connections = 0  # on other nodes (cluster gossip; limited accounts only)
        # Set when mappings, imports or exports apply here (node/crossaccount.py):
        # publishes then go through it, and the fast path stays off.
        self.router: Any = None
        # A JetStream domain's prefix (`$JS.<domain>.API.`) when it is the only mapping
        # here: publishes under it go through `domain_router`, every other one keeps the
        # fast path (node/jetstream/domain.py).
        self.domain_prefix: str | None = None
        self.domain_router: Any = None
        self.sublist = SubList()  # never rebound: the bound methods below stay valid
        self._match = self.sublist.match
        self._cached = self.sublist.cached
        # Auto-unsubscribed while a delivery loop may still hold them: removed after it.
        self.expired: list[Subscription] = []
        self.interest_listeners: list[InterestListener] = []
        self.routes: Any = None  # node/cluster AccountRoutes when clustered
        self.in_msgs = self.in_bytes = 0  # publishes that entered this account
        # accountconf.MsgTraceConfig: messages with a sampled `traceparent` are traced.
        self.msg_trace: Any = None

    def set_limits(self, limits: Any, mappings: Any) -> None:
        """Per-connection limits from the account config (nats-server applies
        max_subscriptions and max_payload to each client); -1 = none."""
        self.max_connections = getattr(limits, "max_connections", -1)
        self.max_subscriptions = getattr(limits, "max_subscriptions", -1)
        self.max_payload = getattr(limits, "max_payload", -1)
        self.mappings = mappings

    def __repr__(self) -> str:
        return f"Account({self.name!r})"

    # ------------------------------------------------------------------ interest

    def subscribe(self, sub: Subscription) -> None:
        self.sublist.insert(sub)
        for listener in self.interest_listeners:
            listener(sub, 1)

    def unsubscribe(self, sub: Subscription) -> None:
        if self.sublist.remove(sub):
            for listener in self.interest_listeners:
                listener(sub, -1)

    def unsubscribe_all(self, subs: list[Subscription]) -> None:
        """A client went away: drop its subscriptions in one pass."""
        self.sublist.remove_batch(subs)
        for listener in self.interest_listeners:
            for sub in subs:
                listener(sub, -1)

    def expire(self, sub: Subscription) -> None:
        """Auto-unsubscribe reached: removed after the current delivery loop,
        because the loop may be iterating the very list holding `sub`."""
        sub.dead = True
        self.expired.append(sub)

    def reap(self) -> None:
        expired, self.expired = self.expired, []
        for sub in expired:
            owner_subs = getattr(sub.client, "subs", None)
            if owner_subs is not None and owner_subs.get(sub.sid) is sub:
                del owner_subs[sub.sid]
            self.unsubscribe(sub)

    def has_interest(self, subject: str) -> bool:
        """Whether a publish on `subject` would reach anyone, here or (in a
        cluster) on a peer that announced interest."""
        if self.has_own_interest(subject):
            return True
        router = self.router
        return router is not None and router.importers_interested(self, subject)

    def has_own_interest(self, subject: str) -> bool:
        """`has_interest` without the accounts that import `subject` from this one."""
        if self.sublist.has_interest(subject):
            return True
        routes = self.routes
        return routes is not None and routes.has_interest(subject)

    def subscription_count(self) -> int:
        return self.sublist.count()

    # ------------------------------------------------------------------ publish

    def fast_publisher(self, client: Any) -> Callable[[str, str | None, bytes], None]:
        """The parser's PUB callback for `client` while it is in this account:
        the hottest code in the node, hence a closure (one call per PUB).

        It publishes here only while `client.fast_account` is this account, that
        is with no per-message checks to make (permissions, verbose, pedantic,
        tracing); otherwise it hands the PUB back (`client.on_pub_checked`), whose
        checks end in `publish`. An account with a router (mappings, imports,
        exports) hands the PUB to it, as `publish` would. With exactly one plain
        subscriber that is a
        network client, the MSG goes straight into its buffer and no Message is
        framed; every other case is `publish`'s. Both paths apply the same
        delivery and no-responders rules (`deliver_direct` also says whether
        the subscriber may receive)."""
        account = self
        sublist = self.sublist
        cached = sublist.cached
        match = self._match
        deliver = self._deliver
        checked = client.on_pub_checked

        # The defaults are not parameters anyone passes: they make the closure's
        # names local variables, the cheapest lookup CPython has.
        def on_pub(subject: str, reply: str | None, payload: bytes, client: Any = client,
                   account: Account = account, cached: Any = cached, sublist: Any = sublist,
                   match: Any = match, deliver: Any = deliver, checked: Any = checked) -> None:
            if client.fast_account is not account:
                checked(subject, reply, None, payload)
                return
            client.in_msgs += 1
            client.in_bytes += len(payload)
            router = account.router  # read per message: a reload may add or drop it
            if router is not None:
                router.publish(account, client, subject, reply, None, payload)
                return
            prefix = account.domain_prefix
            if prefix is not None and subject.startswith(prefix):
                account.domain_router.publish(account, client, subject, reply, None, payload)
                return
            # SubList.match's cache lookup, without its call.
            result = cached(subject)
            if result is None:
                result = match(subject)
            else:
                sublist.hits += 1
            psubs = result.psubs
            if not result.qsubs:
                if not psubs:
                    if account.routes is None:  # nobody anywhere (what _deliver would find)
                        if reply and client.no_responders:
                            client.send_no_responders(subject, reply)
                        return
                elif len(psubs) == 1:
                    sub = psubs[0]
                    if sub.direct and not sub.dead and (client.echo
                                                        or sub.client is not client):
                        ok = sub.client.deliver_direct(sub, subject, reply, payload)
                    elif sub.inline and not sub.dead:  # an internal client, never `client`
                        ok = sub.client.deliver_inline(sub, subject, reply, payload)
                    else:
                        ok = None
                    if ok is not None:
                        routes = account.routes
                        if routes is not None and routes.forward(subject, reply, None, payload,
                                                                 ()):
                            ok = True
                        if not ok and reply and client.no_responders:
                            client.send_no_responders(subject, reply)
                        return
            deliver(result, client, subject, reply, None, payload)

        return on_pub

    def publish(self, publisher: Any, subject: str, reply: str | None,
                headers: bytes | None, payload: bytes, premapped: bool = False) -> int:
        """Deliver a message to every interested subscription; returns how many
        received it. `publisher` is the sending client (None: the server).
        `premapped`: the subject is already the account mapping's result
        (Router.mapped), which is then not applied again."""
        if self.router is not None:
            return self.router.publish(self, publisher, subject, reply, headers, payload,
                                       premapped)
        if self.domain_prefix is not None and subject.startswith(self.domain_prefix) \
                and not premapped:
            return self.domain_router.publish(self, publisher, subject, reply, headers, payload)
        result = self._match(subject)
        if headers is None and len(result.psubs) == 1 and not result.qsubs:
            sub = result.psubs[0]
            if sub.direct and not sub.dead and (publisher is None or publisher.echo
                                                or sub.client is not publisher):
                return self._deliver_one(sub, publisher, subject, reply, payload)
        return self._deliver(result, publisher, subject, reply, headers, payload)

    def _deliver_one(self, sub: Subscription, publisher: Any, subject: str, reply: str | None,
                     payload: bytes) -> int:
        """`_deliver` of a header-less message whose one local match is a plain subscription
        of a network client (a server's reply, such as a PubAck, to its requester): framed
        straight into that client's buffer, no shared Message, as the fast path does
        (`deliver_direct` makes the same permission and tracing checks, and reaps)."""
        count = 1 if sub.client.deliver_direct(sub, subject, reply, payload) else 0
        routes = self.routes
        if routes is not None and not getattr(publisher, "from_route", False):
            count += routes.forward(subject, reply, None, payload, ())
        if count == 0 and reply and publisher is not None and publisher.no_responders:
            publisher.send_no_responders(subject, reply)
        return count

    def deliver_as(self, publisher: Any, route: str, subject: str, reply: str | None,
                   headers: bytes | None, payload: bytes) -> int:
        """Deliver to the subscribers of `route` a message that shows `subject`: a
        JetStream delivery reaches a pull request's inbox with the stored message's own
        subject, as nats-server sends it. With a router it also crosses accounts: back
        through a service import's response route, and into a stream export's importers."""
        if self.router is not None:
            return self.router.deliver_as(self, publisher, route, subject, reply, headers,
                                          payload)
        return self.deliver_as_local(publisher, route, subject, reply, headers, payload)

    def deliver_as_local(self, publisher: Any, route: str, subject: str, reply: str | None,
                         headers: bytes | None, payload: bytes, fanout: Any = None) -> int:
        """`deliver_as` in this account only (and its peers in a cluster, or the peers
        it adds to `fanout`: see deliver_local)."""
        return self._deliver(self._match(route), publisher, subject, reply, headers, payload,
                             match_subject=route, fanout=fanout)

    def deliver_local(self, publisher: Any, subject: str, reply: str | None,
                      headers: bytes | None, payload: bytes, fanout: Any = None) -> int:
        """This account's subscribers only, without mappings, imports or
        no-responders: the router's step for each account a message reaches.
        `fanout` (node/cluster Fanout): the peers this account's interest needs are
        added to it instead of being sent their own copy (a stream export's publish
        crosses each route once, in the exporter's account)."""
        result = self._cached(subject)  # SubList.match's cache lookup, without its call
        if result is None:
            result = self._match(subject)
        else:
            self.sublist.hits += 1
        psubs = result.psubs
        if self.routes is None and not result.qsubs:
            if not psubs:
                return 0  # nobody here: nothing to frame, count or reap
            if headers is None and len(psubs) == 1:
                # One plain network subscriber: straight into its buffer, no Message framed
                # (as the fast path does; deliver_direct applies the same checks, reaping).
                sub = psubs[0]
                if sub.direct and not sub.dead and (publisher is None or publisher.echo
                                                    or sub.client is not publisher):
                    return 1 if sub.client.deliver_direct(sub, subject, reply, payload) else 0
        return self._deliver(result, publisher, subject, reply, headers, payload, False,
                             fanout=fanout)

    def _deliver(self, result: Any, publisher: Any, subject: str, reply: str | None,
                 headers: bytes | None, payload: bytes, answer: bool = True,
                 match_subject: str | None = None, fanout: Any = None) -> int:
        """`answer`: send no-responders when nobody received it (the router
        decides that once, over every account the message reached)."""
        if headers is not None and msgtrace.active is not None:
            return self._deliver_traced(msgtrace.active, result, publisher, subject, reply,
                                        headers, payload, answer, match_subject, fanout)
        psubs, qsubs = result.psubs, result.qsubs
        count = 0
        served: set[str] | tuple = ()
        if psubs or qsubs:
            # Framed once, and only if someone may want it.
            msg = Message(subject, reply, headers, payload)
            skip = publisher if (publisher is not None and not publisher.echo) else None
            for sub in psubs:
                if not sub.dead and sub.client is not skip and sub.client.deliver(sub, msg):
                    count += 1
            if qsubs:
                served = set()
                remote = self.routes.queue_weights(match_subject or subject) \
                    if self.routes is not None and not getattr(publisher, "from_route", False) \
                    else None
                for queue, members in qsubs.items():
                    if remote:
                        # One member of the whole cluster's group, chosen uniformly (peers
                        # weigh by their member count), as a nats-server cluster does.
                        r = remote.get(queue, 0)
                        if r and random.randrange(len(members) + r) >= len(members):
                            continue  # a peer's member takes it
                    if _deliver_to_group(members, skip, msg):
                        count += 1
                        served.add(queue)
            if self.expired:
                self.reap()
        routes = self.routes
        if routes is not None and not getattr(publisher, "from_route", False):
            if fanout is not None:
                fanout.add(routes, subject, served, match_subject)
            else:
                count += routes.forward(subject, reply, headers, payload, served, match_subject)
        if count == 0 and answer and reply and publisher is not None and publisher.no_responders:
            publisher.send_no_responders(subject, reply)
        return count


    def _deliver_traced(self, mt: msgtrace.MsgTrace, result: Any, publisher: Any,
                        subject: str, reply: str | None, headers: bytes, payload: bytes,
                        answer: bool, match_subject: str | None = None,
                        fanout: Any = None) -> int:
        """`_deliver` for a traced message: one egress event per subscription it
        reaches (with nats-server's error when it may not have it), and no
        delivery at all for a trace-only message, which still counts where it
        would have been delivered (a trace-only request then gets no
        no-responders, as from nats-server; Router._publish_traced differs).
        Peers get their copies through `routes.forward_traced`: one route egress
        event each, and a `Nats-Trace-Hop` header that makes them trace it too
        (trace-only copies included: the peer delivers nothing either)."""
        msg = Message(subject, reply, headers, payload)
        from_route = getattr(publisher, "from_route", False)
        routes = None if from_route else self.routes
        count = 0
        for sub in result.psubs:
            if not sub.dead and _traced_delivery(mt, sub, publisher, msg, None, self.name):
                count += 1
        served: set[str] = set()
        remote = routes.queue_weights(match_subject or subject) \
            if routes is not None and result.qsubs else None
        for queue, members in result.qsubs.items():
            n = len(members)
            r = remote.get(queue, 0) if remote else 0
            if r and random.randrange(n + r) >= n:
                continue  # a peer's member takes it (as in _deliver)
            if _traced_group_delivery(mt, members, publisher, msg, queue, self.name):
                count += 1
                served.add(queue)
        if self.expired:
            self.reap()
        if routes is not None:
            if fanout is not None:
                fanout.add(routes, subject, served, match_subject)
            else:
                count += routes.forward_traced(mt, subject, reply, headers, payload, served,
                                               match_subject)
        if count == 0 and answer and reply and publisher is not None and publisher.no_responders:
            publisher.send_no_responders(subject, reply)
        return count

    def deliver_routed(self, publisher: Any, subject: str, reply: str | None,
                       headers: bytes | None, payload: bytes, queues: Any,
                       match_subject: str | None = None, imports: bool = True) -> int:
        """A message a peer forwarded: every local plain subscriber, and one local
        member of each queue group in `queues` (the groups the peer chose this
        node for); then, in each account importing it (`imports`), the same
        (a peer forwards a stream export's publish in the exporter only).
        Never forwarded again, never answered with no-responders."""
        count = 0
        route = match_subject or subject
        router = self.router
        if router is not None:
            if route.startswith("_R_."):
                # A reply to a service import whose response route this node may hold (or
                # a JetStream delivery to it, which shows its stored subject: deliver_as).
                count += router.deliver_response(publisher, route, subject, reply, headers,
                                                  payload)
            if imports:
                count += router.deliver_imported(self, publisher, subject, reply, headers,
                                                 payload, queues, match_subject)
        result = self._match(route)
        psubs, qsubs = result.psubs, result.qsubs
        if not psubs and not (queues and qsubs):
            return count
        if headers is None and not queues and len(psubs) == 1:
            sub = psubs[0]
            if sub.direct and not sub.dead:  # a network client (never a local_only capture)
                # One plain subscriber, such as a requester awaiting a reply (a PubAck from
                # the stream leader): framed straight into its buffer, checks and reaping
                # included (deliver_direct).
                return count + (1 if sub.client.deliver_direct(sub, subject, reply, payload)
                                else 0)
        msg = Message(subject, reply, headers, payload)
        if headers is not None and msgtrace.active is not None:
            # A traced copy (node/cluster/service.py Cluster._deliver_traced).
            count += self._deliver_routed_traced(msgtrace.active, result, queues, publisher, msg)
        else:
            for sub in psubs:
                # A JetStream capture (local_only) took the message on the node it was
                # published on: a routed copy must not be stored twice.
                if not sub.dead and not sub.client.local_only and sub.client.deliver(sub, msg):
                    count += 1
            for queue in queues:
                members = qsubs.get(queue)
                if members and _deliver_to_group(members, None, msg):
                    count += 1
        if self.expired:
            self.reap()
        return count

    def _deliver_routed_traced(self, mt: msgtrace.MsgTrace, result: Any, queues: Any,
                               publisher: Any, msg: Message) -> int:
        count = 0
        for sub in result.psubs:
            if not sub.dead and not sub.client.local_only \
                    and _traced_delivery(mt, sub, publisher, msg, None, self.name):
                count += 1
        for queue in queues:
            members = result.qsubs.get(queue)
            if members and _traced_group_delivery(mt, members, publisher, msg, queue, self.name):
                count += 1
        return count


def _deliver_to_group(members: list, skip: Any, msg: Message) -> bool:
    """One member per queue group gets the message, chosen at random; a member
    that may not receive it (closed, or its permissions deny the subject) passes
    it on to the next, as in nats-server."""
    n = len(members)
    start = random.randrange(n) if n > 1 else 0
    for i in range(n):
        sub = members[(start + i) % n]
        if sub.dead or sub.client is skip:
            continue
        if sub.client.deliver(sub, msg):
            return True
    return False


def _traced_group_delivery(mt: msgtrace.MsgTrace, members: list, publisher: Any,
                           msg: Message, queue: str, account: str) -> bool:
    """One member of a queue group, traced; the next one when it may not have it."""
    n = len(members)
    start = random.randrange(n) if n > 1 else 0
    for i in range(n):
        sub = members[(start + i) % n]
        if not sub.dead and _traced_delivery(mt, sub, publisher, msg, queue, account):
            return True
    return False


def _traced_delivery(mt: msgtrace.MsgTrace, sub: Subscription, publisher: Any, msg: Message,
                     queue: str | None, account: str) -> bool:
    """Record the egress to `sub` and deliver unless the trace is trace-only. While a
    stream import delivers (`mt.export`), a `se` event comes first, as nats-server
    records one per importer subscription it reaches; an import without allow_trace
    gets the message untraced, with no egress event (nothing when trace-only)."""
    client = sub.client
    export = mt.export
    if export is not None:
        mt.stream_export(export.account, export.subject)
        if not export.allow_trace:
            return True if mt.only else bool(client.deliver(sub, msg))
    stream = getattr(sub.callback, "trace_stream", None)
    if stream is not None:  # a JetStream stream's capture: nats-server's `js` event
        mt.jetstream(stream, msg.subject)
        return True if mt.only else bool(client.deliver(sub, msg))
    kind = getattr(getattr(client, "kind", None), "value", "Client")
    name = (getattr(client, "opts", None) or {}).get("name") or ""
    cid = getattr(client, "cid", 0)
    error = None
    if publisher is not None and client is publisher and not publisher.echo:
        error = msgtrace.NO_ECHO
    elif getattr(client, "closed", False):
        error = msgtrace.CLIENT_CLOSED
    elif (perms := getattr(client, "perms", None)) is not None \
            and not perms.can_deliver(msg.subject):
        error = msgtrace.SUB_DENIED
    mt.egress(kind, cid, name, sub.subject, queue, error, account)
    if error is not None:
        return False
    return True if mt.only else bool(client.deliver(sub, msg))

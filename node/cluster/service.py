"""The cluster layer of a node (`server.cluster`): membership, routes, and
the one gRPC server on the cluster port that carries the Route service and
the Raft service (raft/transport_grpc.py, through `raft_transport()`).

Peers are found from the configured routes (seeds) and then by gossip: a
node learns every member its peers know and dials it, so configuring one
seed is enough. Each dialed address is first asked `Hello` (cluster name and
authorization are checked there); an address that turns out to be this node
is dropped, and a second address of an already linked peer waits until that
link fails. See docs/architecture.md, "A core message across nodes".
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from node import msgtrace
from node.cluster import frames, identity
from node.cluster.interest import Change, LocalInterest, RemoteInterest
from node.cluster.link import Link
from node.cluster.members import Member, MemberTable
from node.cluster.security import (
    SERVER_OPTIONS,
    AuthInterceptor,
    Authorizer,
    ChannelMaker,
    server_credentials,
)
from node.cluster.wire import (
    change_from_pb,
    change_to_pb,
    member_from_pb,
    member_to_pb,
    parse_route_url,
    public_host,
)
from node.crossaccount import RESPONSE_PREFIX
from node.fanout import Fanout
from proto import cluster_pb2 as pb
from proto import cluster_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from node.account import Account
    from raft.transport_grpc import GrpcTransport

Handler = Callable[[int, bytes], Awaitable[bytes]]
MemberCallback = Callable[[Member], None]
# A one-way message to a node (not to an account): peer, subject, reply, headers, payload, tag.
FrameHandler = Callable[[int, str, "str | None", "bytes | None", bytes, str], None]
# The account field of such a frame: a NUL (no account name has one) and then the kind.
NODE_FRAME = "\x00"

BACKOFF_MIN, BACKOFF_MAX = 0.1, 2.0
HELLO_TIMEOUT = 2.0
MAX_KIND = 128


class RequestError(Exception):
    """A node-to-node request failed: the peer answered with an error or is unreachable."""


class RoutePublisher:
    """The publisher of a message that came in over a route (one per peer):
    deliveries skip nothing, send no no-responders, and never go out again."""

    kind_name = "Router"
    echo = True
    no_responders = False
    from_route = True

    def __init__(self, peer: int) -> None:
        self.peer = peer

    def send_no_responders(self, subject: str, reply: str) -> None:  # never called
        pass


class AccountRoutes:
    """Attached to an Account as `account.routes`: forwards its publishes."""

    __slots__ = ("cluster", "name", "remote")

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.remote = cluster.remote

    def queue_weights(self, subject: str) -> dict[str, int]:
        """Queue group -> members on peers, for a message on `subject`."""
        return self.remote.queue_weights(self.name, subject)

    def has_interest(self, subject: str) -> bool:
        sl = self.remote.sublists.get(self.name)
        return sl is not None and sl.has_interest(subject)

    def forward(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes,
                done_queues: Any, match_subject: str | None = None) -> int:
        """Send a locally published message to every peer with interest (one
        peer per queue group not served here); returns the peers reached."""
        targets = self.remote.targets(self.name, match_subject or subject, done_queues)
        if not targets:
            return 0
        return self.send(targets, subject, reply, headers, payload, match_subject)

    def send(self, targets: dict[int, list[str]], subject: str, reply: str | None,
             headers: bytes | None, payload: bytes, match_subject: str | None = None) -> int:
        """The message, in this account, to each peer of `targets` (with its queue groups)."""
        if headers is not None and msgtrace.TRACE_HOP_MARK in headers \
                and self._peer_would_trace(headers):
            headers = msgtrace.without_hop(headers)  # untraced here: the peer must not trace it
        return self.cluster.send_msg(targets, self.name, subject, reply, headers, payload,
                                     match_subject)

    def _peer_would_trace(self, headers: bytes) -> bool:
        account = self.cluster.server.accounts.get(self.name)
        trace = account.msg_trace if account is not None else None
        return msgtrace.start(headers, 0, trace, resample=False) is not None

    def forward_traced(self, mt: msgtrace.MsgTrace, subject: str, reply: str | None,
                       headers: bytes, payload: bytes, done_queues: Any,
                       match_subject: str | None = None) -> int:
        """`forward` for a traced message: each peer's copy is a route egress event
        of `mt` and carries its hop number in `Nats-Trace-Hop`, so that the peer
        traces it and sends its own document (as nats-server's routes do)."""
        targets = self.remote.targets(self.name, match_subject or subject, done_queues)
        return self.send_traced(mt, targets, subject, reply, headers, payload, match_subject)

    def send_traced(self, mt: msgtrace.MsgTrace, targets: dict[int, list[str]], subject: str,
                    reply: str | None, headers: bytes, payload: bytes,
                    match_subject: str | None = None) -> int:
        sent = 0
        cluster = self.cluster
        for peer, queues in targets.items():
            if peer not in cluster.links:
                continue
            hop = mt.route_egress(cluster.rid(peer), cluster.peer_name(peer))
            sent += cluster.send_msg({peer: queues}, self.name, subject, reply,
                                     msgtrace.route_copy(mt, self.name, headers, hop), payload,
                                     match_subject)
        return sent

    def fanout(self) -> Fanout:
        return Fanout(self)


class Cluster:
    def __init__(self, server: Any) -> None:
        self.server = server
        self.log = server.log
        o = server.options
        self.opts = o.cluster
        self.name = self.opts.name or ""
        js = o.jetstream
        store = os.path.join(js.store_dir, "cluster") if js.enabled else None
        self.self_id = identity.load_or_create(store)
        self.seeds = [parse_route_url(u) for u in self.opts.routes]
        self.auth = Authorizer(self.opts)
        self.channels = ChannelMaker(self.opts)
        self.local = LocalInterest()
        self.remote = RemoteInterest()
        self.port = 0
        self.grpc_server: grpc.aio.Server | None = None
        self.table: MemberTable | None = None
        self.links: dict[int, Link] = {}
        self.dialers: dict[str, asyncio.Task[Any]] = {}
        self.self_addrs: set[str] = set()
        self.incoming: dict[int, int] = {}  # peer -> generation of its live Messages stream
        self._gen = 0
        self.publishers: dict[int, RoutePublisher] = {}
        self._rids: dict[int, int] = {}
        self._response_interest: set[tuple[str, str]] = set()
        self.handlers: dict[str, Handler] = {}
        self.frame_handlers: dict[str, FrameHandler] = {}
        self._member_cbs: list[MemberCallback] = []
        self._req_channels: dict[int, tuple[str, grpc.aio.Channel]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self.in_msgs = self.in_bytes = 0
        self.bad_ops = 0  # malformed route input ignored
        self.transport: GrpcTransport | None = None
        self._last_urls: tuple[list[str], list[str]] = ([], [])

    # ------------------------------------------------------------------ interface

    def members(self) -> dict[int, Member]:
        assert self.table is not None
        return dict(self.table.members)

    def on_members(self, cb: MemberCallback) -> None:
        self._member_cbs.append(cb)

    def handle(self, kind: str, fn: Handler) -> None:
        self.handlers[kind] = fn

    def handle_frames(self, kind: str, fn: FrameHandler) -> None:
        self.frame_handlers[kind] = fn

    def send_frame(self, peer_id: int, kind: str, subject: str, reply: str | None,
                   headers: bytes | None, payload: bytes, tag: str) -> bool:
        """A one-way message to node `peer_id`'s `kind` frame handler, on the route's
        Messages stream: in order with everything else this node sends that peer, with no
        reply and no round trip of its own. False: no route to it now, or its queue is
        full (the message is dropped, as a core message would be)."""
        link = self.links.get(peer_id)
        if link is None:
            return False
        f = frames.encode(NODE_FRAME + kind, subject, reply, headers, payload, [], tag)
        return link.send_op(f, len(f), droppable=True)

    async def request(self, peer_id: int, kind: str, payload: bytes, timeout: float) -> bytes:
        """Ask node `peer_id`'s handler for `kind`; raises RequestError or TimeoutError."""
        if peer_id == self.self_id:
            async with asyncio.timeout(timeout):
                return await self._dispatch(peer_id, kind, payload)
        member = self.table.members.get(peer_id) if self.table else None
        if member is None:
            raise RequestError(f"unknown peer {peer_id}")
        ch = self._req_channel(member)
        try:
            reply = await pb_grpc.RouteStub(ch).Request(
                pb.NodeRequest(from_peer=self.self_id, to_peer=peer_id, kind=kind,
                               payload=payload), timeout=timeout)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(f"request {kind!r} to peer {peer_id} timed out") from None
            raise RequestError(f"request {kind!r} to peer {peer_id}: {err.code().name} "
                               f"{err.details()}") from None
        if reply.error:
            raise RequestError(reply.error)
        return reply.payload

    def routez(self, query: dict[str, str] | None = None) -> dict[str, Any]:
        """nats-server's /routez document (also for `$SYS.REQ.SERVER.*.ROUTEZ`)."""
        from node.cluster.routez import routez

        return routez(self.server, query or {})

    def rid(self, peer: int) -> int:
        """A small stable number per peer for /routez."""
        return self._rids.setdefault(peer, len(self._rids) + 1)

    def peer_name(self, peer: int) -> str:
        member = self.table.members.get(peer) if self.table is not None else None
        return member.name if member is not None else ""

    def expected_size(self) -> int:
        """Nodes the configuration names: the distinct route addresses that are
        not this node, plus this node (a seed listing itself counts once)."""
        return len({s.addr for s in self.seeds} - self.self_addrs) + 1

    def raft_transport(self, on_messages: Callable[..., None],
                       on_liveness: Callable[[int], None] | None = None,
                       **kw: Any) -> GrpcTransport:
        """A Raft transport on this node's cluster port (start() it; add peers as
        members appear). Only one per node: it registers the Raft service."""
        from raft.transport_grpc import GrpcTransport

        assert self.transport is None, "one Raft transport per cluster port"
        self.transport = GrpcTransport(
            self.self_id, "", {}, on_messages, on_liveness=on_liveness, server=self.grpc_server,
            channel_factory=self.channels.raft_channel, **self._direct_lane(), **kw)
        return self.transport

    @property
    def raft_direct(self) -> bool:
        """This node runs Raft's direct TCP lane (listens on it, dials peers' lanes)."""
        return self.opts.raft_port >= 0 and self.opts.raft_lane != "grpc"

    def _direct_lane(self) -> dict[str, Any]:
        """Raft's direct TCP lane (`cluster { raft_port, raft_lane }`, on by
        default): a second listener with the cluster port's authorization (the
        same Authorizer and credentials) and TLS (the same files, a client
        certificate required). A peer whose lane cannot be dialed is reached
        over the gRPC lanes meanwhile (`raft_lane: auto`)."""
        o = self.opts
        if not self.raft_direct:
            return {}
        ssl_pair = None
        if o.tls is not None:
            from raft import tcp_lane

            assert o.tls.cert_file and o.tls.key_file and o.tls.ca_file  # validate_options
            ssl_pair = tcp_lane.contexts(o.tls.cert_file, o.tls.key_file, o.tls.ca_file)
        return {"direct": {self.self_id: f"{o.host}:{o.raft_port}"}, "direct_ssl": ssl_pair,
                "direct_cred": self.channels.default_cred, "direct_allows": self.auth.allows,
                "on_direct_port": self._announce_raft_port,
                "direct_fallback": o.raft_lane == "auto"}

    def _announce_raft_port(self, port: int) -> None:
        """Gossip where this node's direct Raft lane listens (host as advertised)."""
        assert self.table is not None
        host = self.table.me.cluster_addr.rpartition(":")[0]
        self.log.info(f"Listening for Raft direct lanes on {self.opts.host}:{port}")
        self.update_self(raft_addr=f"{host}:{port}")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        o = self.opts
        server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=[
            AuthInterceptor(self.auth, self._on_refused)])
        pb_grpc.add_RouteServicer_to_server(_RouteServicer(self), server)
        addr = f"{o.host}:{0 if o.port < 0 else o.port}"
        creds = server_credentials(o)
        try:
            port = server.add_secure_port(addr, creds) if creds else server.add_insecure_port(addr)
        except RuntimeError as err:
            raise OSError(f"Error listening on cluster port: {addr}, \"{err}\"") from err
        if not port:
            raise OSError(f"Error listening on cluster port: {addr}")
        await server.start()
        self.grpc_server = server
        self.port = port
        advertise = o.advertise or f"{public_host(o.host)}:{port}"
        if advertise.startswith(("nats-route://", "nats://")):
            advertise = parse_route_url(advertise).addr
        self.self_addrs.add(advertise)
        self.self_addrs.add(f"{o.host}:{port}")
        start_ms = int(time.time() * 1000)
        me = Member(peer_id=self.self_id, name=self.server.server_name, cluster_addr=advertise,
                    jetstream=self.server.options.jetstream.enabled,
                    tags=list(self.server.options.server_tags), server_id=self.server.server_id,
                    start_ms=start_ms, version=time.time_ns() // 1000)
        self.table = MemberTable(me)
        scheme = "tls" if o.tls else "nats-route"
        self.log.info(f"Cluster name is {self.name or '(none)'}")
        self.log.info(f"Listening for route connections on {o.host}:{port} "
                      f"({scheme}, peer id {self.self_id:016x})")
        for seed in self.seeds:
            self._dial(seed.addr, seed.credentials, solicited=True)
        self._spawn(self._count_connections())

    async def _count_connections(self) -> None:
        """Gossip this node's client count of every account with a connection
        limit, so each node enforces the limit over the whole cluster (within a
        gossip round: two nodes admitting at the same instant may overshoot)."""
        while not self._closing:
            counts = {name: acc.connections for name, acc in self.server.accounts.items()
                      if acc.max_connections >= 0 and acc.connections}
            assert self.table is not None
            if counts != self.table.me.account_conns:
                self.update_self(account_conns=counts)
            await asyncio.sleep(0.1)

    def _sum_remote_connections(self) -> None:
        assert self.table is not None
        totals: dict[str, int] = {}
        for m in self.table.members.values():
            if m.is_self or not m.up or m.shutdown:
                continue
            for name, n in m.account_conns.items():
                totals[name] = totals.get(name, 0) + n
        for name, acc in self.server.accounts.items():
            acc.remote_connections = totals.get(name, 0)

    def set_client_urls(self, client_urls: list[str], ws_urls: list[str]) -> None:
        """Called once the client listeners are bound (and by jscluster for storage)."""
        assert self.table is not None
        if self.opts.no_advertise:
            client_urls, ws_urls = [], []
        if self.table.update_self(client_urls=client_urls, ws_urls=ws_urls):
            self._member_changed(self.table.me)

    def update_self(self, **changes: Any) -> None:
        """Change gossiped facts about this node (healthy, store_used, tags...)."""
        assert self.table is not None
        if self.table.update_self(**changes):
            self._member_changed(self.table.me)
            self._gossip_now()

    async def enter_lame_duck(self) -> None:
        self.update_self(lame_duck=True)

    async def stop(self) -> None:
        self._closing = True
        if self.table is not None:
            self.table.update_self(shutdown=True)
            # Tell peers right away, so they drop this node's URLs now, not at timeout.
            pushes = [self._push_gossip(link) for link in list(self.links.values())]
            if pushes:
                try:
                    async with asyncio.timeout(0.5):
                        await asyncio.gather(*pushes, return_exceptions=True)
                except TimeoutError:
                    pass
        for t in list(self.dialers.values()) + list(self._tasks):
            t.cancel()
        for link in list(self.links.values()):
            link.close()
        await asyncio.gather(*self.dialers.values(), *self._tasks, return_exceptions=True)
        for _, ch in self._req_channels.values():
            await ch.close()
        if self.grpc_server is not None:
            await self.grpc_server.stop(grace=0.2)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ accounts

    def attach_account(self, account: Account) -> None:
        """Route `account`'s publishes and announce its local interest."""
        if getattr(account, "routes", None) is not None:
            return
        account.routes = AccountRoutes(self, account.name)
        name = account.name

        def on_interest(sub: Any, delta: int) -> None:
            if getattr(sub.client, "local_only", False):
                return  # JetStream's own subscriptions: each node serves its clients
            if delta > 0:
                change = self.local.add(name, sub.subject, sub.queue)
            else:
                change = self.local.remove(name, sub.subject, sub.queue)
            if change is not None:
                self._broadcast_interest(change)

        account.interest_listeners.append(on_interest)
        for sub in account.sublist.iter_subscriptions():  # subscriptions made before the cluster
            on_interest(sub, 1)
        self.announce_response_interest()

    def announce_response_interest(self) -> None:
        """Replies to a service import are published in the exporting account on
        `_R_.<token>`, possibly on another node, while the route back to the
        requester lives on the node that forwarded the request: so a node whose
        accounts import services from E announces interest in E's `_R_.>`."""
        router = getattr(self.server, "router", None)
        if router is None:
            return
        for acc in router.conf.accounts.values():
            for imp in acc.service_imports:
                key = (imp.account, RESPONSE_PREFIX + ">")
                if key in self._response_interest or imp.account not in self.server.accounts:
                    continue
                self._response_interest.add(key)
                change = self.local.add(imp.account, RESPONSE_PREFIX + ">", None)
                if change is not None:
                    self._broadcast_interest(change)

    def _broadcast_interest(self, change: Change) -> None:
        op = change_to_pb(change)
        for link in self.links.values():
            link.send_op(op, 0, droppable=False)

    def send_msg(self, targets: dict[int, list[str]], account: str, subject: str,
                 reply: str | None, headers: bytes | None, payload: bytes,
                 match_subject: str | None = None) -> int:
        sent = 0
        frame = b""
        for peer, queues in targets.items():
            link = self.links.get(peer)
            if link is None:
                continue
            if queues or not frame:
                f = frames.encode(account, subject, reply, headers, payload, queues, match_subject)
                if not queues:
                    frame = f  # the same bytes for every peer without queue groups
            else:
                f = frame
            if link.send_op(f, len(f), droppable=True):
                sent += 1
        return sent

    # ------------------------------------------------------------------ incoming ops

    def on_route_batch(self, peer: int, batch: pb.RouteBatch) -> None:
        if batch.frames:
            try:
                for account, subject, reply, headers, payload, queues, match in \
                        frames.decode(batch.frames):
                    self._deliver_frame(peer, account, subject, reply, headers, payload,
                                        queues, match)
            except frames.FrameError as err:
                self.bad_ops += 1
                self.log.warn(f"route from {peer:016x}: malformed message frames dropped: {err}")
        for op in batch.ops:
            which = op.WhichOneof("op")
            if which == "msg":
                self._deliver(peer, op.msg)
            elif which == "interest":
                if not self.remote.apply(peer, change_from_pb(op.interest)):
                    self.bad_ops += 1
            elif which == "reset":
                self.remote.forget(peer)
            else:
                self.bad_ops += 1

    def _deliver(self, peer: int, m: pb.RouteMsg) -> None:
        self._deliver_frame(peer, m.account, m.subject, m.reply or None,
                            m.headers if m.has_headers else None, m.payload, list(m.queues),
                            m.match_subject or None)

    def _deliver_frame(self, peer: int, account_name: str, subject: str, reply: str | None,
                       headers: bytes | None, payload: bytes, queues: list[str],
                       match: str | None) -> None:
        if account_name[:1] == NODE_FRAME:
            self._deliver_node_frame(peer, account_name[1:], subject, reply, headers, payload,
                                     match)
            return
        account = self.server.accounts.get(account_name)
        if account is None or not _framable(subject, reply, headers, match):
            self.bad_ops += 1
            return
        pub = self.publishers.get(peer)
        if pub is None:
            pub = self.publishers[peer] = RoutePublisher(peer)
        self.in_msgs += 1
        self.in_bytes += len(payload)
        link = self.links.get(peer)
        if link is not None:
            link.in_msgs += 1
            link.in_bytes += len(payload)
        try:
            if headers is not None and msgtrace.TRACE_HOP_MARK in headers:
                self._deliver_traced(peer, account, pub, subject, reply, headers, payload,
                                     queues, match)
            else:
                account.deliver_routed(pub, subject, reply, headers, payload, queues, match)
        except Exception as err:  # noqa: BLE001 - one bad message must not end the route
            self.bad_ops += 1
            self.log.error(f"route message from {peer:016x} on {subject!r} failed: {err!r}")

    def _deliver_traced(self, peer: int, account: Account, pub: RoutePublisher, subject: str,
                        reply: str | None, headers: bytes, payload: bytes, queues: list[str],
                        match: str | None) -> None:
        """A traced copy from a peer (it carries `Nats-Trace-Hop`): this node's own
        trace of it, an ingress from the route and its local egress, published on
        the trace destination in the message's account (or in the trace's own, named
        by `Nats-Trace-Origin-Account`, when the copy came through a stream import)."""
        owner = account
        if msgtrace.TRACE_ORIGIN_MARK in headers:
            origin = msgtrace.parse_headers(headers).get(msgtrace.TRACE_ORIGIN, [""])[0]
            owner = self.server.accounts.get(origin) or account
        mt = msgtrace.start(headers, len(payload), owner.msg_trace, resample=False)
        if mt is None:
            account.deliver_routed(pub, subject, reply, headers, payload, queues, match)
            return
        mt.hop = mt.header.get(msgtrace.TRACE_HOP, [""])[0]
        mt.ingress(RoutePublisher.kind_name, self.rid(peer), self.peer_name(peer), account.name,
                   subject)
        msgtrace.active = mt
        try:
            account.deliver_routed(pub, subject, reply, headers, payload, queues, match)
        finally:
            msgtrace.active = None
        system = getattr(self.server, "system", None)
        info = system.server_info() if system is not None else {}
        owner.publish(None, mt.dest, None, None, json.dumps(mt.document(info)).encode())

    def _deliver_node_frame(self, peer: int, kind: str, subject: str, reply: str | None,
                            headers: bytes | None, payload: bytes, tag: str | None) -> None:
        fn = self.frame_handlers.get(kind)
        if fn is None or not _framable(subject, reply, headers, None):
            self.bad_ops += 1
            return
        try:
            fn(peer, subject, reply, headers, payload, tag or "")
        except Exception as err:  # noqa: BLE001 - one bad message must not end the route
            self.bad_ops += 1
            self.log.error(f"route frame {kind[:MAX_KIND]!r} from {peer:016x} failed: {err!r}")

    def incoming_opened(self, peer: int) -> int:
        self._gen += 1
        self.incoming[peer] = self._gen
        return self._gen

    def incoming_closed(self, peer: int, gen: int) -> None:
        # Only the live stream's end forgets: a redial may already have replaced it.
        if self.incoming.get(peer) == gen:
            del self.incoming[peer]
            self.remote.forget(peer)

    # ------------------------------------------------------------------ membership

    def gossip_msg(self) -> pb.GossipMsg:
        assert self.table is not None
        return pb.GossipMsg(from_peer=self.self_id,
                            members=[member_to_pb(m) for m in self.table.snapshot()])

    def hello_msg(self, error: str = "") -> pb.HelloMsg:
        assert self.table is not None
        return pb.HelloMsg(cluster_name=self.name, self=member_to_pb(self.table.me),
                           members=[member_to_pb(m) for m in self.table.snapshot()], error=error)

    def merge_gossip(self, members: Any, via: int = 0) -> None:
        assert self.table is not None
        for p in members:
            if not p.peer_id or not p.cluster_addr:
                continue
            merged, replaced = self.table.merge(member_from_pb(p))
            for old in replaced:
                self.log.warn(f"Cluster member {old.name} ({old.peer_id:016x}) was replaced "
                              f"by {p.name} ({p.peer_id:016x}) at {p.cluster_addr}")
                link = self.links.pop(old.peer_id, None)
                if link is not None:
                    link.close()
                self._member_changed(old)
            if merged is None:
                continue
            if merged.shutdown or merged.lame_duck:
                self._member_changed(merged)
                continue
            if merged.peer_id not in self.links and merged.cluster_addr not in self.dialers \
                    and merged.cluster_addr not in self.self_addrs:
                self._dial(merged.cluster_addr, None, solicited=False)
            self._member_changed(merged)

    def _member_changed(self, m: Member) -> None:
        self._sum_remote_connections()
        for cb in list(self._member_cbs):
            try:
                cb(m)
            except Exception as err:  # noqa: BLE001 - a listener bug must not stop gossip
                self.log.error(f"cluster member callback failed: {err!r}")
        self._urls_maybe_changed()

    def _set_up(self, peer: int, up: bool) -> None:
        assert self.table is not None
        m = self.table.set_up(peer, up)
        if m is not None:
            self._member_changed(m)

    def _gossip_now(self) -> None:
        for link in list(self.links.values()):
            self._spawn(self._push_gossip(link))

    async def _push_gossip(self, link: Link) -> None:
        try:
            reply = await pb_grpc.RouteStub(link.ctrl).Gossip(self.gossip_msg(), timeout=1.0)
        except grpc.aio.AioRpcError:
            return
        if not self._closing:
            self.merge_gossip(reply.members, via=link.peer)

    # ------------------------------------------------------------------ client URLs

    def connect_urls(self) -> tuple[list[str], list[str]]:
        """(client, websocket) URLs clients see in INFO, as nats-server builds
        them: none on a node with no_advertise, none while no other member
        advertises one, else this node's first, then every member that is up,
        advertises and is neither in lame duck nor leaving."""
        if self.table is None or self.opts.no_advertise:
            return [], []
        me = self.table.me
        if me.lame_duck or me.shutdown:
            return [], []
        others = sorted((m for m in self.table.members.values()
                         if not m.is_self and m.up and not m.lame_duck and not m.shutdown),
                        key=lambda m: m.name)

        def collect(field: str) -> list[str]:
            theirs = [u for m in others for u in getattr(m, field)]
            if not theirs:
                return []
            out: list[str] = []
            for u in [*getattr(me, field), *theirs]:
                if u not in out:
                    out.append(u)
            return out

        return collect("client_urls"), collect("ws_urls")

    def _urls_maybe_changed(self) -> None:
        urls = self.connect_urls()
        if urls != self._last_urls:
            self._last_urls = urls
            notify = getattr(self.server, "cluster_urls_changed", None)
            if notify is not None:
                notify()

    # ------------------------------------------------------------------ dialing

    def _dial(self, addr: str, cred: str | None, solicited: bool) -> None:
        if addr in self.dialers or self._closing:
            return
        self.dialers[addr] = asyncio.ensure_future(self._dial_loop(addr, cred, solicited))

    async def _dial_loop(self, addr: str, cred: str | None, solicited: bool) -> None:
        backoff = BACKOFF_MIN
        ctrl = self.channels.channel(addr, cred=cred)
        try:
            while not self._closing:
                peer = await self._hello(addr, ctrl)
                if peer == self.self_id:
                    self.self_addrs.add(addr)
                    self.log.debug(f"route {addr} is this node")
                    return
                if peer and peer not in self.links:
                    backoff = BACKOFF_MIN
                    await self._session(peer, addr, cred, ctrl, solicited)
                    if self._closing:
                        return
                elif peer:
                    # Another address of a peer already linked: wait for that link to end.
                    while peer in self.links and not self._closing:
                        await asyncio.sleep(1.0)
                    continue
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, BACKOFF_MAX)
        finally:
            self.dialers.pop(addr, None)
            await ctrl.close()

    async def _hello(self, addr: str, ctrl: grpc.aio.Channel) -> int:
        """The peer id at `addr`, 0 when it cannot be reached or refused us."""
        if self.auth.required and not await self._acceptor_proves(addr, ctrl):
            return 0
        try:
            reply = await pb_grpc.RouteStub(ctrl).Hello(self.hello_msg(), timeout=HELLO_TIMEOUT)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAUTHENTICATED:
                self.log.error(f"route {addr}: refused by the peer (cluster authorization)")
            else:
                self.log.debug(f"route {addr}: {err.code().name}")
            return 0
        if reply.error:
            self.log.error(f"route {addr}: refused by the peer: {reply.error}")
            return 0
        if not reply.self.peer_id:
            return 0
        if reply.self.peer_id != self.self_id:
            err = self._check_peer(reply.cluster_name)
            if err:
                self.log.error(f"route {addr}: {err}")
                return 0
            self.merge_gossip([reply.self, *reply.members], via=reply.self.peer_id)
        return reply.self.peer_id

    async def _acceptor_proves(self, addr: str, ctrl: grpc.aio.Channel) -> bool:
        """With cluster authorization, credentials go only to a node that
        proves it knows the cluster secret: an impostor at a configured route
        address learns nothing and gets nothing."""
        nonce = os.urandom(16)
        try:
            reply = await pb_grpc.RouteStub(ctrl).Prove(pb.ProveMsg(nonce=nonce, addr=addr),
                                                        timeout=HELLO_TIMEOUT)
        except grpc.aio.AioRpcError as err:
            self.log.debug(f"route {addr}: {err.code().name}")
            return False
        if not self.auth.check_proof(nonce, addr, reply.proof):
            self.log.error(f"route {addr}: the node there is not a cluster member "
                           "(no proof of the cluster authorization); not connecting")
            return False
        return True

    def is_self_addr(self, addr: str) -> bool:
        """Whether dialing `addr` reaches this node: one of its own addresses, or
        its cluster port on a name of this host."""
        if addr in self.self_addrs:
            return True
        host, _, port = addr.rpartition(":")
        if port != str(self.port):
            return False
        hosts = {h.rpartition(":")[0].strip("[]") for h in self.self_addrs}
        hosts |= {"localhost", "127.0.0.1", "::1", socket.gethostname()}
        return host.strip("[]") in hosts

    def _check_peer(self, cluster_name: str) -> str:
        if self.name and cluster_name and cluster_name != self.name:
            return (f"cluster name {cluster_name!r} does not match this node's "
                    f"{self.name!r}: not joining")
        return ""

    async def _session(self, peer: int, addr: str, cred: str | None,
                       ctrl: grpc.aio.Channel, solicited: bool) -> None:
        assert self.table is not None
        m = self.table.members.get(peer)
        name = m.name if m else f"{peer:016x}"
        data = self.channels.channel(addr, separate=True, cred=cred)
        link = Link(self, peer, addr, name, ctrl, data, solicited)
        self.links[peer] = link
        first = [pb.RouteOp(reset=True)] + [change_to_pb(c) for c in self.local.snapshot()]
        self._set_up(peer, True)
        self.log.info(f"Route connection created to {name} at {addr}")
        try:
            await link.run(first)
        except Exception as err:  # noqa: BLE001 - any failure ends the session; we redial
            self.log.debug(f"route {name}: {err!r}")
        finally:
            link.close()
            if self.links.get(peer) is link:
                del self.links[peer]
                self._set_up(peer, False)
            if not self._closing:
                self.log.info(f"Route connection to {name} at {addr} closed")
            await data.close()

    def _on_refused(self, method: str) -> None:
        self.log.warn(f"Cluster connection refused: authorization failed ({method})")

    def _req_channel(self, member: Member) -> grpc.aio.Channel:
        cur = self._req_channels.get(member.peer_id)
        if cur is not None and cur[0] == member.cluster_addr:
            return cur[1]
        # Requests have their own connection: a big forwarded publish never
        # waits behind core messages, nor gossip behind it.
        ch = self.channels.channel(member.cluster_addr, separate=True)
        self._req_channels[member.peer_id] = (member.cluster_addr, ch)
        return ch

    async def _dispatch(self, from_peer: int, kind: str, payload: bytes) -> bytes:
        fn = self.handlers.get(kind)
        if fn is None:
            raise RequestError(f"no handler for {kind[:MAX_KIND]!r}")
        return await fn(from_peer, payload)


def _framable(subject: str, reply: str | None, headers: bytes | None, match: str | None) -> bool:
    """What a client's MSG line can carry: a subject and reply without
    whitespace, and a header block shaped as NATS headers (a peer runs our code,
    but a bug or an impostor there must not corrupt clients' streams here)."""
    if not subject:
        return False
    for s in (subject, reply, match):
        # Four substring scans in C: cheaper than translating a copy (once per message).
        if s and (" " in s or "\t" in s or "\r" in s or "\n" in s):
            return False
    if headers is not None and not (headers.startswith(b"NATS/1.0")
                                    and headers.endswith(b"\r\n\r\n")):
        return False
    return True


class _RouteServicer(pb_grpc.RouteServicer):
    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster

    async def Prove(self, request: pb.ProveMsg, context: Any) -> pb.ProveMsg:  # noqa: N802
        c = self.c
        # Only for an address of this node: a proof for another node's address
        # would let an impostor relay it to a member dialing the impostor.
        if not c.is_self_addr(request.addr) or len(request.nonce) < 16:
            return pb.ProveMsg()
        return pb.ProveMsg(proof=c.auth.prove(request.nonce, request.addr))

    async def Hello(self, request: pb.HelloMsg, context: Any) -> pb.HelloMsg:  # noqa: N802
        c = self.c
        if c.table is None:
            return pb.HelloMsg(error="not ready")
        if request.self.peer_id and request.self.peer_id != c.self_id:
            err = c._check_peer(request.cluster_name)
            if err:
                c.log.error(f"route from {request.self.name or '?'}: {err}")
                return c.hello_msg(error=err)
            c.merge_gossip([request.self])
        return c.hello_msg()

    async def Gossip(self, request: pb.GossipMsg, context: Any) -> pb.GossipMsg:  # noqa: N802
        c = self.c
        if c.table is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not ready")
        c.merge_gossip(request.members, via=request.from_peer)
        return c.gossip_msg()

    async def Messages(self, request_iterator: Any, context: Any) -> pb.RouteAck:  # noqa: N802
        c = self.c
        peer = 0
        gen = 0
        try:
            async for batch in request_iterator:
                if not peer:
                    peer = batch.from_peer
                    if not peer or c.table is None or peer not in c.table.members \
                            or peer == c.self_id:
                        await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                            "unknown peer: say Hello first")
                    gen = c.incoming_opened(peer)
                elif batch.from_peer != peer:
                    c.bad_ops += 1
                    continue
                c.on_route_batch(peer, batch)
        finally:
            if gen:
                c.incoming_closed(peer, gen)
        return pb.RouteAck()

    async def Request(self, request: pb.NodeRequest, context: Any) -> pb.NodeReply:  # noqa: N802
        c = self.c
        if request.to_peer != c.self_id:
            return pb.NodeReply(error=f"wrong node: this is {c.self_id:016x}")
        try:
            payload = await c._dispatch(request.from_peer, request.kind, request.payload)
        except RequestError as err:
            return pb.NodeReply(error=str(err))
        except Exception as err:  # noqa: BLE001 - the caller gets the error, the node goes on
            c.log.error(f"cluster request {request.kind[:MAX_KIND]!r} failed: {err!r}")
            return pb.NodeReply(error=f"handler failed: {err!r}")
        return pb.NodeReply(payload=payload)

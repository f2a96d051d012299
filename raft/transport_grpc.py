"""Raft messages between nodes over gRPC (grpc.aio), all groups multiplexed.

Two traffic classes (lanes) per peer pair, each a bidirectional `Raft`
stream on its own TCP connection: **priority** (heartbeats, votes, responses,
liveness beats, the meta group's appends: everything small or urgent) and
**bulk** (appends that carry entries). A stalled bulk stream never holds
heartbeats back. The node with the lower id dials both and keeps redialing
with backoff; the other side accepts. After a `hello` exchange (which names
the lane) both directions carry `Batch`es. Everything `send()` gets for a
peer and lane during one event-loop turn becomes one Batch (heartbeats
coalesced by `raft/codec.py`), queued on that lane's queue, bounded by
BYTES (`queue_bytes`), drained by one writer task, so per-lane order is
kept. A message that cannot be queued (peer disconnected, queue full) is
dropped and reported to `on_messages` as a local UNREACHABLE message, which
the driver steps into the group. A peer without a bulk stream gets
everything on the priority one.

Received batches are checked, not trusted: a message whose sender is not
the stream's proven peer, a local-only type, a SNAP outside the Snapshot
RPC, or a type this version does not know is dropped (counted in
`dropped_in`), without ending the stream.

With `direct` addresses (a cluster's default), both lanes to a peer that has
one run over plain TCP (`raft/tcp_lane.py`: the same Batches, hello and
checks, without gRPC aio's thread hops, which cost most of a low-load commit);
a batch for an idle direct lane is written to its socket at once instead of
going through the writer task. Snapshots stay on gRPC. A lane that cannot be
dialed (a firewall passing only the cluster port, a port the network does not
route) is replaced by a gRPC stream at once (`direct_fallback`), and that
stream tries the lane again every DIRECT_RETRY_S, handing over to it when a
probe's hello gets through. A dial that fails on gRPC too (the peer is down
or cut off) sends the next dial to the lane first again.

Snapshots use their own `Snapshot` RPC on a separate channel (own TCP
connection), streamed in chunks with every write awaited, so a large transfer
never delays heartbeats on the Raft stream. With a `snapshot_source` (the
driver always gives one), every SNAP handed to `send()` is answered by
exactly one SNAP_STATUS (rejected if it failed or could not
start): the leader sends that follower nothing else until it comes.

With TLS, identity is bound to the certificate, not to what a peer claims:
node N's certificate names `node-N` (or `tls_names[N]`) as a SAN DNS entry.
A dialer verifies the acceptor's certificate against that name instead of the
address (`ssl_target_name_override`); an acceptor refuses a hello or a
snapshot whose sender id is not named by the client certificate (SAN DNS or
subject CN).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from proto import cluster_pb2 as pb
from proto import cluster_pb2_grpc as pb_grpc
from raft import lane_auth, tcp_lane
from raft.codec import decode_wire, encode_batch, message_from_pb, message_size, message_to_pb
from raft.types import Message, MsgType

log = logging.getLogger(__name__)

OnMessages = Callable[[list[Message]], None]
OnSnapshot = Callable[[Message, AsyncIterator[bytes]], Awaitable[bool]]
SnapshotSource = Callable[[Message], AsyncIterator[bytes]]
TlsFiles = tuple[str | bytes, str | bytes, str | bytes]  # cert, key, ca: PEM bytes or file paths

MAX_GRPC_MESSAGE = 64 << 20
BATCH_SPLIT_BYTES = 4 << 20  # start a new Batch past this many payload bytes
QUEUE_BYTES = 16 << 20  # per peer and lane; beyond it messages are dropped (Raft retries)
LANE_PRIORITY, LANE_BULK = 0, 1  # traffic classes, each on its own stream and connection
PRIORITY_GROUPS = frozenset({"$meta"})  # groups whose appends never wait behind bulk data
CHUNK_BYTES = 256 << 10
HANDSHAKE_TIMEOUT = 3.0
# Direct-lane connections not yet past their authorization and hello: more at
# once are closed on arrival (each holds at most tcp_lane.AUTH_MAX_FRAME bytes
# for at most HANDSHAKE_TIMEOUT), so unauthenticated dialers cost bounded memory.
DIRECT_HANDSHAKES_MAX = 32
LAZY_FLUSH_S = 0.002  # the longest a `send_lazy` message waits for a flush to ride with
BACKOFF_MIN, BACKOFF_MAX = 0.05, 2.0
# How often a gRPC stream standing in for an unreachable direct lane tries the lane
# again (jittered 0.5-1.5x): a connect, the authorization and a hello per lane.
DIRECT_RETRY_S = 5.0
# The first retry comes sooner, then the gap doubles up to DIRECT_RETRY_S: a lane that
# failed only because its peer was still starting (its gRPC port answered first) is
# back within a fraction of a second.
DIRECT_PROBE_MIN_S = 0.2
# A direct lane carries an empty batch every DIRECT_PING_S, and one that has read nothing
# for DIRECT_DEAD_S (while its peer pings) is closed: a stalled middlebox or a silent
# blackhole keeps TCP quiet for minutes (unacked data: no keepalive probe), where
# the gRPC lanes' HTTP/2 keepalive notices in seconds.
DIRECT_PING_S = 2.0
DIRECT_DEAD_S = 10.0

_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
_SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
    ("grpc.keepalive_time_ms", 10_000),  # also detects dead dialers behind a partition
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]


def _pem(x: str | bytes) -> bytes:
    if isinstance(x, bytes):
        return x
    with open(x, "rb") as f:
        return f.read()


@dataclass(eq=False)
class _Lane:
    """One traffic class to one peer: its stream, queue (bounded by bytes) and connection."""

    kind: int
    stream: Any = None  # the live call (dialer) or servicer context (acceptor)
    # Acceptor: older streams a newer one replaced that are still open and read.
    standby: list[Any] = field(default_factory=list)
    pending: list[Message] = field(default_factory=list)  # this loop turn's messages
    queue: deque[tuple[pb.Batch, set[str], int]] = field(default_factory=deque)
    queued_bytes: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    channel: grpc.aio.Channel | None = None


@dataclass(eq=False)
class _Link:
    """State of the connection to one peer."""

    peer: int
    addr: str
    lanes: tuple[_Lane, _Lane] = field(
        default_factory=lambda: (_Lane(LANE_PRIORITY), _Lane(LANE_BULK)))
    liveness: bool = False
    last_seen: float = 0.0
    snap_channel: grpc.aio.Channel | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)  # writers, dialers, acceptors
    removed: bool = False
    direct: str | None = None  # the peer's direct TCP lane address, if it has one
    direct_fails: int = 0  # direct dials failed in a row (> 0: dialing gRPC instead)

    @property
    def stream(self) -> Any:
        return self.lanes[LANE_PRIORITY].stream


class GrpcTransport:
    def __init__(
        self,
        node_id: int,
        listen_addr: str,
        peers: dict[int, str],
        on_messages: OnMessages,
        on_snapshot: OnSnapshot | None = None,
        tls: TlsFiles | None = None,
        *,
        snapshot_source: SnapshotSource | None = None,
        on_liveness: Callable[[int], None] | None = None,
        queue_bytes: int = QUEUE_BYTES,
        chunk_bytes: int = CHUNK_BYTES,
        tls_names: dict[int, str] | None = None,
        priority_groups: frozenset[str] = PRIORITY_GROUPS,
        server: grpc.aio.Server | None = None,
        channel_factory: Callable[[str, bool], grpc.aio.Channel] | None = None,
        direct: dict[int, str] | None = None,
        direct_cred: str | None = None,
        direct_allows: Callable[[str | None], bool] | None = None,
        direct_ssl: tuple[Any, Any] | None = None,
        on_direct_port: Callable[[int], None] | None = None,
        direct_fallback: bool = True,
        direct_retry_s: float = DIRECT_RETRY_S,
        direct_ping_s: float = DIRECT_PING_S,
        direct_dead_s: float = DIRECT_DEAD_S,
    ) -> None:
        """`server`: a running gRPC server owned by someone else (the node's
        cluster port, node/cluster/) to register the Raft service on instead of
        listening on `listen_addr`. `channel_factory(addr, separate)` makes the
        dialing channels (the cluster's TLS and authorization) instead of `tls`.
        `direct`: node id -> address of its direct TCP lane (this node's entry
        is where it listens); peers listed there are reached over TCP, the
        others over gRPC streams. `direct_cred`: the cluster authorization text
        (the one the gRPC lanes send as metadata, the same on every member);
        given, every direct lane opens with a mutual HMAC proof keyed by it
        (raft/lane_auth.py: the acceptor proves first, the text never crosses
        the wire), dialed and accepted. Without it the dialer sends an empty
        authorization frame and `direct_allows(cred)` checks the one an accepted
        connection sends before anything else is read (None = no authorization,
        as a gRPC server without the interceptor). `direct_ssl`: (server, client)
        contexts of the direct lane when `tls` is not given (the cluster port's
        TLS: a CA-signed client certificate required, the acceptor verified
        against the host it is dialed at, as the cluster's gRPC channels do).
        `on_direct_port(port)`: told the bound port of this node's direct lane
        (its address may name port 0: an ephemeral one). `direct_fallback`: a
        peer whose direct lane cannot be dialed is reached over gRPC meanwhile,
        and the lane is tried again every `direct_retry_s` (False: the direct
        lane or nothing, redialed with backoff)."""
        self.node_id = node_id
        self.listen_addr = listen_addr
        self.port = 0
        self._on_messages = on_messages
        self._on_snapshot = on_snapshot
        self._on_liveness = on_liveness
        self._snapshot_source = snapshot_source
        self._tls = tuple(_pem(x) for x in tls) if tls else None
        self._tls_names = dict(tls_names or {})
        self._chunk = chunk_bytes
        self._queue_bytes = queue_bytes
        self._priority_groups = priority_groups
        self._direct = dict(direct or {})
        self._direct_server: asyncio.Server | None = None
        self._direct_cred = direct_cred
        self._direct_allows = direct_allows
        self._direct_ssl = direct_ssl
        self._on_direct_port = on_direct_port
        self._direct_handshakes = 0
        self._direct_fallback = direct_fallback
        self._direct_retry = direct_retry_s
        self._direct_ping, self._direct_dead = direct_ping_s, direct_dead_s
        self.direct_stalled = 0  # direct streams closed after reading nothing too long
        self.direct_fallbacks = 0  # lanes a gRPC stream took over after a failed direct dial
        self.direct_restored = 0  # lanes moved back from gRPC to a reachable direct lane
        self.direct_probes_failed = 0  # retries of an unreachable direct lane that failed
        self.direct_refused = 0  # direct connections refused (authorization, identity, hello)
        self._ssl: tuple[Any, Any] | None = None  # (server, client) contexts of the direct lane
        self._links: dict[int, _Link] = {}
        for p, a in peers.items():
            if p != node_id:
                self._links[p] = _Link(p, a, direct=self._direct.get(p))
        self._started = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: grpc.aio.Server | None = None
        self._shared_server = server
        self._channel_factory = channel_factory
        self._flush_handle: asyncio.Handle | None = None
        self._lazy_handle: asyncio.TimerHandle | None = None
        self._sending_now = False
        self._closing = False
        self._queued = False  # the last flush queued a batch for a writer task
        self.dropped = 0  # messages reported UNREACHABLE (a SNAP: a failed SNAP_STATUS)
        self.dropped_in = 0  # received messages refused (forged sender, local or unknown type)

    # ---- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        await self._start_direct()
        if self._shared_server is not None:
            pb_grpc.add_ClusterServicer_to_server(_Servicer(self), self._shared_server)
            self._started = True
            for link in self._links.values():
                self._start_link(link)
            return
        self._server = grpc.aio.server(options=_SERVER_OPTIONS)
        pb_grpc.add_ClusterServicer_to_server(_Servicer(self), self._server)
        if self._tls:
            cert, key, ca = self._tls
            creds = grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=ca, require_client_auth=True
            )
            self.port = self._server.add_secure_port(self.listen_addr, creds)
        else:
            self.port = self._server.add_insecure_port(self.listen_addr)
        await self._server.start()
        self._started = True
        for link in self._links.values():
            self._start_link(link)

    async def _start_direct(self) -> None:
        mine = self._direct.get(self.node_id)
        if mine is None:
            return
        if self._tls:
            self._ssl = tcp_lane.contexts(*self._tls)
        else:
            self._ssl = self._direct_ssl
        host, port = tcp_lane.split_addr(mine)
        self._direct_server = await tcp_lane.listen(
            host, port, self._ssl[0] if self._ssl else None, MAX_GRPC_MESSAGE,
            self._on_direct_stream)
        if self._on_direct_port is not None:
            self._on_direct_port(self._direct_server.sockets[0].getsockname()[1])

    def _start_link(self, link: _Link) -> None:
        for lane in link.lanes:
            link.tasks.add(self._spawn(self._writer(link, lane)))
            if self.node_id < link.peer:
                link.tasks.add(self._spawn(self._dial_loop(link, lane)))

    def add_peer(self, node: int, addr: str, direct: str | None = None) -> None:
        """Start talking to `node` at `addr` (runtime membership), over its
        direct lane at `direct` if given. Changing the address of a known
        peer replaces its connection."""
        if node == self.node_id:
            return
        old = self._links.get(node)
        if old is not None:
            if old.addr == addr and old.direct == direct:
                return
            self.remove_peer(node)
        link = _Link(node, addr, direct=direct)
        self._links[node] = link
        if self._started and not self._closing:
            self._start_link(link)

    def remove_peer(self, node: int) -> None:
        """Stop talking to `node`: its stream, dialer and channels are closed;
        a later stream it opens is refused as from an unknown peer."""
        link = self._links.pop(node, None)
        if link is None:
            return
        link.removed = True
        for t in link.tasks:
            t.cancel()
        for lane in link.lanes:
            stream = lane.stream
            self._detach(link, lane, stream)
            if isinstance(stream, (grpc.aio.Call, tcp_lane.TcpStream)):
                stream.cancel()
        self._spawn(self._close_channels(link))

    async def _close_channels(self, link: _Link) -> None:
        for ch in (*(lane.channel for lane in link.lanes), link.snap_channel):
            if ch is not None:
                await ch.close()

    def peers(self) -> list[int]:
        return list(self._links)

    async def stop(self) -> None:
        self._closing = True
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._direct_server is not None:
            self._direct_server.close()
        if self._server is not None:
            await self._server.stop(grace=0.2)
        for link in self._links.values():
            await self._close_channels(link)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def connected(self, peer: int) -> bool:
        return self._links[peer].stream is not None

    def lanes_up(self, peer: int) -> int:
        """How many of the peer's lanes have a stream (each lane notices a loss on its own)."""
        return sum(lane.stream is not None for lane in self._links[peer].lanes)

    def lane_kinds(self) -> dict[int, tuple[str, str]]:
        """Per peer, what carries its (priority, bulk) lanes now: "direct",
        "grpc" or "down" (for /jsz?raft=1 and tests)."""
        def kind(stream: Any) -> str:
            if stream is None:
                return "down"
            return "direct" if isinstance(stream, tcp_lane.TcpStream) else "grpc"
        return {p: (kind(link.lanes[LANE_PRIORITY].stream), kind(link.lanes[LANE_BULK].stream))
                for p, link in self._links.items()}

    def lane_stats(self) -> dict[str, int]:
        """Counters of the direct lanes' fallback to gRPC and back."""
        return {"direct_fallbacks": self.direct_fallbacks,
                "direct_restored": self.direct_restored,
                "direct_probes_failed": self.direct_probes_failed,
                "direct_stalled": self.direct_stalled,
                "direct_refused": self.direct_refused, "dropped_in": self.dropped_in}

    async def wait_connected(self, timeout: float = 10.0) -> None:
        """Until every peer's streams (both lanes) are up (tests, startup)."""
        async with asyncio.timeout(timeout):
            while not all(lane.stream is not None for link in self._links.values()
                          for lane in link.lanes):
                await asyncio.sleep(0.02)

    def last_seen(self, peer: int) -> float:
        """Loop time of the last Batch received from `peer` (0.0 = never)."""
        return self._links[peer].last_seen

    # ---- sending -------------------------------------------------------------

    def send(self, msgs: list[Message]) -> None:
        """Queue messages; never blocks. Flushed as one Batch per peer this loop turn."""
        for m in msgs:
            link = self._links.get(m.to)
            if link is None and m.type == MsgType.SNAP:
                self._snapshot_failed(m)  # UNREACHABLE would leave it paused in SNAPSHOT
                continue
            if link is None:  # not (or no longer) a peer: Raft treats it as down
                self._unreachable(m.to, {m.group})
                continue
            if m.type == MsgType.SNAP and self._snapshot_source is not None:
                self._spawn(self._snapshot_task(m))
                continue
            link.lanes[self._lane_of(m)].pending.append(m)
        if not self._sending_now:
            self._schedule_flush()

    def send_now(self, msgs: list[Message]) -> bool:
        """`send`, then flush at once instead of at the end of this loop turn:
        for a caller that hands over everything of its turn in one call (the
        driver's drain pass) and would otherwise go on to await an fsync
        first, keeping an append or a response off the wire meanwhile.
        True if some of it waits for a writer task (a gRPC lane, or a backlog):
        it leaves only once the caller lets the loop turn; False when all of
        it is already in the sockets (idle direct lanes)."""
        self._queued = False
        self._sending_now = True  # `send` schedules no flush only to have it cancelled
        try:
            self.send(msgs)
        finally:
            self._sending_now = False
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._flush()
        return self._queued

    def send_lazy(self, msgs: list[Message]) -> None:
        """Queue messages that may wait: they leave with the next flush to
        their peer (another send, a beat) or after at most LAZY_FLUSH_S.
        For a leader's commit-index appends at low load: they ride in the
        next proposal's batch instead of costing a gRPC write each."""
        for m in msgs:
            link = self._links.get(m.to)
            if link is None or (m.type == MsgType.SNAP and self._snapshot_source is not None):
                self.send([m])
                continue
            link.lanes[self._lane_of(m)].pending.append(m)
        if self._lazy_handle is None and self._flush_handle is None:
            self._lazy_handle = asyncio.get_running_loop().call_later(LAZY_FLUSH_S, self._flush)

    def _lane_of(self, m: Message) -> int:
        """Appends that carry entries are bulk, unless their group is a
        priority one (the meta group); everything else is small and urgent."""
        if m.type == MsgType.APP and m.entries and m.group not in self._priority_groups:
            return LANE_BULK
        return LANE_PRIORITY

    def beat(self) -> None:
        """Send a node-level liveness beat to every peer (with the next flush)."""
        for link in self._links.values():
            link.liveness = True
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        if self._lazy_handle is not None:
            self._lazy_handle.cancel()
            self._lazy_handle = None
        for link in self._links.values():
            liveness, link.liveness = link.liveness, False
            _drop_stale_commits(*link.lanes)
            for lane in link.lanes:
                msgs, lane.pending = lane.pending, []
                beat = liveness and lane.kind == LANE_PRIORITY
                if msgs or beat:
                    self._flush_lane(link, lane, msgs, beat)

    def _flush_lane(self, link: _Link, lane: _Lane, msgs: list[Message], beat: bool) -> None:
        # A peer without a bulk stream (an older version, or still dialing)
        # gets everything on the priority stream.
        target = lane if lane.stream is not None else link.lanes[LANE_PRIORITY]
        if target.stream is None:
            self._unreachable(link.peer, {m.group for m in msgs})
            return
        for batch_msgs, size in self._split(msgs) or [([], 0)]:
            batch = encode_batch(self.node_id, link.peer, batch_msgs, liveness=beat)
            # Bounded by bytes, not batches: a slow peer holds at most
            # queue_bytes per lane here (one batch more if the queue is empty).
            if target.queue and target.queued_bytes + size > self._queue_bytes:
                self._unreachable(link.peer, {m.group for m in batch_msgs})
                continue
            if not target.queue and self._write_now(link, target, batch, size):
                continue  # (in the socket: its groups are not needed)
            target.queue.append((batch, {m.group for m in batch_msgs}, size))
            target.queued_bytes += size
            target.ready.set()
            self._queued = True

    def _write_now(self, link: _Link, lane: _Lane, batch: pb.Batch, size: int) -> bool:
        """A direct lane with nothing queued takes the batch on its socket now
        (a writer task would first need a loop turn). False: queue it."""
        stream = lane.stream
        if not isinstance(stream, tcp_lane.TcpStream):
            return False
        if stream.buffered() + size > self._queue_bytes:
            return False  # a slow peer: the queue's byte bound applies
        try:
            stream.write_now(batch)
        except Exception as exc:  # a dead stream: the writer path reports it
            log.info("transport: direct write to node %d failed: %r", link.peer, exc)
            return False
        return True

    @staticmethod
    def _split(msgs: list[Message]) -> list[tuple[list[Message], int]]:
        """Messages cut into batches of about BATCH_SPLIT_BYTES, with their sizes."""
        out: list[tuple[list[Message], int]] = []
        cur: list[Message] = []
        size = 0
        for m in msgs:
            n = message_size(m)
            if cur and size + n > BATCH_SPLIT_BYTES:
                out.append((cur, size))
                cur, size = [], 0
            cur.append(m)
            size += n
        if cur:
            out.append((cur, size))
        return out

    def _unreachable(self, peer: int, groups: set[str]) -> None:
        if not groups:
            return
        self.dropped += len(groups)
        reports = [Message(MsgType.UNREACHABLE, g, frm=peer, to=self.node_id) for g in groups]
        # Deliver on a later turn: the driver may be inside send() right now.
        asyncio.get_running_loop().call_soon(self._on_messages, reports)

    async def _writer(self, link: _Link, lane: _Lane) -> None:
        while True:
            while not lane.queue:
                lane.ready.clear()
                await lane.ready.wait()
            batch, groups, size = self._take(lane)
            stream = lane.stream
            if stream is None:
                self._unreachable(link.peer, groups)
                continue
            try:
                await stream.write(batch)
            except Exception as exc:  # any failure means this stream is dead
                log.info("transport: write to node %d failed: %r", link.peer, exc)
                self._detach(link, lane, stream)
                self._unreachable(link.peer, groups)

    @staticmethod
    def _take(lane: _Lane) -> tuple[pb.Batch, set[str], int]:
        """The next batch to write, with the batches queued behind it merged in
        (up to BATCH_SPLIT_BYTES): a backlog that built up during one slow write
        leaves in one write, not one per loop turn that added to it. Measured
        with 1,000 busy groups at load 20: 200+ small batches queued on a
        priority lane, heartbeats and votes behind them, followers timing out.
        Merging keeps every message's order within its kind; a batch already
        decodes its messages before its coalesced heartbeats, so the receiver
        sees what one bigger flush would have given it."""
        batch, groups, size = lane.queue.popleft()
        lane.queued_bytes -= size
        while lane.queue and size + lane.queue[0][2] <= BATCH_SPLIT_BYTES:
            more, more_groups, more_size = lane.queue.popleft()
            lane.queued_bytes -= more_size
            batch.MergeFrom(more)  # repeated fields append; liveness stays set if either is
            groups |= more_groups
            size += more_size
        return batch, groups, size

    # ---- the Raft stream -------------------------------------------------------

    def _attach(self, lane: _Lane, link: _Link, stream: Any, accepted: bool = False) -> None:
        """`stream` carries the lane from now on. On an acceptor (`accepted`) a
        newer stream replaces an older one that may still be open: it waits in
        `standby` until it ends (`_detach`), see there."""
        old = lane.stream
        if accepted and old is not None and old is not stream:
            lane.standby.append(old)
        lane.stream = stream
        log.info("transport: node %d connected to node %d (lane %d)", self.node_id, link.peer,
                 lane.kind)

    def _detach(self, link: _Link, lane: _Lane, stream: Any) -> None:
        """`stream` ended (or failed a write). When it was the lane's stream, an
        older one still open takes over: the newer one may have been a stale
        dial (a link its dialer replaced at start, when a peer's lane address is
        gossiped) that reached us after the dialer's live stream, and that the
        dialer then ended. Left at None, this side would go on reading the live
        stream but send on none, while the dialer, its stream healthy, never
        redials: the CI failure of 2026-11-27 (docs/notes/lag1.md)."""
        if stream is None:
            return
        if stream in lane.standby:
            lane.standby.remove(stream)
            return
        if lane.stream is not stream:
            return
        lane.stream = lane.standby.pop() if lane.standby else None
        if lane.stream is not None:
            return
        while lane.queue:  # queued for a dead stream: report, do not send later
            _, groups, _ = lane.queue.popleft()
            self._unreachable(link.peer, groups)
        lane.queued_bytes = 0

    def _on_batch(self, link: _Link, batch: pb.Batch) -> None:
        if batch.from_node != link.peer or batch.to_node != self.node_id:
            self._drop_in(link, len(batch.messages) + len(batch.heartbeats)
                          + len(batch.heartbeat_resps) + 1, "batch header")
            return
        link.last_seen = asyncio.get_running_loop().time()
        if batch.liveness and self._on_liveness is not None:
            self._on_liveness(link.peer)
        msgs, dropped = decode_wire(batch)
        if dropped:
            self._drop_in(link, dropped, "local or unknown message type")
        # The stream's peer is who the hello (and with TLS, its certificate)
        # proved: a message claiming another sender is forged. Snapshots
        # arrive only on the Snapshot RPC, data and all.
        ok = [m for m in msgs if m.frm == link.peer and m.to == self.node_id
              and m.type != MsgType.SNAP]
        if len(ok) != len(msgs):
            self._drop_in(link, len(msgs) - len(ok), "sender, receiver or type mismatch")
        msgs = ok
        if msgs:
            try:
                self._on_messages(msgs)
            except Exception:  # a driver bug must not tear down the peer's stream
                log.exception("transport: on_messages failed for a batch from %d", link.peer)

    def _drop_in(self, link: _Link, n: int, why: str) -> None:
        self.dropped_in += n
        log.warning("transport: dropped %d message(s) from node %d: %s", n, link.peer, why)

    def tls_name(self, node: int) -> str:
        """The name node `node`'s certificate must carry."""
        return self._tls_names.get(node, f"node-{node}")

    def _identified(self, context: grpc.aio.ServicerContext, node: int) -> bool:
        """Without TLS any claim goes; with it the client certificate must
        name `node` (SAN DNS entry or subject CN)."""
        if not self._tls:
            return True
        auth = context.auth_context()
        names = {*auth.get("peer_dns", ()), *auth.get("x509_common_name", ())}
        return self.tls_name(node).encode() in names

    def _channel(self, link: _Link, *, separate: bool = False) -> grpc.aio.Channel:
        if self._channel_factory is not None:
            return self._channel_factory(link.addr, separate)
        options = list(_CHANNEL_OPTIONS)
        if separate:  # its own TCP connection, not shared with the Raft stream
            options.append(("grpc.use_local_subchannel_pool", 1))
        if self._tls:
            # Verify the acceptor is node `link.peer`, whatever its address.
            options.append(("grpc.ssl_target_name_override", self.tls_name(link.peer)))
            cert, key, ca = self._tls
            creds = grpc.ssl_channel_credentials(ca, private_key=key, certificate_chain=cert)
            return grpc.aio.secure_channel(link.addr, creds, options=options)
        return grpc.aio.insecure_channel(link.addr, options=options)

    async def _open(self, link: _Link, lane: _Lane, direct: bool) -> Any:
        """A new Raft stream to the peer for `lane`: a direct TCP connection
        (`direct`, the peer has a lane address) or a gRPC call."""
        if direct:
            assert link.direct is not None
            ctx = self._ssl[1] if self._ssl else None
            # With per-node certificates (`tls`) the acceptor must be node N;
            # with the cluster's TLS, the host it is dialed at (gRPC's rule).
            name = (self.tls_name(link.peer) if self._tls
                    else tcp_lane.split_addr(link.direct)[0])
            key = self._direct_key()
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                stream = await tcp_lane.dial(link.direct, ctx, name, MAX_GRPC_MESSAGE,
                                             proxy=tcp_lane.proxy_for(link.direct),
                                             prove=key is not None)
                if key is not None:
                    try:
                        await self._prove_to_acceptor(link, stream, key)
                    except BaseException:
                        stream.cancel()
                        raise
                return stream
        if lane.channel is None:
            # The bulk lane has its own TCP connection: a full socket
            # buffer of appends must not hold heartbeats back.
            lane.channel = self._channel(link, separate=lane.kind != LANE_PRIORITY)
        return pb_grpc.ClusterStub(lane.channel).Raft(wait_for_ready=True)

    def _direct_key(self) -> bytes | None:
        return self._direct_cred.encode() if self._direct_cred else None

    async def _prove_to_acceptor(self, link: _Link, stream: tcp_lane.TcpStream,
                                 key: bytes) -> None:
        """The dialer's half of the lane's mutual proof: its challenge, the
        acceptor's proof checked, and only then its own proof. Raises (the
        dial failed: the caller falls back to gRPC) on anything else."""
        assert link.direct is not None
        ch = lane_auth.Challenge(os.urandom(lane_auth.NONCE), self.node_id, link.peer,
                                 tcp_lane.split_addr(link.direct)[1])
        stream.write_frame(ch.frame())
        got = await stream.read_frame()
        if got is None:
            raise ConnectionError(f"direct lane {link.direct} closed during its proof")
        nonce = lane_auth.check_answer(key, ch, got)
        if nonce is None:
            self.direct_refused += 1
            log.warning("transport: node %d -> %d: the direct lane at %s did not prove the "
                        "cluster authorization; not using it", self.node_id, link.peer,
                        link.direct)
            raise ConnectionError(f"direct lane {link.direct}: no proof of the cluster secret")
        stream.write_frame(lane_auth.proof(key, ch, nonce))
        stream.authorized()

    async def _handshake(self, link: _Link, lane: _Lane, direct: bool) -> Any:
        """Open a stream and exchange hellos; the stream, or an exception
        (the stream is closed then)."""
        call = await self._open(link, lane, direct)
        try:
            hello = pb.Batch(from_node=self.node_id, to_node=link.peer, hello=True,
                             lane=lane.kind)
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                await call.write(hello)
                reply = await call.read()
            if reply is grpc.aio.EOF or not reply.hello or reply.from_node != link.peer:
                raise ConnectionError(f"bad hello from {link.addr}")
        except BaseException:
            call.cancel()
            raise
        return call

    def _dial_direct(self, link: _Link) -> bool:
        """Whether the next dial of `link` tries its direct lane: yes while it
        has one and has not just failed. After a failed direct dial the next
        one is a gRPC dial (a firewall that passes only the cluster port, a
        lane port the network cannot reach), which in turn keeps the lane
        until a probe gets through (`_serve_until_direct`)."""
        return link.direct is not None and (not self._direct_fallback or link.direct_fails == 0)

    def _dialed(self, link: _Link, lane: _Lane, direct: bool, ok: bool) -> None:
        """Bookkeeping of one dial's outcome: which kind the next one tries."""
        if direct:
            link.direct_fails = 0 if ok else link.direct_fails + 1
        elif link.direct is not None and ok:
            # A gRPC stream stands in for the lane (counted per lane, logged once a link).
            self.direct_fallbacks += 1
            if lane.kind == LANE_PRIORITY or link.lanes[LANE_PRIORITY].stream is None:
                log.warning("transport: node %d -> %d: direct lane %s unreachable, Raft "
                            "falls back to the gRPC lanes", self.node_id, link.peer, link.direct)
        elif link.direct is not None:
            # gRPC did not answer either: the peer is down or cut off, not
            # only its lane port. Try the lane first again.
            link.direct_fails = 0

    async def _dial_loop(self, link: _Link, lane: _Lane) -> None:
        backoff = BACKOFF_MIN
        while not self._closing:
            call = None
            direct = self._dial_direct(link)
            try:
                try:
                    call = await self._handshake(link, lane, direct)
                except BaseException:
                    self._dialed(link, lane, direct, ok=False)
                    raise
                self._dialed(link, lane, direct, ok=True)
                self._attach(lane, link, call)
                backoff = BACKOFF_MIN
                while call is not None:
                    nxt = await self._serve_until_direct(link, lane, call)
                    if nxt is None:
                        break
                    # The lane is reachable again: its stream replaces the gRPC one.
                    self._detach(link, lane, call)
                    call.cancel()
                    call = nxt
                    self.direct_restored += 1
                    log.info("transport: node %d -> %d: back on the direct lane (lane %d)",
                             self.node_id, link.peer, lane.kind)
                    self._attach(lane, link, call)
            except (grpc.aio.AioRpcError, TimeoutError, OSError) as exc:
                log.debug("transport: node %d -> %d: %r", self.node_id, link.peer, exc)
            except Exception:  # keep redialing whatever happened
                log.exception("transport: node %d -> %d: stream failed", self.node_id, link.peer)
            finally:
                if call is not None:
                    self._detach(link, lane, call)
                    call.cancel()
            if link.direct_fails == 1 and self._direct_fallback:
                continue  # the direct lane just failed: the gRPC dial at once
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def _serve_until_direct(self, link: _Link, lane: _Lane, call: Any) -> Any:
        """Read `call` until it ends (None). A gRPC stream standing in for an
        unreachable direct lane also probes the lane (after DIRECT_PROBE_MIN_S,
        doubling up to every DIRECT_RETRY_S) and returns the new direct stream
        as soon as one gets through."""
        if link.direct is None or isinstance(call, tcp_lane.TcpStream):
            await self._read_loop(link, call)
            return None
        reading = asyncio.ensure_future(self._read_loop(link, call))
        probe: asyncio.Future[Any] | None = None
        gap = min(DIRECT_PROBE_MIN_S, self._direct_retry)
        try:
            while True:
                wait = gap * (0.5 + random.random())
                gap = min(gap * 2, self._direct_retry)
                done, _ = await asyncio.wait({reading}, timeout=wait)
                if done:
                    reading.result()  # its exception, if any, ends this stream
                    return None
                # The probe races the gRPC stream: a silent port holds it for
                # HANDSHAKE_TIMEOUT, and a stream that ends meanwhile must not wait.
                probe = asyncio.ensure_future(self._handshake(link, lane, True))
                await asyncio.wait({reading, probe}, return_when=asyncio.FIRST_COMPLETED)
                if not probe.done():
                    reading.result()
                    return None
                found, probe = probe, None
                try:
                    return found.result()
                except (grpc.aio.AioRpcError, TimeoutError, OSError) as exc:
                    self.direct_probes_failed += 1
                    log.debug("transport: node %d -> %d: direct lane still unreachable: %r",
                              self.node_id, link.peer, exc)
        finally:
            if probe is not None:
                probe.cancel()  # `_handshake` closes what it opened
                (got,) = await asyncio.gather(probe, return_exceptions=True)
                if got is not None and not isinstance(got, BaseException):
                    got.cancel()  # it got through just as this stream ended: redial
            if not reading.done():
                reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)  # its outcome is seen

    async def _read_loop(self, link: _Link, stream: Any) -> None:
        if isinstance(stream, tcp_lane.TcpStream):
            await self._serve_direct(link, stream)
            return
        while True:
            batch = await stream.read()
            if batch is grpc.aio.EOF:
                return
            self._on_batch(link, batch)

    async def _serve_direct(self, link: _Link, stream: tcp_lane.TcpStream) -> None:
        """Each batch is stepped inside the socket's read callback. Meanwhile an
        empty batch leaves every DIRECT_PING_S (a valid batch: it only refreshes
        `last_seen`), and once the peer has pinged, a stream that reads nothing
        for DIRECT_DEAD_S is closed: the dialer redials (and falls back to gRPC
        when the lane port no longer answers). A peer that never pings (an
        older version) is not timed out."""
        loop = asyncio.get_running_loop()
        last = [loop.time(), False]  # last read, the peer pings

        def on_batch(batch: pb.Batch) -> None:
            last[0] = loop.time()
            if not (batch.messages or batch.heartbeats or batch.heartbeat_resps
                    or batch.liveness or batch.hello):
                last[1] = True
                return
            self._on_batch(link, batch)

        serving = asyncio.ensure_future(stream.serve(on_batch))
        try:
            while True:
                done, _ = await asyncio.wait({serving}, timeout=self._direct_ping)
                if done:
                    return serving.result()
                if last[1] and loop.time() - last[0] > self._direct_dead:
                    self.direct_stalled += 1
                    log.warning("transport: node %d -> %d: direct lane silent for %.1fs, "
                                "closing it", self.node_id, link.peer, loop.time() - last[0])
                    stream.cancel()
                    continue
                try:
                    stream.write_now(pb.Batch(from_node=self.node_id, to_node=link.peer))
                except Exception:  # noqa: BLE001 - a dead stream: serving ends
                    stream.cancel()
        finally:
            if not serving.done():
                stream.cancel()
            await asyncio.gather(serving, return_exceptions=True)

    async def _accept(self, context: grpc.aio.ServicerContext) -> None:
        hello = await context.read()
        if hello is grpc.aio.EOF:
            return
        link = self._links.get(hello.from_node)
        if not hello.hello or hello.to_node != self.node_id or link is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "unknown peer or wrong node")
        if not self._identified(context, hello.from_node):
            log.warning("transport: refused a stream claiming node %d: certificate does not "
                        "name %s", hello.from_node, self.tls_name(hello.from_node))
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"certificate does not name {self.tls_name(hello.from_node)}")
        if hello.lane not in (LANE_PRIORITY, LANE_BULK):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown lane {hello.lane}")
        lane = link.lanes[hello.lane]
        await context.write(pb.Batch(from_node=self.node_id, to_node=link.peer, hello=True,
                                     lane=lane.kind))
        self._attach(lane, link, context, accepted=True)  # a redial replaces an older stream
        me = asyncio.current_task()
        if me is not None:
            link.tasks.add(me)  # remove_peer ends this call
        try:
            await self._read_loop(link, context)
        finally:
            link.tasks.discard(me)
            self._detach(link, lane, context)

    def _on_direct_stream(self, stream: tcp_lane.TcpStream) -> None:
        if self._closing or self._direct_handshakes >= DIRECT_HANDSHAKES_MAX:
            self.direct_refused += 1
            stream.cancel()
            return
        self._direct_handshakes += 1
        self._spawn(self._accept_direct(stream))

    async def _direct_hello(self, stream: tcp_lane.TcpStream) -> tuple[_Link, _Lane] | None:
        """Authorization, then the hello and identity checks of `_accept`;
        None (refused, logged) when any fails."""
        key = self._direct_key()
        dialer: int | None = None
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                if key is not None:
                    dialer = await self._proven_dialer(stream, key)
                    if dialer is None:
                        return None
                else:
                    cred = await stream.read_auth()
                    if cred is None:
                        return self._refuse_direct("no authorization frame")
                    if self._direct_allows is not None and not self._direct_allows(cred or None):
                        return self._refuse_direct("cluster authorization failed")
                stream.authorized()
                hello = await stream.read()
        except TimeoutError:
            return self._refuse_direct("handshake timed out")
        except ConnectionError:  # it hung up before our answer could leave
            return None
        if hello is grpc.aio.EOF:
            return None
        link = self._links.get(hello.from_node)
        # A known peer whose own direct address we have not learned yet (gossip)
        # may dial us: the acceptor needs only who it is, not where it listens.
        if (not hello.hello or hello.to_node != self.node_id or link is None
                or hello.lane not in (LANE_PRIORITY, LANE_BULK)
                or dialer not in (None, hello.from_node)):
            return self._refuse_direct("unknown peer, node or lane")
        if self._tls and self.tls_name(hello.from_node).encode() not in stream.peer_names():
            return self._refuse_direct(f"certificate does not name "
                                       f"{self.tls_name(hello.from_node)}")
        return link, link.lanes[hello.lane]

    async def _proven_dialer(self, stream: tcp_lane.TcpStream, key: bytes) -> int | None:
        """The acceptor's half of the lane's mutual proof (raft/lane_auth.py):
        the dialer's node id once its proof checked out, None (refused) else.
        This node proves itself only for a challenge naming it, one of its lane
        ports and a known peer: a squatter on a stale port that relays a
        member's challenge here gets nothing the member would accept."""
        ch = lane_auth.Challenge.parse(await stream.read_frame())
        if ch is None:
            return self._refuse_direct("cluster authorization failed (no lane challenge)")
        assert self._direct_server is not None
        ports = {sock.getsockname()[1] for sock in self._direct_server.sockets}
        if (ch.acceptor != self.node_id or ch.port not in ports
                or ch.dialer not in self._links):
            return self._refuse_direct("cluster authorization failed (a challenge for "
                                       "another node, port or an unknown peer)")
        nonce = os.urandom(lane_auth.NONCE)
        stream.write_frame(lane_auth.answer(key, ch, nonce))
        if not lane_auth.check_proof(key, ch, nonce, await stream.read_frame()):
            return self._refuse_direct("cluster authorization failed (wrong proof)")
        return ch.dialer

    def _refuse_direct(self, why: str) -> None:
        self.direct_refused += 1
        log.warning("transport: refused a direct stream: %s", why)
        return None

    async def _accept_direct(self, stream: tcp_lane.TcpStream) -> None:
        """A peer dialed our direct lane: its authorization frame, then the
        same hello and identity checks as `_accept`, then the same reading."""
        try:
            try:
                found = await self._direct_hello(stream)
            finally:
                self._direct_handshakes -= 1
            if found is None:
                return
            link, lane = found
            stream.write_now(pb.Batch(from_node=self.node_id, to_node=link.peer, hello=True,
                                      lane=lane.kind))
            self._attach(lane, link, stream, accepted=True)  # a redial replaces an older one
            me = asyncio.current_task()
            if me is not None:  # remove_peer ends this connection
                link.tasks.add(me)
            try:
                await self._read_loop(link, stream)
            finally:
                link.tasks.discard(me)
                self._detach(link, lane, stream)
        except Exception:  # one bad connection must not disturb the others
            log.exception("transport: direct stream failed")
        finally:
            stream.cancel()

    # ---- snapshots ----------------------------------------------------------------

    async def send_snapshot(self, msg: Message, data: AsyncIterator[bytes]) -> bool:
        """Stream one snapshot to msg.to; True once the receiver acknowledged it."""
        link = self._links[msg.to]
        if link.snap_channel is None:
            link.snap_channel = self._channel(link, separate=True)
        call = pb_grpc.ClusterStub(link.snap_channel).Snapshot(wait_for_ready=True)
        try:
            await call.write(pb.SnapshotChunk(header=message_to_pb(msg)))
            offset = 0
            async for piece in _rechunk(data, self._chunk):
                await call.write(pb.SnapshotChunk(data=piece, offset=offset))
                offset += len(piece)
            await call.write(pb.SnapshotChunk(offset=offset, done=True))
            await call.done_writing()
            ack = await call
        except grpc.aio.AioRpcError as exc:
            log.warning("transport: snapshot %s to node %d failed: %r", msg.group, msg.to, exc)
            return False
        if not ack.ok:
            log.warning("transport: node %d refused snapshot %s: %s", msg.to, msg.group, ack.error)
        return ack.ok

    async def _snapshot_task(self, msg: Message) -> None:
        """Stream one SNAP and always report how it went (SNAP_STATUS): the
        leader sends that peer nothing else until the report comes."""
        assert self._snapshot_source is not None
        try:
            ok = await self.send_snapshot(msg, self._snapshot_source(msg))
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise  # this task is being stopped (the transport is closing)
            ok = False  # a closed channel cancelled the call under us
        except Exception:
            log.exception("transport: snapshot source for %s failed", msg.group)
            ok = False
        status = Message(MsgType.SNAP_STATUS, msg.group, frm=msg.to, to=self.node_id, reject=not ok)
        self._on_messages([status])

    def _snapshot_failed(self, msg: Message) -> None:
        """Report a SNAP that could not even start, on a later loop turn."""
        self.dropped += 1
        status = Message(MsgType.SNAP_STATUS, msg.group, frm=msg.to, to=self.node_id, reject=True)
        asyncio.get_running_loop().call_soon(self._on_messages, [status])

    async def _receive_snapshot(self, context: grpc.aio.ServicerContext) -> pb.SnapshotAck:
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("header"):
            return pb.SnapshotAck(ok=False, error="no header")
        if self._on_snapshot is None:
            return pb.SnapshotAck(ok=False, error="snapshots not accepted")
        if first.header.type != MsgType.SNAP:
            return pb.SnapshotAck(ok=False, error="header is not a SNAP message")
        header = message_from_pb(first.header)
        if header.to != self.node_id or header.frm not in self._links:
            return pb.SnapshotAck(ok=False, error="unknown sender or wrong receiver")
        if not self._identified(context, header.frm):
            log.warning("transport: refused a snapshot claiming node %d", header.frm)
            return pb.SnapshotAck(ok=False, error="certificate does not name the sender")
        rx = _ChunkReader(context)
        try:
            ok = bool(await self._on_snapshot(header, rx.data()))
        except Exception as exc:
            log.warning("transport: snapshot %s from %d failed: %r", header.group, header.frm, exc)
            return pb.SnapshotAck(ok=False, error=repr(exc), bytes=rx.received)
        if ok and not rx.done:
            return pb.SnapshotAck(ok=False, error="receiver stopped early", bytes=rx.received)
        return pb.SnapshotAck(ok=ok, bytes=rx.received)


class _ChunkReader:
    """Data chunks of one Snapshot call, checked for order and completeness."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._ctx = context
        self.received = 0
        self.done = False

    async def data(self) -> AsyncIterator[bytes]:
        while not self.done:
            chunk = await self._ctx.read()
            if chunk is grpc.aio.EOF:
                raise ConnectionError("snapshot stream ended before its last chunk")
            if chunk.offset != self.received:
                raise ConnectionError(f"snapshot chunk at {chunk.offset}, want {self.received}")
            self.done = chunk.done
            if chunk.data:
                self.received += len(chunk.data)
                yield chunk.data


def _drop_stale_commits(priority: _Lane, bulk: _Lane) -> None:
    """Leave out a leader's commit-index appends (no entries, priority lane)
    whose news an append with entries in the same flush, bulk lane, carries
    too (same group, commit at least as high): at low load a commit's
    `send_lazy` appends ride with the next proposal's flush, and over two lanes
    they cost a second write per peer and commit. Raft tolerates the loss of
    any message; this one says nothing the other does not."""
    if not priority.pending or not bulk.pending:
        return
    carried: dict[str, int] = {}
    for m in bulk.pending:
        if m.type == MsgType.APP and m.commit > carried.get(m.group, -1):
            carried[m.group] = m.commit
    if carried:
        priority.pending = [m for m in priority.pending
                            if not (m.type == MsgType.APP and not m.entries
                                    and carried.get(m.group, -1) >= m.commit)]


async def _rechunk(data: AsyncIterator[bytes], size: int) -> AsyncIterator[bytes]:
    """Re-cut an arbitrary byte stream into pieces of at most `size` bytes."""
    buf = bytearray()
    async for piece in data:
        buf += piece
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if buf:
        yield bytes(buf)


class _Servicer(pb_grpc.ClusterServicer):
    def __init__(self, transport: GrpcTransport) -> None:
        self._t = transport

    async def Raft(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        await self._t._accept(context)

    async def Snapshot(self, request_iterator, context):  # noqa: N802
        return await self._t._receive_snapshot(context)

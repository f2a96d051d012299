"""One outgoing route: this node's side of the link to one peer.

A link owns two gRPC channels to the peer, each its own TCP connection: the
`Messages` stream (interest and core messages, in order, batched per event
loop turn) and the control channel (gossip every GOSSIP_INTERVAL, which is
also the liveness check). Raft traffic has connections of its own
(raft/transport_grpc.py), so core messages never queue behind bulk appends.

A session starts after a Hello named the peer, sends `reset` and this node's
whole interest first, then deltas and messages as they come. It ends when a
write or gossip fails; the cluster then redials with backoff.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from proto import cluster_pb2 as pb
from proto import cluster_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from node.cluster.service import Cluster

GOSSIP_INTERVAL = 0.5
GOSSIP_TIMEOUT = 2.0
GOSSIP_FAILURES = 3  # consecutive failed gossips before the peer counts as down
QUEUE_BYTES = 32 << 20  # queued messages per link beyond which new ones are dropped
BATCH_OPS = 4096  # ops per RouteBatch: a reset with a huge interest snapshot stays small
BATCH_BYTES = 1 << 20  # frame bytes per RouteBatch


class Link:
    def __init__(self, cluster: Cluster, peer: int, addr: str, name: str,
                 ctrl: grpc.aio.Channel, data: grpc.aio.Channel, solicited: bool) -> None:
        self.cluster = cluster
        self.peer = peer
        self.addr = addr
        self.name = name
        self.ctrl = ctrl
        self.data = data
        self.solicited = solicited  # dialed from the configured routes
        self.pending: list[pb.RouteOp] = []
        self.pending_bytes = 0
        self.queue: deque[tuple[pb.RouteBatch, int]] = deque()
        self.queued_bytes = 0
        self.ready = asyncio.Event()
        self.closed = False
        self._flush_scheduled = False
        self.start = time.time()
        self.last_activity = self.start
        self.rtt = 0.0
        self.out_msgs = self.out_bytes = 0
        self.in_msgs = self.in_bytes = 0  # filled by the incoming stream of this peer
        self.dropped = 0
        self._stream: Any = None

    # ---- queueing (never blocks; called on the publisher's path)

    def send_op(self, op: pb.RouteOp | bytes, size: int, droppable: bool) -> bool:
        """Queue an interest op (never dropped) or a message frame (bytes,
        node/cluster/frames.py; dropped past QUEUE_BYTES)."""
        if self.closed:
            return False
        if droppable and self.queued_bytes + self.pending_bytes + size > QUEUE_BYTES:
            self.dropped += 1  # a stalled peer: drop messages, never interest
            return False
        self.pending.append(op)
        self.pending_bytes += size
        if droppable:
            self.out_msgs += 1
            self.out_bytes += size
        if not self._flush_scheduled:
            # The writer batches what is pending when it next runs (this loop turn's
            # frames together): one loop turn to the gRPC write, not a flush turn and
            # then the writer's (a forwarded publish and its PubAck cross a route each).
            self._flush_scheduled = True
            self.ready.set()
        return True

    def _flush(self) -> None:
        self._flush_scheduled = False
        items, self.pending = self.pending, []
        self.pending_bytes = 0
        if not items or self.closed:
            return
        me = self.cluster.self_id
        # Runs of frames and runs of ops become separate batches, in order.
        run: list = []
        run_bytes = 0
        frames = isinstance(items[0], bytes)
        for item in items:
            is_frame = isinstance(item, bytes)
            if is_frame != frames or len(run) >= BATCH_OPS or run_bytes >= BATCH_BYTES:
                self._queue_batch(me, run, frames, run_bytes)
                run, run_bytes, frames = [], 0, is_frame
            run.append(item)
            if is_frame:
                run_bytes += len(item)
        self._queue_batch(me, run, frames, run_bytes)
        self.ready.set()

    def _queue_batch(self, me: int, run: list, frames: bool, nbytes: int) -> None:
        if not run:
            return
        if frames:
            batch = pb.RouteBatch(from_peer=me, frames=b"".join(run))
        else:
            batch = pb.RouteBatch(from_peer=me, ops=run)
        self.queue.append((batch, nbytes))
        self.queued_bytes += nbytes

    # ---- the session

    async def run(self, first_ops: list[pb.RouteOp]) -> None:
        """Until the link fails or is closed."""
        self._stream = pb_grpc.RouteStub(self.data).Messages()
        self.pending[:0] = first_ops
        self._flush()
        writer = asyncio.ensure_future(self._writer())
        gossip = asyncio.ensure_future(self._gossip_loop())
        ended = asyncio.ensure_future(self._stream_ended())
        tasks = {writer, gossip, ended}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    self.cluster.log.debug(f"route to {self.name}: {t.exception()!r}")
        finally:
            self.closed = True
            for t in tasks:
                t.cancel()
            self._stream.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _stream_ended(self) -> None:
        """Returns when the peer ends the Messages call (it refused or stopped)."""
        try:
            await self._stream
        except grpc.aio.AioRpcError as err:
            self.cluster.log.debug(f"route to {self.name}: stream ended: {err.code().name}")

    async def _writer(self) -> None:
        while True:
            while not self.queue:
                if self._flush_scheduled:
                    self._flush()
                    continue
                self.ready.clear()
                await self.ready.wait()
            batch, size = self.queue.popleft()
            self.queued_bytes -= size
            await self._stream.write(batch)
            self.last_activity = time.time()

    async def _gossip_loop(self) -> None:
        stub = pb_grpc.RouteStub(self.ctrl)
        failures = 0
        while True:
            t0 = time.monotonic()
            try:
                reply = await stub.Gossip(self.cluster.gossip_msg(), timeout=GOSSIP_TIMEOUT)
            except grpc.aio.AioRpcError as err:
                failures += 1
                # A refused connection or a peer that stopped is down now;
                # a slow answer gets a few chances.
                if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED) \
                        or failures >= GOSSIP_FAILURES:
                    raise
            else:
                failures = 0
                self.rtt = time.monotonic() - t0
                self.cluster.merge_gossip(reply.members, via=self.peer)
                if any(m.peer_id == self.peer and m.shutdown for m in reply.members):
                    return  # the peer is leaving
            await asyncio.sleep(GOSSIP_INTERVAL)

    def close(self) -> None:
        self.closed = True
        self.ready.set()
        if self._stream is not None:
            self._stream.cancel()


OnDone = Callable[[Link], None]

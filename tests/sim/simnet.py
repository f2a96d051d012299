"""A simulated network: the driver's `Transport` over seeded faults.

Every message is delivered (or not) by a timer on the simulation loop:
dropped with probability `drop`, delivered twice with `dup`, after a random
delay (which reorders), and never across a partition or to a node that is
down. Snapshots stream like the gRPC transport's: the sender's
`snapshot_source` is read chunk by chunk into the receiver's `on_snapshot`,
and the sender learns the outcome as a SNAP_STATUS message. A stream can be
cut in the middle.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from raft.types import Message, MsgType
from tests.sim.simdisk import SimCrash

_LOCAL = frozenset({MsgType.HUP, MsgType.BEAT, MsgType.PROP, MsgType.UNREACHABLE,
                    MsgType.SNAP_STATUS, MsgType.STORAGE_APPEND_RESP})


@dataclass
class NetFaults:
    drop: float = 0.0
    dup: float = 0.0
    delay_s: tuple[float, float] = (0.0005, 0.004)
    slow: float = 0.05  # share of messages delayed 20x (reordering)
    cut_snapshot: float = 0.1


class SimNet:
    def __init__(self, loop: asyncio.AbstractEventLoop, rng: random.Random,
                 faults: NetFaults | None = None) -> None:
        self.loop = loop
        self.rng = rng
        self.faults = faults or NetFaults()
        self.endpoints: dict[int, SimTransport] = {}
        self.side: dict[int, int] = {}  # node -> partition side (same side = connected)
        self.sent = 0
        self.delivered = 0
        self.snapshots_sent = 0

    def transport(self, node: int, peers: list[int]) -> SimTransport:
        t = SimTransport(self, node, peers)
        self.endpoints[node] = t
        return t

    def connected(self, a: int, b: int) -> bool:
        return self.side.get(a, 0) == self.side.get(b, 0)

    def partition(self, sides: list[list[int]]) -> None:
        self.side = {n: i for i, side in enumerate(sides) for n in side}

    def heal(self) -> None:
        self.side = {}

    def up(self, node: int) -> SimTransport | None:
        t = self.endpoints.get(node)
        return t if t is not None and t.running else None

    def _delay(self) -> float:
        lo, hi = self.faults.delay_s
        d = lo + self.rng.random() * (hi - lo)
        return d * 20 if self.rng.random() < self.faults.slow else d

    def post(self, frm: int, m: Message) -> None:
        self.sent += 1
        if self.rng.random() < self.faults.drop:
            return
        copies = 2 if self.rng.random() < self.faults.dup else 1
        for _ in range(copies):
            self.loop.call_later(self._delay(), self._deliver, frm, m)

    def _deliver(self, frm: int, m: Message) -> None:
        src, dst = self.up(frm), self.up(m.to)
        if src is None or dst is None or not self.connected(frm, m.to):
            return
        dst.seen[frm] = self.loop.time()
        self.delivered += 1
        dst.callbacks["on_messages"]([_copy(m)])

    def beat(self, frm: int, to: int) -> None:
        if self.rng.random() < self.faults.drop:
            return

        def arrive() -> None:
            src, dst = self.up(frm), self.up(to)
            if src is None or dst is None or not self.connected(frm, to):
                return
            dst.seen[frm] = self.loop.time()
            dst.callbacks["on_liveness"](frm)

        self.loop.call_later(self._delay(), arrive)

    async def stream_snapshot(self, frm: int, m: Message) -> None:
        """Stream the snapshot `m` announces; report SNAP_STATUS to the sender."""
        ok = False
        try:
            ok = await self._stream(frm, m)
        except SimCrash:
            ok = False
        except Exception:  # noqa: BLE001 (a failed source or receiver: Raft retries)
            ok = False
        src = self.up(frm)
        if src is not None:
            status = Message(MsgType.SNAP_STATUS, m.group, frm=m.to, to=frm, reject=not ok)
            src.callbacks["on_messages"]([status])

    async def _stream(self, frm: int, m: Message) -> bool:
        src = self.up(frm)
        if src is None:
            return False
        source = src.callbacks["snapshot_source"](m)
        cut = self.rng.random() < self.faults.cut_snapshot
        self.snapshots_sent += 1

        async def chunks() -> AsyncIterator[bytes]:
            async for piece in source:
                await asyncio.sleep(self._delay())
                if self.up(frm) is None or self.up(m.to) is None or not self.connected(frm, m.to):
                    raise ConnectionError("snapshot stream broken")
                if cut and self.rng.random() < 0.5:
                    raise ConnectionError("snapshot stream cut")
                yield piece

        await asyncio.sleep(self._delay())
        dst = self.up(m.to)
        if dst is None or not self.connected(frm, m.to):
            return False
        dst.seen[frm] = self.loop.time()
        return bool(await dst.callbacks["on_snapshot"](_copy(m), chunks()))


def _copy(m: Message) -> Message:
    """The receiver gets its own objects, as after a wire round trip."""
    from dataclasses import replace

    ents = [type(e)(e.term, e.index, e.type, bytes(e.data)) for e in m.entries]
    return replace(m, entries=ents)


@dataclass
class SimTransport:
    net: SimNet
    node: int
    peers: list[int]
    callbacks: dict[str, Callable[..., Any]] = field(default_factory=dict)
    seen: dict[int, float] = field(default_factory=dict)
    running: bool = False
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    refused_local: int = 0

    def bind(self, callbacks: dict[str, Callable[..., Any]]) -> None:
        self.callbacks = callbacks

    async def start(self) -> None:
        self.running = True

    async def stop(self) -> None:
        self.running = False

    def kill(self) -> None:
        """The node died: nothing more leaves or arrives."""
        self.running = False
        for t in list(self.tasks):
            t.cancel()

    def send(self, msgs: list[Message]) -> None:
        if not self.running:
            return
        for m in msgs:
            if m.type in _LOCAL:
                self.refused_local += 1
                continue
            if m.type is MsgType.SNAP:
                task = asyncio.ensure_future(self.net.stream_snapshot(self.node, m))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
                continue
            self.net.post(self.node, m)

    def beat(self) -> None:
        if not self.running:
            return
        for p in self.peers:
            if p != self.node:
                self.net.beat(self.node, p)

    def last_seen(self, peer: int) -> float:
        if peer not in self.peers:
            raise KeyError(peer)
        return self.seen.get(peer, 0.0)

    def add_peer(self, node: int, addr: str) -> None:
        if node not in self.peers:
            self.peers.append(node)

    def remove_peer(self, node: int) -> None:
        if node in self.peers:
            self.peers.remove(node)

"""The nemesis: faults injected on a schedule while the workload runs.

Each fault is a pair of steps, `inject` then `heal` after a hold time, recorded in the
history as `info` events of process "nemesis". The stream leader is found by asking the
cluster (STREAM.INFO `cluster.leader`); a single node is its own leader.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from chaos.history import History
from chaos.nodes import Cluster, Node


@dataclass(frozen=True)
class FaultInfo:
    name: str
    doc: str
    min_nodes: int = 1
    needs_net: bool = False


FAULTS: dict[str, FaultInfo] = {f.name: f for f in [
    FaultInfo("kill-leader", "kill -9 the stream leader, restart it after the hold"),
    FaultInfo("restart-leader", "SIGTERM the stream leader (clean stop), restart it"),
    FaultInfo("pause-leader", "SIGSTOP the stream leader, SIGCONT after the hold"),
    FaultInfo("kill-meta-leader", "kill -9 the JetStream meta leader (/jsz meta_cluster) while "
              "streams are being created, restart it", min_nodes=3),
    FaultInfo("kill-all", "kill -9 every node, restart them all"),
    FaultInfo("kill-minority", "kill -9 a minority of the nodes, restart them", min_nodes=3),
    FaultInfo("partition-leader", "cut the stream leader off from everyone (network "
              "namespaces), heal after the hold", min_nodes=3, needs_net=True),
    FaultInfo("wipe-follower", "kill -9 a follower, delete its data directory, restart it "
              "(it must rejoin as a new peer, never with a forgotten vote)", min_nodes=3),
    FaultInfo("none", "no faults: the control run"),
]}


def applicable(name: str, nodes: int, has_net: bool) -> str | None:
    """Why `name` cannot run here, or None."""
    names = [n for n in name.split(",") if n]
    if not names:
        return "no fault named"
    for n in names:
        if n == "mixed":
            continue
        info = FAULTS.get(n)
        if info is None:
            return f"unknown fault {n!r} (known: {', '.join(sorted(FAULTS))}, mixed)"
        if nodes < info.min_nodes:
            return f"{n} needs at least {info.min_nodes} nodes"
        if info.needs_net and not has_net:
            return f"{n} needs network namespaces (--net netns, as root)"
    return None


class Nemesis:
    def __init__(self, history: History, cluster: Cluster, stream: str,
                 find_leader: Callable[[], Awaitable[str | None]], net: Any = None,
                 seed: int = 0) -> None:
        self.h = history
        self.cluster = cluster
        self.stream = stream
        self.find_leader = find_leader
        self.net = net
        self.rng = random.Random(seed)
        self.count = 0

    def _choices(self, spec: str) -> list[str]:
        names = spec.split(",")
        if "mixed" in names:
            n = len(self.cluster.nodes)
            names = [f for f, info in FAULTS.items() if f != "none" and n >= info.min_nodes
                     and (self.net is not None or not info.needs_net)]
        return names

    async def _leader(self) -> Node:
        name = await self.find_leader()
        if name is None:
            return self.cluster.nodes[0] if len(self.cluster.nodes) == 1 \
                else self.rng.choice(self.cluster.nodes)
        return self.cluster.by_name(name)

    async def run(self, spec: str, stop: asyncio.Event, interval: float, hold: float) -> None:
        choices = self._choices(spec)
        mixed = "mixed" in spec.split(",")
        turn = 0
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.rng.uniform(interval / 2, interval))
                return
            except TimeoutError:
                pass
            # A list runs in order (repeatable); "mixed" draws at random.
            name = self.rng.choice(choices) if mixed else choices[turn % len(choices)]
            turn += 1
            if name == "none":
                continue
            await self.once(name, hold)

    async def _meta_leader(self) -> Node:
        """The meta group's leader by /jsz `meta_cluster.leader` (any node that answers)."""
        for node in self.cluster.nodes:
            if not node.alive() or node.paused:
                continue
            try:
                body = await asyncio.to_thread(_http_get, f"http://{node.host}:"
                                               f"{node.ports.monitor}/jsz")
                name = json.loads(body).get("meta_cluster", {}).get("leader")
            except Exception:  # noqa: BLE001 - that node cannot say: ask the next
                continue
            if name:
                return self.cluster.by_name(name)
        return self.rng.choice(self.cluster.nodes)

    def _note(self, f: str, **kw: Any) -> None:
        self.h.add("nemesis", "info", f, **kw)

    async def _start(self, nodes: list[Node]) -> None:
        for n in nodes:
            n.start(wait=False)
        for n in nodes:
            await asyncio.to_thread(n.wait_ready, 120)

    async def once(self, name: str, hold: float) -> None:
        self.count += 1
        nodes = self.cluster.nodes
        if name in ("kill-leader", "restart-leader", "pause-leader", "partition-leader",
                    "kill-meta-leader"):
            leader = await self._meta_leader() if name == "kill-meta-leader" \
                else await self._leader()
            self._note(name, phase="inject", node=leader.name)
            if name in ("kill-leader", "kill-meta-leader"):
                leader.kill()
            elif name == "restart-leader":
                await asyncio.to_thread(leader.stop)
            elif name == "pause-leader":
                leader.pause()
            else:
                self.net.isolate(leader.index)
            await asyncio.sleep(hold)
            if name == "pause-leader":
                leader.resume()
            elif name == "partition-leader":
                self.net.heal(leader.index)
            else:
                await self._start([leader])
            self._note(name, phase="heal", node=leader.name)
        elif name == "kill-all":
            self._note(name, phase="inject", nodes=[n.name for n in nodes])
            for n in nodes:
                n.kill()
            await asyncio.sleep(hold)
            await self._start(nodes)
            self._note(name, phase="heal")
        elif name == "kill-minority":
            victims = self.rng.sample(nodes, (len(nodes) - 1) // 2)
            self._note(name, phase="inject", nodes=[n.name for n in victims])
            for n in victims:
                n.kill()
            await asyncio.sleep(hold)
            await self._start(victims)
            self._note(name, phase="heal", nodes=[n.name for n in victims])
        elif name == "wipe-follower":
            leader = await self._leader()
            victim = self.rng.choice([n for n in nodes if n is not leader])
            self._note(name, phase="inject", node=victim.name)
            victim.kill()
            victim.wipe()
            await asyncio.sleep(hold)
            await self._start([victim])
            self._note(name, phase="heal", node=victim.name)
        else:
            raise ValueError(f"unknown fault {name!r}")

    def heal_all(self) -> None:
        """Undo whatever is still injected (end of run, or an error mid-fault)."""
        if self.net is not None:
            self.net.heal()
        for n in self.cluster.nodes:
            if n.paused:
                n.signal(signal.SIGCONT)
                n.paused = False


def _http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=3) as r:
        return r.read().decode()

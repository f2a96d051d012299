"""Network partitions between real node processes without root: an HTTP CONNECT proxy per
node that carries ALL of that node's outgoing cluster traffic (routes, gossip, Raft), which
the test controls.

Each node process starts with `grpc_proxy=http://127.0.0.1:<its egress port>` in its
environment: gRPC (the only cluster transport) then opens every outgoing connection through
`CONNECT host:port`, so the proxy knows the source node (whose egress it is) and the target
node (by its cluster port). A cut between A and B closes their tunnels (both directions: A's
to B and B's to A) and holds new CONNECTs between them unanswered (a connect timeout, like
a silent network) until the heal, which closes the held ones so that the nodes redial.
Clients (nats-py over TCP) are not proxied: a client of a cut-off node still reaches it.

The proxies run on their own event loop in a thread, so the test's blocking calls (waiting
for a node to start) never stall the cluster's traffic.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from tests.cluster.jshelp import JsCluster
from tests.ports import free_port


class Tunnel:
    def __init__(self, src: str, dst: str) -> None:
        self.src, self.dst = src, dst
        self.writers: list[asyncio.StreamWriter] = []
        self.lane = False  # to a port that is not a cluster port (a direct Raft lane)

    def close(self) -> None:
        for w in self.writers:
            w.close()


class NetCut:
    """Egress proxies for `names`; `cut(name)` isolates one node, `heal()` ends every cut."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = list(names)
        self.egress = {n: free_port() for n in self.names}
        self.port_of: dict[int, str] = {}  # a node's cluster port -> its name
        self.blocked: set[frozenset[str]] = set()
        self.lanes_blocked: set[str] = set()  # nodes whose direct Raft lane port is firewalled
        self.tunnels: set[Tunnel] = set()
        self.held: set[asyncio.StreamWriter] = set()
        self.counts = {"tunnels": 0, "refused": 0}
        self.loop = asyncio.new_event_loop()
        self._servers: list[Any] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._call(self._start())

    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        for name, port in self.egress.items():
            srv = await asyncio.start_server(
                lambda r, w, name=name: self._serve(name, r, w), "127.0.0.1", port)
            self._servers.append(srv)

    def resolve(self, port: int) -> str:
        """The node behind a port that is not a cluster port (a Raft direct lane's,
        `cluster { raft_port }`); "?" if none is known."""
        return "?"

    def env_for(self, name: str) -> dict[str, str]:
        return {"grpc_proxy": f"http://127.0.0.1:{self.egress[name]}"}

    # ---- control (from the test's thread)

    def cut(self, name: str) -> None:
        """`name` loses every link to the other nodes, both ways."""
        self._call(self._set([frozenset((name, o)) for o in self.names if o != name]))

    def heal(self) -> None:
        self._call(self._heal())

    def block_lane(self, name: str, on: bool = True) -> None:
        """A firewall in front of `name` that passes only its cluster port: dials
        of its direct Raft lane (any port of it that is not the cluster port) get
        no answer, and open tunnels to it close. `on=False` lifts it."""
        self._call(self._block_lane(name, on))

    def stop(self) -> None:
        self._call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    async def _set(self, pairs: list[frozenset[str]]) -> None:
        self.blocked.update(pairs)
        for t in list(self.tunnels):
            if frozenset((t.src, t.dst)) in self.blocked:
                t.close()

    async def _block_lane(self, name: str, on: bool) -> None:
        if not on:
            self.lanes_blocked.discard(name)
            return
        self.lanes_blocked.add(name)
        for t in list(self.tunnels):
            if t.dst == name and t.lane:
                t.close()

    async def _heal(self) -> None:
        self.blocked.clear()
        for w in list(self.held):
            w.close()
        self.held.clear()

    async def _stop(self) -> None:
        for srv in self._servers:
            srv.close()
        for t in list(self.tunnels):
            t.close()
        for w in list(self.held):
            w.close()

    # ---- the proxy

    async def _serve(self, src: str, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) < 2 or parts[0] != b"CONNECT":
            writer.close()
            return
        host, _, port = parts[1].decode().rpartition(":")
        lane = int(port) not in self.port_of
        dst = self.port_of.get(int(port)) or self.resolve(int(port))
        if frozenset((src, dst)) in self.blocked or (lane and dst in self.lanes_blocked):
            self.counts["refused"] += 1
            self.held.add(writer)  # no answer: the dialer's connect times out
            return
        try:
            up_r, up_w = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        tunnel = Tunnel(src, dst)
        tunnel.lane = lane
        tunnel.writers = [writer, up_w]
        self.tunnels.add(tunnel)
        self.counts["tunnels"] += 1
        try:
            await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))
        finally:
            self.tunnels.discard(tunnel)
            tunnel.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                frozen: Callable[[], bool] = lambda: False) -> None:
    """Copy one direction until EOF; while `frozen()`, hold what was read (a stalled
    middlebox: the sockets stay open and nothing crosses)."""
    try:
        while data := await reader.read(1 << 16):
            while frozen():
                await asyncio.sleep(0.05)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


class ProxiedCluster(JsCluster):
    """A JsCluster whose nodes send their cluster traffic through a NetCut."""

    def __init__(self, directory: Any, n: int = 3) -> None:
        super().__init__(directory, n)
        self.net = NetCut(node.name for node in self.nodes)
        self.net.port_of = {node.cluster_port: node.name for node in self.nodes}
        self.net.resolve = self._listener  # type: ignore[method-assign]

    def _listener(self, port: int) -> str:
        """The node process listening on `port` (its direct Raft lane when the
        cluster runs with `raft_port: 0`: an ephemeral port, known only to it)."""
        import psutil

        for node in self.nodes:
            proc = getattr(node, "proc", None)
            if proc is None or proc.poll() is not None:
                continue
            try:
                conns = psutil.Process(proc.pid).net_connections(kind="tcp")
            except (psutil.Error, OSError):
                continue
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   for c in conns):
                return node.name
        return "?"

    def start_node(self, node: Any, wait: bool = True, config: str | None = None) -> None:
        saved = os.environ.get("grpc_proxy")
        os.environ.update(self.net.env_for(node.name))  # the child copies os.environ
        try:
            super().start_node(node, wait=wait, config=config)
        finally:
            if saved is None:
                os.environ.pop("grpc_proxy", None)
            else:
                os.environ["grpc_proxy"] = saved

    def stop(self) -> None:
        super().stop()

    def close(self) -> None:
        self.stop()
        self.net.stop()

"""Process control for N local Jetraft nodes: start, stop, kill -9, SIGSTOP/SIGCONT, wipe.

Each node is a real `jetraft serve -c <config>` process with its own directory (config,
store, log). With `net` (chaos/net.py) each node runs inside its own network namespace
and binds its namespace's address; otherwise all bind 127.0.0.1 on distinct ports.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# `python -c` rather than the `jetraft` script: the checkout on PYTHONPATH wins over
# whatever the editable install points at.
LAUNCH = "import sys; from node.cli import main; sys.exit(main(sys.argv[1:]))"
READY_LINE = "Server is ready"


class Net(Protocol):
    def host(self, i: int) -> str: ...
    def prefix(self, i: int) -> list[str]: ...


class Loopback:
    """No isolation: every node on 127.0.0.1 (partitions are not available)."""

    def host(self, i: int) -> str:
        return "127.0.0.1"

    def prefix(self, i: int) -> list[str]:
        return []


@dataclass
class Ports:
    client: int
    monitor: int
    cluster: int


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Node:
    def __init__(self, index: int, name: str, directory: Path, host: str, ports: Ports,
                 prefix: list[str]) -> None:
        self.index = index
        self.name = name
        self.dir = directory
        self.host = host
        self.ports = ports
        self.prefix = prefix
        self.routes: list[str] = []
        self.cluster_name = "chaos"
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self._log_offset = 0
        self.dir.mkdir(parents=True, exist_ok=True)

    @property
    def store_dir(self) -> Path:
        return self.dir / "store"

    @property
    def log_path(self) -> Path:
        return self.dir / "node.log"

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.ports.client}"

    @property
    def cluster_addr(self) -> str:
        return f"{self.host}:{self.ports.cluster}"

    def config_text(self) -> str:
        lines = [
            f"server_name: {_q(self.name)}",
            f"listen: {_q(f'{self.host}:{self.ports.client}')}",
            f"http: {_q(f'{self.host}:{self.ports.monitor}')}",
            f"jetstream {{ store_dir: {_q(str(self.store_dir))} }}",
        ]
        if self.routes:
            routes = ", ".join(_q(r) for r in self.routes)
            lines.append(f"cluster {{ name: {_q(self.cluster_name)}, "
                         f"listen: {_q(self.cluster_addr)}, routes: [{routes}] }}")
        return "\n".join(lines) + "\n"

    def start(self, wait: bool = True, timeout: float = 60.0) -> None:
        assert not self.alive(), f"{self.name} is already running"
        conf = self.dir / "node.conf"
        conf.write_text(self.config_text())
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== chaos: start {self.name} at {time.time():.3f}\n".encode())
            self._log_offset = log.tell()
            self.proc = subprocess.Popen(
                [*self.prefix, sys.executable, "-c", LAUNCH, "serve", "-c", str(conf)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.paused = False
        if wait:
            self.wait_ready(timeout)

    def log_text(self) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY_LINE in self.log_text():
                return
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc and self.proc.returncode}):"
                                   f"\n{self.log_text()[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready in {timeout}s:\n{self.log_text()[-3000:]}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """kill -9: no chance to flush or say goodbye."""
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)
        self.proc.wait()
        self.paused = False

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (after SIGCONT if paused); SIGKILL if it does not exit in time."""
        if self.proc is None:
            return None
        if self.paused:
            self.resume()
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        return self.proc.returncode

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def wipe(self) -> None:
        """Delete the data directory (the node must be down): it lost its disk."""
        assert not self.alive(), f"wipe {self.name} while it runs"
        shutil.rmtree(self.store_dir, ignore_errors=True)


_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nobody listens on, never handed out twice by this process (the
    kernel may give the same ephemeral port to two bind(0) calls in a row)."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no free port")


class Cluster:
    def __init__(self, workdir: Path, n: int, net: Net) -> None:
        self.workdir = workdir
        self.net = net
        pick = free_port
        self.nodes: list[Node] = []
        for i in range(n):
            host = net.host(i)
            ports = Ports(pick(), pick(), pick()) if host == "127.0.0.1" \
                else Ports(4222, 8222, 6222)
            self.nodes.append(Node(i, f"n{i}", workdir / f"n{i}", host, ports, net.prefix(i)))
        if n > 1:
            for node in self.nodes:
                node.routes = [f"nats-route://{o.cluster_addr}" for o in self.nodes
                               if o is not node]

    def start(self) -> None:
        for node in self.nodes:
            node.start(wait=False)
        for node in self.nodes:
            node.wait_ready()

    def stop(self) -> None:
        for node in self.nodes:
            if node.paused:
                node.resume()
        for node in self.nodes:
            if node.alive():
                node.signal(signal.SIGTERM)
        for node in self.nodes:
            node.stop()

    def by_name(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

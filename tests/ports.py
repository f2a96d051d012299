"""Free loopback ports for tests that start servers.

Ports are handed out from a range BELOW the kernel's ephemeral range
(net.ipv4.ip_local_port_range, 32768-60999 by default). A port told to a server is then never
taken meanwhile as the local port of some outgoing connection, nor by a node that binds
port 0: the kernel picks those from the ephemeral range only.

Under pytest-xdist every worker (PYTEST_XDIST_WORKER=gw0, gw1, ...) draws from its own slice of
that range, so two workers of one run never hand out the same port; a serial run uses the
whole range. A process walks its slice in order, so it hands a port out again only after the
whole slice (2,000+ ports) went round. Each process starts at a random point of its slice, so
two test runs on one machine (other checkouts) rarely meet, and a port somebody holds fails
the bind check and is skipped.
"""

from __future__ import annotations

import os
import random
import socket
import time

LOW = 10000  # well-known services stay below
SLICES = 8  # worker gwN uses slice N % SLICES


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _slice() -> range:
    """This process's ports: the whole range, or worker N's slice of it."""
    high = min(_ephemeral_low(), 32768)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return range(LOW, high)
    width = (high - LOW) // SLICES
    start = LOW + (int(worker[2:]) % SLICES) * width
    return range(start, start + width)


_ports: range | None = None
_next = 0


def _bindable(host: str, port: int) -> bool:
    """Nobody holds `port` (a listener, a connection, a TIME_WAIT left over)."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    global _ports, _next
    if _ports is None:
        _ports = _slice()
        _next = random.randrange(len(_ports))
    for _ in range(len(_ports)):
        port = _ports[_next % len(_ports)]
        _next += 1
        if _bindable(host, port):
            return port
    raise RuntimeError(f"no free port in {_ports}")


def wait_listening(port: int, host: str = "127.0.0.1", timeout: float = 15.0) -> None:
    """Until a server started by a test accepts connections on `port`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)

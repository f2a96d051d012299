"""Free loopback ports for tests that start servers.

The kernel may hand the same ephemeral port to two bind(0) calls in a row once the first
socket is closed, so ports given out in this test run are never given out again.
"""

from __future__ import annotations

import socket
import time

_given: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    for _ in range(1000):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _given:
            _given.add(port)
            return port
    raise RuntimeError("no free port found")


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

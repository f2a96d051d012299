"""A wrong-password storm from many source addresses must not keep a correct
login out (issue 7 review). The storm overfills the bcrypt queue; the clean
address's login takes the place of a storm guess (node/authqueue.py).
Its own file: the storm keeps a core busy for a few seconds."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable

import bcrypt
import nats
import pytest

from tests.integration.test_security import HOST

pytestmark = pytest.mark.timeout(120)

STORM_HOSTS = [f"127.0.0.{i}" for i in range(10, 22)]  # loopback aliases: Linux routes 127/8
PER_HOST = 4  # the per-address cap: 12 x 4 checks overfill the queue of 32


async def wait_until(cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def guess(port: int, source: str, n: int) -> bytes:
    """One wrong-password CONNECT from `source`; what the server answered."""
    with socket.create_connection((HOST, port), timeout=20, source_address=(source, 0)) as s:
        buf = b""
        while b"\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                return buf
            buf += chunk
        connect = {"verbose": False, "user": "u", "pass": f"wrong-{source}-{n}"}
        s.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
        return answer


def storm(port: int, stop: threading.Event) -> list[threading.Thread]:
    def hammer(source: str, lane: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                guess(port, source, lane * 100000 + n)
            except OSError:
                pass
            stop.wait(0.1)  # keeps connection churn modest on a shared machine

    threads = [threading.Thread(target=hammer, args=(h, lane), daemon=True)
               for h in STORM_HOSTS for lane in range(PER_HOST)]
    for t in threads:
        t.start()
    return threads


async def test_a_correct_login_gets_in_during_a_many_address_storm(servers):
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=8)).decode()
    srv = servers.jetraft(f"authorization {{ timeout: 30, users: [{{user: u, password: "
                          f"{json.dumps(hashed)}}}] }}\n")
    stop = threading.Event()
    threads = storm(srv.port, stop)
    try:
        # The queue is full: the throttle has started refusing storm guesses.
        await wait_until(lambda: "too many authentication attempts" in srv.log_text(), timeout=60)
        nc = await nats.connect(f"nats://{HOST}:{srv.port}", user="u", password="right",
                                allow_reconnect=False, max_reconnect_attempts=0,
                                connect_timeout=30)
        await nc.flush(timeout=30)
        await nc.close()
        log = srv.log_text()
        # The storm was still being refused after the login: it got in during it.
        refused = log.count("too many authentication attempts")
        await wait_until(lambda: srv.log_text().count("too many authentication attempts") > refused,
                   timeout=60)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert '"u" - authentication error' in log  # the storm's guesses were hashed and failed

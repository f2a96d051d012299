"""Fixtures shared by every test directory."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.ports import free_port


def run_nats_server(*args: str) -> Iterator[int]:
    """A nats-server (the oracle) on a free loopback port with `args`; yields the port."""
    binary = shutil.which("nats-server")
    if binary is None:
        pytest.skip("nats-server not installed")
    port = free_port()
    proc = subprocess.Popen([binary, *args, "-a", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def nats_port() -> Iterator[int]:
    """A bare nats-server (the oracle) on loopback, for raw-socket differential tests."""
    yield from run_nats_server()

"""Fixtures for the JetStream tests: a nats-server with JetStream on, the oracle."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port


@pytest.fixture(scope="module")
def js_oracle_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A standalone `nats-server -js` on loopback with its own store dir."""
    binary = shutil.which("nats-server")
    if binary is None:
        pytest.skip("nats-server not installed")
    store: Path = tmp_path_factory.mktemp("js-oracle")
    port = free_port()
    proc = subprocess.Popen([binary, "-js", "-sd", str(store), "-a", "127.0.0.1",
                             "-p", str(port)],
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

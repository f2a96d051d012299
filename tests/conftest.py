"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
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


def _descendants(root: int) -> dict[int, str]:
    """Live processes below `root` (by parent pid), with their command lines."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if fields[0] != b"Z":
                parents[int(entry)] = int(fields[1])
    found: dict[int, str] = {}
    for pid in parents:
        up = parents.get(pid)
        while up is not None and up != root:
            up = parents.get(up)
        if up == root:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found[pid] = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
            except OSError:
                continue
    return found


_SPAWNED_BY: dict[int, tuple[str, str]] = {}


@pytest.fixture(autouse=True)
def _note_spawned_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Remember which test started each child process, so that leaks are named at the end:
    a node left running slows every later test on a 2-core CI machine."""
    before = set(_descendants(os.getpid()))
    yield
    for pid, cmd in _descendants(os.getpid()).items():
        if pid not in before:
            _SPAWNED_BY.setdefault(pid, (request.node.nodeid, cmd))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    alive = _descendants(os.getpid())
    leaks = [(test, cmd) for pid, (test, cmd) in _SPAWNED_BY.items() if pid in alive]
    if leaks:
        terminalreporter.section("child processes still running")
        for test, cmd in sorted(leaks):
            terminalreporter.write_line(f"{test}: {cmd}")

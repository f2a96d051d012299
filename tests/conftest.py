"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import chaos.nodes
import node.cluster.local
from tests.ports import free_port

# Every port a test's server gets comes from tests.ports: its own range per xdist worker,
# below the kernel's ephemeral range (see there). The clusters of node/cluster/local.py and
# chaos/nodes.py pick theirs with a module-level free_port of their own.
node.cluster.local.free_port = free_port
chaos.nodes.free_port = free_port


# --------------------------------------------------------------------------- pytest-xdist
# `pytest` runs the suite in worker processes (pyproject addopts: `-n auto --dist loadgroup
# --no-loadscope-reorder`; docs/notes/xdist.md). The suite mostly waits (process starts,
# timers, Raft elections), so more workers than the CI machine's 2 cores pay off. `-n 0`
# runs everything in one process, as before.
XDIST_WORKERS = 4

# Files that take longest, longest first: they are handed out first, so that no worker is left
# with a long file at the end while the others are idle. (Measured in docs/notes/xdist.md; a
# file missing here only runs later, it still runs.)
SLOW_FIRST = (
    "tests/audit/test_audit_encrypted.py",
    "tests/cluster/test_js_faults.py",
    "tests/audit/test_audit_spark.py",
    "tests/cluster/test_js_audit.py",
    "tests/audit/test_audit_cli.py",
    "tests/sim/test_sim_real.py",
    "tests/cluster/test_js_sourcing.py",
    "tests/cluster/test_js_partition.py",
    "tests/unit/test_parser_fuzz.py",
    "tests/sim/test_raft_sim.py",
    "tests/cluster/test_js_encryption.py",
    "tests/raft/test_process_crash.py",
    "tests/integration/test_security_defects.py",
    "tests/cluster/test_js_identity.py",
    "tests/audit/test_audit_jetstream.py",
)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: XDIST_WORKERS for the suite or a directory; for named files one worker per
    file, up to XDIST_WORKERS; none (no xdist at all) for a single file."""
    env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if env:
        return int(env)
    files: set[Path] = set()
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0])
        if path.is_dir():
            return XDIST_WORKERS
        files.add(path)
    return min(XDIST_WORKERS, len(files)) if len(files) > 1 else 0


def _file_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)  # instead of xdist's own scheduler for --dist loadgroup
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under xdist a test file is one unit of work, so its module fixtures (a 3-node cluster,
    a Spark session) start once, as in a serial run. Tests marked
    `@pytest.mark.xdist_group("name")` form one unit with every other test of that name."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileOrGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)  # the group, if xdist appended "@group"
            return _file_of(nodeid) if scope == nodeid else scope

    return FileOrGroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist the slowest files come first (units are handed out in collection order)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {f: i for i, f in enumerate(SLOW_FIRST)}
        items.sort(key=lambda item: rank.get(_file_of(item.nodeid), len(rank)))


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


def _leaks() -> list[tuple[str, str]]:
    alive = _descendants(os.getpid())
    return [(test, cmd) for pid, (test, cmd) in _SPAWNED_BY.items() if pid in alive]


_WORKER_LEAKS: list[tuple[str, str]] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its leaks to the controller, which prints the summary."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["jetraft_leaks"] = _leaks()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    _WORKER_LEAKS.extend(tuple(x) for x in getattr(node, "workeroutput", {}).get(
        "jetraft_leaks", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    leaks = _leaks() + _WORKER_LEAKS
    if leaks:
        terminalreporter.section("child processes still running")
        for test, cmd in sorted(leaks):
            terminalreporter.write_line(f"{test}: {cmd}")

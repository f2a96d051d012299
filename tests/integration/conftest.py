"""Fixtures that run real servers: `jetraft serve` and the Go nats-server.

Both are real subprocesses on random free 127.0.0.1 ports.  A server is
"up" once its log says "Server is ready" (both print that exact line).
Helpers are handed to tests through fixtures (`servers`, `raw`) rather than
imported, so this file can change without touching the tests' imports.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port

READY_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0

# Starts a node from an Options built in-process: used for settings the
# command line and config file refuse (e.g. lame duck shorter than 30 s).
_DIRECT_LAUNCH = """
import json, sys
from node.options import Options
from node.server import run
kw = json.loads(sys.argv[1])
sys.exit(run(Options(**kw)))
"""


def _has_cli() -> bool:
    try:
        import node.cli  # noqa: F401
    except ImportError:
        return False
    return True


class ServerProc:
    """A server subprocess whose log goes to a file we can read any time."""

    def __init__(self, name: str, argv: list[str], port: int, http_port: int,
                 workdir: Path) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.http_port = http_port
        self.workdir = workdir
        self.log_path = workdir / f"{name}-{port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> ServerProc:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self._log_offset = self.log_path.stat().st_size
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self.workdir, start_new_session=True)
        log.close()
        self.wait_for_log("Server is ready", READY_TIMEOUT)
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")[self._log_offset:]

    def wait_for_log(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log_text():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n"
                                   f"{self.log_text()}")
            time.sleep(0.01)  # every server start waits here: ~20 ms less each on average
        raise TimeoutError(f"{self.name}: no {text!r} in log:\n{self.log_text()}")

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        """Stop and return the exit code (SIGKILL if it does not stop in time)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def jetraft_argv(port: int, http_port: int, workdir: Path, config: str | None,
                 args: list[str], options: dict[str, Any] | None) -> list[str]:
    """`jetraft serve` flags (+ a config file), or a direct launch of run()."""
    if options is not None or not _has_cli():
        kw = {"host": "127.0.0.1", "port": port, "http_host": "127.0.0.1",
              "http_port": http_port, **(options or {})}
        return [sys.executable, "-c", _DIRECT_LAUNCH, json.dumps(kw)]
    exe = shutil.which("jetraft") or "jetraft"
    argv = [exe, "serve", "-a", "127.0.0.1", "-p", str(port), "-m", str(http_port), *args]
    if config is not None:
        path = workdir / f"jetraft-{port}.conf"
        path.write_text(config)
        argv += ["-c", str(path)]
    return argv


def nats_server_argv(port: int, http_port: int, workdir: Path, config: str | None,
                     args: list[str]) -> list[str]:
    argv = ["nats-server", "-a", "127.0.0.1", "-p", str(port), "-m", str(http_port), *args]
    if config is not None:
        path = workdir / f"nats-server-{port}.conf"
        path.write_text(config)
        argv += ["-c", str(path)]
    return argv


class Servers:
    """Factory for servers that are all stopped when the fixture ends."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[ServerProc] = []

    def jetraft(self, config: str | None = None, args: list[str] | None = None,
                options: dict[str, Any] | None = None, port: int | None = None) -> ServerProc:
        port = port or free_port()
        http_port = free_port()
        argv = jetraft_argv(port, http_port, self.workdir, config, args or [], options)
        return self._start("jetraft", argv, port, http_port)

    def nats_server(self, config: str | None = None, args: list[str] | None = None,
                    port: int | None = None) -> ServerProc:
        port = port or free_port()
        http_port = free_port()
        argv = nats_server_argv(port, http_port, self.workdir, config, args or [])
        return self._start("nats-server", argv, port, http_port)

    def both(self, config: str | None = None) -> dict[str, ServerProc]:
        """One of each with the same config, for differential tests."""
        return {"nats-server": self.nats_server(config), "jetraft": self.jetraft(config)}

    def jetraft_argv(self, port: int, args: list[str] | None = None) -> list[str]:
        """The command line `jetraft()` would run, for tests that run it themselves."""
        return jetraft_argv(port, free_port(), self.workdir, None, args or [], None)

    free_port = staticmethod(free_port)

    def _start(self, name: str, argv: list[str], port: int, http_port: int) -> ServerProc:
        proc = ServerProc(name, argv, port, http_port, self.workdir)
        self.started.append(proc)
        return proc.start()

    def stop_all(self) -> None:
        for proc in self.started:
            proc.stop()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    s = Servers(tmp_path)
    yield s
    s.stop_all()


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    s = Servers(tmp_path_factory.mktemp("servers"))
    yield s
    s.stop_all()


@pytest.fixture(scope="module")
def pair(module_servers: Servers) -> dict[str, ServerProc]:
    """nats-server and jetraft side by side, for differential tests."""
    return module_servers.both()


@pytest.fixture(scope="module")
def jetraft(module_servers: Servers) -> ServerProc:
    """One jetraft node shared by a test module."""
    return module_servers.jetraft()


@pytest.fixture(scope="module")
def nats_server(module_servers: Servers) -> ServerProc:
    """One Go nats-server shared by a test module (the behaviour oracle)."""
    return module_servers.nats_server()


# --------------------------------------------------------------------------- raw sockets


class RawConn:
    """A plain TCP NATS connection for protocol-level assertions."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.eof = False
        self.info = json.loads(self.read_line(timeout)[5:])

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, timeout: float) -> bool:
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return False
        except ConnectionError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def read_line(self, timeout: float = 10.0) -> bytes:
        deadline = time.monotonic() + timeout
        while b"\r\n" not in self.buf:
            left = deadline - time.monotonic()
            if self.eof or left <= 0:
                raise AssertionError(f"no line; have {self.buf!r} eof={self.eof}")
            self._fill(left)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def read_until(self, marker: bytes, timeout: float = 10.0) -> bytes:
        """Everything up to and including `marker`."""
        deadline = time.monotonic() + timeout
        while marker not in self.buf:
            left = deadline - time.monotonic()
            if self.eof or left <= 0:
                raise AssertionError(f"no {marker!r}; have {self.buf!r} eof={self.eof}")
            self._fill(left)
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def exchange(self, data: bytes, timeout: float = 10.0) -> bytes:
        """Send `data` then a PING; return what came before the PONG."""
        self.send(data + b"PING\r\n")
        return self.read_until(b"PONG\r\n", timeout)[:-6]

    def read_to_close(self, timeout: float = 10.0) -> bytes:
        """All remaining bytes until the server closes (fails on timeout)."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"server did not close; have {self.buf!r}")
            self._fill(left)
        out, self.buf = self.buf, b""
        return out

    def read_close_or_wait(self, wait: float) -> bytes:
        """Whatever arrives before the server closes or `wait` seconds pass."""
        deadline = time.monotonic() + wait
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._fill(left)
        out, self.buf = self.buf, b""
        return out

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw() -> Iterator[Callable[[int], RawConn]]:
    conns: list[RawConn] = []

    def connect(port: int, timeout: float = 10.0) -> RawConn:
        c = RawConn(port, timeout)
        conns.append(c)
        return c

    yield connect
    for c in conns:
        c.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: opt-in long test (run with -m slow)")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")

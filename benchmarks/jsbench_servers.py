"""Start the servers of the JetStream benchmarks: one jetraft node and nats-server at its
default and with `sync_interval: always`, each on free loopback ports, each in its own
temporary store, each pinned to one core (`taskset`; nats-server also gets GOMAXPROCS=1)
so that the server CPU per message is comparable. The shared harness's servers.sh uses
fixed ports that other users of this machine may already hold, so this module starts its
own servers following the same method (README of /work/shared/bench).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

SERVER_CPU = os.environ.get("SERVER_CPU", "1")
CLIENT_CPU = os.environ.get("CLIENT_CPU", "0")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    label: str
    port: int
    proc: subprocess.Popen[bytes]
    store: str
    log: str

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {open(log).read()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                if s.recv(4096).startswith(b"INFO"):
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"port {port} never answered")


def _pin(cmd: list[str], cpu: str | None) -> list[str]:
    return ["taskset", "-c", cpu, *cmd] if cpu else cmd


@dataclass
class Servers:
    """`with Servers(kinds) as s:` -> s.by_label[label] for each started server."""

    kinds: tuple[str, ...] = ("jetraft", "ref", "ref-always")
    pin: bool = True
    wrap: list[str] = field(default_factory=list)  # e.g. strace: prefix of each command
    by_label: dict[str, Server] = field(default_factory=dict)
    tmp: str = ""

    def __enter__(self) -> Servers:
        self.tmp = tempfile.mkdtemp(prefix="jsbench-")
        try:
            for kind in self.kinds:
                self.by_label[kind] = self._start(kind)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self, kind: str) -> Server:
        port = free_port()
        store = os.path.join(self.tmp, kind)
        os.makedirs(store)
        log = os.path.join(self.tmp, kind + ".log")
        env = dict(os.environ)
        src = None
        if kind.startswith("jetraft"):
            # "jetraft-base": the checkout in JETRAFT_BASE (an older commit, same run)
            src = os.environ["JETRAFT_BASE"] if kind == "jetraft-base" else REPO
            env["PYTHONPATH"] = src  # and cwd: `python -m` puts the cwd first on sys.path
            cmd = [sys.executable, "-m", "node.cli", "serve", "-js", "-sd", store,
                   "-a", "127.0.0.1", "-p", str(port), "-n", "jetraft-bench"]
        else:
            conf = os.path.join(self.tmp, kind + ".conf")
            sync = "  sync_interval: always\n" if kind == "ref-always" else ""
            with open(conf, "w") as f:
                f.write(f'server_name: {kind}\nlisten: 127.0.0.1:{port}\nmax_payload: 1MB\n'
                        f'jetstream {{\n  store_dir: "{store}"\n  max_memory_store: 1GB\n'
                        f'  max_file_store: 10GB\n{sync}}}\n')
            env["GOMAXPROCS"] = "1"
            cmd = [shutil.which("nats-server") or "nats-server", "-c", conf]
        cmd = _pin(self.wrap + cmd, SERVER_CPU if self.pin else None)
        out = open(log, "wb")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=src,
                                start_new_session=True)
        _wait_port(port, proc, log)
        return Server(kind, port, proc, store, log)

    def server_pid(self, label: str) -> int:
        """The server's own pid (a wrapper such as strace or taskset execs or forks it)."""
        srv = self.by_label[label]
        if not self.wrap:
            return srv.pid  # taskset execs the server: same pid
        out = subprocess.run(["pgrep", "-P", str(srv.pid)], capture_output=True, text=True)
        kids = [int(p) for p in out.stdout.split()]
        return kids[0] if kids else srv.pid

    def __exit__(self, *exc: object) -> None:
        for srv in self.by_label.values():
            if srv.proc.poll() is None:
                os.killpg(srv.proc.pid, signal.SIGTERM)
        for srv in self.by_label.values():
            try:
                srv.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(srv.proc.pid, signal.SIGKILL)
                srv.proc.wait()
        if os.environ.get("KEEP_STORES") != "1":
            shutil.rmtree(self.tmp, ignore_errors=True)


if __name__ == "__main__":
    with Servers() as s:
        print(json.dumps({k: [v.url, v.pid] for k, v in s.by_label.items()}))
        input("running; press enter to stop ")

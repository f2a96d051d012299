"""In-process A/B of the PUB path: the node's own Server/Client objects, no sockets.

    PYTHONPATH=<checkout> python benchmarks/ingest_micro.py [--msgs 200000] [--scenarios ...]

Clients are real `Client` objects over a transport that keeps nothing; each scenario feeds
64 KiB reads of pre-encoded PUB frames (128 B payloads, the same frames as
benchmarks/server_bound.py) to `data_received`, so the parser, the account's fast path,
the router and delivery all run as in the server; only the socket and the event loop are
absent. Prints CPU ns per published message (process time, best of --reps). Run it for two
checkouts alternately for an A/B in one sitting, or under
`valgrind --tool=callgrind --collect-atstart=no --toggle-collect=...` is not needed: the
set-up is small next to the load, so `--msgs 20000` under callgrind counts mostly the path.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from typing import Any

from node.config import load_options
from node.server import Server

CONF = """listen: 127.0.0.1:4222
accounts {
  A: { users: [{user: a, password: a}],
       exports: [{stream: "bench.>"}, {service: "svc.>"}] }
  B: { users: [{user: b, password: b}],
       imports: [{stream: {account: A, subject: "bench.>"}},
                 {service: {account: A, subject: "svc.>"}}] }
}
authorization { users: [{user: g, password: g}] }
"""
SIZE = 128
PAYLOAD = b"x" * SIZE
READ = 65536
# name -> (publisher user, subscriber user or "", subjects)
SCENARIOS = {
    "ingest": ("g", "", 1000),
    "ingest_acct": ("a", "", 1000),
    "pubsub": ("g", "g", 1000),
    "pubsub_1subj": ("g", "g", 1),
    "pubsub_import": ("a", "b", 1000),
}


class Sink:
    """A transport that drops what it is given (a subscriber's socket)."""

    def write(self, data: Any) -> None:
        pass

    def writelines(self, data: Any) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def login(server: Server, user: str) -> Any:
    c = server.make_client_protocol()
    c.connection_made(Sink())
    c.data_received(b'CONNECT {"verbose":false,"pedantic":false,"echo":false,"user":"%s",'
                    b'"pass":"%s","headers":true,"no_responders":true}\r\nPING\r\n'
                    % (user.encode(), user.encode()))
    c.flush()
    return c


def chunks(subjects: int, msgs: int) -> list[bytes]:
    frames = b"".join(b"PUB bench.%d %d\r\n%s\r\n" % ((i * 7919) % subjects, SIZE, PAYLOAD)
                      for i in range(2000))
    stream = frames * (msgs // 2000)
    return [stream[i:i + READ] for i in range(0, len(stream), READ)]


def one(server: Server, name: str, msgs: int) -> float:
    pub_user, sub_user, subjects = SCENARIOS[name]
    pub = login(server, pub_user)
    sub = None
    if sub_user:
        sub = login(server, sub_user)
        sub.data_received(b"SUB bench.> 1\r\n")
    data = chunks(subjects, msgs)
    for piece in data[: len(data) // 10]:  # warm the caches
        pub.data_received(piece)
        if sub is not None:
            sub.flush()
    n = (len(data) - len(data) // 10) * READ // (len(PAYLOAD) + 2 + len(b"PUB bench.0 128\r\n"))
    t0 = time.process_time()
    for piece in data[len(data) // 10:]:
        pub.data_received(piece)
        if sub is not None:
            sub.flush()
    dt = time.process_time() - t0
    if pub.in_msgs < msgs * 9 // 10 or (sub is not None and sub.out_msgs < msgs * 9 // 10):
        raise SystemExit(f"{name}: {pub.in_msgs} in, {sub and sub.out_msgs} out: not routed")
    pub.close("done")
    if sub is not None:
        sub.close("done")
    return 1e9 * dt / n


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--msgs", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    a = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
        f.write(CONF)
    try:
        server = Server(load_options(f.name))
    finally:
        os.unlink(f.name)
    out = []
    for name in a.scenarios.split(","):
        best = min(one(server, name, a.msgs) for _ in range(a.reps))
        out.append(f"{name} {best:.0f}")
    print(os.environ.get("PYTHONPATH", "."), " ".join(out), file=sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())

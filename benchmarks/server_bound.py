"""Server-bound core benchmark: jetraft vs nats-server, measured on the server, not the client.

Follows /work/shared/bench/rawblast.py (README "Server-bound core load"): raw-socket publishers
resend one pre-encoded buffer of PUB frames (TCP back pressure paces them to the server's read
rate) and sinks only count bytes, so the client costs almost nothing. Added here: user/password
logins (to publish in `$G` or in a named account), 100 concurrent raw requesters with one raw
responder, and both servers started on free ports in one invocation, so the ratios compare runs
that shared the machine's conditions.

  PYTHONPATH=$PWD python benchmarks/server_bound.py [--seconds 4] [--reps 2]
        [--modes pinned,unpinned] [--scenarios ingest,pubsub,...]
        [--servers jetraft,jetraft-pure,jetraft-base,nats]  (jetraft-base: JETRAFT_BASE=<dir>)
        [--out benchmarks/results/server-bound-TAG.md] [--domain hub|""]

Modes: `pinned` = the server on CPU 1 (`taskset -c 1`; nats-server with GOMAXPROCS=1);
`unpinned` = no taskset (nats-server with its default GOMAXPROCS). The load always runs on
CPU 0. Figures per run: msgs/s in and out (from /varz in_msgs/out_msgs), the server's CPU
(utime+stime from /proc/<pid>/stat over the same window) per message in+out, and `uptime`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOAD_CPU = {0}
CLK = os.sysconf("SC_CLK_TCK")

# A stream export and a service export in A, imported by B: a message from A reaches a
# subscriber in B only through the import (the named-account scenarios).
CONF = """listen: 127.0.0.1:{port}
http: 127.0.0.1:{http}
accounts {{
  A: {{ users: [{{user: a, password: a}}],
        exports: [{{stream: "bench.>"}}, {{service: "svc.>"}}] }}
  B: {{ users: [{{user: b, password: b}}],
        imports: [{{stream: {{account: A, subject: "bench.>"}}}},
                  {{service: {{account: A, subject: "svc.>"}}}}] }}
}}
authorization {{ users: [{{user: g, password: g}}] }}
"""


@dataclass(frozen=True)
class Scenario:
    name: str
    pubs: int = 0
    subs: int = 0
    subjects: int = 1000
    pub_user: str = "g"
    sub_user: str = "g"
    requesters: int = 0  # > 0: request/reply instead of publishers
    what: str = ""


SCENARIOS = [
    Scenario("ingest", pubs=4, what="4 publishers, 1,000 subjects, no subscriber ($G)"),
    Scenario("pubsub", pubs=1, subs=1, what="pub->sub 1:1, 1,000 subjects ($G)"),
    Scenario("pubsub_1subj", pubs=1, subs=1, subjects=1,
             what="pub->sub 1:1, one subject ($G, the single-subject fast path)"),
    Scenario("fanout10", pubs=1, subs=10, what="1 publisher -> 10 sinks, 1,000 subjects ($G)"),
    Scenario("reqrep", requesters=100, what="100 concurrent requesters, 1 responder ($G)"),
    Scenario("ingest_acct", pubs=4, pub_user="a",
             what="4 publishers in account A (which exports bench.>), no subscriber"),
    Scenario("pubsub_import", pubs=1, subs=1, pub_user="a", sub_user="b",
             what="publisher in A -> sink in B through B's stream import"),
    Scenario("reqrep_import", requesters=100, pub_user="b", sub_user="a",
             what="100 requesters in B -> responder in A through a service import"),
]
BY_NAME = {s.name: s for s in SCENARIOS}
SIZE = 128
PAYLOAD = b"x" * SIZE


# ------------------------------------------------------------------ raw clients

def _connect(port: int, user: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    f = s.makefile("rb")
    f.readline()  # INFO
    opts = {"verbose": False, "pedantic": False, "echo": False, "user": user, "pass": user,
            "headers": True, "no_responders": True, "protocol": 1}
    s.sendall(b"CONNECT " + json.dumps(opts).encode() + b"\r\nPING\r\n")
    while True:
        line = f.readline()
        if not line or line.startswith(b"-ERR"):
            raise RuntimeError(f"login as {user} failed: {line!r}")
        if line.startswith(b"PONG"):
            return s


def _pong(s: socket.socket) -> None:
    """Wait for the PONG that says the SUB before it is in place."""
    got = b""
    while b"PONG" not in got:
        got += s.recv(4096)


def _publisher(port: int, user: str, subjects: int, start: float, end: float, idx: int,
               done: Any) -> None:
    """Sends from `start` to `end`, then PING: its PONG means the server has processed every
    PUB before it, so that time ends the window (a /varz poll under load answers late)."""
    os.sched_setaffinity(0, LOAD_CPU)
    s = _connect(port, user)
    frames = [b"PUB bench.%d %d\r\n%s\r\n" % ((idx * 7919 + i) % subjects, SIZE, PAYLOAD)
              for i in range(2000)]
    buf = b"".join(frames)
    time.sleep(max(0.0, start - time.time()))
    while time.time() < end:
        s.sendall(buf)
    s.sendall(b"PING\r\n")
    got = b""
    while b"PONG" not in got:
        data = s.recv(4096)
        if not data:
            break
        got = got[-8:] + data
    done.put(time.time())
    s.close()


def _sink(port: int, user: str, ready: mp.Event, end: float) -> None:
    os.sched_setaffinity(0, LOAD_CPU)
    s = _connect(port, user)
    s.sendall(b"SUB bench.> 1\r\nPING\r\n")
    _pong(s)
    ready.set()
    b = bytearray(1 << 20)
    s.settimeout(0.5)
    while time.time() < end + 1.5:
        try:
            if not s.recv_into(b):
                break
        except TimeoutError:
            pass
    s.close()


def _responder(port: int, user: str, ready: mp.Event, end: float) -> None:
    """Answers every request on svc.> with 128 B; parses only what it must (MSG lines)."""
    os.sched_setaffinity(0, LOAD_CPU)
    s = _connect(port, user)
    s.sendall(b"SUB svc.> 1\r\nPING\r\n")
    _pong(s)
    ready.set()
    s.settimeout(0.5)
    buf = b""
    while time.time() < end + 1.5:
        try:
            data = s.recv(1 << 20)
        except TimeoutError:
            continue
        if not data:
            break
        buf += data
        out = []
        pos = 0
        while True:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            args = buf[pos:nl].split()
            if args[0] != b"MSG" and args[0] != b"HMSG":
                pos = nl + 1
                continue
            total = int(args[-1])
            if nl + 1 + total + 2 > len(buf):
                break
            pos = nl + 1 + total + 2
            if len(args) >= 5 - (args[0] == b"MSG"):
                reply = args[3]
                out.append(b"PUB %s %d\r\n%s\r\n" % (reply, SIZE, PAYLOAD))
        buf = buf[pos:]
        if out:
            s.sendall(b"".join(out))
    s.close()


def _requesters(port: int, user: str, n: int, start: float, end: float, idx: int) -> None:
    """n connections, each with one request in flight: the next goes when the reply came."""
    os.sched_setaffinity(0, LOAD_CPU)
    sel = selectors.DefaultSelector()
    want: dict[socket.socket, int] = {}
    reqs: dict[socket.socket, bytes] = {}
    for i in range(n):
        s = _connect(port, user)
        inbox = b"r%d.%d" % (idx, i)
        s.sendall(b"SUB %s 1\r\nPING\r\n" % inbox)
        _pong(s)
        s.setblocking(False)
        reqs[s] = b"PUB svc.%d %s %d\r\n%s\r\n" % (i, inbox, SIZE, PAYLOAD)
        # the reply: "MSG r<idx>.<i> 1 128\r\n" + payload + CRLF
        want[s] = len(b"MSG %s 1 %d\r\n" % (inbox, SIZE)) + SIZE + 2
        sel.register(s, selectors.EVENT_READ)
    time.sleep(max(0.0, start - time.time()))
    got = dict.fromkeys(want, 0)
    for s in want:
        s.sendall(reqs[s])
    while time.time() < end:
        for key, _ in sel.select(0.5):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            got[s] += len(data)
            while got[s] >= want[s]:
                got[s] -= want[s]
                s.sendall(reqs[s])
    for s in want:
        s.close()


# ------------------------------------------------------------------ servers

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, kind: str, pinned: bool, tmp: str, domain: str | None = None) -> None:
        self.kind = kind
        self.port, self.http = _free_port(), _free_port()
        conf = os.path.join(tmp, f"{kind}.conf")
        with open(conf, "w") as f:
            f.write(CONF.format(port=self.port, http=self.http))
            if domain is not None:  # JetStream ("": no domain; else every account maps
                store = json.dumps(os.path.join(tmp, f"{kind}-js"))  # `$JS.<domain>.API.>`)
                extra = f", domain: {domain}" if domain else ""
                f.write(f"jetstream {{ store_dir: {store}{extra} }}\n")
        env = dict(os.environ)
        env.pop("JETRAFT_PURE_PYTHON", None)
        if kind.startswith("jetraft"):
            # jetraft: the compiled parser if built; jetraft-pure: parser.py interpreted;
            # jetraft-base: the checkout in JETRAFT_BASE (an older commit, same run).
            src = os.environ["JETRAFT_BASE"] if kind == "jetraft-base" else REPO
            env["PYTHONPATH"] = src
            if kind == "jetraft-pure":
                env["JETRAFT_PURE_PYTHON"] = "1"
            cmd = [sys.executable, "-m", "node.cli", "serve", "-c", conf]
        else:
            if pinned:
                env["GOMAXPROCS"] = "1"
            cmd = [shutil.which("nats-server") or "nats-server", "-c", conf]
        if pinned:
            cmd = ["taskset", "-c", "1", *cmd]  # taskset execs: the pid is the server's
        self.log = open(os.path.join(tmp, f"{kind}.log"), "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     cwd=env.get("PYTHONPATH", REPO), start_new_session=True)
        deadline = time.time() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{kind} exited")
            try:
                self.varz()
                return
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)

    def varz(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/varz", timeout=5) as r:
            return json.load(r)

    def cpu(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            st = f.read().rsplit(")", 1)[1].split()
        return (int(st[11]) + int(st[12])) / CLK  # utime, stime

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


# ------------------------------------------------------------------ one run

def run(server: Server, sc: Scenario, seconds: float) -> dict:
    """One scenario on one server. The window opens when the load starts (server idle before:
    /varz and /proc read then) and closes at the last publisher's PONG (requesters: at the end
    time); the counters are read after the load stopped, so a slow /varz cannot skew them."""
    ctx = mp.get_context("fork")
    helpers = []
    start = time.time() + 1.5  # every client connects before the window opens
    end = start + seconds
    done = ctx.Queue()
    if sc.requesters:
        ready = ctx.Event()
        helpers.append(ctx.Process(target=_responder, args=(server.port, sc.sub_user, ready,
                                                            end)))
        helpers[-1].start()
        ready.wait(10)
        loaders = [ctx.Process(target=_requesters, args=(server.port, sc.pub_user,
                                                         sc.requesters // 2, start, end, i))
                   for i in range(2)]
    else:
        for _ in range(sc.subs):
            ready = ctx.Event()
            p = ctx.Process(target=_sink, args=(server.port, sc.sub_user, ready, end))
            p.start()
            ready.wait(10)
            helpers.append(p)
        loaders = [ctx.Process(target=_publisher, args=(server.port, sc.pub_user, sc.subjects,
                                                        start, end, i, done))
                   for i in range(sc.pubs)]
    for p in loaders:
        p.start()
    time.sleep(max(0.0, start - time.time() - 0.3))
    v0, c0 = server.varz(), server.cpu()
    time.sleep(max(0.0, start - time.time()))
    t0 = time.time()
    for p in loaders:
        p.join(seconds + 30)
    c1 = server.cpu()
    t1 = time.time()
    if not sc.requesters:
        t1 = max(done.get(timeout=5) for _ in loaders)
    time.sleep(0.3)
    v1 = server.varz()
    for p in helpers:
        p.join(10)
        if p.is_alive():
            p.kill()
    dt = t1 - t0
    msgs_in, msgs_out = v1["in_msgs"] - v0["in_msgs"], v1["out_msgs"] - v0["out_msgs"]
    return {"server": server.kind, "scenario": sc.name, "in_per_s": round(msgs_in / dt),
            "out_per_s": round(msgs_out / dt), "cpu_pct": round(100 * (c1 - c0) / dt),
            "us_per_msg": round(1e6 * (c1 - c0) / max(1, msgs_in + msgs_out), 3),
            "load": os.getloadavg()[0]}


def _rate(r: dict) -> float:
    return max(r["in_per_s"], r["out_per_s"])


def report(results: list[dict], modes: list[str], uptimes: list[str]) -> str:
    lines = ["# Server-bound core benchmark (benchmarks/server_bound.py)", "",
             f"{SIZE} B payloads; load on CPU 0. uptime during the run:", ""]
    lines += [f"    {u}" for u in uptimes]
    lines += ["", "Rates: the larger of in/out msgs/s (fan-out: out). us/msg: server CPU per "
              "message in+out. Medians over repetitions.", ""]
    kinds = sorted({r["server"] for r in results if r["server"] != "nats"})
    for mode in modes:
        lines += [f"## {mode}", "",
                  "| scenario | server | msgs/s | nats msgs/s | ratio | us/msg | nats us/msg | "
                  "CPU/msg vs nats | CPU% | nats CPU% |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for sc in SCENARIOS:
            med = {}
            for k in [*kinds, "nats"]:
                rs = [r for r in results if r["mode"] == mode and r["scenario"] == sc.name
                      and r["server"] == k]
                if rs:
                    med[k] = {"rate": statistics.median(_rate(r) for r in rs),
                              "us": statistics.median(r["us_per_msg"] for r in rs),
                              "cpu": statistics.median(r["cpu_pct"] for r in rs)}
            n = med.get("nats")
            for k in kinds:
                j = med.get(k)
                if not j or not n:
                    continue
                lines.append(f"| {sc.name} | {k} | {j['rate']:,.0f} | {n['rate']:,.0f} | "
                             f"{j['rate'] / max(n['rate'], 1):.2f}x | {j['us']:.2f} | "
                             f"{n['us']:.2f} | {j['us'] / max(n['us'], 1e-9):.1f}x | "
                             f"{j['cpu']:.0f} | {n['cpu']:.0f} |")
        lines.append("")
    lines += ["Scenarios:", ""] + [f"- `{s.name}`: {s.what}" for s in SCENARIOS]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--modes", default="pinned,unpinned")
    ap.add_argument("--scenarios", default=",".join(BY_NAME))
    ap.add_argument("--servers", default="jetraft,nats")
    ap.add_argument("--out", default="")
    ap.add_argument("--domain", default=None,
                    help="run the servers with JetStream, `domain: <this>` unless \"\"")
    a = ap.parse_args()
    modes = a.modes.split(",")
    results: list[dict] = []
    uptimes: list[str] = []
    tmp = tempfile.mkdtemp(prefix="srvbound-")
    try:
        for mode in modes:
            servers = [Server(k, mode == "pinned", tmp, a.domain) for k in a.servers.split(",")]
            try:
                for rep in range(a.reps):
                    uptimes.append(f"{mode} rep {rep}: " + subprocess.run(
                        ["uptime"], capture_output=True, text=True).stdout.strip())
                    for name in a.scenarios.split(","):
                        for srv in servers:  # interleaved: both see the same conditions
                            r = run(srv, BY_NAME[name], a.seconds)
                            r["mode"] = mode
                            results.append(r)
                            print(json.dumps(r), flush=True)
            finally:
                for srv in servers:
                    srv.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = report(results, modes, uptimes)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
        with open(a.out.rsplit(".", 1)[0] + ".json", "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

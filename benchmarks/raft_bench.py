"""Jetraft's multi-group Raft against the pysyncobj baseline, side by side.

Ours: 3 nodes; node 1 runs in this process (MultiRaft + NodeLog + GrpcTransport,
proposing in-process, leader of every group); nodes 2 and 3 are
`python -m raft.node` subprocesses. Every entry is fsynced on every member
before it counts. pysyncobj: `benchmarks/raft_pysyncobj.py` run as a
subprocess, same shape (node 1 proposing in-process, 2 followers as
processes), never fsyncs. Scenarios alternate ours / pysyncobj so both see
the same machine load.

    python benchmarks/raft_bench.py                 # default run, a few minutes
    python benchmarks/raft_bench.py --quick         # smaller counts
    python benchmarks/raft_bench.py --idle-1000-pysyncobj   # also 1,000 idle pysyncobj groups
    python benchmarks/raft_bench.py --only "128 B, window" --repeat 2   # some rows, twice
    JETRAFT_BASE=/tmp/base python benchmarks/raft_bench.py --only "128 B, window 1 "
        # also an older checkout, interleaved round by round (same rows, same lanes)

The headline column is the cluster's default lane (the direct TCP lane,
`cluster { raft_lane: auto }`); `--lanes both` adds the gRPC lanes. A direct
run starts measuring only once every lane is on the direct connection (at
start a lane may stand in on gRPC for a moment: the followers' listeners come
up after the leader's first dial). The machine is shared: every round
records the load average before and after it, and only ratios within a
round mean much.

Prints a markdown table, then one JSON document (also written to --json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

# RAFT_BENCH_TREE: the checkout whose raft/ runs (a child run for JETRAFT_BASE).
ROOT = Path(os.environ.get("RAFT_BENCH_TREE") or Path(__file__).resolve().parents[1]).resolve()
sys.path.insert(0, str(ROOT))

# This script's own folder (sys.path[0]), whichever tree RAFT_BENCH_TREE runs.
from fsync_concurrency import latencies  # noqa: E402, I001

from raft import multigroup  # noqa: E402
from raft.node import CountSM  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OurCluster:
    def __init__(self, tmp: str, groups: int, direct: bool = False) -> None:
        self.tmp = tmp
        # direct: members talk over raft/tcp_lane.py instead of gRPC streams
        self.direct = {i: f"127.0.0.1:{free_port()}" for i in (1, 2, 3)} if direct else None
        self.groups = [f"g{k}" for k in range(groups)]
        self.addrs = {i: f"127.0.0.1:{free_port()}" for i in (1, 2, 3)}
        self.procs: list[subprocess.Popen] = []
        self.mr: multigroup.MultiRaft | None = None

    async def start(self) -> multigroup.MultiRaft:
        peers = ",".join(f"{i}={a}" for i, a in self.addrs.items())
        for nid in (2, 3):
            cmd = [sys.executable, "-m", "raft.node", "--id", str(nid),
                   "--dir", f"{self.tmp}/n{nid}", "--listen", self.addrs[nid], "--peers", peers,
                   "--control-port", str(free_port()), "--groups", str(len(self.groups)),
                   "--sm", "count", "--snapshot-every", "1000000"]
            if self.direct:
                cmd += ["--direct", ",".join(f"{i}={a}" for i, a in self.direct.items())]
            self.procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL))
        mr = multigroup.create(1, f"{self.tmp}/n1", self.addrs[1], self.addrs,
                               snapshot_every=1_000_000, direct=self.direct)
        for g in self.groups:
            mr.add_group(g, [1, 2, 3], state_machine=CountSM())
        await mr.start()
        self.mr = mr
        await self._lead_all()
        if self.direct:
            await self._direct_up()
        return mr

    async def _direct_up(self, timeout: float = 30.0) -> None:
        """Until every lane runs over the direct connection: the leader dials
        before the followers listen, and a gRPC stream stands in until its
        next probe of the lane gets through (0.2 s, then doubling)."""
        kinds = getattr(self.mr.transport, "lane_kinds", None)
        if kinds is None:  # an older tree: no fallback, the lanes are direct or down
            return
        deadline = time.monotonic() + timeout
        while any(k != ("direct", "direct") for k in kinds().values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"direct lanes not up after {timeout} s: {kinds()}")
            await asyncio.sleep(0.05)

    async def _lead_all(self) -> None:
        """Node 1 leads every group (it is where the benchmark proposes)."""
        mr = self.mr
        assert mr is not None
        async with asyncio.timeout(120):
            for g in self.groups:
                await mr.wait_leader(g, timeout=120)
            sem = asyncio.Semaphore(50)

            async def lead(g: str) -> None:
                async with sem:
                    while mr.leader(g) != 1:
                        try:
                            await mr.transfer_leader(g, 1, timeout=5)
                        except TimeoutError:
                            pass
            await asyncio.gather(*(lead(g) for g in self.groups))

    async def stop(self) -> None:
        if self.mr is not None:
            await self.mr.stop()
        for p in self.procs:
            p.kill()
            p.wait()


async def drive(mr: multigroup.MultiRaft, groups: list[str], size: int, count: int,
                window: int) -> dict[str, Any]:
    """`count` proposals spread over `groups`, at most `window` in flight in total."""
    payload = os.urandom(size)
    lat: list[float] = []
    errors = 0
    per_group = max(1, window // len(groups))
    todo = [count // len(groups)] * len(groups)

    async def worker(g: str, k: int) -> None:
        nonlocal errors
        while todo[k] > 0:
            todo[k] -= 1
            t0 = time.perf_counter()
            try:
                await mr.propose(g, payload)
            except (multigroup.NotLeader, multigroup.ProposalDropped):
                errors += 1
            lat.append(time.perf_counter() - t0)

    f0, s0 = mr.node_log.stats.fsyncs, mr.stats.syncs
    start = time.perf_counter()
    await asyncio.gather(*(worker(g, k) for k, g in enumerate(groups) for _ in range(per_group)))
    elapsed = time.perf_counter() - start
    lat.sort()
    n = len(lat)
    return {
        "rate": n / elapsed, "p50_ms": 1000 * lat[n // 2], "p99_ms": 1000 * lat[int(n * 0.99)],
        "errors": errors, "count": n,
        "leader_fsyncs_per_entry": (mr.node_log.stats.fsyncs - f0) / max(1, n),
        "entries_per_sync": n / max(1, mr.stats.syncs - s0),
    }


# ---- the physical floor of a commit, measured in the same run -----------------------

_ECHO = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    data = s.recv(65536)
    if not data:
        break
    s.sendall(data)
"""


def fsync_p50(dir: str, seconds: float = 1.0, size: int = 128) -> float:
    """p50 seconds of appending `size` bytes to a file in `dir` and fsyncing
    it: what one member pays per commit at low load."""
    path = os.path.join(dir, f".floor-{os.getpid()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    lat: list[float] = []
    try:
        end = time.perf_counter() + seconds
        while (t := time.perf_counter()) < end:
            os.write(fd, b"x" * size)
            os.fsync(fd)
            lat.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    return sorted(lat)[len(lat) // 2]


def rtt_p50(seconds: float = 1.0, size: int = 128) -> float:
    """p50 seconds of a `size`-byte ping-pong with another process over
    loopback TCP: one network round trip between two members."""
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        child = subprocess.Popen([sys.executable, "-c", _ECHO, str(ls.getsockname()[1])])
        conn, _ = ls.accept()
    lat: list[float] = []
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = b"p" * size
        end = time.perf_counter() + seconds
        while (t := time.perf_counter()) < end:
            conn.sendall(msg)
            got = 0
            while got < size:
                got += len(conn.recv(size - got))
            lat.append(time.perf_counter() - t)
    child.wait(timeout=10)
    return sorted(lat)[len(lat) // 2]


def floor(dir: str, size: int = 128) -> dict[str, float]:
    """One fsync plus one loopback round trip: no commit can be faster."""
    f, r = fsync_p50(dir, size=size), rtt_p50()
    return {"fsync_p50_ms": 1000 * f, "rtt_p50_ms": 1000 * r, "floor_ms": 1000 * (f + r),
            "fsync3_p50_ms": 1000 * fsync_concurrent_p50(dir, 3, size=size)}


def fsync_concurrent_p50(dir: str, writers: int = 3, seconds: float = 1.0,
                         size: int = 128) -> float:
    """p50 seconds of one fsync when `writers` files on the same disk are
    appended to and fsynced at the same moment: what each member of a
    3-node commit pays, the three sharing one disk here. Reported beside the
    floor, never part of it (the floor stays one lone fsync + one RTT)."""
    lat = latencies(dir, writers, "append", seconds, size)
    return lat[len(lat) // 2]


def cpu_times(procs: list[psutil.Process]) -> list[float]:
    out = []
    for p in procs:
        t = p.cpu_times()
        out.append(t.user + t.system)
    return out


async def idle_cpu(c: OurCluster, seconds: float) -> dict[str, Any]:
    mr = c.mr
    assert mr is not None
    async with asyncio.timeout(600):  # every group quiesces once idle (10,000: minutes)
        while not all(mr.status(g)["quiesced"] for g in c.groups):
            await asyncio.sleep(0.2)
    ps = [psutil.Process()] + [psutil.Process(p.pid) for p in c.procs]
    before = cpu_times(ps)
    await asyncio.sleep(seconds)
    pct = [100 * (a - b) / seconds for a, b in zip(cpu_times(ps), before, strict=True)]
    # RSS over the group count: an upper bound per group (includes the
    # interpreter and gRPC); the 1-group row gives the fixed part to subtract.
    rss = [p.memory_info().rss / 2**20 for p in ps]
    return {"cpu_pct_per_node": pct, "cpu_pct_max": max(pct), "rss_mib_per_node": rss,
            "rss_kib_per_group": max(rss) * 1024 / len(c.groups)}


async def ours(scenario: str, groups: int, size: int = 128, count: int = 0, window: int = 1,
               idle_s: float = 0.0, direct: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        c = OurCluster(tmp, groups, direct)
        try:
            mr = await c.start()
            if scenario == "idle":
                res = await idle_cpu(c, idle_s)
            else:
                # warm-up: at least one proposal per group
                await drive(mr, c.groups, size, max(min(count, 500), groups), window)
                # In a thread: the leader's loop keeps its heartbeats going.
                before = await asyncio.to_thread(floor, tmp, size) if window == 1 else None
                # CPU per commit of each member (leader first; its figure includes the
                # proposing clients): steadier than latency on a shared, loaded machine.
                ps = [psutil.Process()] + [psutil.Process(p.pid) for p in c.procs]
                cpu0 = cpu_times(ps)
                res = await drive(mr, c.groups, size, count, window)
                res["cpu_us_per_commit"] = [1e6 * (a - b) / max(1, res["count"])
                                            for a, b in zip(cpu_times(ps), cpu0, strict=True)]
                if before is not None:
                    res.update(with_floor(res, before, await asyncio.to_thread(floor, tmp, size)))
            return {"impl": "jetraft-direct" if direct else "jetraft", "scenario": scenario,
                    "groups": groups, "size": size, "window": window, **res}
        finally:
            await c.stop()


def with_floor(res: dict[str, Any], before: dict[str, float],
               after: dict[str, float]) -> dict[str, Any]:
    """The floor measured just before and just after our run (the machine is
    shared: only a ratio within one run means anything), and p50 / floor."""
    fl = {k: (before[k] + after[k]) / 2 for k in before}
    return {**fl, "floor_before_ms": before["floor_ms"], "floor_after_ms": after["floor_ms"],
            "p50_over_floor": res["p50_ms"] / fl["floor_ms"]}


def pysyncobj(*args: str) -> dict[str, Any]:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "raft_pysyncobj.py"), *args]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"impl": "pysyncobj", "error": out.stderr[-500:]}
    return json.loads(lines[-1])


def plan(args: argparse.Namespace) -> list[tuple[str, Any, Any]]:
    q = 4 if args.quick else 1
    w = str(args.pysyncobj_window)
    rows: list[tuple[str, Any, Any]] = [
        ("128 B, window 1 (low load)",
         lambda **kw: ours("throughput", 1, 128, 400 // q, 1, **kw),
         lambda: pysyncobj("--size", "128", "--count", str(100 // q), "--window", "1")),
        (f"128 B, window {args.window} / pysyncobj {w}",
         lambda **kw: ours("throughput", 1, 128, 20000 // q, args.window, **kw),
         lambda: pysyncobj("--size", "128", "--count", str(20000 // q), "--window", w)),
        ("16 KiB, window 1 (low load)",
         lambda **kw: ours("throughput", 1, 16384, 300 // q, 1, **kw),
         lambda: pysyncobj("--size", "16384", "--count", str(60 // q), "--window", "1")),
        (f"16 KiB, window {args.window_16k} / pysyncobj {w}",
         lambda **kw: ours("throughput", 1, 16384, 4000 // q, args.window_16k, **kw),
         lambda: pysyncobj("--size", "16384", "--count", str(4000 // q), "--window", w)),
        (f"100 busy groups, 128 B, window {args.window} / pysyncobj {w}",
         lambda **kw: ours("throughput", 100, 128, 20000 // q, args.window, **kw),
         lambda: pysyncobj("--groups", "100", "--size", "128", "--count", str(20000 // q),
                           "--window", w)),
    ]
    rows.append((f"1,000 busy groups, 128 B, window {args.window}",
                 lambda **kw: ours("throughput", 1000, 128, args.busy_1000_count // q,
                                   args.window, **kw),
                 None))  # pysyncobj: 1,000 groups never became ready (see docs/raft.md)
    for n in (1, 100, 1000, 10000):
        def py(n: int = n) -> dict[str, Any]:
            return pysyncobj("--groups", str(n), "--idle-seconds", str(args.idle_s))
        skip = n >= 10000 or (n == 1000 and not args.idle_1000_pysyncobj)
        rows.append((f"idle CPU, {n} groups per node",
                     lambda n=n, **kw: ours("idle", n, idle_s=args.idle_s, **kw),
                     None if skip else py))
    return rows


def fmt(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not run"
    if "error" in r:
        return "error"
    if "rate" in r:
        out = f"{r['rate']:,.0f}/s, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms"
        if "cpu_us_per_commit" in r:
            out += ", CPU/commit " + "/".join(f"{u:.0f}" for u in r["cpu_us_per_commit"]) + " us"
        if "floor_ms" in r:
            out += (f" (floor {r['floor_ms']:.2f} ms = fsync {r['fsync_p50_ms']:.2f} + RTT "
                    f"{r['rtt_p50_ms']:.3f}; p50 = {r['p50_over_floor']:.1f}x floor; "
                    f"3 concurrent fsyncs p50 {r.get('fsync3_p50_ms', 0):.2f})")
        return out
    out = "CPU " + ", ".join(f"{p:.1f}%" for p in r["cpu_pct_per_node"])
    if "rss_kib_per_group" in r:
        out += (", RSS " + "/".join(f"{m:.0f}" for m in r["rss_mib_per_node"])
                + f" MiB, <= {r['rss_kib_per_group']:.1f} KiB per group")
    return out


def base_run(title: str, lanes: str) -> tuple[dict | None, dict | None]:
    """One round of the row `title` with JETRAFT_BASE's raft/ (a child
    process running this script against that tree): (gRPC, direct)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = dict(os.environ, RAFT_BENCH_TREE=os.environ["JETRAFT_BASE"], PYTHONPATH="")
        env.pop("JETRAFT_BASE")
        cmd = [sys.executable, __file__, "--only", title, "--lanes", lanes, "--repeat", "1",
               "--no-pysyncobj", "--json", out.name]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        try:
            r = json.loads(Path(out.name).read_text())["results"][0]
        except (ValueError, KeyError, IndexError):
            err = {"error": done.stderr[-500:]}
            return err, err
    return r["jetraft"], r["jetraft_direct"]


def load() -> str:
    """The 1/5/15-minute load average: the machine is shared, so every row
    records it before and after."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--window-16k", type=int, default=256)
    ap.add_argument("--pysyncobj-window", type=int, default=4096)
    ap.add_argument("--idle-s", type=float, default=8.0)
    ap.add_argument("--idle-1000-pysyncobj", action="store_true")
    ap.add_argument("--only", default="", help="run only rows whose title contains this")
    ap.add_argument("--busy-1000-count", type=int, default=20000,
                    help="entries of the 1,000-busy-groups row (more: closer to steady state)")
    ap.add_argument("--repeat", type=int, default=1, help="run every row this many times")
    ap.add_argument("--json", default="")
    ap.add_argument("--lanes", choices=("grpc", "direct", "both"), default="both",
                    help="ours over the direct TCP lane (the cluster default), over gRPC "
                         "streams, or both per round")
    ap.add_argument("--no-pysyncobj", action="store_true", help="skip the pysyncobj rows")
    args = ap.parse_args()
    base = os.environ.get("JETRAFT_BASE")
    results = []
    for title, mine, theirs in plan(args):
        if args.only and args.only not in title:
            continue
        for k in range(args.repeat):
            la = load()
            # base and this tree alternate which goes first, round by round
            first_base = base and k % 2 == 1
            ba = bd = None
            if first_base:
                ba, bd = base_run(title, args.lanes)
            d = asyncio.run(mine(direct=True)) if args.lanes != "grpc" else None
            a = asyncio.run(mine()) if args.lanes != "direct" else None
            if base and not first_base:
                ba, bd = base_run(title, args.lanes)
            b = theirs() if theirs and not args.no_pysyncobj else None
            r = {"scenario": title, "round": k + 1, "jetraft": a, "jetraft_direct": d,
                 "pysyncobj": b, "load_before": la, "load_after": load()}
            if base:
                r.update(base=base, base_jetraft=ba, base_jetraft_direct=bd)
            results.append(r)
            line = f"{title} #{k + 1}: direct lane (default) {fmt(d)} | gRPC lanes {fmt(a)}"
            if base:
                line += f" | BASE direct {fmt(bd)} | BASE gRPC {fmt(ba)}"
            print(f"{line} | pysyncobj {fmt(b)} | load {la} -> {r['load_after']}",
                  file=sys.stderr, flush=True)
    cols = ["jetraft, direct TCP lane (the default; fsync on every member)", "jetraft, gRPC lanes"]
    if base:
        cols += [f"base {base}, direct lane", f"base {base}, gRPC lanes"]
    print(f"| scenario | round | {' | '.join(cols)} | pysyncobj 0.3.17 (no fsync) "
          "| load before -> after |")
    print("|---" * (len(cols) + 4) + "|")
    for r in results:
        cells = [r["jetraft_direct"], r["jetraft"]]
        if base:
            cells += [r["base_jetraft_direct"], r["base_jetraft"]]
        print(f"| {r['scenario']} | {r['round']} | {' | '.join(fmt(c) for c in cells)} | "
              f"{fmt(r['pysyncobj'])} | {r['load_before']} -> {r['load_after']} |")
    fs = [x["leader_fsyncs_per_entry"] for r in results for x in (r["jetraft"], r["jetraft_direct"])
          if x and "rate" in x]
    if fs:
        print(f"\nfsyncs per committed entry on the leader: {min(fs):.4f} to {max(fs):.3f} "
              "(ours); pysyncobj: 0 (it never fsyncs)")
    doc = json.dumps({"results": results}, indent=1)
    print(doc)
    if args.json:
        Path(args.json).write_text(doc)


if __name__ == "__main__":
    main()

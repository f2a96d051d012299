"""The pysyncobj baseline for the Raft benchmark.

A plain 3-node pysyncobj cluster over its own TCP transport, each node its own process, with a
replicated append command. It runs in the same benchmark invocation as Jetraft's Raft, so the
two are compared under the same machine load. pysyncobj never fsyncs (see docs/raft.md), so its
figures are "no-fsync" figures. Its commit latency is tick-bound (about 100 ms), so its peak
throughput needs thousands of commands in flight: use --window 4096.

    python benchmarks/raft_pysyncobj.py --size 128 --count 20000 --window 256
    python benchmarks/raft_pysyncobj.py --groups 100 --count 20000 --window 4096   # busy groups
    python benchmarks/raft_pysyncobj.py --groups 1000 --idle-seconds 10

Prints one JSON object per scenario.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

import psutil
from pysyncobj import SyncObj, SyncObjConf, replicated


class AppendLog(SyncObj):
    def __init__(self, self_addr: str, partners: list[str], conf: SyncObjConf) -> None:
        super().__init__(self_addr, partners, conf)
        self.count = 0
        self.bytes = 0

    @replicated
    def append(self, data: bytes) -> int:
        self.count += 1
        self.bytes += len(data)
        return self.count


def make_conf(journal: str | None) -> SyncObjConf:
    return SyncObjConf(
        appendEntriesUseBatch=True, journalFile=journal, dynamicMembershipChange=False
    )


def run_member(addr: str, partners: list[str], journal_dir: str, groups: int) -> None:
    """A follower process: hosts `groups` AppendLog objects and idles until killed."""
    nodes = []
    for g in range(groups):
        me = _shift(addr, g)
        peers = [_shift(p, g) for p in partners]
        nodes.append(AppendLog(me, peers, make_conf(os.path.join(journal_dir, f"j{g}"))))
    while True:
        time.sleep(3600)


def _shift(addr: str, offset: int) -> str:
    host, port = addr.rsplit(":", 1)
    return f"{host}:{int(port) + offset}"


def start_cluster(
    groups: int, tmp: str
) -> tuple[list[AppendLog], list[subprocess.Popen], list[str]]:
    # Member i uses `groups` consecutive ports starting at its base port.
    first = 20000 + random.randrange(0, 20000)
    base = [first + i * groups for i in range(3)]
    addrs = [f"127.0.0.1:{p}" for p in base]
    procs = []
    for i in (1, 2):
        partners = [a for j, a in enumerate(addrs) if j != i]
        cmd = [
            sys.executable,
            __file__,
            "--member",
            addrs[i],
            "--partners",
            ",".join(partners),
            "--journal-dir",
            os.path.join(tmp, f"n{i}"),
            "--groups",
            str(groups),
        ]
        os.makedirs(os.path.join(tmp, f"n{i}"), exist_ok=True)
        procs.append(subprocess.Popen(cmd))
    os.makedirs(os.path.join(tmp, "n0"), exist_ok=True)
    local = [
        AppendLog(
            _shift(addrs[0], g),
            [_shift(a, g) for a in addrs[1:]],
            make_conf(os.path.join(tmp, "n0", f"j{g}")),
        )
        for g in range(groups)
    ]
    return local, procs, addrs


def wait_ready(nodes: list[AppendLog], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for n in nodes:
        while n._getLeader() is None or not n.isReady():
            if time.monotonic() > deadline:
                raise TimeoutError("pysyncobj cluster has no leader")
            time.sleep(0.05)


def throughput(nodes: list[AppendLog], size: int, count: int, window: int) -> dict:
    """Commands round-robin over the groups, at most `window` in flight in total."""
    payload = os.urandom(size)
    sem = threading.Semaphore(window)
    lat: list[float] = []
    errors = [0]
    done = threading.Event()
    remaining = [count]
    lock = threading.Lock()

    def make_cb(t0: float):
        def cb(result, err) -> None:
            with lock:
                if err != 0:
                    errors[0] += 1
                lat.append(time.perf_counter() - t0)
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()
            sem.release()

        return cb

    start = time.perf_counter()
    for k in range(count):
        sem.acquire()
        nodes[k % len(nodes)].append(payload, callback=make_cb(time.perf_counter()))
    done.wait(300)
    elapsed = time.perf_counter() - start
    lat.sort()
    return {
        "rate": count / elapsed,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[int(len(lat) * 0.99)],
        "errors": errors[0],
    }


def idle_cost(procs: list[subprocess.Popen], seconds: float) -> dict:
    ps = [psutil.Process(p.pid) for p in procs] + [psutil.Process()]
    before = [p.cpu_times() for p in ps]
    time.sleep(seconds)
    after = [p.cpu_times() for p in ps]
    busy = [(a.user + a.system) - (b.user + b.system) for a, b in zip(after, before, strict=True)]
    pct = [100 * b / seconds for b in busy]
    return {"cpu_pct_per_node": pct, "cpu_pct_max": max(pct)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--member")
    ap.add_argument("--partners")
    ap.add_argument("--journal-dir")
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--idle-seconds", type=float, default=0.0)
    args = ap.parse_args()
    if args.member:
        run_member(args.member, args.partners.split(","), args.journal_dir, args.groups)
        return
    with tempfile.TemporaryDirectory() as tmp:
        local, procs, _ = start_cluster(args.groups, tmp)
        try:
            wait_ready(local)
            if args.idle_seconds:
                result = {
                    "scenario": "idle",
                    "groups": args.groups,
                    **idle_cost(procs, args.idle_seconds),
                }
            else:
                throughput(local, args.size, min(args.count, 2000), args.window)  # warm-up
                result = {
                    "scenario": "throughput",
                    "groups": args.groups,
                    "size": args.size,
                    "window": args.window,
                    **throughput(local, args.size, args.count, args.window),
                }
            print(json.dumps({"impl": "pysyncobj", **result}))
        finally:
            for p in procs:
                p.kill()
            os._exit(0)  # pysyncobj's threads are not daemonic everywhere


if __name__ == "__main__":
    main()

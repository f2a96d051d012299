"""What each member spends per Raft commit: CPU, run periods (wake-ups), run-queue wait
and, optionally, syscalls; for one or more source trees, interleaved.

    PYTHONPATH=$PWD python benchmarks/raft_counts.py [--trees . /tmp/base] [--lanes direct grpc]
        [--rounds 3] [--count 800] [--groups 1] [--window 1] [--strace]

The cluster is `benchmarks/raft_bench.py`'s (node 1 in this process proposes and leads; nodes 2
and 3 are `python -m raft.node` processes), started from each tree in turn (a child process per
run, so every tree imports its own code). Per commit and per member, summed over the member's
threads from `/proc/<pid>/task/*/schedstat`: CPU us, run periods (each starts with a wake-up or
a preemption; on a saturated machine each one first waits for a core) and run-queue wait us.
Commits per CPU-second of the three members together is the figure that does not depend on
the share of the machine the run got (rates on a shared box do). `--strace` also counts each
member's syscalls per commit (`strace -c -f`: slows the run, counts only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile

CHILD = "--child"


def schedstat(pids: list[int]) -> list[tuple[int, int, int]]:
    """(CPU ns, run-queue wait ns, run periods) of every thread of each process."""
    out = []
    for pid in pids:
        cpu = wait = runs = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    c, w, r = map(int, f.read().split())
            except (OSError, ValueError):
                continue  # the thread ended meanwhile
            cpu, wait, runs = cpu + c, wait + w, runs + r
        out.append((cpu, wait, runs))
    return out


def strace_counts(path: str, commits: int) -> dict[str, float]:
    rows: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                rows[parts[-1]] = int(parts[3])
    top = sorted(rows.items(), key=lambda kv: -kv[1])[:10]
    return {k: round(v / commits, 2) for k, v in top}


async def child(args: argparse.Namespace) -> None:
    """One run, inside the tree under test (cwd and sys.path point at it)."""
    sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
    import raft_bench as rb

    direct = args.lane == "direct"
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        c = rb.OurCluster(tmp, args.groups, direct)
        try:
            mr = await c.start()
            warm = 300 if args.window == 1 else max(2000, args.window)
            await rb.drive(mr, c.groups, 128, warm, args.window)
            pids = [os.getpid()] + [p.pid for p in c.procs]
            tracers = []
            if args.strace:
                for i, pid in enumerate(pids):
                    tracers.append(subprocess.Popen(
                        ["strace", "-c", "-f", "-p", str(pid), "-o", f"{tmp}/st{i}"],
                        stderr=subprocess.DEVNULL))
                await asyncio.sleep(1.0)
            before = schedstat(pids)
            res = await rb.drive(mr, c.groups, 128, args.count, args.window)
            after = schedstat(pids)
            n = max(1, res["count"])
            for t in tracers:
                t.send_signal(signal.SIGINT)
                t.wait()
            d = [[a - b for a, b in zip(x, y, strict=True)] for x, y in zip(after, before,
                                                                                strict=True)]
            cpu_us = [v[0] / n / 1e3 for v in d]
            out = {"p50_ms": res["p50_ms"], "rate": res["rate"], "errors": res["errors"],
                   "cpu_us": cpu_us, "rq_wait_us": [v[1] / n / 1e3 for v in d],
                   "runs": [v[2] / n for v in d],
                   "commits_per_cpu_s": 1e6 / max(1e-9, sum(cpu_us)),
                   "load": os.getloadavg()[0]}
            if tracers:
                out["syscalls"] = [strace_counts(f"{tmp}/st{i}", n) for i in range(len(pids))]
            print(json.dumps(out))
        finally:
            await c.stop()


def run_one(tree: str, lane: str, args: argparse.Namespace) -> dict | None:
    cmd = [sys.executable, os.path.abspath(__file__), CHILD, "--lane", lane,
           "--count", str(args.count), "--groups", str(args.groups),
           "--window", str(args.window)] + (["--strace"] if args.strace else [])
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    p = subprocess.run(cmd, cwd=os.path.abspath(tree), env=env, capture_output=True, text=True,
                       timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        print(f"  {tree} {lane}: failed: {p.stderr[-400:]}")
        return None
    return json.loads(lines[-1])


def fmt(v: list[float]) -> str:
    return "/".join(f"{x:.0f}" if x >= 10 else f"{x:.1f}" for x in v)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(CHILD, action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lane", default="direct", help=argparse.SUPPRESS)
    ap.add_argument("--trees", nargs="+", default=["."])
    ap.add_argument("--lanes", nargs="+", default=["direct", "grpc"],
                    choices=["direct", "grpc"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=800)
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--window", type=int, default=1)
    ap.add_argument("--strace", action="store_true")
    args = ap.parse_args()
    if args.child:
        asyncio.run(child(args))
        return
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print("| round | tree | lane | p50 ms | commits/s | CPU us/commit L/F/F | run periods L/F/F | "
          "run-queue wait us L/F/F | commits per CPU-s | load |\n|" + "---|" * 10)
    for r in range(1, args.rounds + 1):
        trees = args.trees if r % 2 else args.trees[::-1]  # alternate the order
        for tree in trees:
            for lane in args.lanes:
                res = run_one(tree, lane, args)
                if res is None:
                    continue
                print(f"| {r} | {tree} | {lane} | {res['p50_ms']:.2f} | {res['rate']:,.0f} | "
                      f"{fmt(res['cpu_us'])} | {fmt(res['runs'])} | {fmt(res['rq_wait_us'])} | "
                      f"{res['commits_per_cpu_s']:,.0f} | {res['load']:.1f} |", flush=True)
                for i, sc in enumerate(res.get("syscalls", [])):
                    print(f"|   | syscalls per commit, node {i + 1} | {sc} |")
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()

"""Sync publish latency, interleaved A/B: this tree, another checkout (JETRAFT_BASE) and
nats-server at its default and with `sync_interval: always`, all in ONE run.

    PYTHONPATH=$PWD [JETRAFT_BASE=/tmp/base] python benchmarks/js_sync_ab.py
        [--replicas 1|3] [--via leader|other] [--rounds 10] [--per 200] [--size 128]
        [--direct] [--grpc] [--threads]

Each target is a single server (R1) or a 3-node cluster (R3) on free loopback ports in a
temporary store. One nats-py client per target publishes one message at a time and waits
for its PubAck (the shared harness's js_sync scenario); the targets take turns in rounds of
`--per` publishes, so a change of machine load hits them alike. Prints p50/p90/p99 per target,
the ratio of each p50 to nats-server `always`'s, the 1-min load before and after, and per
publish the server processes' CPU and their run-queue wait (`/proc/<pid>/task/*/schedstat`:
time runnable but not running, summed over every thread of every node): on a saturated
machine that wait, not the work, is most of a publish's latency.
`--via other`: R3 publishes go to a node that does not lead the stream.
`--direct` (R3): one more target, this tree with `cluster { raft_port: 0 }` (Raft over the
direct TCP lane; the default since session 9, so this matters only against an older base).
`--grpc` (R3): one more target, this tree with `cluster { raft_lane: grpc }` (Raft over the
gRPC lanes, the default before session 9).
`--threads`: per server process, the loop thread's CPU and run periods per publish apart
from the other threads' (WAL/apply workers, LMDB sync thread, gRPC's threads); nats-server
processes show everything under "loop" only for their main thread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from node.cluster.local import LocalCluster, free_port  # noqa: E402


def _wait_log(path: Path, proc: Any, text: bytes = b"Server is ready") -> None:
    for _ in range(600):
        if path.exists() and text in path.read_bytes():
            return
        if proc.poll() is not None:
            raise RuntimeError(path.read_text()[-2000:])
        time.sleep(0.05)
    raise TimeoutError(str(path))


class Target:
    def __init__(self, label: str, tmp: Path, replicas: int) -> None:
        self.label = label
        self.dir = tmp / label
        self.dir.mkdir()
        self.replicas = replicas
        self.procs: list[subprocess.Popen[bytes]] = []
        self.cluster: LocalCluster | None = None
        self.urls: list[str] = []

    def start(self) -> None:
        if self.label.startswith("jetraft"):
            self._start_jetraft()
        else:
            self._start_nats(self.label == "nats-always")

    def _start_jetraft(self) -> None:
        tree = os.environ["JETRAFT_BASE"] if self.label == "jetraft-base" else str(ROOT)
        if self.replicas > 1:
            import node.cluster.local as local
            old = local.REPO_ROOT
            local.REPO_ROOT = tree
            try:
                extra = {"jetraft-direct": "raft_port: 0",
                         "jetraft-grpc": "raft_lane: grpc"}.get(self.label, "")
                self.cluster = LocalCluster(self.dir, 3, cluster_extra=extra).start()
            finally:
                local.REPO_ROOT = old
            self.urls = [n.url for n in self.cluster.nodes]
            return
        port = free_port()
        log = self.dir / "node.log"
        with open(log, "wb") as out:
            p = subprocess.Popen(
                [sys.executable, "-m", "node.cli", "serve", "-js", "-sd", str(self.dir / "data"),
                 "-a", "127.0.0.1", "-p", str(port)], cwd=tree, stdout=out,
                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": tree},
                start_new_session=True)
        self.procs.append(p)
        _wait_log(log, p)
        self.urls = [f"nats://127.0.0.1:{port}"]

    def _start_nats(self, always: bool) -> None:
        n = 1 if self.replicas == 1 else 3
        ports = [free_port() for _ in range(n)]
        cports = [free_port() for _ in range(n)]
        routes = ",".join(f"nats-route://127.0.0.1:{p}" for p in cports)
        sync = ", sync_interval: always" if always else ""
        for i in range(n):
            conf = self.dir / f"n{i}.conf"
            text = (f"server_name: n{i + 1}\nlisten: 127.0.0.1:{ports[i]}\n"
                    f"jetstream {{ store_dir: \"{self.dir}/d{i}\"{sync} }}\n")
            if n > 1:
                text += (f"cluster {{ name: C1, listen: 127.0.0.1:{cports[i]}, "
                         f"routes: [{routes}] }}\n")
            conf.write_text(text)
            self.procs.append(subprocess.Popen(
                [shutil.which("nats-server") or "nats-server", "-c", str(conf)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        self.urls = [f"nats://127.0.0.1:{p}" for p in ports]

    def pids(self) -> list[int]:
        if self.cluster is not None:
            return [n.proc.pid for n in self.cluster.nodes if n.proc is not None]
        return [p.pid for p in self.procs]

    def node_cpu(self) -> list[int]:
        """CPU ns so far of each server process (all its threads), in pid order."""
        out = []
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                out.append(0)
                continue
            ticks = int(fields[11]) + int(fields[12])  # utime + stime
            out.append(ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK"))
        return out

    def schedstat(self) -> tuple[int, int, int]:
        """(CPU ns, run-queue wait ns, run periods) of every thread of the target's servers
        so far. A run period starts at each wake-up (or preemption): under load each one
        waits in the run queue first, so their number per publish matters as much as CPU."""
        cpu = wait = runs = 0
        for pid in self.pids():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        c, w, r = f.read().split()
                except (OSError, ValueError):
                    continue
                cpu += int(c)
                wait += int(w)
                runs += int(r)
        return cpu, wait, runs

    def node_threads(self) -> list[list[int]]:
        """Per server process (pid order): [loop thread CPU ns, its run periods, other
        threads' CPU ns, their run periods]. The loop thread is the main one (tid = pid);
        the others are the WAL/apply workers, LMDB's sync thread and gRPC's threads."""
        out = []
        for pid in self.pids():
            row = [0, 0, 0, 0]
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                tids = []
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        c, _, r = f.read().split()
                except (OSError, ValueError):
                    continue
                k = 0 if int(tid) == pid else 2
                row[k] += int(c)
                row[k + 1] += int(r)
            out.append(row)
        return out

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


async def _quiet(_exc: Exception) -> None:
    return None


async def connect(t: Target, via: str, size: int) -> Any:
    """A client on the node that leads the stream (or, `via other`, one that does not),
    with the stream created and warmed up."""
    import nats

    deadline = time.monotonic() + 90
    while True:
        try:
            nc = await nats.connect(t.urls[0], error_cb=_quiet, max_reconnect_attempts=0)
            js = nc.jetstream(timeout=10)
            await js.add_stream(name="AB", subjects=["ab.x"], num_replicas=t.replicas)
            await js.publish("ab.x", b"w")
            break
        except Exception:  # noqa: BLE001 - starting up / no meta leader yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    url = t.urls[0]
    if t.replicas > 1:
        info = await js.stream_info("AB")
        leader = info.cluster.leader if info.cluster else None
        names = [f"n{i + 1}" for i in range(len(t.urls))]
        idx = names.index(leader) if leader in names else 0
        if via == "other":
            idx = (idx + 1) % len(t.urls)
        url = t.urls[idx]
    await nc.close()
    nc = await nats.connect(url, error_cb=_quiet)
    js = nc.jetstream(timeout=10)
    data = os.urandom(size)
    for _ in range(100):
        await js.publish("ab.x", data)
    return nc, js, data


async def run(args: argparse.Namespace) -> None:
    labels = ["jetraft", "nats-default", "nats-always"]
    if os.environ.get("JETRAFT_BASE"):
        labels.insert(1, "jetraft-base")
    if args.direct and args.replicas > 1:
        labels.insert(1, "jetraft-direct")
    if args.grpc and args.replicas > 1:
        labels.insert(1, "jetraft-grpc")
    tmp = Path(tempfile.mkdtemp(prefix="syncab-", dir=args.dir))
    targets = [Target(lb, tmp, args.replicas) for lb in labels]
    lat: dict[str, list[float]] = {lb: [] for lb in labels}
    sched: dict[str, list[int]] = {lb: [0, 0, 0] for lb in labels}
    per_node: dict[str, list[int]] = {lb: [] for lb in labels}
    threads: dict[str, list[list[int]]] = {lb: [] for lb in labels}
    try:
        for t in targets:
            t.start()
        conns = {t.label: await connect(t, args.via, args.size) for t in targets}
        by_label = {t.label: t for t in targets}
        load0 = os.getloadavg()[0]
        up0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        for r in range(args.rounds):
            order = labels if r % 2 == 0 else labels[::-1]
            for lb in order:
                _, js, data = conns[lb]
                t = by_label[lb]
                before = t.schedstat()
                nodes0 = t.node_cpu()
                thr0 = t.node_threads() if args.threads else []
                for _ in range(args.per):
                    s = time.perf_counter()
                    await js.publish("ab.x", data)
                    lat[lb].append((time.perf_counter() - s) * 1e6)
                for k, v in enumerate(t.schedstat()):
                    sched[lb][k] += v - before[k]
                nodes1 = t.node_cpu()
                acc = per_node[lb] or [0] * len(nodes1)
                per_node[lb] = [a + b - c for a, b, c in zip(acc, nodes1, nodes0, strict=False)]
                if args.threads:
                    thr1 = t.node_threads()
                    acc2 = threads[lb] or [[0] * 4 for _ in thr1]
                    threads[lb] = [[a + b - c for a, b, c in zip(x, y, z, strict=False)]
                                   for x, y, z in zip(acc2, thr1, thr0, strict=False)]
        up1 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        for nc, _, _ in conns.values():
            await nc.close()
    finally:
        for t in targets:
            t.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    ref = statistics.median(lat["nats-always"])
    print(f"\n## sync publish R{args.replicas} via {args.via}, {args.size} B, "
          f"{args.rounds} x {args.per} per target, interleaved; load {load0:.1f} at start")
    print(f"uptime before: {up0}\nuptime after:  {up1}\n")
    print("| target | p50 us | p90 us | p99 us | p50 / nats always | srv CPU us/pub | "
          "srv run-queue wait us/pub | srv run periods/pub |\n|---|---|---|---|---|---|---|---|")
    for lb in labels:
        v = sorted(lat[lb])
        n = len(v)
        print(f"| {lb} | {statistics.median(v):.0f} | {_q(v, 0.9):.0f} | {_q(v, 0.99):.0f} | "
              f"{statistics.median(v) / ref:.2f}x | {sched[lb][0] / n / 1e3:.0f} | "
              f"{sched[lb][1] / n / 1e3:.0f} | {sched[lb][2] / n:.1f} |")
    print("\nCPU us per publish per server process (utime+stime, in node order; the "
          "client publishes to the stream leader):")
    for lb in labels:
        n = len(lat[lb])
        print(f"  {lb}: " + " / ".join(f"{c / n / 1e3:.0f}" for c in per_node[lb]))
    if args.threads:
        print("\nPer publish per server process (node order), loop thread | other threads: "
              "CPU us (schedstat) and run periods:")
        for lb in labels:
            n = len(lat[lb])
            print(f"  {lb}: " + " / ".join(
                f"{lc / n / 1e3:.0f} {lr / n:.1f}r | {oc / n / 1e3:.0f} {orr / n:.1f}r"
                for lc, lr, oc, orr in threads[lb]))


def _q(v: list[float], q: float) -> float:
    return v[min(len(v) - 1, int(len(v) * q))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--via", choices=("leader", "other"), default="leader")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per", type=int, default=200)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--dir", default=None, help="where the stores go (default: $TMPDIR)")
    ap.add_argument("--direct", action="store_true",
                    help="R3: also this tree with Raft over the direct TCP lane (raft_port: 0)")
    ap.add_argument("--grpc", action="store_true",
                    help="R3: also this tree with Raft over the gRPC lanes (raft_lane: grpc)")
    ap.add_argument("--threads", action="store_true",
                    help="also split each server process into its loop thread and the rest")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()

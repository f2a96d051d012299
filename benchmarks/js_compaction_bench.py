"""What log compaction costs a clustered R3 stream at steady load (issue 9).

    PYTHONPATH=$PWD python benchmarks/js_compaction_bench.py [--msgs 60000] [--rate 2000]
        [--prefill 0] [--size 128] [--repeats 2] [--code before=/tmp/base,after=$PWD]
        [--no-nats] [--out FILE]

Each target is a fresh 3-node cluster on free loopback ports: one per `--code` tree (jetraft
nodes started with PYTHONPATH at that tree, so the same run compares two versions of the code)
and a 3-node nats-server cluster (the reference, default sync). For each, an R3 file stream,
`--prefill` messages published as fast as possible (not measured: a big stream, since a
whole-image compaction costs O(stream size)), then `--msgs` publishes of `--size` bytes with
PubAcks, paced at `--rate` msgs/s (0 = as fast as a window of 64 in flight allows) from one
nats-py client connected to the stream leader's node.
Measured per server process over the publishing window (utime + stime from /proc/<pid>/stat):
CPU % of one core and CPU us per message; and, for jetraft, the bytes the nodes' snapshot files
take at the end (`raft/snap/*.data`: whole stream images before issue 9, markers after). The
targets take turns in every repetition so they share the machine's load; `uptime` is printed
before and after. Writes a markdown table to `--out` (default benchmarks/results/...)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.js_cluster_bench import nats_cluster  # noqa: E402
from node.cluster.local import free_port  # noqa: E402

HERE = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def jetraft_cluster(d: Path, code: str) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    """Three jetraft nodes running the code in `code` (PYTHONPATH), routed to each other."""
    ports = [(free_port(), free_port(), free_port()) for _ in range(3)]
    routes = ", ".join(f'"nats-route://127.0.0.1:{c}"' for _, _, c in ports)
    env = {**os.environ, "PYTHONPATH": code}
    procs = []
    for i, (port, http, cport) in enumerate(ports):
        nd = d / f"n{i + 1}"
        nd.mkdir(parents=True)
        conf = nd / "node.conf"
        conf.write_text(f'server_name: n{i + 1}\nlisten: "127.0.0.1:{port}"\n'
                        f'http: "127.0.0.1:{http}"\n'
                        f'jetstream {{ store_dir: {json.dumps(str(nd / "data"))} }}\n'
                        f'cluster {{ name: C1, listen: "127.0.0.1:{cport}", '
                        f'routes: [{routes}] }}\n')
        log = open(nd / "node.log", "ab")  # noqa: SIM115 - the child owns it
        procs.append(subprocess.Popen([sys.executable, "-m", "node.cli", "serve", "-c", str(conf)],
                                      stdout=log, stderr=subprocess.STDOUT, cwd=nd, env=env,
                                      start_new_session=True))
        log.close()
    return procs, [f"nats://127.0.0.1:{p}" for p, _, _ in ports]


async def _quiet(_exc: Exception) -> None:
    pass


async def create_stream(urls: list[str], timeout: float = 90.0) -> int:
    """Creates the R3 stream (retrying until the meta group answers); the index in `urls`
    of the stream leader's node."""
    deadline = time.monotonic() + timeout
    body = json.dumps({"name": "C", "subjects": ["c"], "num_replicas": 3,
                       "storage": "file"}).encode()
    while True:
        try:
            nc = await nats.connect(urls[0], connect_timeout=2, allow_reconnect=False,
                                    error_cb=_quiet)
            try:
                r = json.loads((await nc.request("$JS.API.STREAM.CREATE.C", body,
                                                 timeout=10)).data)
                if "error" in r and r["error"].get("err_code") != 10058:  # exists: retried
                    raise RuntimeError(r["error"])
                for _ in range(100):
                    info = json.loads((await nc.request("$JS.API.STREAM.INFO.C", b"",
                                                        timeout=5)).data)
                    leader = info.get("cluster", {}).get("leader")
                    if leader and len(info["cluster"].get("replicas", [])) == 2:
                        return int(leader.lstrip("n")) - 1
                    await asyncio.sleep(0.2)
            finally:
                await nc.close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def publish(url: str, msgs: int, rate: float, size: int, window: int = 64) -> float:
    """`msgs` acknowledged publishes; returns the seconds they took."""
    nc = await nats.connect(url, error_cb=_quiet)
    js = nc.jetstream(timeout=30)
    sem = asyncio.Semaphore(window)
    payload = os.urandom(size // 2 + 1).hex().encode()[:size]
    tasks: set[asyncio.Task[Any]] = set()

    async def one() -> None:
        try:
            await js.publish("c", payload)
        finally:
            sem.release()

    start = time.monotonic()
    for i in range(msgs):
        if rate:
            ahead = start + i / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        await sem.acquire()
        t = asyncio.ensure_future(one())
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    took = time.monotonic() - start
    await nc.close()
    return took


def snap_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.glob("n*/data/raft/snap/*.data"))


def run_one(label: str, code: str | None, args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="compbench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if code is None:
            procs, urls = nats_cluster(tmp, False)
        else:
            procs, urls = jetraft_cluster(tmp, code)
        leader = asyncio.run(create_stream(urls))
        if args.prefill:
            asyncio.run(publish(urls[leader], args.prefill, 0, args.size, window=256))
        load = os.getloadavg()[0]
        before = [cpu_s(p.pid) for p in procs]
        took = asyncio.run(publish(urls[leader], args.msgs, args.rate, args.size))
        after = [cpu_s(p.pid) for p in procs]
        used = [a - b for a, b in zip(after, before, strict=True)]
        return {"target": label, "msgs_per_s": args.msgs / took, "seconds": took,
                "cpu_pct": [100 * u / took for u in used],
                "us_per_msg": [1e6 * u / args.msgs for u in used], "leader": leader,
                "snap_bytes": snap_bytes(tmp) if code is not None else 0, "load1": load}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def table(runs: list[dict[str, Any]], up: tuple[str, str], args: argparse.Namespace) -> str:
    rows = [f"uptime before: {up[0]}", "", f"uptime after: {up[1]}", "",
            f"{args.prefill} messages prefilled, then {args.msgs} measured publishes of "
            f"{args.size} B to an R3 file stream, paced at "
            f"{args.rate or 'max'} msgs/s, one nats-py client on the leader's node. CPU per "
            "node: leader first. snap MB: raft/snap/*.data on all nodes at the end.", "",
            "| target | msgs/s | CPU % per node | CPU us/msg per node | sum us/msg | "
            "snap MB | load1 |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        order = [r["leader"]] + [i for i in range(3) if i != r["leader"]]
        pct = " / ".join(f"{r['cpu_pct'][i]:.1f}" for i in order)
        us = " / ".join(f"{r['us_per_msg'][i]:.0f}" for i in order)
        rows.append(f"| {r['target']} | {r['msgs_per_s']:,.0f} | {pct} | {us} | "
                    f"{sum(r['us_per_msg']):.0f} | {r['snap_bytes'] / 1e6:.2f} | "
                    f"{r['load1']:.2f} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--msgs", type=int, default=60000)
    p.add_argument("--rate", type=float, default=2000)
    p.add_argument("--prefill", type=int, default=0)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--code", default=f"jetraft={HERE}",
                   help="label=tree,... jetraft code trees to compare")
    p.add_argument("--no-nats", action="store_true")
    p.add_argument("--out", default=str(HERE / "benchmarks" / "results" /
                                        f"compaction-{time.strftime('%Y%m%d-%H%M')}.md"))
    args = p.parse_args()
    targets: list[tuple[str, str | None]] = [
        (lab, tree) for lab, tree in (x.split("=", 1) for x in args.code.split(","))]
    if not args.no_nats:
        targets.append(("nats-server", None))
    up0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    runs = []
    for _ in range(args.repeats):
        for label, code in targets:
            r = run_one(label, code, args)
            print(json.dumps(r), flush=True)
            runs.append(r)
    up1 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    md = table(runs, (up0, up1), args)
    Path(args.out).write_text(md)
    print(md)


if __name__ == "__main__":
    main()

"""Scale: many R3 streams on a 3-node jetraft cluster (issue 9 "Scale").

    PYTHONPATH=$PWD python benchmarks/cluster_scale.py [--streams 1000] [--parallel 16]
        [--idle 30] [--replicas 3] [--pyspy /tmp/idle.txt]

Starts 3 real nodes on loopback (node/cluster/local.py), creates `--streams` file streams
(`--parallel` creates in flight, spread over the three nodes), then reports:
  * the time to create them (and the p50/max of one create);
  * idle CPU per node, % of one core, over `--idle` seconds with no client traffic, read from
    /proc/<pid>/stat (utime + stime) before and after;
  * RSS per node (/proc/<pid>/status VmRSS) before and after, and the growth per stream.
Checks, before the idle window, that every stream answers STREAM.INFO with a leader.
Prints one JSON document and a markdown block with `uptime` next to the figures."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from node.cluster.local import LocalCluster  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


async def api(nc: Any, subject: str, body: dict[str, Any] | None = None,
              timeout: float = 20) -> dict[str, Any]:
    msg = await nc.request("$JS.API." + subject, json.dumps(body or {}).encode(),
                           timeout=timeout)
    return dict(json.loads(msg.data))


async def wait_meta(nc: Any, replicas: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            r = await api(nc, "STREAM.CREATE.PROBE", {"name": "PROBE", "subjects": ["probe"],
                                                      "num_replicas": replicas}, 5)
            if "error" not in r:
                await api(nc, "STREAM.DELETE.PROBE")
                return
        except Exception:  # noqa: BLE001 (the meta group is still forming)
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("no meta leader")
        await asyncio.sleep(0.5)


async def create_all(conns: list[Any], n: int, parallel: int, replicas: int
                     ) -> tuple[float, list[float], list[str]]:
    todo = list(range(n))
    times: list[float] = []
    errors: list[str] = []

    async def worker(w: int) -> None:
        nc = conns[w % len(conns)]
        while todo:
            i = todo.pop(0)
            name = f"S{i:05d}"
            cfg = {"name": name, "subjects": [f"s.{i}.>"], "num_replicas": replicas}
            for attempt in range(5):
                t = time.perf_counter()
                try:
                    r = await api(nc, f"STREAM.CREATE.{name}", cfg, 30)
                except Exception as exc:  # noqa: BLE001 (timeout: try again, same config)
                    r = {"error": {"description": repr(exc)}}
                if "error" not in r:
                    times.append(time.perf_counter() - t)
                    break
                if attempt == 4:
                    errors.append(f"{name}: {r['error']}")
                await asyncio.sleep(0.5)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(parallel)))
    return time.perf_counter() - t0, times, errors


async def check_leaders(conns: list[Any], n: int) -> int:
    """Streams whose STREAM.INFO (asked through rotating nodes) names a leader."""
    ok = 0
    for i in range(n):
        nc = conns[i % len(conns)]
        try:
            r = await api(nc, f"STREAM.INFO.S{i:05d}", None, 10)
            ok += bool(r.get("cluster", {}).get("leader"))
        except Exception:  # noqa: BLE001 (counted as missing)
            pass
    return ok


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="clscale-"))
    c = LocalCluster(tmp, 3, name="C1")
    out: dict[str, Any] = {"streams": args.streams, "replicas": args.replicas}
    try:
        c.start()
        pids = {nd.name: nd.proc.pid for nd in c.nodes if nd.proc}
        conns = [await nats.connect(nd.url) for nd in c.nodes]
        await wait_meta(conns[0], args.replicas)
        await asyncio.sleep(2)
        out["rss_before_mb"] = {k: round(rss_mb(p), 1) for k, p in pids.items()}
        a = {k: cpu_s(p) for k, p in pids.items()}
        await asyncio.sleep(args.idle0)
        out["idle_cpu_pct_empty"] = {k: round(100 * (cpu_s(p) - a[k]) / args.idle0, 1)
                                     for k, p in pids.items()}
        out["uptime_create"] = uptime()
        wall, times, errors = await create_all(conns, args.streams, args.parallel,
                                               args.replicas)
        out["create_s"] = round(wall, 1)
        out["create_per_s"] = round(len(times) / wall, 1)
        out["create_p50_ms"] = round(statistics.median(times) * 1000, 1) if times else None
        out["create_max_ms"] = round(max(times) * 1000, 1) if times else None
        out["create_errors"] = errors[:10]
        out["created"] = len(times)
        out["with_leader"] = await check_leaders(conns, args.streams)
        for nc in conns:
            await nc.close()
        await asyncio.sleep(args.settle)
        out["uptime_idle"] = uptime()
        a = {k: cpu_s(p) for k, p in pids.items()}
        t = time.monotonic()
        spy = None
        if args.pyspy:  # a profile of node 1 over the idle window (collapsed stacks)
            spy = subprocess.Popen(["py-spy", "record", "-p", str(pids["n1"]), "-d",
                                    str(int(args.idle)), "-r", "50", "-f", "raw", "-o",
                                    args.pyspy, "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(args.idle)
        if spy is not None:
            spy.wait()
        dt = time.monotonic() - t
        out["idle_cpu_pct"] = {k: round(100 * (cpu_s(p) - a[k]) / dt, 1) for k, p in pids.items()}
        out["uptime_after"] = uptime()
        out["rss_after_mb"] = {k: round(rss_mb(p), 1) for k, p in pids.items()}
        out["rss_per_stream_kb"] = {
            k: round((out["rss_after_mb"][k] - out["rss_before_mb"][k]) * 1024 / args.streams, 1)
            for k in pids}
        out["alive"] = {nd.name: nd.alive() for nd in c.nodes}
        out["errors_in_logs"] = {nd.name: nd.log_text().count("[ERR]") for nd in c.nodes}
    finally:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--parallel", type=int, default=16)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--idle0", type=float, default=5.0, help="idle window before creating")
    p.add_argument("--settle", type=float, default=5.0, help="pause after creating")
    p.add_argument("--idle", type=float, default=30.0)
    p.add_argument("--pyspy", default="", help="py-spy node 1 while idle, to this file")
    args = p.parse_args()
    out = asyncio.run(run(args))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

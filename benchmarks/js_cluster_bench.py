"""R3 JetStream publish through the leader and through a non-leader: a 3-node jetraft cluster
next to a 3-node nats-server cluster in the same run (ratios, never absolute goals).

    PYTHONPATH=. python benchmarks/js_cluster_bench.py [--async-n 5000] [--sync-n 300]

Async: `--window` publishes in flight (nats-py js.publish_async-style futures over requests);
sync: one publish at a time, p50 latency. nats-server runs with its default sync_interval and
with `sync_interval: always` (what jetraft always does)."""

from __future__ import annotations

import argparse
import asyncio
import json
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
from node.cluster.local import LocalCluster, free_port  # noqa: E402


def nats_cluster(d: Path, always: bool) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    ports = [free_port() for _ in range(3)]
    cports = [free_port() for _ in range(3)]
    routes = ",".join(f"nats-route://127.0.0.1:{p}" for p in cports)
    procs = []
    for i in range(3):
        conf = d / f"n{i}.conf"
        sync = ", sync_interval: always" if always else ""
        conf.write_text(f"server_name: n{i + 1}\nlisten: 127.0.0.1:{ports[i]}\n"
                        f"jetstream {{ store_dir: \"{d}/d{i}\"{sync} }}\n"
                        f"cluster {{ name: C1, listen: 127.0.0.1:{cports[i]}, "
                        f"routes: [{routes}] }}\n")
        procs.append(subprocess.Popen(["nats-server", "-c", str(conf)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs, [f"nats://127.0.0.1:{p}" for p in ports]


async def create(url: str, name: str) -> str:
    nc = await nats.connect(url)
    deadline = time.monotonic() + 60
    while True:
        try:
            msg = await nc.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(
                {"name": name, "subjects": [name.lower()], "num_replicas": 3}).encode(), timeout=5)
            r = json.loads(msg.data)
            if "error" not in r:
                await nc.close()
                return str(r["cluster"]["leader"])
        except Exception:  # noqa: BLE001 (cluster still forming)
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("no stream")
        await asyncio.sleep(0.5)


async def async_rate(url: str, subject: str, n: int, window: int) -> float:
    nc = await nats.connect(url)
    sem = asyncio.Semaphore(window)
    payload = b"x" * 128

    async def one() -> None:
        try:
            await nc.request(subject, payload, timeout=30)
        finally:
            sem.release()

    t = time.perf_counter()
    tasks = []
    for _ in range(n):
        await sem.acquire()
        tasks.append(asyncio.ensure_future(one()))
    await asyncio.gather(*tasks)
    rate = n / (time.perf_counter() - t)
    await nc.close()
    return rate


async def sync_p50(url: str, subject: str, n: int) -> tuple[float, float]:
    nc = await nats.connect(url)
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        await nc.request(subject, b"x" * 128, timeout=10)
        lat.append(time.perf_counter() - t)
    rate = n / (time.perf_counter() - t0)
    await nc.close()
    return rate, statistics.median(lat) * 1e6


async def measure(urls: list[str], names: list[str], args: Any, tag: str) -> dict[str, Any]:
    leader = await create(urls[0], "B" + tag)
    li = names.index(leader)
    other = (li + 1) % 3
    subj = "b" + tag.lower()
    out = {"async_leader": await async_rate(urls[li], subj, args.async_n, args.window),
           "async_nonleader": await async_rate(urls[other], subj, args.async_n, args.window)}
    out["sync_leader_rate"], out["sync_leader_p50_us"] = await sync_p50(urls[li], subj,
                                                                       args.sync_n)
    out["sync_nonleader_rate"], out["sync_nonleader_p50_us"] = await sync_p50(
        urls[other], subj, args.sync_n)
    return out


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--async-n", type=int, default=5000)
    p.add_argument("--window", type=int, default=500)
    p.add_argument("--sync-n", type=int, default=300)
    args = p.parse_args()
    results: dict[str, Any] = {}
    for always in (False, True):
        d = Path(tempfile.mkdtemp(prefix="jsbench"))
        procs, urls = nats_cluster(d, always)
        try:
            results["nats-always" if always else "nats-default"] = await measure(
                urls, ["n1", "n2", "n3"], args, "A" if always else "D")
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait()
            shutil.rmtree(d, ignore_errors=True)
    d = Path(tempfile.mkdtemp(prefix="jsbench"))
    c = LocalCluster(d, 3, name="C1")
    try:
        c.start()
        results["jetraft"] = await measure([n.url for n in c.nodes], [n.name for n in c.nodes],
                                           args, "J")
    finally:
        c.stop()
        shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(results, indent=2))
    j = results["jetraft"]
    for ref in ("nats-default", "nats-always"):
        r = results[ref]
        print(f"vs {ref}: async leader {j['async_leader'] / r['async_leader']:.2f}x, "
              f"async non-leader {j['async_nonleader'] / r['async_nonleader']:.2f}x, "
              f"sync p50 leader {j['sync_leader_p50_us'] / r['sync_leader_p50_us']:.2f}x "
              f"(latency ratio, lower is better)")


if __name__ == "__main__":
    asyncio.run(main())

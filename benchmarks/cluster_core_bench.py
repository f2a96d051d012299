"""Core NATS across two nodes of a 3-node cluster: Jetraft vs nats-server, same run.

    PYTHONPATH=$PWD python benchmarks/cluster_core_bench.py [n_msgs] [size]

Both clusters run on loopback (nats-server 2.15.1 from PATH; Jetraft via
node/cluster/local.py, core only). One nats-py publisher on node 1, one
subscriber on node 2: messages per second until the subscriber has all of
them; then request/reply from node 1 to a responder on node 3 (p50, p99).
The client is Python too, so on a small machine it bounds both sides: read
the ratio, not the absolute numbers. Not a test.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats

from node.cluster.local import LocalCluster, free_port


async def throughput(pub_url: str, sub_url: str, n: int, size: int) -> float:
    p = await nats.connect(pub_url)
    s = await nats.connect(sub_url)
    got = 0
    done = asyncio.Event()

    async def cb(m: object) -> None:
        nonlocal got
        got += 1
        if got == n:
            done.set()

    probe: list[int] = []

    async def on_probe(m: object) -> None:
        probe.append(1)

    await s.subscribe("bench", cb=cb, pending_msgs_limit=n * 2, pending_bytes_limit=n * size * 4)
    await s.subscribe("probe", cb=on_probe)
    await s.flush()
    while not probe:  # interest has crossed
        await p.publish("probe", b"")
        await p.flush()
        await asyncio.sleep(0.05)
    data = b"x" * size
    t0 = time.perf_counter()
    for i in range(n):
        await p.publish("bench", data)
        if i % 512 == 0:
            await asyncio.sleep(0)
    await p.flush()
    await asyncio.wait_for(done.wait(), 120)
    rate = n / (time.perf_counter() - t0)
    await p.close()
    await s.close()
    return rate


async def latency(req_url: str, svc_url: str, n: int = 2000) -> tuple[float, float]:
    r = await nats.connect(req_url)
    s = await nats.connect(svc_url)

    async def handler(m: nats.aio.msg.Msg) -> None:
        await m.respond(m.data)

    await s.subscribe("echo", cb=handler)
    await s.flush()
    while True:
        try:
            await r.request("echo", b"", timeout=0.5)
            break
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            await asyncio.sleep(0.05)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await r.request("echo", b"x" * 16, timeout=5)
        samples.append(time.perf_counter() - t0)
    samples.sort()
    await r.close()
    await s.close()
    return statistics.median(samples) * 1e6, samples[int(len(samples) * 0.99)] * 1e6


def nats_server_cluster(d: Path) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    ports = [(free_port(), free_port()) for _ in range(3)]
    routes = ", ".join(f'"nats-route://127.0.0.1:{c}"' for _, c in ports)
    procs, urls = [], []
    for i, (p, c) in enumerate(ports):
        conf = d / f"ns{i}.conf"
        conf.write_text(f"server_name: ns{i}\nlisten: 127.0.0.1:{p}\n"
                        f"cluster {{ name: b, listen: 127.0.0.1:{c}, routes: [{routes}] }}\n")
        procs.append(subprocess.Popen(["nats-server", "-c", str(conf)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"nats://127.0.0.1:{p}")
    time.sleep(2.0)
    return procs, urls


async def measure(urls: list[str], n: int, size: int) -> dict[str, float]:
    rate = await throughput(urls[0], urls[1], n, size)
    p50, p99 = await latency(urls[0], urls[2])
    return {"msgs_per_s": rate, "rr_p50_us": p50, "rr_p99_us": p99}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    d = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    procs, ns_urls = nats_server_cluster(d)
    ours = LocalCluster(d / "jetraft", 3, jetstream=False)
    try:
        ours.start()
        res = {"nats-server": asyncio.run(measure(ns_urls, n, size)),
               "jetraft": asyncio.run(measure([x.url for x in ours.nodes], n, size))}
    finally:
        ours.stop()
        for p in procs:
            p.terminate()
    print(f"{n} msgs of {size} B, publisher on node 1 -> subscriber on node 2; "
          "request/reply node 1 -> node 3")
    print(f"{'':12} {'msgs/s':>10} {'rr p50 us':>10} {'rr p99 us':>10}")
    for name, r in res.items():
        print(f"{name:12} {r['msgs_per_s']:>10,.0f} {r['rr_p50_us']:>10.0f} "
              f"{r['rr_p99_us']:>10.0f}")
    j, g = res["jetraft"], res["nats-server"]
    print(f"ratio jetraft/nats-server: throughput {j['msgs_per_s'] / g['msgs_per_s']:.2f}x, "
          f"rr p50 {g['rr_p50_us'] / j['rr_p50_us']:.2f}x (higher is better)")


if __name__ == "__main__":
    main()

"""JetStream side by side: jetraft vs nats-server (default) vs nats-server (`sync_interval:
always`), in ONE run, every server pinned to core SERVER_CPU (1) and the clients to CLIENT_CPU
(0).

    PYTHONPATH=$PWD python benchmarks/js_bench.py [TAG]

1. The shared harness (/work/shared/bench/bench.py, ANCHORBENCH_WORK with js/node_modules)
   with three targets: js_sync_r1 (nats-py), js_async_r1 (nats.js raw PUB, window 512),
   js_fetch_r1 (nats-py and nats.js). Targets interleave per repetition.
2. A KV mix (nats-py, one op in flight, 50 % put / 50 % get over 1,000 keys), interleaved
   per repetition too; server CPU per op from the pinned server's CPU time.

Writes benchmarks/results/js-<TAG>.json (harness JSON + kv runs) and js-<TAG>.md (tables and
ratios). Knobs: DURATION (5) REPEATS (3) PREFILL (50000) BENCH_DIR ANCHORBENCH_WORK
SCENARIOS (js_sync_r1,js_async_r1,js_fetch_r1) KV=0 to skip the KV mix; JETRAFT_BASE=<dir of
another checkout> adds it as the target `jetraft-base` (before/after in one run).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jsbench_servers import CLIENT_CPU, Servers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH_DIR = os.environ.get("BENCH_DIR", "/work/shared/bench")
WORK = os.environ.get("ANCHORBENCH_WORK", "/tmp/perfbench")
DURATION = float(os.environ.get("DURATION", "5"))
REPEATS = int(os.environ.get("REPEATS", "3"))
PREFILL = int(os.environ.get("PREFILL", "50000"))
SCENARIOS = os.environ.get("SCENARIOS", "js_sync_r1,js_async_r1,js_fetch_r1")


def run_harness(srv: Servers, out_json: str) -> dict[str, Any]:
    targets: list[str] = []
    for label, s in srv.by_label.items():
        targets += ["--target", f"{label}={s.url}", "--server-pid", f"{label}={s.pid}"]
    cmd = ["taskset", "-c", CLIENT_CPU, sys.executable, os.path.join(BENCH_DIR, "bench.py"),
           *targets, "--scenarios", SCENARIOS, "--client", "py,js",
           "--duration", str(DURATION), "--repeats", str(REPEATS), "--prefill", str(PREFILL),
           "--js-dir", os.path.join(WORK, "js"), "--json", out_json]
    subprocess.run(cmd, check=True)
    with open(out_json) as f:
        return json.load(f)


async def kv_run(url: str, pid: int, seconds: float) -> dict[str, Any]:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream(timeout=10)
    bucket = f"B{random.randrange(1 << 30)}"
    kv = await js.create_key_value(bucket=bucket, history=1)
    keys = [f"k{i}" for i in range(1000)]
    value = b"v" * 128
    for k in keys[:100]:
        await kv.put(k, value)  # warm-up and something to read
    written = set(keys[:100])
    proc = psutil.Process(pid)
    put_lat: list[float] = []
    get_lat: list[float] = []
    rng = random.Random(1)
    cpu0 = sum(proc.cpu_times()[:2])
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        k = rng.choice(keys)
        s = time.perf_counter()
        if rng.random() < 0.5 or k not in written:
            await kv.put(k, value)
            written.add(k)
            put_lat.append(time.perf_counter() - s)
        else:
            await kv.get(k)
            get_lat.append(time.perf_counter() - s)
    elapsed = time.perf_counter() - t0
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    ops = len(put_lat) + len(get_lat)
    await js.delete_key_value(bucket)
    await nc.close()
    put_lat.sort()
    get_lat.sort()

    def pct(v: list[float], p: float) -> float:
        return round(v[int(p * (len(v) - 1))] * 1e6, 1) if v else 0.0

    return {"ops": ops, "ops_per_s": ops / elapsed, "puts": len(put_lat), "gets": len(get_lat),
            "put_p50_us": pct(put_lat, 0.5), "put_p99_us": pct(put_lat, 0.99),
            "get_p50_us": pct(get_lat, 0.5), "get_p99_us": pct(get_lat, 0.99),
            "srv_us_per_op": cpu / ops * 1e6, "srv_cpu_pct": cpu / elapsed * 100}


def run_kv(srv: Servers) -> dict[str, list[dict[str, Any]]]:
    os.sched_setaffinity(0, {int(CLIENT_CPU)})
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in srv.by_label}
    for _ in range(REPEATS):
        for label, s in srv.by_label.items():
            r = asyncio.run(kv_run(s.url, s.pid, DURATION))
            print(f"kv {label}: {r['ops_per_s']:.0f} ops/s put p50 {r['put_p50_us']} us "
                  f"get p50 {r['get_p50_us']} us srv {r['srv_us_per_op']:.0f} us/op",
                  file=sys.stderr)
            runs[label].append(r)
    return runs


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs) if runs else 0.0


def markdown(harness: dict[str, Any] | None, kv: dict[str, list[dict[str, Any]]] | None,
             tag: str) -> str:
    lines = [f"# JetStream side by side, {tag}", "",
             (f"Servers pinned to CPU {os.environ.get('SERVER_CPU', '1')}"
              if os.environ.get("SERVER_CPU", "1") else "Servers not pinned")
             + f", clients on CPU {CLIENT_CPU}; {REPEATS} x {DURATION:g} s; 128 B; load "
             f"{os.getloadavg()[0]:.1f} at the end.", ""]
    if harness:
        rows: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        for s in harness.get("summary", []):
            rows.setdefault((s["scenario"], s["client"]), {})[s["target"]] = s
        lines += ["| scenario | client | target | rate/s (median) | p50/p99 us | srv us/op | "
                  "cli/srv/oth % | jetraft / target |", "|---|---|---|---|---|---|---|---|"]
        def m(s: dict[str, Any], key: str) -> float:
            v = s.get(key)
            return float(v["median"]) if isinstance(v, dict) else 0.0

        for (scen, client), by_t in rows.items():
            mine = by_t.get("jetraft")
            for target, s in by_t.items():
                rate = m(s, s["primary"])
                ratio = ""
                if mine and target != "jetraft" and rate:
                    ratio = f"{m(mine, mine['primary']) / rate:.2f}x"
                lat = (f"{m(s, 'lat_p50_us'):.0f}/{m(s, 'lat_p99_us'):.0f}"
                       if "lat_p50_us" in s else "")
                lines.append(
                    f"| {scen} | {client} | {target} | {rate:,.0f} | {lat} | "
                    f"{m(s, 'server_cpu_us_per_op'):.1f} | {m(s, 'client_cpu_pct'):.0f}/"
                    f"{m(s, 'server_cpu_pct'):.0f}/{m(s, 'other_cpu_pct'):.0f} | {ratio} |")
    if kv:
        lines += ["", "KV mix (nats-py, 1 in flight, 50 % put / 50 % get, 1,000 keys):", "",
                  "| target | ops/s | put p50/p99 us | get p50/p99 us | srv us/op "
                  "| jetraft / target |", "|---|---|---|---|---|---|"]
        mine = med(kv.get("jetraft", []), "ops_per_s")
        for label, runs in kv.items():
            ratio = f"{mine / med(runs, 'ops_per_s'):.2f}x" if label != "jetraft" else ""
            lines.append(
                f"| {label} | {med(runs, 'ops_per_s'):,.0f} | {med(runs, 'put_p50_us'):.0f}/"
                f"{med(runs, 'put_p99_us'):.0f} | {med(runs, 'get_p50_us'):.0f}/"
                f"{med(runs, 'get_p99_us'):.0f} | {med(runs, 'srv_us_per_op'):.0f} | {ratio} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    tag = sys.argv[1] if len(sys.argv) > 1 else time.strftime("%Y%m%d-%H%M%S")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    base = os.path.join(HERE, "results", f"js-{tag}")
    harness = kv = None
    kinds = ("jetraft", "ref", "ref-always")
    if os.environ.get("JETRAFT_BASE"):
        kinds = ("jetraft", "jetraft-base", "ref", "ref-always")
    with Servers(kinds) as srv:
        print({k: (v.url, v.pid) for k, v in srv.by_label.items()}, file=sys.stderr)
        if SCENARIOS:
            harness = run_harness(srv, base + ".harness.json")
        if os.environ.get("KV", "1") == "1":
            kv = run_kv(srv)
    with open(base + ".json", "w") as f:
        json.dump({"tag": tag, "harness": harness, "kv": kv}, f, indent=1)
    if os.path.exists(base + ".harness.json"):
        os.unlink(base + ".harness.json")
    md = markdown(harness, kv, tag)
    with open(base + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()

"""R3 JetStream side by side: a 3-node jetraft cluster, a 3-node nats-server cluster at its
default and one with `sync_interval: always`, measured by the shared harness
(/work/shared/bench/bench.py) in ONE invocation, so the three targets take turns in every
repetition and share the machine's conditions.

    PYTHONPATH=$PWD python benchmarks/js_cluster_bench.py [--duration 5] [--repeats 2]
        [--client py,js] [--prefill 20000] [--scenarios ...] [--out benchmarks/results/X]

Scenarios (bench.py's): sync and async publish R3 to the leader and through a non-leader,
fetch+ack R3. Every cluster runs on free loopback ports in its own temporary store (the
harness's servers.sh uses fixed ports that other users of this machine may hold). The
harness reads each server's CPU (psutil, /proc/<pid>/stat) before and after each timed
window; this script turns that into CPU microseconds per message for EACH node, and prints
ratios jetraft / nats-server with the load average next to them. Writes <out>.json (bench.py's
raw runs) and <out>.md (the ratio table).

`--base DIR` adds a fourth target, `jetraft-base`: the same 3-node cluster run from another
source tree (e.g. `git archive` of main unpacked in DIR), so that old and new code take turns
in every repetition of ONE run (A/B under the same machine load)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from node.cluster.local import LocalCluster, free_port  # noqa: E402

HARNESS = Path(os.environ.get("ANCHORBENCH_DIR", "/work/shared/bench"))
SCENARIOS = ("js_sync_r3_leader,js_sync_r3_nonleader,js_async_r3_leader,"
             "js_async_r3_nonleader,js_fetch_r3")
JS_DIRS = (os.environ.get("ANCHORBENCH_JS_DIR", ""), str(Path(__file__).resolve().parents[1] /
           "tests/js"), "/work/main/tests/js")


def nats_cluster(d: Path, always: bool) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    """Three nats-server processes routed to each other (the harness's cluster configs,
    on free ports)."""
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


def wait_js_meta(urls: list[str], timeout: float = 60.0) -> None:
    """Until a 1-replica probe stream can be created and deleted (the meta group has a
    leader); nats-server's /healthz needs a monitor port we do not open."""
    import asyncio

    import nats

    async def _quiet(_exc: Exception) -> None:
        pass

    async def probe() -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                nc = await nats.connect(urls[0], connect_timeout=2, allow_reconnect=False,
                                        error_cb=_quiet)
                try:
                    r = json.loads((await nc.request(
                        "$JS.API.STREAM.CREATE.PROBE", b'{"name":"PROBE","subjects":["probe.x"],'
                        b'"num_replicas":3}', timeout=5)).data)
                    if "error" not in r:
                        await nc.request("$JS.API.STREAM.DELETE.PROBE", b"", timeout=5)
                        return
                finally:
                    await nc.close()
            except Exception:  # noqa: BLE001 (cluster still forming)
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("no JetStream meta leader")
            await asyncio.sleep(0.5)

    asyncio.run(probe())


def js_dir() -> str:
    for d in JS_DIRS:
        if d and (Path(d) / "node_modules/@nats-io/jetstream").is_dir():
            return d
    return ""


def per_node_us(run: dict[str, Any], primary: str) -> dict[str, float]:
    rate = run.get(primary) or 0
    by_node = run.get("server_cpu_pct_by_node") or {}
    return {n: round(p / 100.0 / rate * 1e6, 1) for n, p in by_node.items()} if rate else {}


def med(vals: list[float]) -> float:
    vals = sorted(vals)
    return vals[len(vals) // 2] if vals else float("nan")


def _ratio(fig: dict[str, float], ref: str, sync: bool) -> str:
    if not fig[ref] or fig[ref] != fig[ref]:
        return "-"
    return f"{fig['jetraft'] / fig[ref]:.2f}x" + (" (latency)" if sync else "")


def _node_cpu(runs: list[dict[str, Any]]) -> str:
    per: dict[str, list[float]] = {}
    for r in runs:
        for n, us in per_node_us(r, "msgs_per_s").items():
            per.setdefault(n, []).append(us)
    return " ".join(f"{n}:{med(v):.0f}" for n, v in sorted(per.items()))


def report(raw: dict[str, Any], load: dict[str, str]) -> str:
    """Markdown: per scenario/client the median figure of each target, ratios to both
    nats-server targets, and the CPU us/msg per node (median over repetitions)."""
    rows = ["| scenario | client | jetraft | nats default | nats always | vs default | "
            "vs always | jetraft CPU us/msg per node | nats always us/msg per node | load |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    keys: list[tuple[str, str]] = []
    for r in raw["runs"]:
        if (r["scenario"], r["client"]) not in keys:
            keys.append((r["scenario"], r["client"]))
    for sc, client in keys:
        runs = {t: [r for r in raw["runs"] if (r["scenario"], r["client"], r["target"]) ==
                    (sc, client, t) and "error" not in r]
                for t in ("jetraft", "nats", "nats-always")}
        sync = sc.startswith("js_sync")
        primary = "lat_p50_us" if sync else "msgs_per_s"
        base = [r for r in raw["runs"] if (r["scenario"], r["client"], r["target"]) ==
                (sc, client, "jetraft-base") and "error" not in r]
        for label, jruns in (("", runs["jetraft"]), (" (base)", base)):
            if not jruns:
                continue
            fig = {t: med([r[primary] for r in rs if r.get(primary)])
                   for t, rs in {**runs, "jetraft": jruns}.items()}
            cells = [f"{fig[t]:,.0f} us p50" if sync else f"{fig[t]:,.0f}/s"
                     for t in ("jetraft", "nats", "nats-always")]
            loads = sorted({str(r.get("loadavg1_start")) for rs in (*runs.values(), jruns)
                            for r in rs})
            rows.append(f"| {sc}{label} | {client} | {' | '.join(cells)} | "
                        f"{_ratio(fig, 'nats', sync)} | {_ratio(fig, 'nats-always', sync)} | "
                        f"{_node_cpu(jruns)} | {_node_cpu(runs['nats-always'])} | "
                        f"{','.join(loads)} |")
    head = (f"uptime before: {load['before']}\n\nuptime after: {load['after']}\n\n"
            "Sync rows: PubAck p50 latency (ratio > 1 = jetraft slower). Other rows: msgs/s "
            "(ratio < 1 = jetraft slower). CPU us/msg: each server process's CPU time in the "
            "timed window / messages. `load` = 1-min load average at each run's start.\n\n")
    return head + "\n".join(rows) + "\n"


def start_from(cluster: LocalCluster, tree: str) -> None:
    """Start `cluster`'s nodes with `tree` (a source tree) first on their module path; this
    tree when empty. LocalCluster puts its own REPO_ROOT there: swapped for the start only."""
    if not tree:
        cluster.start()
        return
    import node.cluster.local as local

    saved = local.REPO_ROOT
    local.REPO_ROOT = str(Path(tree).resolve())
    try:
        cluster.start()
    finally:
        local.REPO_ROOT = saved


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--duration", type=float, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--client", default="py,js")
    p.add_argument("--prefill", type=int, default=20000)
    p.add_argument("--scenarios", default=SCENARIOS)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" /
                                        f"cluster-{time.strftime('%Y%m%d-%H%M')}"))
    p.add_argument("--targets", default="jetraft,nats,nats-always")
    p.add_argument("--base", default="", help="another jetraft source tree, run as target "
                   "jetraft-base beside this one (A/B in the same run)")
    args = p.parse_args()
    want = args.targets.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="clbench-"))
    procs: list[subprocess.Popen[bytes]] = []
    jet = LocalCluster(tmp / "jetraft", 3, name="C1")
    base = LocalCluster(tmp / "jetraft-base", 3, name="C1")
    targets, pids = [], []
    try:
        for label, cluster, tree in (("jetraft", jet, ""), ("jetraft-base", base, args.base)):
            if label not in want and not (label == "jetraft-base" and tree):
                continue
            start_from(cluster, tree)
            urls = [n.url for n in cluster.nodes]
            wait_js_meta(urls)
            targets.append(f"{label}=" + ",".join(urls))
            pids.append(f"{label}=" + ",".join(str(n.proc.pid) for n in cluster.nodes if n.proc))
        for label, always in (("nats", False), ("nats-always", True)):
            if label not in want:
                continue
            d = tmp / label
            d.mkdir()
            ps, urls = nats_cluster(d, always)
            procs += ps
            wait_js_meta(urls)
            targets.append(f"{label}=" + ",".join(urls))
            pids.append(f"{label}=" + ",".join(str(x.pid) for x in ps))
        cmd = [sys.executable, str(HARNESS / "bench.py"), "--scenarios", args.scenarios,
               "--client", args.client, "--duration", str(args.duration),
               "--repeats", str(args.repeats), "--prefill", str(args.prefill),
               "--json", args.out + ".json"]
        for t in targets:
            cmd += ["--target", t]
        for x in pids:
            cmd += ["--server-pid", x]
        jsd = js_dir()
        if jsd:
            cmd += ["--js-dir", jsd]
        elif "js" in args.client:
            raise SystemExit("no nats.js node_modules found (set ANCHORBENCH_JS_DIR)")
        before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        subprocess.run(cmd, check=False)
        after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    finally:
        jet.stop()
        base.stop()
        for x in procs:
            x.terminate()
        for x in procs:
            x.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    raw = json.loads(Path(args.out + ".json").read_text())
    md = report(raw, {"before": before, "after": after})
    Path(args.out + ".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()

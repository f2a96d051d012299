"""fsyncs per acknowledged JetStream message: jetraft vs nats-server (default, and
`sync_interval: always`).

    PYTHONPATH=$PWD python benchmarks/js_fsyncs.py [TAG]

For each server: create an R1 file stream, warm up, then attach `strace -c -f` (all threads;
fsync, fdatasync, msync, sync_file_range) for one phase at a time: SYNC_N publishes with one
PubAck in flight (nats-py), then ASYNC_N publishes with up to 256 in flight (raw PUB with a
reply inbox, as the shared harness does). Counts / acked messages = fsyncs per ack. strace
slows the server, so this is a count, not a speed figure. Writes
benchmarks/results/fsyncs-<TAG>.md and .json.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jsbench_servers import Servers  # noqa: E402

BENCH_DIR = os.environ.get("BENCH_DIR", "/work/shared/bench")
sys.path.insert(0, BENCH_DIR)
from bench import py_async_publish  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SYNC_N = int(os.environ.get("SYNC_N", "500"))
ASYNC_N = int(os.environ.get("ASYNC_N", "5000"))
CALLS = "fsync,fdatasync,msync,sync_file_range"


async def _prepare(url: str) -> None:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream(timeout=10)
    await js.add_stream(name="F", subjects=["f.>"])
    for _ in range(100):
        await js.publish("f.x", b"w" * 128)
    await nc.close()


async def _phase(url: str, mode: str) -> int:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream(timeout=10)
    acked = 0
    if mode == "sync":
        for _ in range(SYNC_N):
            await js.publish("f.x", b"s" * 128)
            acked += 1
    else:
        r = await py_async_publish(nc, "f.x", b"a" * 128, 256, None, ASYNC_N, None)
        acked = r["acked"] - r["errors"]
    await nc.close()
    return acked


def _count(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
            if m and m.group(2) in CALLS.split(","):
                out[m.group(2)] = int(m.group(1))
    return out


def measure(srv: Servers, label: str, tmp: str) -> dict[str, dict[str, object]]:
    s = srv.by_label[label]
    asyncio.run(_prepare(s.url))
    res: dict[str, dict[str, object]] = {}
    for mode in ("sync", "async"):
        out = os.path.join(tmp, f"{label}-{mode}.strace")
        st = subprocess.Popen(["strace", "-c", "-f", "-e", f"trace={CALLS}", "-o", out,
                               "-p", str(s.pid)], stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached to every thread
        acked = asyncio.run(_phase(s.url, mode))
        time.sleep(0.5)  # a sync point that was due lands inside the window
        st.send_signal(signal.SIGINT)
        st.wait()
        counts = _count(out)
        total = sum(counts.values())
        res[mode] = {"acked": acked, "calls": counts, "per_ack": round(total / max(acked, 1), 3)}
    return res


def main() -> None:
    tag = sys.argv[1] if len(sys.argv) > 1 else time.strftime("%Y%m%d-%H%M%S")
    results = {}
    kinds: tuple[str, ...] = ("jetraft", "ref", "ref-always")
    if os.environ.get("JETRAFT_BASE"):  # an older checkout as a 4th server
        kinds = ("jetraft", "jetraft-base", "ref", "ref-always")
    with Servers(kinds, pin=False) as srv:
        for label in srv.by_label:
            results[label] = measure(srv, label, srv.tmp)
            print(label, json.dumps(results[label]), file=sys.stderr)
    base = os.path.join(HERE, "results", f"fsyncs-{tag}")
    with open(base + ".json", "w") as f:
        json.dump(results, f, indent=1)
    lines = [f"# fsyncs per acknowledged message, {tag}", "",
             f"R1 file stream, 128 B; sync = {SYNC_N} publishes, 1 in flight; async = {ASYNC_N}"
             " publishes, 256 in flight. strace -c -f over each phase "
             f"({CALLS}).", "",
             "| server | sync: fsyncs/ack | calls | async: fsyncs/ack | calls |",
             "|---|---|---|---|---|"]
    for label, r in results.items():
        lines.append(f"| {label} | {r['sync']['per_ack']} | {r['sync']['calls']} | "
                     f"{r['async']['per_ack']} | {r['async']['calls']} |")
    md = "\n".join(lines) + "\n"
    with open(base + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()

"""Memory while a stream grows: publish into one R1 file stream until it holds GB gigabytes,
sampling the server's memory (RSS split into anonymous and file-backed pages, /proc status)
against the stream's size. "Flat" means the anonymous part (heap: Python objects, buffers,
LMDB's dirty pages) does not grow with the stream; file-backed pages are LMDB's map (page
cache the kernel can drop at will), reported apart.

    PYTHONPATH=$PWD python benchmarks/js_memgrow.py [TAG]

Knobs: GB (10) SIZE (payload bytes, 65536) WINDOW (PubAcks in flight, 64) EVERY (sample
period s, 2) TARGETS (jetraft; e.g. "jetraft,ref-always" adds nats-server for comparison,
one after the other) MAX_S (stop anyway after this many seconds, 900). The stores are
temporary directories deleted at the end (KEEP_STORES=1 keeps them). Writes
benchmarks/results/memgrow-<TAG>.json and .md.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jsbench_servers import CLIENT_CPU, Servers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
GB = float(os.environ.get("GB", "10"))
SIZE = int(os.environ.get("SIZE", "65536"))
WINDOW = int(os.environ.get("WINDOW", "64"))
EVERY = float(os.environ.get("EVERY", "2"))
MAX_S = float(os.environ.get("MAX_S", "900"))
TARGETS = os.environ.get("TARGETS", "jetraft").split(",")


def mem(pid: int) -> dict[str, int]:
    """KiB from /proc/<pid>/status: RssAnon (heap), RssFile (mapped file pages), VmHWM."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(rest.split()[0])
    return out


def mdb_rss(pid: int) -> int:
    """KiB of LMDB's map (data.mdb) resident in the process: part of RssFile."""
    total, inside = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if not line[0].isupper() or ":" not in line.split()[0]:
                    inside = line.rstrip().endswith("data.mdb")
                elif inside and line.startswith("Rss:"):
                    total += int(line.split()[1])
    except OSError:
        return 0
    return total


def du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


async def grow(url: str, pid: int, store: str) -> list[dict[str, Any]]:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream(timeout=30)
    await js.add_stream(name="GROW", subjects=["grow.>"])
    target = int(GB * (1 << 30))
    payload = os.urandom(SIZE)  # incompressible: nothing may shrink it on disk
    sem = asyncio.Semaphore(WINDOW)
    acked = [0, 0]  # acks, errors

    async def on_ack(msg: Any) -> None:
        acked[0 if b'"error"' not in msg.data else 1] += 1
        sem.release()

    inbox = nc.new_inbox()
    await nc.subscribe(inbox + ".*", cb=on_ack)
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    next_sample = t0
    sent = 0
    while True:
        now = time.monotonic()
        if now >= next_sample:
            info = await js.stream_info("GROW")
            s = {"t": round(now - t0, 1), "stream_bytes": info.state.bytes,
                 "msgs": info.state.messages, "acked": acked[0], "errors": acked[1],
                 "disk_bytes": du(store), "RssMdb": mdb_rss(pid), **mem(pid)}
            samples.append(s)
            print(json.dumps(s), file=sys.stderr)
            next_sample = now + EVERY
            if info.state.bytes >= target or now - t0 > MAX_S:
                break
        await sem.acquire()
        sent += 1
        await nc.publish(f"grow.{sent % 100}", payload, reply=f"{inbox}.{sent}")
    await nc.flush()
    await nc.close()
    return samples


def summary(label: str, samples: list[dict[str, Any]]) -> list[str]:
    first = next((s for s in samples if s["stream_bytes"] >= (64 << 20)), samples[0])
    last = samples[-1]
    gb = last["stream_bytes"] / (1 << 30)
    secs = last["t"] or 1
    rows = [f"### {label}: {gb:.2f} GB in {secs:.0f} s ({gb * 1024 / secs:.0f} MB/s, "
            f"{last['msgs'] / secs:,.0f} msgs/s), errors {last['errors']}", "",
            f"RssAnon {first['RssAnon'] / 1024:.0f} MiB at {first['stream_bytes'] >> 20} MiB "
            f"-> {last['RssAnon'] / 1024:.0f} MiB at {last['stream_bytes'] >> 20} MiB; "
            f"max RSS (VmHWM) {last['VmHWM'] / 1024:.0f} MiB; disk {last['disk_bytes'] >> 20} MiB",
            "", "| t s | stream MiB | disk MiB | RssAnon MiB | RssFile MiB (data.mdb) "
            "| VmRSS MiB |",
            "|---|---|---|---|---|---|"]
    step = max(1, len(samples) // 20)
    for s in samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else []):
        rows.append(f"| {s['t']:.0f} | {s['stream_bytes'] >> 20} | {s['disk_bytes'] >> 20} | "
                    f"{s['RssAnon'] / 1024:.0f} | {s['RssFile'] / 1024:.0f} "
                    f"({s.get('RssMdb', 0) / 1024:.0f}) | "
                    f"{s['VmRSS'] / 1024:.0f} |")
    return rows + [""]


def main() -> None:
    tag = sys.argv[1] if len(sys.argv) > 1 else time.strftime("%Y%m%d-%H%M%S")
    os.sched_setaffinity(0, {int(CLIENT_CPU)})
    results: dict[str, list[dict[str, Any]]] = {}
    for label in TARGETS:
        with Servers((label,)) as srv:
            s = srv.by_label[label]
            results[label] = asyncio.run(grow(s.url, s.pid, s.store))
    base = os.path.join(HERE, "results", f"memgrow-{tag}")
    with open(base + ".json", "w") as f:
        json.dump({"tag": tag, "gb": GB, "size": SIZE, "window": WINDOW, "runs": results}, f)
    lines = [f"# Memory while a stream grows, {tag}", "",
             f"R1 file stream, {SIZE} B payloads, {WINDOW} PubAcks in flight, load "
             f"{os.getloadavg()[0]:.1f} at the end (`uptime`).", ""]
    for label, samples in results.items():
        lines += summary(label, samples)
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""The cost of encryption at rest: sync publish R1 (nats-py, one publish in flight, 128 B),
jetraft plain / chacha / aes, and nats-server (`sync_interval: always`) plain / chacha, in ONE
run, interleaved per repetition so load drift hits every target alike.

    PYTHONPATH=$PWD python benchmarks/crypt_bench.py

Prints a table (msgs/s, p50 and p99 latency, server CPU per message) and the ratios
encrypted / plain per server. Knobs: DURATION (4 s per run) REPEATS (3) PAYLOAD (128).
Note `uptime` next to the figures: the machine is shared.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

DURATION = float(os.environ.get("DURATION", "4"))
REPEATS = int(os.environ.get("REPEATS", "3"))
PAYLOAD = b"x" * int(os.environ.get("PAYLOAD", "128"))
KEY = "bench-key-7d1e6a0c93b24f58a1e0c7d9b3f2a6e4"
TARGETS = {
    "jetraft": ("jetraft", None),
    "jetraft-chacha": ("jetraft", "chacha"),
    "jetraft-aes": ("jetraft", "aes"),
    "nats-always": ("nats-server", None),
    "nats-always-chacha": ("nats-server", "chacha"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(kind: str, cipher: str | None, work: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    store = os.path.join(work, f"{kind}-{cipher or 'plain'}")
    js = [f"store_dir: {store!r}".replace("'", '"')]
    if kind == "nats-server":
        js.append("sync_interval: always")
    if cipher:
        js += [f'key: "{KEY}"', f"cipher: {cipher}"]
    conf = os.path.join(work, f"{kind}-{cipher or 'plain'}.conf")
    with open(conf, "w") as f:
        f.write(f"listen: 127.0.0.1:{port}\njetstream {{ {', '.join(js)} }}\n")
    cmd = (["nats-server", "-c", conf] if kind == "nats-server"
           else [sys.executable, "-m", "node.cli", "serve", "-c", conf])
    log = open(conf + ".log", "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{kind} {cipher} did not start: see {conf}.log")


async def run_once(port: int, pid: int, stream: str) -> dict[str, float]:
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    try:
        await js.stream_info(stream)
    except Exception:  # noqa: BLE001 - not there yet
        await js.add_stream(name=stream, subjects=[stream.lower() + ".>"])
    subject = stream.lower() + ".x"
    for _ in range(200):  # warm up
        await js.publish(subject, PAYLOAD)
    proc = psutil.Process(pid)
    cpu0 = sum(proc.cpu_times()[:2])
    lat: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < DURATION:
        s = time.perf_counter()
        await js.publish(subject, PAYLOAD)
        lat.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    await nc.close()
    lat.sort()
    return {"rate": len(lat) / wall, "p50_us": lat[len(lat) // 2] * 1e6,
            "p99_us": lat[int(len(lat) * 0.99)] * 1e6, "cpu_us_per_msg": cpu / len(lat) * 1e6}


def micro() -> str:
    """CPU of the crypto alone, per 128 B record: what a publish adds (two seals: the WAL
    entry and the LMDB record; a read adds one open)."""
    from node.jetstream import crypt

    out = []
    for cipher in ("chacha", "aes"):
        d = tempfile.mkdtemp(prefix="crypt-micro-")
        sc = crypt.open_store(d, KEY, cipher)
        assert sc is not None
        n = 20000
        t = time.process_time()
        blobs = [sc.lmdb.seal(PAYLOAD, b"aad") for _ in range(n)]
        seal = (time.process_time() - t) / n * 1e6
        t = time.process_time()
        for b in blobs:
            sc.lmdb.open(b, b"aad")
        opened = (time.process_time() - t) / n * 1e6
        shutil.rmtree(d, ignore_errors=True)
        out.append(f"- {cipher}: seal {seal:.1f} us, open {opened:.1f} us per {len(PAYLOAD)} B "
                   "record (CPU time, this process)")
    return "\n".join(out)


def edge() -> str:
    """CPU at the storage edge per 128 B publish, plain vs sealed: one WAL append and one
    LMDB record store (in batches of 500, as applies run), process CPU time."""
    from node.jetstream import crypt
    from node.jetstream.store.base import StoredMsg
    from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv
    from raft.storage import NodeLog
    from raft.types import Entry

    best: dict[str, float] = {}
    n = 10000
    for cipher in (None, "chacha", "aes") * 5:  # interleaved; the least disturbed run counts
        d = tempfile.mkdtemp(prefix="crypt-edge-")
        sc = crypt.open_store(d, KEY, cipher) if cipher else None
        wal = NodeLog(os.path.join(d, "wal"), sealer=sc and sc.wal)
        env = NodeEnv(os.path.join(d, "lmdb"), sync=False, sealer=sc and sc.lmdb,
                      files=sc and sc.files, tokens=sc and sc.tokens)
        store = LmdbStore(env, "S")
        t = time.process_time()
        for lo in range(1, n + 1, 500):
            wal.append("g", [Entry(1, i, data=PAYLOAD) for i in range(lo, lo + 500)])
            with store.batch():
                for i in range(lo, lo + 500):
                    store.store(StoredMsg(i, f"s.{i % 100}", b"", PAYLOAD, i))
        cpu = (time.process_time() - t) / n * 1e6
        wal.close()
        env.close()
        shutil.rmtree(d, ignore_errors=True)
        name = cipher or "plain"
        best[name] = min(best.get(name, cpu), cpu)
    return "\n".join(f"- storage edge, {name}: {cpu:.1f} us CPU per publish (WAL append + "
                     "LMDB store, no fsync; best of 5)" for name, cpu in best.items())


def main() -> None:
    print(micro(), flush=True)
    print(edge(), flush=True)
    work = tempfile.mkdtemp(prefix="crypt-bench-")
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    results: dict[str, list[dict[str, float]]] = {label: [] for label in TARGETS}
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    try:
        for label, (kind, cipher) in TARGETS.items():
            procs[label] = start(kind, cipher, work)
        for rep in range(REPEATS):
            for label in TARGETS:
                proc, port = procs[label]
                r = asyncio.run(run_once(port, proc.pid, "B"))
                results[label].append(r)
                print(f"rep {rep} {label:20s} {r['rate']:8.0f}/s p50 {r['p50_us']:6.0f} us "
                      f"cpu {r['cpu_us_per_msg']:6.0f} us/msg", flush=True)
    finally:
        for proc, _ in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(table(results))


def table(results: dict[str, list[dict[str, float]]]) -> str:
    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in results[label])

    lines = ["| target | msgs/s | p50 us | p99 us | server CPU us/msg |", "|---|---|---|---|---|"]
    for label in results:
        lines.append(f"| {label} | {med(label, 'rate'):.0f} | {med(label, 'p50_us'):.0f} | "
                     f"{med(label, 'p99_us'):.0f} | {med(label, 'cpu_us_per_msg'):.0f} |")
    ratios: list[Any] = [
        ("jetraft-chacha / jetraft", "jetraft-chacha", "jetraft"),
        ("jetraft-aes / jetraft", "jetraft-aes", "jetraft"),
        ("nats-always-chacha / nats-always", "nats-always-chacha", "nats-always"),
        ("jetraft-chacha / nats-always-chacha", "jetraft-chacha", "nats-always-chacha"),
    ]
    lines.append("")
    for name, a, b in ratios:
        lines.append(f"- {name}: rate {med(a, 'rate') / med(b, 'rate'):.2f}x, p50 "
                     f"{med(a, 'p50_us') / med(b, 'p50_us'):.2f}x, CPU/msg "
                     f"{med(a, 'cpu_us_per_msg') / med(b, 'cpu_us_per_msg'):.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""Where a standalone node's CPU goes per sync publish: thread CPU per function.

    PYTHONPATH=$PWD python benchmarks/js_sync_cpu.py [--count 3000] [--size 128]
        [--rounds 2]   (with JETRAFT_BASE=/tmp/base_main: that tree too, taking turns)

Starts one jetraft node (R1, JetStream) per tree with this file as its entry point: it
wraps functions of a sync publish's path, each adding its thread's CPU time
(`time.thread_time_ns`, inclusive of what it calls; a nested wrapped call is counted in
both) and its call count, then runs `node.cli serve`. Counting is off until the client,
after a warm-up, sends SIGRTMIN+3; SIGRTMIN+4 writes the counts out (JSON) and stops
counting. A nats-py client then publishes `--count` messages one at a time, each waiting
for its PubAck. The table: calls and CPU us per publish for each function, and the loop
thread's whole CPU per publish (its `thread_time` between the two signals; the signal
handlers run on the main thread, which is the loop's). Each wrapper adds ~1 us per call:
compare functions and trees with each other, not with the A/B's figures
(benchmarks/js_sync_ab.py is the judge). Not production code: the node does not know.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ON_SIG = signal.SIGRTMIN + 3
OFF_SIG = signal.SIGRTMIN + 4

# (module, class or None, function): the sync publish's path on a standalone node
TARGETS = [
    ("node.client", "Client", "data_received"),
    ("node.client", "Client", "flush"),
    ("node.jetstream.service", "JetStreamService", "_on_publish"),
    ("node.jetstream.service", "JetStreamService", "_accept_publish"),
    ("node.jetstream.service", "JetStreamService", "_early_replies"),
    ("node.jetstream.service", None, "_flush_receivers"),
    ("node.jetstream.service", "JetStreamService", "_on_effects"),
    ("raft.multigroup", "MultiRaft", "propose_quiet"),
    ("raft.multigroup", "MultiRaft", "_flush_proposals"),
    ("raft.multigroup", "MultiRaft", "_persist"),
    ("raft.multigroup", "MultiRaft", "_take_early"),
    ("raft.multigroup", "MultiRaft", "_settle"),
    ("raft.multigroup", "MultiRaft", "_after"),
    ("raft.multigroup", "MultiRaft", "_count_sync"),
    ("raft.multigroup", "MultiRaft", "_newest_segment"),
    ("raft.multigroup", None, "_apply_batches"),
    ("raft.multigroup", None, "storage_append_resp"),
    ("raft.core", "Raft", "step"),
    ("raft.core", "Raft", "ready"),
    ("raft.core", "Raft", "advance"),
    ("raft.core", "Raft", "has_ready"),
    ("raft.storage", "NodeLog", "append"),
    ("raft.storage", "NodeLog", "set_hard_state"),
    ("raft.storage", "NodeLog", "_write"),
    ("raft.storage", "NodeLog", "_take"),
    ("raft.storage", "NodeLog", "_after_sync"),
    ("raft.storage", "NodeLog", "pending_bytes"),
    ("raft.disk", "OsDisk", "fdatasync"),
    ("node.jetstream.machines", "StreamMachine", "apply_batch"),
    ("node.jetstream.stream", "Stream", "apply_batch"),
    ("node.jetstream.stream", "Stream", "apply"),
    ("node.jetstream.stream", "Stream", "_save_progress"),
    ("node.jetstream.ops", None, "decode"),
    ("node.jetstream.machines", "StreamMachine", "_keep"),
    ("node.jetstream.machines", "StreamMachine", "_before_commit"),
    ("node.jetstream.store.lmdbstore", "LmdbStore", "store"),
    ("node.jetstream.store.lmdbstore", "LmdbStore", "_write_back"),
    ("node.jetstream.store.lmdbstore", "LmdbStore", "put_metas"),
    ("node.client", "Client", "publish"),
    ("node.sublist", "SubList", "match"),
]


def node_main(out: str) -> None:
    """Wrap TARGETS, count between the two signals, then run the node."""
    import importlib

    acc: dict[str, list[int]] = {}
    on = [False]
    start = [0]
    tt = time.thread_time_ns

    def wrap(owner: Any, name: str, key: str) -> None:
        fn = getattr(owner, name)
        cell = acc.setdefault(key, [0, 0])

        @functools.wraps(fn)
        def w(*a: Any, **k: Any) -> Any:
            if not on[0]:
                return fn(*a, **k)
            t = tt()
            try:
                return fn(*a, **k)
            finally:
                cell[0] += tt() - t
                cell[1] += 1
        setattr(owner, name, w)

    for mod, cls, name in TARGETS:
        m = importlib.import_module(mod)
        owner = getattr(m, cls) if cls else m
        if hasattr(owner, name):
            wrap(owner, name, f"{cls}.{name}" if cls else name)
    def start_counting(*_: Any) -> None:
        for cell in acc.values():
            cell[0] = cell[1] = 0
        start[0] = tt()
        on[0] = True

    def stop_counting(*_: Any) -> None:
        on[0] = False
        loop_ns = tt() - start[0]
        with open(out, "w") as f:
            json.dump({"loop_ns": loop_ns, "acc": acc}, f)

    signal.signal(ON_SIG, start_counting)
    signal.signal(OFF_SIG, stop_counting)
    from node import cli
    cli.main()


async def _publish(url: str, pid: int, count: int, size: int) -> float:
    import nats
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="CPU", subjects=["cpu.>"])
    body = b"x" * size
    for _ in range(300):  # warm-up: stream created, caches filled
        await js.publish("cpu.x", body)
    os.kill(pid, ON_SIG)
    await asyncio.sleep(0.2)
    t = time.perf_counter()
    for _ in range(count):
        await js.publish("cpu.x", body)
    dt = time.perf_counter() - t
    os.kill(pid, OFF_SIG)
    await nc.close()
    return dt / count * 1e6


def _run_tree(label: str, tree: str, tmp: str, count: int, size: int) -> dict:
    from node.cluster.local import free_port
    port = free_port()
    d = tempfile.mkdtemp(prefix=f"{label}-", dir=tmp)
    out = os.path.join(d, "cpu.json")
    log = open(os.path.join(d, "node.log"), "wb")  # noqa: SIM115 - closed below
    p = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--node", out, "serve", "-js",
         "-sd", os.path.join(d, "data"), "-a", "127.0.0.1", "-p", str(port)],
        cwd=tree, env={**os.environ, "PYTHONPATH": tree}, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while b"Server is ready" not in Path(d, "node.log").read_bytes():
            if p.poll() is not None or time.monotonic() > deadline:
                text = Path(d, "node.log").read_text()
                raise RuntimeError(f"{label}: node did not start: {text}")
            time.sleep(0.05)
        per_pub = asyncio.run(_publish(f"nats://127.0.0.1:{port}", p.pid, count, size))
        deadline = time.monotonic() + 10
        while not os.path.exists(out) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.1)
        data = json.loads(Path(out).read_text())
    finally:
        p.terminate()
        p.wait()
        log.close()
    data["per_pub_us"] = per_pub
    return data


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--node":
        out = sys.argv[2]
        sys.argv = ["node.cli", *sys.argv[3:]]
        node_main(out)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    trees = [("HEAD", str(ROOT))]
    if os.environ.get("JETRAFT_BASE"):
        trees.append(("base", os.environ["JETRAFT_BASE"]))
    tmp = tempfile.mkdtemp(prefix="jscpu-")
    res: dict[str, list[dict]] = {label: [] for label, _ in trees}
    print(f"uptime before: {os.popen('uptime').read().strip()}")
    for _ in range(args.rounds):
        for label, tree in trees:
            res[label].append(_run_tree(label, tree, tmp, args.count, args.size))
    print(f"uptime after:  {os.popen('uptime').read().strip()}")
    n = args.count
    labels = [label for label, _ in trees]
    print(f"\n{n} sync publishes of {args.size} B per round, {args.rounds} round(s); "
          "CPU us per publish (loop thread, inclusive), calls per publish; median over rounds")
    print("| function | " + " | ".join(f"{lb} us | {lb} calls" for lb in labels) + " |")
    print("|---|" + "---|---|" * len(labels))

    def med(v: list[float]) -> float:
        v = sorted(v)
        return v[len(v) // 2]
    keys = sorted({k for rs in res.values() for r in rs for k in r["acc"]},
                  key=lambda k: -med([r["acc"].get(k, [0, 0])[0] for r in res["HEAD"]]))
    print("| **loop thread, whole** | " + " | ".join(
        f"{med([r['loop_ns'] / n / 1e3 for r in res[lb]]):.1f} | " for lb in labels) + " |")
    print("| **client: us per publish (wall)** | " + " | ".join(
        f"{med([r['per_pub_us'] for r in res[lb]]):.0f} | " for lb in labels) + " |")
    for k in keys:
        cells = []
        for lb in labels:
            ns = med([r["acc"].get(k, [0, 0])[0] for r in res[lb]])
            calls = med([r["acc"].get(k, [0, 0])[1] for r in res[lb]])
            cells.append(f"{ns / n / 1e3:.1f} | {calls / n:.2f}")
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

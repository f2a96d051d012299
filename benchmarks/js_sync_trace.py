"""Where the time of one sync JetStream publish goes: a timestamped trace.

    PYTHONPATH=$PWD python benchmarks/js_sync_trace.py [--replicas 1|3] [--via leader|other]
        [--count 300] [--size 128]

Starts one jetraft node (R1) or a 3-node cluster (R3, `LocalCluster`), every node
process instrumented from the outside (this file is the node's entry point: it wraps
client, JetStream, driver, WAL and transport functions, then runs `node.cli serve`;
no production code knows about it). Each event is `time.monotonic_ns()` (one clock for
every process on this machine) in a per-process list written out at exit. A nats-py
client publishes `--count` messages one at a time, each waiting for its PubAck; the
events of every node inside a publish's [send, PubAck] window make its timeline. The
table gives, per step, the median offset from the client's send and the median gap
from the previous step (steps in order of median offset; a step that occurs twice in a
window is numbered). `--via other`: the client talks to a node that does not lead.
Each event also carries the recording thread's CPU clock (`time.thread_time_ns()`): the
"thread CPU" column is what that thread spent since its own previous step in the same
publish (the loop thread's work between two steps, or the WAL thread's write+fsync),
whatever the run-queue wait.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (wall ns, step, CPU ns of the recording thread, that thread's id)
EVENTS: list[tuple[int, str, int, int]] = []


def install(out: str) -> None:
    """Wrap the functions on a publish's path so each records (time, step)."""
    import atexit
    import threading

    from node import client as nclient
    from node.jetstream import cluster as jcluster
    from node.jetstream import service
    from raft import multigroup, storage, transport_grpc
    from raft.types import MsgType

    now = time.monotonic_ns
    cpu = time.thread_time_ns
    ident = threading.get_ident

    def ev(name: str) -> None:
        EVENTS.append((now(), name, cpu(), ident()))

    def wrap(owner: Any, attr: str, before: Any = None, after: Any = None) -> None:
        fn = getattr(owner, attr)
        if asyncio.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def w(*a: Any, **k: Any) -> Any:
                if before:
                    before(*a, **k)
                r = await fn(*a, **k)
                if after:
                    after(*a, **k)
                return r
        else:
            @functools.wraps(fn)
            def w(*a: Any, **k: Any) -> Any:
                if before:
                    before(*a, **k)
                r = fn(*a, **k)
                if after:
                    after(*a, **k)
                return r
        setattr(owner, attr, w)

    def on_rx(self: Any, data: bytes) -> None:
        if b"PUB " in data[:8] or b"HPUB" in data[:8]:
            ev("client PUB read")
    wrap(nclient.Client, "data_received", before=on_rx)

    def on_flush(self: Any) -> None:
        if self.out and self.transport is not None and b"MSG " in self.out[:4]:
            ev("client MSG written")
    wrap(nclient.Client, "flush", before=on_flush)
    wrap(service.JetStreamService, "_on_publish", before=lambda *a, **k: ev("js _on_publish"))
    wrap(service.JetStreamService, "_accept_publish", before=lambda *a, **k: ev("js propose"))
    wrap(service.JetStreamService, "_on_effects", before=lambda *a, **k: ev("js effects (PubAck)"))
    wrap(jcluster.ClusterJS, "forward_publish", before=lambda *a, **k: ev("fwd: frame out"))
    if hasattr(jcluster.ClusterJS, "_on_pub_frame"):
        wrap(jcluster.ClusterJS, "_on_pub_frame", before=lambda *a, **k: ev("fwd: frame in"))

    def on_drain(self: Any) -> None:
        if self._dirty:
            ev("raft drain pass")
    wrap(multigroup.MultiRaft, "_drain_once", before=on_drain)
    wrap(storage.NodeLog, "_write", before=lambda *a, **k: ev("WAL write+fsync start"),
         after=lambda *a, **k: ev("WAL fsync end"))
    wrap(storage.NodeLog, "_after_sync", before=lambda *a, **k: ev("WAL sync back on loop"))
    orig_apply = multigroup._apply_batches

    def apply_batches(batches: Any) -> None:
        if any(s.__class__.__name__ == "StreamMachine" for s, _ in batches):
            ev("apply start")
            orig_apply(batches)
            ev("apply end")
        else:
            orig_apply(batches)
    multigroup._apply_batches = apply_batches

    def tag(msgs: Any) -> str | None:
        ks = {(m.type, bool(m.entries)) for m in msgs}
        if (MsgType.APP, True) in ks:
            return "APP"
        if any(t == MsgType.APP_RESP for t, _ in ks):
            return "APP_RESP"
        return None

    def on_send(self: Any, msgs: Any) -> None:
        t = tag(msgs)
        if t:
            ev(f"raft send {t}")
    wrap(transport_grpc.GrpcTransport, "send", before=on_send)

    def on_batch(self: Any, link: Any, batch: Any) -> None:
        t = {m.type for m in batch.messages}
        if MsgType.APP in t and any(m.entries for m in batch.messages):
            ev("raft recv APP")
        elif MsgType.APP_RESP in t:
            ev("raft recv APP_RESP")
    wrap(transport_grpc.GrpcTransport, "_on_batch", before=on_batch)

    if os.environ.get("JSTRACE_NO_SYNC_POINTS") == "1":
        # Diagnosis only (not durable): no periodic LMDB sync points, to see what they
        # cost the WAL's fsync on a shared ext4 journal.
        from node.jetstream.store import lmdbstore

        lmdbstore.NodeEnv._sync_loop = lambda self, interval: self._stop.wait()

    def dump() -> None:
        try:
            with open(out, "w") as f:
                json.dump(EVENTS, f)
        except OSError:
            pass
    atexit.register(dump)


def node_main() -> None:
    out = sys.argv.pop(1)
    install(out)
    from node import cli
    sys.exit(cli.main(sys.argv[1:]))


async def publish_loop(url: str, count: int, size: int, replicas: int,
                       leader_url: Any = None) -> list[tuple[int, int]]:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream(timeout=10)
    subject = "trace.x"
    await js.add_stream(name="TRACE", subjects=[subject], num_replicas=replicas)
    data = os.urandom(size)
    for _ in range(100):  # warm-up (leader elected, routes and inbox interest settled)
        await js.publish(subject, data)
    windows = []
    for _ in range(count):
        t0 = time.monotonic_ns()
        await js.publish(subject, data)
        windows.append((t0, time.monotonic_ns()))
    await nc.close()
    return windows


def timeline(windows: list[tuple[int, int]], traces: dict[str, list[tuple]]
             ) -> list[tuple[str, float, float, float | None, int]]:
    """(step, median offset us, median gap us, median CPU us, windows seen) in order of
    median offset. The CPU of a step is what the thread that recorded it spent since its
    own previous step in the same publish (None for a thread's first step there)."""
    offsets: dict[str, list[float]] = {}
    gaps: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    evs = sorted((e[0], f"{node}: {e[1]}", node, *e[2:4]) for node, tr in traces.items()
                 for e in tr)
    i = 0
    for t0, t1 in windows:
        while i < len(evs) and evs[i][0] < t0:
            i += 1
        seen: dict[str, int] = {}
        last_cpu: dict[tuple[str, int], int] = {}
        prev = t0
        j = i
        while j < len(evs) and evs[j][0] <= t1:
            t, name, node, *rest = evs[j]
            seen[name] = seen.get(name, 0) + 1
            key = name if seen[name] == 1 else f"{name} #{seen[name]}"
            offsets.setdefault(key, []).append((t - t0) / 1e3)
            gaps.setdefault(key, []).append((t - prev) / 1e3)
            if len(rest) == 2:  # a trace with thread CPU
                c, tid = rest
                if (node, tid) in last_cpu:
                    cpus.setdefault(key, []).append((c - last_cpu[node, tid]) / 1e3)
                last_cpu[node, tid] = c
            prev = t
            j += 1
        offsets.setdefault("client PubAck received", []).append((t1 - t0) / 1e3)
        gaps.setdefault("client PubAck received", []).append((t1 - prev) / 1e3)
    rows = [(k, statistics.median(v), statistics.median(gaps[k]),
             statistics.median(cpus[k]) if len(cpus.get(k, ())) >= len(v) // 2 else None,
             len(v)) for k, v in offsets.items()]
    rows.sort(key=lambda r: r[1])
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--node":
        sys.argv.pop(1)
        node_main()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--via", choices=("leader", "other"), default="leader")
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--show", type=int, default=2, help="raw timelines near the median")
    args = ap.parse_args()
    from node.cluster import local

    tmp = tempfile.mkdtemp(prefix="jstrace-")
    outs: dict[str, str] = {}
    orig_popen = local.subprocess.Popen

    def popen(cmd: list[str], **kw: Any) -> Any:
        name = Path(kw.get("cwd") or tmp).name
        out = outs[name] = f"{tmp}/trace-{name}.json"
        cmd = [cmd[0], __file__, "--node", out, *cmd[3:]]
        return orig_popen(cmd, **kw)
    local.subprocess.Popen = popen
    n = 1 if args.replicas == 1 else 3
    c = local.LocalCluster(tmp, n) if n > 1 else None
    try:
        if c is not None:
            c.start()
            windows = asyncio.run(_cluster_run(c, args))
        else:
            windows = asyncio.run(_single_run(tmp, args, popen))
    finally:
        local.subprocess.Popen = orig_popen
        if c is not None:
            c.stop()
        for p in _SINGLE:
            p.terminate()
            p.wait()
    traces = {}
    for name, path in outs.items():
        try:
            traces[name] = [tuple(e) for e in json.load(open(path))]
        except OSError:
            print(f"no trace from {name}")
    lat = sorted((b - a) / 1e3 for a, b in windows)
    print(f"# R{args.replicas} via {args.via}, {len(windows)} publishes of {args.size} B, "
          f"load {os.getloadavg()[0]:.2f}: p50 {statistics.median(lat):.0f} us, "
          f"p90 {lat[int(len(lat) * 0.9)]:.0f} us")
    print("| step | median offset us | median gap us | thread CPU us since its last step "
          "| windows |\n|---|---|---|---|---|")
    for name, off, gap, cpu, seen in timeline(windows, traces):
        if seen >= len(windows) // 4:
            c = "" if cpu is None else f"{cpu:.0f}"
            print(f"| {name} | {off:.0f} | {gap:.0f} | {c} | {seen} |")
    evs = sorted((e[0], f"{node}: {e[1]}") for node, tr in traces.items() for e in tr)
    by_lat = sorted(windows, key=lambda w: w[1] - w[0])
    for t0, t1 in by_lat[len(by_lat) // 2 - args.show // 2:][:args.show]:
        print(f"\n# one window of {(t1 - t0) / 1e3:.0f} us (offsets from the client's send)")
        for t, name in evs:
            if t0 <= t <= t1:
                print(f"  {(t - t0) / 1e3:7.0f}  {name}")


_SINGLE: list[Any] = []


async def _single_run(tmp: str, args: argparse.Namespace, popen: Any) -> list[tuple[int, int]]:
    from node.cluster.local import free_port

    port = free_port()
    d = Path(tmp) / "n1"
    d.mkdir()
    log = open(d / "node.log", "wb")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = popen([sys.executable, "-m", "node.cli", "serve", "-js", "-sd", str(d / "data"),
               "-a", "127.0.0.1", "-p", str(port)], cwd=str(d), stdout=log,
              stderr=log, env=env, start_new_session=True)
    _SINGLE.append(p)
    for _ in range(300):
        if b"Server is ready" in (d / "node.log").read_bytes():
            break
        await asyncio.sleep(0.05)
    return await publish_loop(f"nats://127.0.0.1:{port}", args.count, args.size, 1)


async def _cluster_run(c: Any, args: argparse.Namespace) -> list[tuple[int, int]]:
    import nats

    urls = [nd.url for nd in c.nodes]
    nc = await nats.connect(urls[0])
    js = nc.jetstream(timeout=10)
    for _ in range(100):
        try:
            await js.add_stream(name="TRACE", subjects=["trace.x"], num_replicas=3)
            break
        except Exception:  # noqa: BLE001 - the meta group may not have a leader yet
            await asyncio.sleep(0.3)
    await js.publish("trace.x", b"w")
    info = await js.stream_info("TRACE")
    leader = info.cluster.leader if info.cluster else None
    await nc.close()
    names = [nd.name for nd in c.nodes]
    idx = names.index(leader) if leader in names else 0
    if args.via == "other":
        idx = (idx + 1) % len(urls)
    return await _publish_existing(urls[idx], args.count, args.size)


async def _publish_existing(url: str, count: int, size: int) -> list[tuple[int, int]]:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream(timeout=10)
    data = os.urandom(size)
    for _ in range(100):
        await js.publish("trace.x", data)
    windows = []
    for _ in range(count):
        t0 = time.monotonic_ns()
        await js.publish("trace.x", data)
        windows.append((t0, time.monotonic_ns()))
    await nc.close()
    return windows


if __name__ == "__main__":
    main()

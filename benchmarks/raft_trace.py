"""Where the time of one window-1 Raft commit goes: a timestamped trace.

    PYTHONPATH=$PWD python benchmarks/raft_trace.py [--count 200] [--dir /dev/shm]
        [--direct [--wakeups]]

Three members as in `benchmarks/raft_bench.py` (node 1 in this process leads
group g0; nodes 2 and 3 are `python -m raft.node` processes). Every process
is instrumented by wrapping driver, WAL and transport functions from the
outside (no production code knows about it); each event is a wall-clock
timestamp (`time.time()`, one clock for all processes on this machine) in a
per-process list, written out at exit. For each proposal the events of all
three processes inside its [propose, return] window are put on one timeline;
the table gives the median offset of each step from the propose call and
the median gap from the previous step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EVENTS: list[tuple[float, str]] = []


def install(out: str) -> None:
    """Wrap the functions on a commit's path so each records (time, step)."""
    import atexit
    import functools

    from raft import multigroup, storage, transport_grpc
    from raft.types import MsgType

    def ev(name: str) -> None:
        EVENTS.append((time.time(), name))

    def wrap(cls, attr, before=None, after=None):
        fn = getattr(cls, attr)
        if asyncio.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def w(*a, **k):
                if before:
                    before(*a, **k)
                r = await fn(*a, **k)
                if after:
                    after(*a, **k)
                return r
        else:
            @functools.wraps(fn)
            def w(*a, **k):
                if before:
                    before(*a, **k)
                r = fn(*a, **k)
                if after:
                    after(*a, **k)
                return r
        setattr(cls, attr, w)

    def kinds(msgs):
        return {(m.type, bool(m.entries)) for m in msgs}

    def tag(msgs):
        ks = kinds(msgs)
        if (MsgType.APP, True) in ks:
            return "APP"
        if any(t == MsgType.APP_RESP for t, _ in ks):
            return "APP_RESP"
        return None

    wrap(multigroup.MultiRaft, "propose", before=lambda *a, **k: ev("propose"))
    if os.environ.get("TRACE_WAKEUPS"):
        # When the process's loop woke with I/O ready, and when a socket's
        # read callback ran (direct lane only: gRPC reads in its own threads).
        import selectors
        from asyncio import selector_events

        wrap(selector_events._SelectorSocketTransport, "_read_ready",
             before=lambda *a, **k: ev("sock readable"))
        select = selectors.EpollSelector.select

        def woke(self, timeout=None):
            ready = select(self, timeout)
            if ready:
                ev("select woke")
            return ready
        selectors.EpollSelector.select = woke
    wrap(multigroup.MultiRaft, "_drain_once", before=lambda *a, **k: ev("drain start"))
    wrap(storage.NodeLog, "append", before=lambda *a, **k: ev("WAL append (buffered)"))
    wrap(storage.NodeLog, "_write", before=lambda *a, **k: ev("fsync start"),
         after=lambda *a, **k: ev("fsync end"))
    wrap(storage.NodeLog, "_after_sync", before=lambda *a, **k: ev("sync back on loop"))
    wrap(multigroup.MultiRaft, "_finish", before=lambda *a, **k: ev("finish (post-sync)"))
    wrap(multigroup.MultiRaft, "_settle", before=lambda s, g, rd: rd.committed_entries and ev(
        "commit: apply+settle"))

    def on_send(self, msgs):
        t = tag(msgs)
        if t:
            ev(f"send {t}")
    wrap(transport_grpc.GrpcTransport, "send", before=on_send)

    def on_flush_lane(self, link, lane, msgs, beat):
        t = tag(msgs)
        if t:
            ev(f"flush {t} -> queue")
    wrap(transport_grpc.GrpcTransport, "_flush_lane", before=on_flush_lane)

    def on_batch(self, link, batch):
        if batch.messages:
            t = {m.type for m in batch.messages}
            if MsgType.APP in t and any(m.entries for m in batch.messages):
                ev("recv APP")
            elif MsgType.APP_RESP in t:
                ev("recv APP_RESP")
    wrap(transport_grpc.GrpcTransport, "_on_batch", before=on_batch)

    class Timed:
        """A stream whose write() is timed (the call into gRPC and its completion)."""

        def __init__(self, s):
            self._s = s

        def __getattr__(self, a):
            return getattr(self._s, a)

        async def write(self, batch):
            big = any(m.entries for m in batch.messages) or any(
                m.type == MsgType.APP_RESP for m in batch.messages)
            if big:
                ev("grpc write start")
            r = await self._s.write(batch)
            if big:
                ev("grpc write done")
            return r

    if os.environ.get("TRACE_DIRECT"):
        # The direct TCP lane: its socket write is the "grpc write start" step.
        from raft import tcp_lane

        def on_write_now(self, batch):
            if any(m.entries for m in batch.messages) or any(
                    m.type == MsgType.APP_RESP for m in batch.messages):
                ev("grpc write start")
        wrap(tcp_lane.TcpStream, "write_now", before=on_write_now,
             after=lambda *a, **k: ev("write_now end"))
    else:
        orig_attach = transport_grpc.GrpcTransport._attach

        def attach(self, lane, link, stream):
            orig_attach(self, lane, link, Timed(stream))
        transport_grpc.GrpcTransport._attach = attach
        orig_detach = transport_grpc.GrpcTransport._detach

        def detach(self, link, lane, stream):
            if isinstance(lane.stream, Timed) and lane.stream._s is stream:
                stream = lane.stream
            orig_detach(self, link, lane, stream)
        transport_grpc.GrpcTransport._detach = detach

    def dump():
        try:
            with open(out, "w") as f:
                json.dump(EVENTS, f)
        except OSError:
            pass
    atexit.register(dump)
    import signal
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))


def follower_main() -> None:
    out = sys.argv.pop(1)
    install(out)
    from raft import node
    node.main(sys.argv[1:])


async def leader(args, tmp: str, outs: list[str]) -> list[tuple[float, float]]:
    from benchmarks.raft_bench import OurCluster

    c = OurCluster(tmp, 1, direct=args.direct)
    orig_popen = subprocess.Popen

    def popen(cmd, **kw):
        out = f"{tmp}/trace-{len(outs)}.json"
        outs.append(out)
        cmd = [cmd[0], __file__, "--follower", out, *cmd[3:]]
        return orig_popen(cmd, **{**kw, "env": {**os.environ, "PYTHONPATH": str(ROOT)}})
    subprocess.Popen = popen
    try:
        mr = await c.start()
    finally:
        subprocess.Popen = orig_popen
    windows = []
    data = os.urandom(args.size)
    try:
        for _ in range(50):
            await mr.propose("g0", data)
        EVENTS.clear()
        pids = [os.getpid()] + [p.pid for p in c.procs]
        cs0 = [ctx_switches(p) for p in pids]
        for _ in range(args.count):
            t0 = time.time()
            await mr.propose("g0", data)
            windows.append((t0, time.time()))
        cs = [ctx_switches(p) for p in pids]
        print("context switches per commit, voluntary/involuntary (leader, n2, n3): " + ", ".join(
            f"{(a[0] - b[0]) / args.count:.2f}/{(a[1] - b[1]) / args.count:.2f}"
            for a, b in zip(cs, cs0, strict=True)))
    finally:
        for p in c.procs:
            p.terminate()
            p.wait()
        c.procs = []
        await c.stop()
    return windows


# The causal chain of one commit: each step is the first event of that name in
# that process after the previous step (the followers' own commit bookkeeping
# of the previous entry falls inside the window too and must not be picked).
CHAIN = [
    # (The leader buffers its own records after its appends leave: off the chain.)
    ("leader", "propose"), ("leader", "drain start"),
    ("leader", "send APP"), ("leader", "flush APP -> queue"), ("leader", "grpc write start"),
    ("F", "recv APP"), ("F", "drain start"), ("F", "WAL append (buffered)"),
    # (A follower's answers leave right after its fsync, before its "sync back
    # on loop" and "finish" bookkeeping: those two are not on the chain.)
    ("F", "fsync start"), ("F", "fsync end"), ("F", "send APP_RESP"),
    ("F", "flush APP_RESP -> queue"), ("F", "grpc write start"),
    ("leader", "recv APP_RESP"), ("leader", "drain start"),
    ("leader", "commit: apply+settle"),
]
LOCAL = [("leader", "WAL append (buffered)"), ("leader", "fsync start"), ("leader", "fsync end"),
         ("leader", "sync back on loop"), ("leader", "finish (post-sync)"),
         ("leader", "grpc write done")]


def _first(evs, name, after, until):
    for t, n in evs:
        if after <= t <= until and n == name:
            return t
    return None


def with_wakeups() -> None:
    """Put the two wake-up probes on the chain (before each receive)."""
    at = CHAIN.index(("F", "recv APP"))
    CHAIN[at:at] = [("F", "select woke"), ("F", "sock readable")]
    at = CHAIN.index(("leader", "recv APP_RESP"))
    CHAIN[at:at] = [("leader", "select woke"), ("leader", "sock readable")]


def report(windows, streams: dict[str, list[tuple[float, str]]]) -> None:
    steps: list[list[float]] = [[] for _ in CHAIN]
    local: list[list[float]] = [[] for _ in LOCAL]
    totals = []
    for t0, t1 in windows:
        totals.append(t1 - t0)
        # The follower whose APP_RESP the leader received first made the quorum.
        best = None
        for who in streams:
            if who == "leader":
                continue
            chain, t = [], t0 - 1e-6
            for proc, name in CHAIN:
                t = _first(streams["leader" if proc == "leader" else who], name, t, t1)
                if t is None:
                    break
                chain.append(t)
            if t is not None and (best is None or chain[-1] < best[-1]):
                best = chain
        if best is None:
            continue
        for i, t in enumerate(best):
            steps[i].append(t - t0)
        for i, (_, name) in enumerate(LOCAL):
            t = _first(streams["leader"], name, t0, t1)
            if t is not None:
                local[i].append(t - t0)
    med = statistics.median
    print(f"window-1 commits: {len(windows)} (full chain found in {len(steps[0])}), "
          f"p50 {1e6 * med(totals):.0f} us, mean {1e6 * statistics.fmean(totals):.0f} us")
    print(f"{'step (F = the follower that made the quorum)':52} {'p50 at us':>10} "
          f"{'p50 gap us':>10}")
    rows = list(zip(*steps, strict=True))
    gaps = [[b - a for a, b in zip([0.0, *v[:-1]], v, strict=True)] for v in rows]
    for i, (proc, name) in enumerate(CHAIN):
        if not steps[i]:
            continue
        g = med([row[i] for row in gaps]) if gaps else 0.0
        print(f"{proc + ': ' + name:52} {1e6 * med(steps[i]):10.0f} {1e6 * g:10.0f}")
    print(f"{'leader: propose returns':52} {1e6 * med(totals):10.0f}")
    print("leader's own fsync path (in parallel with the follower round trip):")
    for i, (proc, name) in enumerate(LOCAL):
        if local[i]:
            print(f"  {proc + ': ' + name:50} {1e6 * med(local[i]):10.0f}")


def sequence(windows, streams: dict[str, list[tuple[float, str]]]) -> None:
    """Every event of every process inside the windows, named by its
    occurrence (the k-th "fsync start" of n2 in the window), at its median
    offset from the propose: the whole timeline, not only the chain."""
    at: dict[tuple[str, str, int], list[float]] = {}
    for t0, t1 in windows:
        for who, evs in streams.items():
            seen: dict[str, int] = {}
            for t, n in evs:
                if t0 <= t <= t1:
                    k = seen[n] = seen.get(n, 0) + 1
                    at.setdefault((who, n, k), []).append(t - t0)
    rows = [(statistics.median(v), key, len(v)) for key, v in at.items()
            if len(v) >= len(windows) // 2]
    print(f"every event seen in at least half of {len(windows)} windows (median offset us):")
    for off, (who, n, k), cnt in sorted(rows):
        print(f"  {1e6 * off:8.0f}  {who:6} {n}{f' #{k}' if k > 1 else ''}  ({cnt})")


def ctx_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every thread of `pid`."""
    vol = inv = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in open(f"/proc/{pid}/task/{task}/status"):
                if line.startswith("voluntary_ctxt_switches"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    inv += int(line.split()[1])
        except OSError:
            pass
    return vol, inv


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--follower":
        sys.argv.pop(1)
        follower_main()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--dir", default=os.environ.get("BENCH_TMP"))
    ap.add_argument("--direct", action="store_true",
                    help="members talk over the direct TCP lane (raft/tcp_lane.py)")
    ap.add_argument("--wakeups", action="store_true",
                    help="also time each process's wake-up and socket read callback "
                         "(with --direct; gRPC lanes read in gRPC's threads)")
    ap.add_argument("--sequence", action="store_true",
                    help="also print every event of every process on one timeline")
    args = ap.parse_args()
    if args.direct:
        os.environ["TRACE_DIRECT"] = "1"  # the followers' instrumentation reads it too
    if args.wakeups:
        os.environ["TRACE_WAKEUPS"] = "1"
        with_wakeups()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        out = f"{tmp}/trace-leader.json"
        install(out)
        outs: list[str] = []
        windows = asyncio.run(leader(args, tmp, outs))
        Path(out).write_text(json.dumps(EVENTS))
        time.sleep(0.5)
        streams = {"leader": list(EVENTS)}
        for k, o in enumerate(outs):
            try:
                streams[f"n{k + 2}"] = [tuple(e) for e in json.loads(Path(o).read_text())]
            except (OSError, ValueError) as exc:
                print(f"no trace from n{k + 2}: {exc!r}")
        report(windows, streams)
        if args.sequence:
            sequence(windows, streams)


if __name__ == "__main__":
    main()

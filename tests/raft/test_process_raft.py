"""Raft across real processes (`python -m raft.node`): gRPC, fsync, kill -9, disk damage.

A client drives writes through each node's JSON control port and records which
were acknowledged; an acknowledged write must be on every member afterwards.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raft import wal
from tests.ports import free_port

pytestmark = pytest.mark.timeout(150)
ROOT = Path(__file__).resolve().parents[2]


class Conn:
    """One control connection; requests are pipelined and matched by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future] = {}
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while line := await self.reader.readline():
                resp = json.loads(line)
                fut = self.waiting.pop(resp["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(resp)
        except (ConnectionError, OSError):
            pass
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(ConnectionError("control connection lost"))

    async def call(self, timeout: float = 15.0, **req) -> dict:
        if self.task.done():
            raise ConnectionError("control connection lost")
        req["id"] = rid = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        self.writer.write(json.dumps(req).encode() + b"\n")
        return await asyncio.wait_for(fut, timeout)

    def close(self) -> None:
        try:
            self.task.cancel()
            self.writer.close()
            for fut in self.waiting.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("control connection closed"))
        except RuntimeError:
            pass  # the test's loop is already closed (fixture teardown)


class Proc:
    def __init__(self, cluster: ProcCluster, nid: int) -> None:
        self.cluster, self.nid = cluster, nid
        self.dir = cluster.tmp / f"n{nid}"
        self.control = free_port()
        self.popen: subprocess.Popen | None = None
        self.conn: Conn | None = None

    async def start(self, voters: str = "1,2,3") -> None:
        c = self.cluster
        peers = ",".join(f"{i}={a}" for i, a in c.addrs.items())
        cmd = [sys.executable, "-m", "raft.node", "--id", str(self.nid), "--dir", str(self.dir),
               "--listen", c.addrs[self.nid], "--peers", peers, "--control-port",
               str(self.control), "--voters", voters, "--tick", "0.05",
               "--snapshot-every", str(c.snapshot_every), "--groups", "1", *c.extra_args]
        log = open(c.tmp / f"n{self.nid}.log", "ab")
        self.popen = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log)
        async with asyncio.timeout(30):
            while True:
                if self.popen.poll() is not None:
                    raise RuntimeError(f"node {self.nid} exited: see {c.tmp}/n{self.nid}.log")
                try:
                    # A large limit: `entries` of a long log is one big line.
                    self.conn = Conn(*await asyncio.open_connection(
                        "127.0.0.1", self.control, limit=64 << 20))
                    return
                except OSError:
                    await asyncio.sleep(0.05)

    def kill9(self) -> None:
        if self.conn:
            self.conn.close()
            self.conn = None
        if self.popen and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait()

    async def call(self, **req) -> dict:
        if self.conn is None:
            raise ConnectionError("node down")
        return await self.conn.call(**req)

    async def entries(self) -> list[str]:
        return [d for _, d in (await self.call(op="entries"))["entries"]]

    async def status(self) -> dict:
        return (await self.call(op="status"))["status"]


class ProcCluster:
    def __init__(self, tmp: Path, n: int = 3, snapshot_every: int = 100_000,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.tmp = tmp
        self.snapshot_every = snapshot_every
        self.extra_args = extra_args  # more `python -m raft.node` options
        self.addrs = {i: f"127.0.0.1:{free_port()}" for i in range(1, n + 1)}
        self.procs = {i: Proc(self, i) for i in self.addrs}
        self.acked: list[str] = []
        self.retried: set[str] = set()  # outcome unknown once: may legitimately apply twice
        self.seq = itertools.count()
        self.halted = False  # stop the load without task.cancel() (3.11 wait_for can eat it)

    def up(self) -> list[Proc]:
        return [p for p in self.procs.values() if p.conn is not None]

    async def leader(self, timeout: float = 30.0) -> Proc:
        last: dict[int, Any] = {}  # what each node said last: named if no leader shows up
        try:
            async with asyncio.timeout(timeout):
                while not self.halted:
                    for p in self.up():
                        try:
                            last[p.nid] = await p.status()
                            if last[p.nid]["state"] == "leader":
                                return p
                        except (ConnectionError, TimeoutError) as err:
                            last[p.nid] = repr(err)
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise TimeoutError(f"no leader in {timeout} s; last status {last}; logs:\n"
                               + self.log_tails()) from None
        raise ConnectionError("halted")

    def log_tails(self, lines: int = 15) -> str:
        out = []
        for nid in self.procs:
            path = self.tmp / f"n{nid}.log"
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- n{nid}.log\n" + "\n".join(tail))
        return "\n".join(out)

    async def write(self, data: str, timeout: float = 40.0) -> None:
        """One write through the current leader, retried until acknowledged."""
        async with asyncio.timeout(timeout):
            while True:
                p = await self.leader()
                try:
                    resp = await p.call(op="propose", data=data)
                except (ConnectionError, TimeoutError):
                    self.retried.add(data)
                    continue
                if resp["ok"]:
                    self.acked.append(data)
                    return
                if resp["err"] != "not_leader":
                    self.retried.add(data)  # e.g. dropped after an append: may still commit
                await asyncio.sleep(0.02)

    async def load(self, stop: asyncio.Event, window: int = 4) -> None:
        async def worker() -> None:
            while not stop.is_set():
                await self.write(f"w{next(self.seq)}")
        await asyncio.gather(*(worker() for _ in range(window)))

    async def until_converged(self, members: list[Proc], timeout: float = 60.0) -> list[str]:
        """Until every member applied the same sequence holding every acked write."""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    seqs = [await p.entries() for p in members]
                except (ConnectionError, TimeoutError):
                    seqs = []
                if seqs and all(s == seqs[0] for s in seqs) and set(self.acked) <= set(seqs[0]):
                    dups = {d for d in seqs[0] if seqs[0].count(d) > 1}
                    assert dups <= self.retried, f"applied twice without a retry: {dups}"
                    return seqs[0]
                await asyncio.sleep(0.2)

    def close(self) -> None:
        for p in self.procs.values():
            p.kill9()


@pytest.fixture
def cluster(tmp_path):
    clusters: list[ProcCluster] = []

    def make(**kw) -> ProcCluster:
        clusters.append(ProcCluster(tmp_path, **kw))
        return clusters[-1]

    yield make
    for c in clusters:
        c.close()


async def run_load_for(
    c: ProcCluster, acks: int, window: int = 4
) -> tuple[asyncio.Event, asyncio.Task]:
    stop = asyncio.Event()
    task = asyncio.ensure_future(c.load(stop, window))
    start = len(c.acked)
    async with asyncio.timeout(60):
        while len(c.acked) < start + acks:
            await asyncio.sleep(0.02)
    return stop, task


async def test_kill9_leader_mid_stream(cluster):
    c = cluster()
    for p in c.procs.values():
        await p.start()
    stop, load = await run_load_for(c, 100)
    old = await c.leader()
    old.kill9()  # mid-stream: writes are in flight
    async with asyncio.timeout(60):
        n = len(c.acked)
        while len(c.acked) < n + 100:
            await asyncio.sleep(0.02)
    stop.set()
    await load
    await old.start()
    final = await c.until_converged(list(c.procs.values()))
    assert len(final) >= len(c.acked) >= 200


async def test_kill9_all_then_restart(cluster):
    c = cluster()
    for p in c.procs.values():
        await p.start()
    stop, load = await run_load_for(c, 150, window=8)
    for p in c.procs.values():
        p.kill9()
    stop.set()
    c.halted = True
    await asyncio.gather(load, return_exceptions=True)
    c.halted = False
    for p in c.procs.values():
        await p.start()
    await c.write("after-restart")
    await c.until_converged(list(c.procs.values()))


@pytest.mark.parametrize("damage", ["truncate", "bitflip"])
async def test_damaged_wal_tail_recovers_and_catches_up(cluster, damage):
    c = cluster()
    for p in c.procs.values():
        await p.start()
    for k in range(60):
        await c.write(f"a{k}")
    leader = await c.leader()
    victim = next(p for p in c.procs.values() if p is not leader)
    await c.until_converged(list(c.procs.values()))
    victim.kill9()
    segs = sorted((victim.dir / "wal").glob("wal-*.log"))
    seg = segs[-1]
    # A record being written when the machine died: never fsynced, never acked.
    # (Losing *fsynced* records is a disk failure Raft cannot absorb in place:
    # the node must be removed and re-added; see docs/raft.md.)
    rec = bytearray(wal.encode(wal.RecordType.ENTRY, b"g0", 99, 10**6, 0, b"x" * 300))
    if damage == "truncate":
        rec = rec[: len(rec) // 2]
    else:
        rec[-100] ^= 0x10  # CRC mismatch
    size = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(rec)
    for k in range(20):
        await c.write(f"b{k}")
    await victim.start()
    final = await c.until_converged(list(c.procs.values()))
    assert final[:60] == [f"a{k}" for k in range(60)]
    assert (await victim.status())["last_index"] < 10**6
    assert "torn tail" in (c.tmp / f"n{victim.nid}.log").read_text()
    assert seg.stat().st_size >= size  # the valid prefix was kept


async def test_empty_member_catches_up_by_snapshot(cluster):
    c = cluster(n=4, snapshot_every=50)
    for nid in (1, 2, 3):
        await c.procs[nid].start()
    for k in range(180):
        await c.write(f"s{k}")
    leader = await c.leader()
    async with asyncio.timeout(30):  # the leader compacted past the start of the log
        while (await leader.status())["first_index"] <= 100:
            await asyncio.sleep(0.1)
    new = c.procs[4]
    await new.start(voters="1,2,3")  # not in the initial configuration: joins empty
    resp = await leader.call(op="add_member", node=4)
    assert resp["ok"], resp
    await c.write("after-join")
    final = await c.until_converged(list(c.procs.values()))
    assert final[:180] == [f"s{k}" for k in range(180)]
    # (the image is restored off the loop, before the driver counts the install)
    async with asyncio.timeout(30):
        while (await new.call(op="stats"))["driver"]["snapshots_installed"] < 1:
            await asyncio.sleep(0.1)


async def test_membership_add_remove_under_load(cluster):
    c = cluster(n=4)
    for nid in (1, 2, 3):
        await c.procs[nid].start()
    stop, load = await run_load_for(c, 50)
    await c.procs[4].start(voters="1,2,3")
    async def change(**req) -> None:
        async with asyncio.timeout(40):
            while True:
                leader = await c.leader()
                resp = await leader.call(**req)
                if resp["ok"]:
                    return
                await asyncio.sleep(0.1)
    await change(op="add_member", node=4)
    n = len(c.acked)
    async with asyncio.timeout(60):
        while len(c.acked) < n + 50:
            await asyncio.sleep(0.02)
    leader = await c.leader()
    gone = next(nid for nid in (1, 2, 3) if nid != leader.nid)
    await change(op="remove_member", node=gone)
    n = len(c.acked)
    async with asyncio.timeout(60):
        while len(c.acked) < n + 50:
            await asyncio.sleep(0.02)
    stop.set()
    await load
    members = [p for nid, p in c.procs.items() if nid != gone]
    await c.until_converged(members)
    st = await (await c.leader()).status()
    assert sorted(st["voters"]) == sorted(p.nid for p in members)

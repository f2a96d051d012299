"""kill -9 across real processes, aimed at the risky moments (issue 6).

Four `python -m raft.node` members (voters 1-3; node 4 is added and removed
over and over) run under acknowledged proposal load, with 4 KiB WAL segments
and a snapshot every 40 entries, so rolls, compactions and snapshot installs
happen all the time. Each cycle kills one member with SIGKILL at a moment
picked for one of four kinds:

- roll: while a drain-pass sync that starts a new segment is in flight;
- snapshot: while an image is written, committed or the log compacted;
- install: a follower is killed, falls behind the leader's compaction,
  restarts, and is killed again while it receives or installs the snapshot;
- membership: while node 4's addition or removal is in flight (the leader
  or node 4 is the victim).

The victim is aimed at by polling its `activity` op and killing as soon as
the moment shows; what that last probe said is recorded per kill, so the
report tells how many kills landed in each phase. Every victim restarts
with the same command line (no repair), and the cluster must make progress
again before the next cycle. At the end every member must hold the same
sequence, holding every acknowledged write exactly once, in real-time order.

    RAFT_CRASH_CYCLES=200 PYTHONPATH=$PWD python -m pytest -s tests/raft/test_process_crash.py

(CI: 20 cycles.) The figures are printed and, with RAFT_CRASH_REPORT=path,
written as JSON.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.raft import test_process_raft
from tests.raft.test_process_raft import Proc, ProcCluster

CYCLES = int(os.environ.get("RAFT_CRASH_CYCLES", "20"))
SEGMENT_BYTES = 4096
SNAPSHOT_EVERY = 40
KINDS = ("roll", "snapshot", "install", "membership")
MOVER = 4  # the member that is added and removed

pytestmark = pytest.mark.timeout(240 + 25 * CYCLES)
cluster = test_process_raft.cluster  # the process-cluster fixture


# ---- the history checker -----------------------------------------------------------


@dataclass
class Write:
    data: str
    sent: float  # first attempt (monotonic)
    acked: float | None = None  # None: not acknowledged (outcome unknown or never sent)


def check_history(seq: list[str], writes: dict[str, Write]) -> list[str]:
    """What is wrong with one member's applied sequence, given what the
    client saw. A write whose outcome was unknown is never proposed again,
    so no entry may appear twice; every acknowledged write must appear; and
    a write acknowledged before another was first sent must come before it."""
    errors: list[str] = []
    pos: dict[str, int] = {}
    for i, d in enumerate(seq):
        if d in pos:
            errors.append(f"{d!r} applied twice (positions {pos[d]} and {i})")
        elif d not in writes:
            errors.append(f"{d!r} applied but never proposed")
        pos.setdefault(d, i)
    acked = [w for w in writes.values() if w.acked is not None]
    errors += [f"acknowledged {w.data!r} missing" for w in acked if w.data not in pos]
    present = [w for w in acked if w.data in pos]
    by_ack = sorted(present, key=lambda w: w.acked)
    before: Write | None = None  # the latest-placed write acked before `b` was sent
    j = 0
    for b in sorted(present, key=lambda w: w.sent):
        while j < len(by_ack) and by_ack[j].acked < b.sent:
            if before is None or pos[by_ack[j].data] > pos[before.data]:
                before = by_ack[j]
            j += 1
        if before is not None and pos[before.data] > pos[b.data]:
            errors.append(f"{before.data!r} was acknowledged before {b.data!r} was sent, "
                          f"but applied after it")
    return errors


def test_checker_catches_lost_duplicated_and_reordered_writes():
    w = {d: Write(d, sent=k, acked=k + 0.5) for k, d in enumerate("abc")}
    w["u"] = Write("u", sent=9)  # outcome unknown: may or may not be there
    assert check_history(["a", "b", "c"], w) == []
    assert check_history(["a", "u", "b", "c"], w) == []
    assert any("missing" in e for e in check_history(["a", "c"], w))
    assert any("twice" in e for e in check_history(["a", "b", "b", "c"], w))
    assert any("twice" in e for e in check_history(["a", "b", "c", "u", "u"], w))
    assert any("applied after" in e for e in check_history(["b", "a", "c"], w))
    assert any("never proposed" in e for e in check_history(["a", "b", "c", "x"], w))
    w["d"] = Write("d", sent=2.2, acked=4)  # concurrent with c: either order is fine
    assert check_history(["a", "b", "d", "c"], w) == []
    assert check_history(["a", "b", "c", "d"], w) == []


# ---- load --------------------------------------------------------------------------


class Client:
    """Acknowledged-proposal load through whichever member leads.

    Only a `not_leader` answer is retried (nothing was appended); a write
    whose outcome is unknown (connection lost, dropped after an append) is
    left as it is and the worker moves on, so nothing can legitimately be
    applied twice."""

    def __init__(self, c: ProcCluster) -> None:
        self.c = c
        self.writes: dict[str, Write] = {}
        self.seq = 0
        self.stop = asyncio.Event()

    @property
    def acked(self) -> int:
        return sum(w.acked is not None for w in self.writes.values())

    async def leader(self) -> Proc | None:
        for p in self.c.up():
            try:
                if (await p.call(op="status"))["status"]["state"] == "leader":
                    return p
            except (ConnectionError, TimeoutError):
                pass
        return None

    async def write(self, data: str) -> None:
        w = self.writes[data] = Write(data, time.monotonic())
        while not self.stop.is_set():
            p = await self.leader()
            if p is None:
                await asyncio.sleep(0.02)
                continue
            try:
                resp = await p.call(op="propose", data=data)
            except (ConnectionError, TimeoutError):
                return  # outcome unknown
            if resp["ok"]:
                w.acked = time.monotonic()
                return
            if resp["err"] != "not_leader":
                return  # e.g. dropped after an append: outcome unknown
            await asyncio.sleep(0.02)

    async def run(self, window: int = 4) -> None:
        async def worker() -> None:
            while not self.stop.is_set():
                self.seq += 1
                await self.write(f"w{self.seq}")
        await asyncio.gather(*(worker() for _ in range(window)))

    async def progress(self, n: int, timeout: float = 60.0) -> None:
        """Until `n` more writes are acknowledged (the cluster is live)."""
        goal = self.acked + n
        async with asyncio.timeout(timeout):
            while self.acked < goal:
                await asyncio.sleep(0.02)


# ---- kills -------------------------------------------------------------------------


class Crasher:
    def __init__(self, c: ProcCluster, client: Client) -> None:
        self.c, self.client = c, client
        self.kills: list[dict[str, Any]] = []
        self.restarts = 0
        self.conf_open = False  # a membership request is outstanding
        self.rng = random.Random(int(os.environ.get("RAFT_CRASH_SEED", "6")))

    async def activity(self, p: Proc) -> dict[str, int] | None:
        try:
            resp = await p.call(op="activity")
        except (ConnectionError, TimeoutError):
            return None
        return resp["activity"] if resp["ok"] else None

    async def kill_when(self, p: Proc, kind: str, role: str,
                        aim: Callable[[dict[str, int]], bool], wait: float) -> None:
        """SIGKILL `p` as soon as its activity shows the aimed-at moment (or
        after `wait` seconds); record what the last probe said."""
        deadline = time.monotonic() + wait
        while True:  # at least one probe
            act = await self.activity(p)
            if (act is not None and aim(act)) or time.monotonic() >= deadline:
                break
        conf_open = self.conf_open
        p.kill9()
        self.kills.append({"kind": kind, "node": p.nid, "role": role, "activity": act or {},
                           "conf_open": conf_open, "aimed": bool(act and aim(act))})

    async def restart(self, p: Proc) -> None:
        await p.start()  # same command line; no repair of any kind
        self.restarts += 1

    async def status(self, p: Proc) -> dict[str, Any] | None:
        try:
            resp = await p.call(op="status")
        except (ConnectionError, TimeoutError):
            return None
        return resp["status"] if resp["ok"] else None

    async def leader(self, timeout: float = 30.0) -> tuple[Proc, dict[str, Any]]:
        async with asyncio.timeout(timeout):
            while True:
                for p in self.c.up():
                    st = await self.status(p)
                    if st is not None and st["state"] == "leader":
                        return p, st
                await asyncio.sleep(0.05)

    def victim(self, leader: Proc, voters: list[int], cycle: int) -> tuple[Proc, str]:
        if cycle % 2 == 0:
            return leader, "leader"
        nid = self.rng.choice([v for v in voters if v != leader.nid])
        return self.c.procs[nid], "follower"

    # -- the four kinds --

    async def roll(self, cycle: int) -> None:
        leader, st = await self.leader()
        p, role = self.victim(leader, st["voters"], cycle)
        await self.kill_when(p, "roll", role, lambda a: a["sync_roll"] > 0, wait=5)
        await self.restart(p)

    async def snapshot(self, cycle: int) -> None:
        leader, st = await self.leader()
        p, role = self.victim(leader, st["voters"], cycle)
        try:
            await p.call(op="snapshot")
        except (ConnectionError, TimeoutError):
            pass
        # A few ms later now and then: the image write, the log sync, the file
        # commit and the compaction are all in the window.
        await asyncio.sleep(self.rng.choice((0, 0, 0.001, 0.003)))
        await self.kill_when(p, "snapshot", role, lambda a: a["snapshotting"] > 0, wait=2)
        await self.restart(p)

    async def install(self, cycle: int) -> None:
        leader, st = await self.leader()
        p = self.c.procs[self.rng.choice([v for v in st["voters"] if v != leader.nid])]
        pst = await self.status(p)
        behind = pst["last_index"] if pst else 0
        await self.kill_when(p, "install-lag", "follower", lambda a: True, wait=0)
        # Until the leader compacted past what the victim holds: it must
        # catch up by snapshot.
        async with asyncio.timeout(60):
            while True:
                leader, st = await self.leader()
                if st["first_index"] > behind + 1:
                    break
                await self.client.progress(SNAPSHOT_EVERY // 2)
        await self.restart(p)
        await self.kill_when(p, "install", "follower", lambda a: a["installing"] > 0, wait=5)
        await self.restart(p)

    async def membership(self, cycle: int) -> None:
        leader, st = await self.leader()
        op = "remove_member" if MOVER in st["voters"] else "add_member"
        victim = leader if self.rng.random() < 0.5 else self.c.procs[MOVER]
        role = "leader" if victim is leader else f"mover-{op}"
        self.conf_open = True
        req = asyncio.ensure_future(leader.call(op=op, node=MOVER, timeout=30))
        await asyncio.sleep(self.rng.choice((0, 0.002, 0.005)))
        try:
            await self.kill_when(victim, "membership", role,
                                 lambda a: a["conf_changing"] > 0 or not req.done(), wait=1)
        finally:
            await asyncio.gather(req, return_exceptions=True)
            self.conf_open = False
        await self.restart(victim)

    async def cycle(self, k: int) -> None:
        kind = KINDS[k % len(KINDS)]
        await getattr(self, kind)(k // len(KINDS))
        await self.client.progress(10)  # live again before the next kill

    def summary(self, client: Client) -> dict[str, Any]:
        landed: collections.Counter[str] = collections.Counter()
        for k in self.kills:
            a = k["activity"]
            hits = [name for name, flag in (
                ("roll", a.get("sync_roll")), ("snapshot", a.get("snapshotting")),
                ("install", a.get("installing")),
                ("membership", a.get("conf_changing") or k["conf_open"])) if flag]
            landed.update(hits or ["other"])
        return {
            "cycles": CYCLES, "kills": len(self.kills),
            "kills_per_kind": dict(collections.Counter(k["kind"] for k in self.kills)),
            "kills_per_role": dict(collections.Counter(k["role"] for k in self.kills)),
            "landed_in_phase": dict(landed), "restarts": self.restarts,
            "writes": len(client.writes), "acked": client.acked,
        }


async def converge(procs: list[Proc], client: Client,
                   timeout: float = 60.0) -> dict[int, list[str]]:
    """Each member's applied sequence, once they are all equal and hold every
    acked write, or as they are after `timeout` (the checks then say why)."""
    acked = {d for d, w in client.writes.items() if w.acked is not None}
    seqs: dict[int, list[str]] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            seqs = {p.nid: await p.entries() for p in procs}
        except (ConnectionError, TimeoutError):
            await asyncio.sleep(0.3)
            continue
        first = next(iter(seqs.values()))
        if all(s == first for s in seqs.values()) and acked <= set(first):
            break
        await asyncio.sleep(0.3)
    return seqs


async def ensure_member(crasher: Crasher) -> None:
    """Node MOVER back in the configuration, so all four are checked."""
    async with asyncio.timeout(60):
        while True:
            leader, st = await crasher.leader()
            if MOVER in st["voters"]:
                return
            try:
                await leader.call(op="add_member", node=MOVER, timeout=10)
            except (ConnectionError, TimeoutError):
                pass
            await asyncio.sleep(0.2)


async def test_kill9_at_rolls_snapshots_installs_and_membership_changes(cluster):
    c: ProcCluster = cluster(n=4, snapshot_every=SNAPSHOT_EVERY,
                             extra_args=("--segment-bytes", str(SEGMENT_BYTES)))
    for nid in (1, 2, 3):
        await c.procs[nid].start()
    await c.procs[MOVER].start(voters="1,2,3")  # joins empty, added in a membership cycle
    client = Client(c)
    crasher = Crasher(c, client)
    load = asyncio.ensure_future(client.run())
    failure: BaseException | None = None
    try:
        await client.progress(50)
        for k in range(CYCLES):
            await crasher.cycle(k)
            dead = [p.nid for p in c.procs.values() if p.popen.poll() is not None]
            assert not dead, f"cycle {k}: nodes {dead} exited on their own (see logs)"
        await ensure_member(crasher)
    except BaseException as exc:
        failure = exc
    finally:
        client.stop.set()
        await asyncio.gather(load, return_exceptions=True)
    summary = crasher.summary(client)
    print("\ncrash test:", json.dumps(summary))
    if path := os.environ.get("RAFT_CRASH_REPORT"):
        with open(path, "w") as f:
            json.dump({**summary, "kill_log": crasher.kills}, f, indent=1)
    if failure is not None:
        raise AssertionError(f"after {len(crasher.kills)} kills: {failure!r} "
                             f"(node logs in {c.tmp})") from failure
    seqs = await converge(list(c.procs.values()), client)
    assert sorted(seqs) == sorted(c.procs), "a member did not answer"
    for nid, seq in seqs.items():
        errors = check_history(seq, client.writes)
        assert not errors, f"node {nid}: {len(errors)} errors: {errors[:10]}"
    first = seqs[1]
    for nid, seq in seqs.items():
        assert seq == first, f"nodes 1 and {nid} applied different sequences"
    assert len(first) >= summary["acked"] > 0
    assert summary["kills"] >= CYCLES and summary["restarts"] == summary["kills"]

"""Real Raft logs for the audit tests, made by real `python -m raft.node` processes.

One run: 3 voters under load, two leader transfers, snapshots every 40
entries (so COMPACT records and, for the joiner, a snapshot install), node 4
added and node 3 removed (membership change), then a clean stop. Every write
the client saw acknowledged goes to `acked.jsonl` in the audit's format, with
the index the node returned.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

from tests.raft.test_process_raft import ProcCluster

WRITES_PER_PHASE = 60


class AckingCluster(ProcCluster):
    """ProcCluster that also keeps the index each acknowledged write got."""

    def __init__(self, tmp: Path, **kw) -> None:
        super().__init__(tmp, **kw)
        self.lines: list[dict] = []

    async def write(self, data: str, timeout: float = 40.0) -> None:
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
                    self.lines.append({"group": "g0", "data": data, "index": resp["index"],
                                       "retried": data in self.retried})
                    return
                if resp["err"] != "not_leader":
                    self.retried.add(data)
                await asyncio.sleep(0.02)


async def _change(c: ProcCluster, **req) -> None:
    async with asyncio.timeout(40):
        while True:
            resp = await (await c.leader()).call(**req)
            if resp["ok"]:
                return
            await asyncio.sleep(0.1)


async def _writes(c: AckingCluster, prefix: str, n: int = WRITES_PER_PHASE) -> None:
    async def one(k: int) -> None:
        await c.write(f"{prefix}{k}")
    for lo in range(0, n, 4):
        await asyncio.gather(*(one(k) for k in range(lo, min(n, lo + 4))))


async def _transfer(c: AckingCluster) -> None:
    leader = await c.leader()
    to = next(p.nid for p in c.up() if p is not leader)
    await _change(c, op="transfer", node=to)
    async with asyncio.timeout(30):
        while (await c.leader()).nid != to:
            await asyncio.sleep(0.05)


async def make_logs(tmp: Path) -> dict:
    c = AckingCluster(tmp, n=4, snapshot_every=40)
    try:
        for nid in (1, 2, 3):
            await c.procs[nid].start()
        await _writes(c, "a")
        await _transfer(c)
        await _writes(c, "b")
        await _transfer(c)
        await c.procs[4].start(voters="1,2,3")
        await _change(c, op="add_member", node=4)
        await _writes(c, "c")
        if (await c.leader()).nid == 3:
            await _transfer(c)
        await _change(c, op="remove_member", node=3)
        await _writes(c, "d")
        members = [c.procs[n] for n in (1, 2, 4)]
        await c.until_converged(members)
        await _writes(c, "e", 20)  # the joiner holds entries of its own, not just a snapshot
        await c.until_converged(members)
    finally:
        for p in c.procs.values():
            if p.popen and p.popen.poll() is None:
                if p.conn:
                    p.conn.close()
                    p.conn = None
                p.popen.send_signal(signal.SIGTERM)
                p.popen.wait(timeout=30)
        c.close()
    acked = tmp / "acked.jsonl"
    acked.write_text("".join(json.dumps(x) + "\n" for x in c.lines))
    return {"dirs": [tmp / f"n{n}" for n in (1, 2, 3, 4)], "acked": acked,
            "writes": len(c.lines)}

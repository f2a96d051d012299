"""Busy groups with a watchdog: where a run that stops making progress is stuck.

    TREE=$PWD PYTHONPATH=$PWD python benchmarks/raft_busy_watch.py 1000 60000 2048

Three members as in `benchmarks/raft_bench.py` (node 1 here leads every group,
nodes 2 and 3 are `python -m raft.node`); `count` 128 B proposals over `groups`
with `window` in flight. When no entry is applied for STALL_S seconds (env,
default 30) it prints, for the groups with unresolved proposals, node 1's view
(state, log, pending indexes, followers' progress) and the other members' status
over their control ports; after three such dumps it gives up. At the end: rate,
errors and how many groups node 1 still leads. Found the deposed-leader stall of
2026-11-27 (docs/raft.md, Benchmarks). TREE names the source tree (A/B runs).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import tempfile
import time

root = os.environ.get("TREE", os.getcwd())
sys.path.insert(0, root)
sys.path.insert(0, os.path.join(root, "benchmarks"))

import raft_bench as rb  # noqa: E402

STALL_S = float(os.environ.get("STALL_S", "30"))


def control(port: int, req: dict) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall((json.dumps(req) + "\n").encode())
        return json.loads(s.makefile().readline())


def dump(c: rb.OurCluster, ports: list[int], applied: int) -> None:
    mr = c.mr
    assert mr is not None
    stuck = [g for g in c.groups if mr._groups[g].pending or mr._groups[g].props]
    print(f"=== no progress at {applied} applied; load {os.getloadavg()[0]:.1f}; "
          f"{len(stuck)} groups with pending proposals: {stuck[:10]}", flush=True)
    for peer, link in mr.transport._links.items():
        lanes = [(lane.kind, lane.stream is not None, len(lane.queue), lane.queued_bytes)
                 for lane in link.lanes]
        print(f"link {peer}: (lane, up, queued batches, bytes) {lanes}")
    for g in stuck[:5]:
        grp = mr._groups[g]
        print("node 1", mr.status(g), "pending", sorted(grp.pending)[:5], len(grp.pending))
        for nid, pr in grp.core.prs.items():
            print(f"   progress {nid}: match {pr.match} next {pr.next} {pr.state.name}")
        for port in ports:
            try:
                print("   member", control(port, {"op": "status", "group": g}).get("status"))
            except OSError as exc:
                print("   member", port, exc)
    sys.stdout.flush()


async def main(groups: int, count: int, window: int) -> None:
    ports: list[int] = []
    popen = rb.subprocess.Popen

    def spy(cmd, *a, **kw):  # noqa: ANN001, ANN202 - records the control ports
        if "--control-port" in cmd:
            ports.append(int(cmd[cmd.index("--control-port") + 1]))
        return popen(cmd, *a, **kw)
    rb.subprocess.Popen = spy
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP", "/dev/shm")) as tmp:
        c = rb.OurCluster(tmp, groups)
        t0 = time.time()
        try:
            mr = await c.start()
            await rb.drive(mr, c.groups, 128, max(500, groups), window)
            task = asyncio.ensure_future(rb.drive(mr, c.groups, 128, count, window))
            last, since, dumps = -1, time.time(), 0
            while not task.done():
                await asyncio.sleep(1)
                if mr.stats.entries_applied != last:
                    last, since = mr.stats.entries_applied, time.time()
                elif time.time() - since > STALL_S:
                    dump(c, ports, last)
                    dumps, since = dumps + 1, time.time()
                    if dumps == 3:
                        task.cancel()
                        break
            r = None if task.cancelled() else await task
            led = sum(mr.leader(g) == 1 for g in c.groups)
            print(f"result {json.dumps(r)}; node 1 leads {led} of {groups}; "
                  f"{time.time() - t0:.0f} s; load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            await c.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))

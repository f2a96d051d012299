"""Heartbeats a leader sends while busy groups commit (issue 6, busy groups).

    TREE=$PWD PYTHONPATH=$PWD python benchmarks/raft_busy_beats.py 1000 20000 2048

Three members as in `benchmarks/raft_bench.py` (node 1 here leads every group,
nodes 2 and 3 are `python -m raft.node`); after a warm-up, `count` 128 B
proposals spread over `groups` with `window` in flight; the leader's transport
send calls are wrapped to count messages by type. Prints rate, p50, errors,
CPU per commit of each member and heartbeats per 1,000 commits. TREE names the
source tree (for an A/B against a `git archive` of another revision).
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import tempfile

root = os.environ.get("TREE", os.getcwd())
sys.path.insert(0, root)
sys.path.insert(0, os.path.join(root, "benchmarks"))

import psutil  # noqa: E402
import raft_bench as rb  # noqa: E402


async def main(groups: int, count: int, window: int) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP", "/dev/shm")) as tmp:
        c = rb.OurCluster(tmp, groups)
        try:
            mr = await c.start()
            await rb.drive(mr, c.groups, 128, max(500, groups), window)
            counts: collections.Counter[str] = collections.Counter()
            t = mr.transport
            for name in ("send", "send_now", "send_lazy"):
                orig = getattr(t, name, None)
                if orig is None:
                    continue

                def wrap(msgs: list, _orig=orig) -> object:  # noqa: ANN001
                    for m in msgs:
                        counts[m.type.name] += 1
                    return _orig(msgs)
                setattr(t, name, wrap)
            ps = [psutil.Process()] + [psutil.Process(p.pid) for p in c.procs]
            c0 = rb.cpu_times(ps)
            r = await rb.drive(mr, c.groups, 128, count, window)
            cpu = [1e6 * (a - b) / r["count"] for a, b in zip(rb.cpu_times(ps), c0, strict=True)]
            print(f"{os.path.basename(root)}: {r['rate']:.0f}/s p50 {r['p50_ms']:.1f} ms "
                  f"errors {r['errors']} CPU/commit {'/'.join(f'{x:.0f}' for x in cpu)} us; "
                  f"leader sent HEARTBEAT {counts['HEARTBEAT']} APP {counts['APP']}: "
                  f"{1000 * counts['HEARTBEAT'] / r['count']:.0f} heartbeats per 1k commits; "
                  f"load {os.getloadavg()[0]:.1f}")
        finally:
            await c.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))

"""Apply throughput of the stream state machine over LmdbStore and MemStore (no Raft, no I/O
besides LMDB): `python benchmarks/js_apply_bench.py` from the worktree root."""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from node.jetstream import config, ops  # noqa: E402
from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv  # noqa: E402
from node.jetstream.store.memstore import MemStore  # noqa: E402
from node.jetstream.stream import Stream  # noqa: E402

cfg, p = config.parse_request(b'{"name":"B","subjects":["b.*"]}')
cfg = config.check_create("B", cfg, p, {})[0]
N = 20000
# "sync points": commits without fsync, a durable sync point every 0.25 s (NodeEnv's
# default since the perf branch); "no sync points": tests only, not crash-safe.
CASES = (("lmdb sync points batch=1", 1, True), ("lmdb sync points batch=100", 100, True),
         ("lmdb no sync points batch=100", 100, False), ("mem batch=100", 100, None))
for label, batch, sync in CASES:
    with tempfile.TemporaryDirectory() as d:
        env = NodeEnv(d, sync=sync) if sync is not None else None
        store = LmdbStore(env, "B") if env else MemStore("B")
        s = Stream(cfg, store)
        n = N if batch > 1 else 2000
        entries = [(i, ops.encode(ops.StreamMsg(i, f"b.{i % 10}", "r", b"", b"x" * 128)))
                   for i in range(1, n + 1)]
        t = time.perf_counter()
        for k in range(0, n, batch):
            s.apply_batch(entries[k:k + batch])
        el = time.perf_counter() - t
        print(f"{label}: {n / el:,.0f} msgs/s ({el / n * 1e6:.0f} us/msg)")
        if env:
            env.close()

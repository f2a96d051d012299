"""CPU per applied message of the stream state machine over LmdbStore and MemStore: what every
replica does when a committed publish entry is applied (no Raft, no network, no fsync).

    PYTHONPATH=$PWD taskset -c 1 python benchmarks/js_apply_bench.py
    JETRAFT_ROOT=/tmp/base taskset -c 1 python benchmarks/js_apply_bench.py   # another checkout
    PROFILE=plain python benchmarks/js_apply_bench.py                       # cProfile one case

Figures are process CPU time (the LMDB sync-point thread included) per message, best of
REPEAT runs, for batches of 1 entry (a sync publish: one entry per Raft round) and of 100
(async publishing: a group commit applies a run of entries in one LMDB transaction). Scenarios:
- plain: a publish with a reply subject (its PubAck), no headers, 10 subjects;
- msgid: the same with a `Nats-Msg-Id` header (deduplication index);
- kv: a KV-like stream (max_msgs_per_subject 1, 1,000 keys: every put removes the older value);
- maxage: a stream with max_age (expiry looks at the oldest message on every entry);
- mem: plain over MemStore.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import tempfile
import time

ROOT = os.environ.get("JETRAFT_ROOT") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from node.jetstream import config, ops  # noqa: E402
from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv  # noqa: E402
from node.jetstream.store.memstore import MemStore  # noqa: E402
from node.jetstream.stream import Stream  # noqa: E402

N = int(os.environ.get("N", "20000"))
REPEAT = int(os.environ.get("REPEAT", "3"))
T0 = 1_700_000_000_000_000_000
CONFIGS = {
    "plain": b'{"name":"B","subjects":["b.>"]}',
    "msgid": b'{"name":"B","subjects":["b.>"]}',
    "kv": b'{"name":"B","subjects":["b.>"],"max_msgs_per_subject":1,"allow_rollup_hdrs":true}',
    "maxage": b'{"name":"B","subjects":["b.>"],"max_age":3600000000000}',
    "mem": b'{"name":"B","subjects":["b.>"],"storage":"memory"}',
}


def _cfg(name: str) -> dict:
    cfg, present = config.parse_request(CONFIGS[name])
    return config.check_create("B", cfg, present, {})[0]


def _entries(name: str, n: int) -> list[tuple[int, bytes]]:
    out = []
    for i in range(1, n + 1):
        subject = f"b.{i % 1000}" if name == "kv" else f"b.{i % 10}"
        hdr = f"NATS/1.0\r\nNats-Msg-Id: id-{i}\r\n\r\n".encode() if name == "msgid" else b""
        msg = ops.StreamMsg(T0 + i * 1000, subject, f"_INBOX.abcdefghijklmnop.{i}", hdr,
                            b"x" * 128)
        out.append((i, ops.encode(msg)))
    return out


def _run(name: str, batch: int, n: int, profile: bool = False) -> float:
    with tempfile.TemporaryDirectory() as d:
        env = None if name == "mem" else NodeEnv(d)
        stream = Stream(_cfg(name), MemStore("B") if env is None else LmdbStore(env, "B"))
        entries = _entries(name, n)

        def go() -> None:
            for k in range(0, n, batch):
                stream.apply_batch(entries[k:k + batch])

        start = time.process_time()
        if profile:
            prof = cProfile.Profile()
            prof.runcall(go)
            pstats.Stats(prof).sort_stats("tottime").print_stats(35)
        else:
            go()
        used = time.process_time() - start
        assert stream.last_seq == n, (name, stream.last_seq)
        if env is not None:
            env.close()
        return used / n * 1e6


def main() -> None:
    only = os.environ.get("PROFILE")
    if only:
        _run(only, int(os.environ.get("BATCH", "100")), N, profile=True)
        return
    print(f"root {ROOT}; N={N}; best of {REPEAT}; CPU us per message")
    for name in CONFIGS:
        for batch in (1, 100):
            n = N if batch > 1 else N // 5
            best = min(_run(name, batch, n) for _ in range(REPEAT))
            print(f"{name:7s} batch={batch:<4d} {best:6.1f} us/msg", flush=True)


if __name__ == "__main__":
    main()

"""kill -9 a process applying a stream log to LMDB, at random moments, then restart.

After each kill: the environment opens, every stored record passes its CRC, the durable
`applied` index is at least the last one the child reported synced (commits are not fsynced;
the store reopens at its last sync point), and re-applying the
log from the start (as the Raft driver does from its last snapshot) ends in exactly the state
of an uninterrupted run. Power loss (unsynced pages dropped) needs the FUSE layer and is not
covered here: the page cache survives kill -9.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

from node.jetstream.store.base import file_size
from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Stream
from tests.jetstream.crash_log import entries, stream_config

ROOT = Path(__file__).resolve().parents[2]
KILLS = 6


def _reference() -> Stream:
    stream = Stream(stream_config(), MemStore("C", sizer=file_size))
    stream.apply_batch(entries())
    return stream


def _run_child_until_killed(path: Path, rng: random.Random) -> int:
    """Start the child, kill -9 it after a random number of reported batches; returns the
    last index it reported as committed (0 if none)."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.jetstream.crash_child", str(path)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    reported, target = 0, rng.randint(1, 14)
    for n, line in enumerate(proc.stdout, start=1):
        if line.strip() == "done":
            break
        reported = int(line)
        if n >= target:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    return reported


def test_kill_9_during_applies_loses_nothing_committed(tmp_path: Path) -> None:
    rng = random.Random(8)
    path = tmp_path / "env"
    for _ in range(KILLS):
        reported = _run_child_until_killed(path, rng)
        env = NodeEnv(str(path))
        try:
            stream = Stream(stream_config(), LmdbStore(env, "C"))
            assert stream.applied >= reported
            for seq in stream.store.seqs():
                assert stream.store.load(seq) is not None  # CRC checked on every load
        finally:
            env.close()
    env = NodeEnv(str(path))
    try:
        stream = Stream(stream_config(), LmdbStore(env, "C"))
        stream.apply_batch(entries())  # the rest, as a restarted node re-applies its log
        ref = _reference()
        assert stream.state() == ref.state()
        assert [stream.store.load(s) for s in stream.store.seqs()] == \
            [ref.store.load(s) for s in ref.store.seqs()]
        assert list(stream.store.subjects()) == list(ref.store.subjects())
    finally:
        env.close()


def test_python_memory_does_not_grow_with_the_stream(tmp_path: Path) -> None:
    """LMDB holds the messages; the stream and store keep no per-message Python objects, so
    the Python heap after 20,000 messages is what it was after 2,000 (tracemalloc)."""
    import tracemalloc

    from node.jetstream import ops

    env = NodeEnv(str(tmp_path / "env"), sync=False)
    try:
        stream = Stream(stream_config() | {"max_msgs": -1, "max_msgs_per_subject": -1},
                        LmdbStore(env, "C"))
        payload = b"z" * 1024

        def fill(first: int, last: int) -> None:
            for start in range(first, last, 500):
                stream.apply_batch([(i, ops.encode(ops.StreamMsg(i, f"c.{i % 1000}", "", b"",
                                                                 payload)))
                                    for i in range(start, min(start + 500, last))])

        fill(1, 2001)
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        fill(2001, 20_001)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
        assert stream.store.msgs() == 20_000
        assert grown < 512 * 1024, f"Python heap grew by {grown} bytes"
    finally:
        env.close()

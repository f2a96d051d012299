"""Nothing per sync grows with the number of groups: the WAL's work for a sync is
counted in executed Python lines (not time), with 100 and with 10,000 groups."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

from raft.storage import NodeLog
from raft.types import ConfState, Entry, HardState, SnapshotMeta

CS = ConfState((1, 2, 3), ())


def traced(fn: Callable[[], object]) -> tuple[int, dict[str, int]]:
    """Run fn; return (lines executed, calls per function name)."""
    lines = 0
    calls: dict[str, int] = {}

    def tracer(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
        elif event == "call":
            calls[frame.f_code.co_name] = calls.get(frame.f_code.co_name, 0) + 1
        return tracer

    # No garbage collection inside: a finalizer of some earlier test's object (an xdist
    # worker runs many test files in one process) would add its lines to the count.
    gc.collect()
    gc.disable()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
        gc.enable()
    return lines, calls


def many_groups(tmp_path, n: int) -> NodeLog:
    """n groups, each with entries in the oldest segment and later ones."""
    wal = NodeLog(str(tmp_path / f"n{n}"), segment_bytes=4 << 20)
    names = [f"g{k}" for k in range(n)]
    for name in names:
        wal.apply_snapshot(name, SnapshotMeta(1, 1, CS))
        wal.set_hard_state(name, HardState(1, 1, 1))
    i = 2
    while len(wal.segments()) < 3:
        for name in names:
            wal.append(name, [Entry(1, i, data=b"x" * 100)])
        i += 1
    wal.sync()
    return wal


def one_round(wal: NodeLog) -> Callable[[], None]:
    """What a drain pass does for 3 changed groups: append, hard state, compact, sync."""

    def run() -> None:
        for name in ("g0", "g1", "g2"):
            g = wal.group(name)
            wal.append(name, [Entry(2, g.last_index() + 1, data=b"y" * 100)])
            wal.set_hard_state(name, HardState(2, 1, g.last_index()))
        wal.compact("g1", wal.group("g1").first_index())
        wal.sync()
        wal.pinning_groups(limit=8)

    return run


def test_a_sync_does_the_same_work_for_100_and_10000_groups(tmp_path):
    small, big = many_groups(tmp_path, 100), many_groups(tmp_path, 10_000)
    # the oldest segment is pinned by most groups (rolls copied some short tails forward)
    assert len(big.pinning_groups()) > 5_000 and len(big.segments()) >= 3
    one_round(small)()  # warm both up (first reads, caches)
    one_round(big)()
    lines_small, _ = traced(one_round(small))
    lines_big, _ = traced(one_round(big))
    assert lines_small == lines_big, (lines_small, lines_big)
    assert len(big.pinning_groups(limit=8)) == 8
    small.close()
    big.close()


def test_a_roll_reencodes_only_groups_that_changed_and_skips_dropped_ones(tmp_path):
    wal = NodeLog(str(tmp_path), segment_bytes=1 << 20)
    for k in range(2_000):
        wal.apply_snapshot(f"g{k}", SnapshotMeta(1, 1, CS))
        wal.set_hard_state(f"g{k}", HardState(1, 1, 1))
    wal.append("busy", [Entry(1, 1, data=b"z" * (1 << 20))])
    wal.append("busy", [Entry(1, 2, data=b"z")])  # first roll: every group encoded once
    wal.sync()
    wal.set_hard_state("g7", HardState(2, 7, 1))
    wal.drop_group("g8")
    wal.append("busy", [Entry(1, 3, data=b"z" * (1 << 20))])
    before = wal.segments()
    _, calls = traced(lambda: wal.append("busy", [Entry(1, 4, data=b"z")]))
    assert len(wal.segments()) == len(before) + 1  # it rolled
    encodes = calls.get("encode", 0) + calls.get("encode_hard_state", 0)
    assert encodes <= 4, calls  # g7's two records, busy's hard state, and the entry itself
    wal.sync()
    wal.close()
    wal = NodeLog(str(tmp_path), segment_bytes=1 << 20)
    assert "g8" not in wal.groups() and "g7" in wal.groups()
    assert wal.group("g7").initial_state()[0] == HardState(2, 7, 1)
    wal.close()


def test_idle_groups_release_old_segments_without_snapshots(tmp_path):
    wal = NodeLog(str(tmp_path), segment_bytes=16 << 10)
    idle = [f"idle{k}" for k in range(300)]
    for name in idle:  # a few entries each, then silence
        wal.apply_snapshot(name, SnapshotMeta(1, 1, CS))
        wal.append(name, [Entry(1, i, data=name.encode() * 3) for i in (2, 3, 4)])
    wal.sync()
    first = wal.segments()[0]
    for i in range(1, 3_000):  # one busy group, compacting itself as the driver would
        wal.append("busy", [Entry(1, i, data=b"b" * 100)])
        if i % 100 == 0:
            wal.compact("busy", i - 50)
            wal.sync()
    wal.sync()
    assert wal.segments()[0] > first and wal.stats.entries_relocated > 0
    assert wal.stats.segments_deleted > 0
    # checkpoints (300 groups, about 18 KiB) are bigger than a segment here: no roll storm
    assert len(wal.segments()) + wal.stats.segments_deleted < 40
    wal.close()
    wal = NodeLog(str(tmp_path), segment_bytes=16 << 10)
    for name in idle:
        g = wal.group(name)
        assert (g.first_index(), g.last_index()) == (2, 4)
        assert [e.data for e in g.entries(2, 5)] == [name.encode() * 3] * 3
    wal.close()

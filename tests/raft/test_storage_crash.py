"""Issue 6 defects 2-5 and the fail-stop policy, on the real NodeLog and snapshot files
over a disk that crashes where the test says and loses what was never fsynced."""

from __future__ import annotations

import zlib

import pytest

from raft import snapfile
from raft.disk import StorageFatalError
from raft.storage import NodeLog
from raft.types import ConfState, Entry, HardState, SnapshotMeta
from tests.raft.crashdisk import Crash, CrashDisk, keep_all, lose_all, tear_oldest

WAL = "/n1/wal"
SNAP = "/n1/snap"
CS = ConfState((1, 2, 3), ())
POLICIES = (lose_all, keep_all, tear_oldest)


def entry(i: int, term: int = 1, size: int = 200) -> Entry:
    return Entry(term, i, data=bytes([i % 251]) * size)


def new_disk() -> CrashDisk:
    disk = CrashDisk()
    disk.makedirs(WAL)
    return disk


def check_entries(wal: NodeLog, group: str, upto: int, term: int = 1) -> None:
    g = wal.group(group)
    assert g.last_index() >= upto
    for e in g.entries(g.first_index(), upto + 1) if upto else []:
        assert e.data == entry(e.index).data and e.term == term


# ---- defect 2: a segment deleted before the COMPACT that justifies it is durable -------


def test_segment_is_deleted_only_by_a_compact_that_is_already_durable():
    disk = new_disk()
    wal = NodeLog(WAL, segment_bytes=4096, disk=disk)
    wal.apply_snapshot("a", SnapshotMeta(1, 1, CS))
    i = 2
    while len(wal.segments()) < 3:
        wal.append("a", [entry(i)])
        i += 1
    wal.sync()
    last = i - 1
    first_seg_top = wal._seg_max[wal.segments()[0]]["a"]  # noqa: SLF001
    wal.append("a", [entry(last + 1)])
    # While the write of that batch is in flight (the driver's sync_async runs it in a
    # thread), the snapshot task compacts past the first segment on the loop.
    disk.hooks["fsync"] = lambda: wal.compact("a", first_seg_top + 2, CS)
    wal.sync()
    assert wal.segments()[0] == 1, "deleted by a COMPACT that is still only in memory"
    restarted = NodeLog(WAL, segment_bytes=4096, disk=disk.crashed(lose_all))
    g = restarted.group("a")
    assert (g.first_index(), g.last_index()) == (2, last + 1)
    check_entries(restarted, "a", last + 1)
    # The next sync makes the COMPACT durable, and only then the segment goes.
    wal.sync()
    assert wal.segments()[0] > 1
    restarted = NodeLog(WAL, segment_bytes=4096, disk=disk.crashed(lose_all))
    assert restarted.group("a").first_index() == first_seg_top + 3


# ---- defect 3: a crash inside a batch that crosses a segment roll ---------------------


def roll_workload(disk: CrashDisk, acked: list[int]) -> None:
    wal = NodeLog(WAL, segment_bytes=4096, disk=disk)
    wal.apply_snapshot("a", SnapshotMeta(1, 1, CS))
    wal.sync()
    acked.append(1)
    i = 2
    for _ in range(3):  # each batch crosses one roll
        seg = wal.segments()[-1]
        while wal.segments()[-1] == seg:
            wal.append("a", [entry(i)])
            i += 1
        wal.append("a", [entry(i)])
        i += 1
        wal.sync()
        acked.append(i - 1)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.__name__)
def test_crash_anywhere_in_a_batch_across_a_roll_recovers_every_acked_entry(policy):
    probe = new_disk()
    roll_workload(probe, [])
    for crash_at in range(1, probe.ops + 1):
        disk = new_disk()
        disk.crash_at = crash_at
        acked: list[int] = []
        with pytest.raises(Crash):
            roll_workload(disk, acked)
        wal = NodeLog(WAL, segment_bytes=4096, disk=disk.crashed(policy))
        check_entries(wal, "a", max(acked, default=0))
        # and it keeps working where it stopped
        g = wal.group("a")
        wal.append("a", [entry(g.last_index() + 1)])
        wal.sync()


def copy_workload(disk: CrashDisk, acked: list[int]) -> None:
    """An idle group's short tail is copied forward at each roll a busy group causes."""
    wal = NodeLog(WAL, segment_bytes=4096, disk=disk)
    wal.append("idle", [entry(i, size=30) for i in range(1, 11)])
    wal.sync()
    acked.append(10)
    for i in range(1, 80):
        wal.append("busy", [entry(i)])
        if i % 7 == 0:
            wal.sync()
            wal.compact("busy", i - 3)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.__name__)
def test_a_torn_run_of_copied_entries_cuts_nothing(policy):
    probe = new_disk()
    copy_workload(probe, [])
    wal = NodeLog(WAL, disk=probe.crashed(keep_all))
    assert wal.segments()[0] > 1  # the copies let the first segment go
    for crash_at in range(1, probe.ops + 1):
        disk = new_disk()
        disk.crash_at = crash_at
        acked: list[int] = []
        with pytest.raises(Crash):
            copy_workload(disk, acked)
        wal = NodeLog(WAL, segment_bytes=4096, disk=disk.crashed(policy))
        g = wal.group("idle")
        if acked:
            assert g.last_index() == 10, crash_at
        for e in g.entries(g.first_index(), g.last_index() + 1):
            assert e.data == entry(e.index, size=30).data


# ---- defect 4: a received snapshot committed before its WAL records are durable ---------


def install_workload(disk: CrashDisk) -> None:
    """A follower at snapshot 10 (its own) receives and installs snapshot 50."""
    disk.makedirs(SNAP)
    wal = NodeLog(WAL, disk=disk)
    wal.apply_snapshot("g", SnapshotMeta(1, 1, CS))
    wal.append("g", [entry(i) for i in range(2, 13)])
    wal.set_hard_state("g", HardState(1, 1, 12))
    wal.sync()
    part = snapfile.new_part(SNAP, "g", disk)
    fd = disk.open(part, create=True)
    disk.pwrite(fd, b"image at 10", 0)
    disk.close(fd)
    size, crc = snapfile.seal(part, disk)
    snapfile.commit(SNAP, "g", SnapshotMeta(10, 1, CS), part, size, crc, disk)
    wal.compact("g", 10, CS)
    wal.sync()
    # received: the .part is written and fsynced by the Receiver
    rx = snapfile.Receiver(SNAP, "g", disk)
    image = b"image at 50"
    for piece in (snapfile.encode_head(SnapshotMeta(50, 2, CS), len(image),
                                       zlib.crc32(image)), image):
        rx.feed(piece)
    rx.finish()
    stored = snapfile.stage(SNAP, "g", rx.meta, rx.path, rx.size, rx.crc, disk)
    wal.apply_snapshot("g", stored.meta)
    wal.set_hard_state("g", HardState(2, 0, 50))
    wal.sync()
    snapfile.promote(SNAP, "g", disk)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.__name__)
def test_snapshot_install_crash_anywhere_leaves_file_and_log_agreeing(policy):
    probe = new_disk()
    install_workload(probe)
    seen = set()
    for crash_at in range(1, probe.ops + 2):
        disk = new_disk()
        disk.crash_at = crash_at
        try:
            install_workload(disk)
        except Crash:
            pass
        after = disk.crashed(policy)
        wal = NodeLog(WAL, disk=after)
        log_snap = wal.group("g").snapshot().meta.index
        stored = snapfile.load(SNAP, "g", disk=after, log_index=log_snap)
        if log_snap > 1:
            assert stored is not None and stored.meta.index == log_snap, (crash_at, log_snap)
            fd = after.open(stored.path)
            assert after.pread(fd, 100, 0) == f"image at {log_snap}".encode()
        hs = wal.group("g").initial_state()[0]
        assert hs.commit >= log_snap
        seen.add(log_snap)
    assert seen == {0, 1, 10, 50}  # crashes before, during and after each step


# ---- defect 5: repair=True must make its unlinks durable ------------------------------


def test_repair_drops_later_segments_durably():
    disk = new_disk()
    wal = NodeLog(WAL, segment_bytes=1024, disk=disk)
    for i in range(1, 61):
        wal.append("G", [Entry(1, i, data=bytes([i]) * 50)])
    wal.sync()
    segs = wal.segments()
    wal.close()
    # The first segment: with two or more left the restart rolls anyway, and that
    # roll's directory fsync would make even bare unlinks durable.
    mid = f"{WAL}/wal-{segs[0]:016d}.log"
    disk.damage(mid, len(disk.file(mid)) - 20)
    # (big segments from now on: no roll, whose directory fsync would hide the bug)
    wal = NodeLog(WAL, segment_bytes=1 << 20, disk=disk, repair=True)
    last = wal.group("G").last_index()
    assert last < 60
    # the node rejoins: the new leader's entries are fsynced and acknowledged
    wal.append("G", [Entry(5, i, data=b"NEW") for i in range(last + 1, last + 4)])
    wal.sync()
    wal = NodeLog(WAL, segment_bytes=1024, disk=disk.crashed(lose_all))
    g = wal.group("G")
    assert g.last_index() == last + 3
    assert [g.term(i) for i in range(last + 1, last + 4)] == [5, 5, 5]


# ---- fail-stop: a failed write or fsync poisons the log ---------------------------------


@pytest.mark.parametrize("kind", ["pwrite", "fsync", "fsync_dir"])
def test_failed_write_or_fsync_is_fatal_and_refuses_later_writes(kind):
    disk = new_disk()
    wal = NodeLog(WAL, disk=disk)
    wal.append("G", [entry(1)])
    wal.sync()
    disk.fail = (kind, disk._kinds.get(kind, 0) + 1)  # noqa: SLF001
    if kind == "fsync_dir":
        wal._dir_dirty = True  # noqa: SLF001 (as after a roll)
    wal.append("G", [entry(2)])
    with pytest.raises(StorageFatalError):
        wal.sync()
    disk.fail = None  # the disk "works" again: the log must still not trust it
    for write in (lambda: wal.append("G", [entry(3)]),
                  lambda: wal.set_hard_state("G", HardState(1, 1, 1)),
                  lambda: wal.compact("G", 1),
                  wal.sync):
        with pytest.raises(StorageFatalError):
            write()
    ops = disk.ops
    wal.close()
    assert disk.ops == ops, "close() after a failure must not write"


# ---- a restart finds a segment whose opening checkpoint the crash took (sim seed 444) --


def test_restart_after_a_lost_roll_writes_no_segment_without_checkpoint():
    """The batch crossing a roll fsyncs the old segment, then the crash takes
    the new one's first write: the new segment exists, empty. Had the restarted
    log written on in it, a truncation by a new leader would unpin the old
    segment and delete it, leaving a survivor with no COMPACT / HARD_STATE."""
    disk = new_disk()
    wal = NodeLog(WAL, segment_bytes=4096, disk=disk)
    wal.apply_snapshot("a", SnapshotMeta(1, 1, CS))
    wal.set_hard_state("a", HardState(1, 1, 1))
    wal.sync()
    i = 2
    while len(wal.segments()) < 2:
        wal.append("a", [entry(i)])
        i += 1
    last = i - 1
    # _write: fsync_dir (new segment), pwrite + the zero runway's pwrite (the batch passes
    # the old segment's runway) + fsync old segment, pwrite new: crash.
    disk.crash_at = disk.ops + 5
    with pytest.raises(Crash):
        wal.sync()
    # the crash hit the first write of the new file (offset 0)
    assert disk.log[-1].startswith("pwrite") and "@0+" in disk.log[-1], disk.log[-5:]
    disk = disk.crashed(lose_all)
    wal = NodeLog(WAL, segment_bytes=4096, disk=disk)
    top = wal.group("a").last_index()
    assert 2 <= top < last
    # A new leader (term 2) replaces everything after the snapshot: no entry of
    # the first segment is live any more, so the sync after it deletes that segment.
    wal.set_hard_state("a", HardState(2, 2, 1))
    wal.append("a", [Entry(2, k, data=b"new") for k in range(2, 6)])
    wal.sync()
    wal.sync()
    assert 1 not in wal.segments()
    wal = NodeLog(WAL, segment_bytes=4096, disk=disk.crashed(lose_all))
    g = wal.group("a")
    assert (g.first_index(), g.last_index()) == (2, 5)
    assert [g.term(k) for k in range(2, 6)] == [2, 2, 2, 2]
    assert g.initial_state()[0] == HardState(2, 2, 1)

"""Audit retention: with `archive_dir`, compaction moves obsolete WAL segments into
`<wal>/archive` (rename, both directories fsynced) instead of deleting them."""

from __future__ import annotations

import os

import pytest

from raft.storage import ARCHIVE_DIR, NodeLog, segment_name
from raft.types import Entry
from raft.wal import RecordType, Scanner
from tests.raft.crashdisk import Crash, CrashDisk, lose_all

WAL = "/n1/wal"


def workload(wal: NodeLog) -> None:
    for i in range(1, 121):
        wal.append("A", [Entry(1, i, data=b"a" * 100)])
        if i % 10 == 0:
            wal.sync()
    wal.compact("A", 100)
    wal.sync()
    wal.append("A", [Entry(1, 121, data=b"b")])  # life goes on after the archiving
    wal.sync()


def test_compaction_moves_segments_into_the_archive(tmp_path):
    wal = NodeLog(str(tmp_path), segment_bytes=2048, archive_dir=ARCHIVE_DIR)
    workload(wal)
    live = wal.segments()
    wal.close()
    archive = tmp_path / "archive"
    archived = sorted(int(n[4:20]) for n in os.listdir(archive))
    assert archived and archived == list(range(1, live[0]))
    assert not any((tmp_path / segment_name(s)).exists() for s in archived)
    # an offline reader gets every entry that left the live log, in order
    seen = []
    for seq in archived:
        with open(archive / segment_name(seq), "rb") as f:
            scan = Scanner(f.read())
            seen += [r.index for r in scan if r.type is RecordType.ENTRY]
            assert scan.error is None
    assert seen == list(range(1, len(seen) + 1)) and len(seen) >= 50
    # the live log recovers without looking at the archive
    wal = NodeLog(str(tmp_path), segment_bytes=2048, archive_dir=ARCHIVE_DIR)
    a = wal.group("A")
    assert (a.first_index(), a.last_index()) == (101, 121)
    wal.close()


def test_without_archive_dir_segments_are_deleted(tmp_path):
    wal = NodeLog(str(tmp_path), segment_bytes=2048)
    workload(wal)
    assert wal.stats.segments_deleted > 0
    wal.close()
    assert not (tmp_path / "archive").exists()


def test_a_crash_while_archiving_never_loses_a_segment():
    probe = CrashDisk()
    probe.makedirs(WAL)
    workload(NodeLog(WAL, segment_bytes=2048, disk=probe, archive_dir=ARCHIVE_DIR))
    first_retire = next(i for i, op in enumerate(probe.log, 1) if op.startswith("rename"))
    for crash_at in range(first_retire, probe.ops + 1):
        disk = CrashDisk()
        disk.makedirs(WAL)
        disk.crash_at = crash_at
        with pytest.raises(Crash):
            workload(NodeLog(WAL, segment_bytes=2048, disk=disk, archive_dir=ARCHIVE_DIR))
        after = disk.crashed(lose_all)
        names = set(after.listdir(WAL)) | set(after.listdir(f"{WAL}/archive"))
        seqs = {int(n[4:20]) for n in names if n.startswith("wal-")}
        # only the newest segments may vanish (created, directory not yet fsynced)
        assert seqs == set(range(1, max(seqs) + 1)), (crash_at, sorted(seqs))
        wal = NodeLog(WAL, segment_bytes=2048, disk=after, archive_dir=ARCHIVE_DIR)
        assert wal.group("A").last_index() >= 100
        wal.close()

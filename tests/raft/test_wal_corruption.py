"""Torn and corrupt WAL tails on restart, mid-log corruption, and the documented byte layout."""

from __future__ import annotations

import logging
import os
import shutil
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raft.storage import NodeLog, segment_name
from raft.types import Entry, HardState
from raft.wal import CorruptLogError, RecordType, Scanner, encode


def fill(path, n: int = 20, size: int = 50) -> NodeLog:
    wal = NodeLog(str(path))
    for i in range(1, n + 1):
        wal.append("G", [Entry(1, i, data=bytes([i % 256]) * size)])
        wal.set_hard_state("G", HardState(1, 1, i - 1))
        wal.sync()
    return wal


def only_segment(path) -> str:
    names = sorted(n for n in os.listdir(path) if n.startswith("wal-"))
    return os.path.join(path, names[-1])


def check_prefix(wal: NodeLog, upto: int, size: int = 50) -> None:
    g = wal.group("G")
    assert g.last_index() == upto
    for e in g.entries(1, upto + 1) if upto else []:
        assert e.data == bytes([e.index % 256]) * size and e.term == 1


def test_truncated_tail_recovers_valid_prefix(tmp_path, caplog):
    fill(tmp_path).close()
    seg = only_segment(tmp_path)
    size = os.path.getsize(seg)
    os.truncate(seg, size - 30)  # cut into the last record (the final HARD_STATE is 38 bytes)
    with caplog.at_level(logging.WARNING, logger="raft.storage"):
        wal = NodeLog(str(tmp_path))
    assert "short record" in caplog.text
    # the torn remainder (38 - 30 = 8 bytes: 29 + len("G") + 8 for the vote) is gone
    assert wal.stats.torn_bytes_truncated == 8
    assert os.path.getsize(seg) == size - 38
    check_prefix(wal, 20)
    assert wal.group("G").initial_state()[0].commit == 18  # last HARD_STATE was torn
    wal.append("G", [Entry(2, 21, data=b"after")])
    wal.sync()
    wal.close()
    wal = NodeLog(str(tmp_path))
    assert wal.stats.torn_bytes_truncated == 0
    assert wal.group("G").entries(21, 22)[0].data == b"after"


def test_bit_flip_in_last_record_detected_and_dropped(tmp_path, caplog):
    wal = fill(tmp_path)
    wal.append("G", [Entry(1, 21, data=b"Q" * 200)])
    wal.sync()
    wal.close()
    seg = only_segment(tmp_path)
    with open(seg, "r+b") as f:
        f.seek(os.path.getsize(seg) - 100)  # inside entry 21's payload
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x10]))
    with caplog.at_level(logging.WARNING, logger="raft.storage"):
        wal = NodeLog(str(tmp_path))
    assert "crc mismatch" in caplog.text
    assert wal.stats.torn_bytes_truncated > 200
    check_prefix(wal, 20)  # entry 21 is never served
    wal.append("G", [Entry(3, 21, data=b"new")])
    wal.sync()
    wal.close()
    wal = NodeLog(str(tmp_path))
    assert [(e.term, e.data) for e in wal.group("G").entries(21, 22)] == [(3, b"new")]


def test_zeroed_tail_is_the_end_of_the_log(tmp_path):
    # A segment's runway (zeros preallocated ahead of its records, and what a crash after
    # the file grew but before the data reached the disk leaves) ends the records cleanly:
    # nothing is truncated, appends go right after the last record and survive a restart.
    fill(tmp_path, n=5).close()
    seg = only_segment(tmp_path)
    end = os.path.getsize(seg)  # close() trims the runway
    with open(seg, "ab") as f:
        f.write(b"\0" * 4096)
    wal = NodeLog(str(tmp_path))
    assert wal.stats.torn_bytes_truncated == 0
    check_prefix(wal, 5)
    wal.append("G", [Entry(1, 6, data=bytes([6]) * 50)])
    wal.sync()
    assert os.path.getsize(seg) == end + 4096  # written inside the runway: no growth
    with open(seg, "rb") as f:
        assert f.read()[end : end + 2] == b"JR"
    wal.close()
    check_prefix(NodeLog(str(tmp_path)), 6)


def crash_image(src, dst) -> str:
    """A copy of the log directory as a power cut would leave it (the files' bytes)."""
    shutil.copytree(src, dst)
    return only_segment(dst)


@pytest.mark.parametrize("kept", [0, 1, 17, "all-but-1"])
def test_a_write_torn_inside_the_preallocated_runway_recovers(tmp_path, kept):
    """The node dies while a batch is written into the zeros ahead of the records: the
    file holds the acked records, part of the batch, then zeros. Recovery keeps every
    synced entry, serves nothing of the torn batch and appends after the synced ones."""
    live = tmp_path / "live"
    wal = fill(live, n=5)  # synced: 5 entries and their hard states
    seg = only_segment(live)
    synced_end = wal._cur_size
    size = os.path.getsize(seg)
    assert size >= synced_end + 4096  # the runway is there (never trimmed: no close)
    rec = encode(RecordType.ENTRY, b"G", 1, 6, 0, b"x" * 300)
    n = len(rec) - 1 if kept == "all-but-1" else kept
    image = crash_image(live, tmp_path / "cut")
    with open(image, "r+b") as f:  # the part of the unsynced write that reached the disk
        f.seek(synced_end)
        f.write(rec[:n])
    assert os.path.getsize(image) == size
    wal2 = NodeLog(str(tmp_path / "cut"))
    check_prefix(wal2, 5)
    # a partial record is truncated off (with the runway); zeros alone are a clean end
    assert wal2.stats.torn_bytes_truncated == (0 if n == 0 else size - synced_end)
    wal2.append("G", [Entry(2, 6, data=b"after")])
    wal2.sync()
    wal2.close()
    wal3 = NodeLog(str(tmp_path / "cut"))
    assert [(e.term, e.data) for e in wal3.group("G").entries(6, 7)] == [(2, b"after")]
    wal.close()


def test_zeros_then_data_in_the_runway_is_a_torn_tail_not_an_end(tmp_path):
    """Pages of a batch may reach the disk out of order: zeros followed by record bytes
    are a torn write (truncated), never a clean end after which data is ignored."""
    live = tmp_path / "live"
    wal = fill(live, n=5)
    end = wal._cur_size
    image = crash_image(live, tmp_path / "cut")
    rec = encode(RecordType.ENTRY, b"G", 1, 7, 0, b"y" * 40)
    with open(image, "r+b") as f:
        f.seek(end + 4096)
        f.write(rec)
    wal2 = NodeLog(str(tmp_path / "cut"))
    check_prefix(wal2, 5)
    assert wal2.stats.torn_bytes_truncated > 0
    assert os.path.getsize(image) == end
    wal.close()


def test_corruption_in_older_segment_is_fatal_unless_repair(tmp_path):
    wal = NodeLog(str(tmp_path), segment_bytes=1024)
    for i in range(1, 61):
        wal.append("G", [Entry(1, i, data=bytes([i]) * 50)])
    wal.sync()
    segs = wal.segments()
    assert len(segs) >= 3
    wal.close()
    first = tmp_path / segment_name(segs[0])
    with open(first, "r+b") as f:
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 1]))
    backup = tmp_path.parent / "backup"
    shutil.copytree(tmp_path, backup)
    with pytest.raises(CorruptLogError, match="not the last segment"):
        NodeLog(str(tmp_path), segment_bytes=1024)
    wal = NodeLog(str(backup), segment_bytes=1024, repair=True)
    g = wal.group("G")
    assert 0 < g.last_index() < 60
    # later segments dropped; new records go to a segment numbered after all of them
    assert wal.segments() == [segs[0], segs[-1] + 1]
    check_prefix(wal, g.last_index())


def test_records_follow_documented_layout(tmp_path):
    """An independent reader built only from docs/raft.md, as the audit job would be."""
    wal = NodeLog(str(tmp_path))
    wal.append("S-ORDERS", [Entry(4, 1, data=b"hello"), Entry(4, 2, data=b"")])
    wal.set_hard_state("S-ORDERS", HardState(term=4, vote=2, commit=1))
    wal.sync()
    wal.close()
    buf = open(only_segment(tmp_path), "rb").read()
    pos, out = 0, []
    while pos < len(buf):
        magic, rtype, glen = struct.unpack_from("<2sBB", buf, pos)
        group = buf[pos + 4 : pos + 4 + glen].decode()
        term, index, etype, plen, crc = struct.unpack_from("<QQBII", buf, pos + 4 + glen)
        head_end = pos + 4 + glen + 21
        payload = buf[head_end + 4 : head_end + 4 + plen]
        assert magic == b"JR"
        assert zlib.crc32(payload, zlib.crc32(buf[pos:head_end])) == crc
        out.append((rtype, group, term, index, etype, payload))
        pos = head_end + 4 + plen
    assert out == [
        (RecordType.ENTRY, "S-ORDERS", 4, 1, 0, b"hello"),
        (RecordType.ENTRY, "S-ORDERS", 4, 2, 0, b""),
        (RecordType.HARD_STATE, "S-ORDERS", 4, 1, 0, struct.pack("<Q", 2)),
    ]


def test_scanner_stops_at_first_bad_record():
    good = encode(RecordType.ENTRY, b"g", 1, 1, 0, b"abc")
    bad = bytearray(encode(RecordType.ENTRY, b"g", 1, 2, 0, b"def"))
    bad[-1] ^= 0xFF
    sc = Scanner(good + bytes(bad) + good)
    assert [r.index for r in sc] == [1]
    assert sc.end == len(good) and sc.error.startswith("crc mismatch")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.integers(min_value=0, max_value=10_000))
def test_any_truncation_point_recovers_a_prefix(tmp_path_factory, cut):
    d = tmp_path_factory.mktemp("cut")
    wal = NodeLog(str(d))
    for i in range(1, 41):
        wal.append("G", [Entry(1 + i // 10, i, data=bytes([i]) * (i * 5))])
    wal.sync()
    wal.close()
    seg = only_segment(d)
    size = os.path.getsize(seg)
    os.truncate(seg, min(cut, size))
    wal = NodeLog(str(d))
    g = wal.group("G")
    last = g.last_index()
    assert [e.index for e in g.entries(1, last + 1)] == list(range(1, last + 1)) if last else True
    for e in g.entries(1, last + 1) if last else []:
        assert e.data == bytes([e.index]) * (e.index * 5) and e.term == 1 + e.index // 10
    if cut >= size:
        assert last == 40
    wal.append("G", [Entry(9, last + 1, data=b"x")])
    wal.sync()
    wal.close()
    assert NodeLog(str(d)).group("G").last_index() == last + 1


def test_close_twice_is_harmless_and_the_closed_log_ends_at_its_last_record(tmp_path):
    wal = fill(tmp_path, n=3)
    end = wal._cur_size
    assert os.path.getsize(only_segment(tmp_path)) > end  # the runway
    wal.close()
    wal.close()
    assert os.path.getsize(only_segment(tmp_path)) == end
    check_prefix(NodeLog(str(tmp_path)), 3)

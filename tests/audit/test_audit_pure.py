"""The audit's pure parts, without Spark: the byte-range reader and its stitching,
the per-log pass, the verdicts and the acknowledged-writes file."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from audit import model
from audit.acked import AckFileError, digest_of, parse_line
from audit.logpass import one_log
from audit.segread import read_split
from audit.stitch import grade
from audit.verdicts import judge_log, two_leaders
from raft import wal
from tests.audit.nodelogs import write_log

# ---- reader: any split size gives the same records and the same damage --------------


def _read_all(seg: Path, split: int) -> tuple[list[tuple], list]:
    size = seg.stat().st_size
    rows, edges = [], []
    for start in range(0, max(size, 1), split):
        it, e = read_split("n", 1, str(seg), start, min(size, start + split))
        rows += list(it)
        edges.append(e)
    return rows, edges


@pytest.fixture(scope="module")
def segment_file(tmp_path_factory) -> Path:
    wal_dir = tmp_path_factory.mktemp("seg") / "wal"
    write_log(wal_dir, n=60, archive=False)
    segs = sorted(wal_dir.glob("wal-*.log"))
    return segs[-1]


def _records(seg: Path) -> list[wal.Record]:
    return list(wal.Scanner(seg.read_bytes()))


@pytest.mark.parametrize("split", [7, 64, 100, 997, 1 << 20])
def test_splits_tile_a_healthy_segment(segment_file, split):
    whole, _ = _read_all(segment_file, 1 << 30)
    rows, edges = _read_all(segment_file, split)
    assert rows == whole and len(rows) == len(_records(segment_file)) > 10
    assert grade("n", 1, segment_file.stat().st_size, True, edges) == []


@pytest.mark.parametrize("split", [13, 128, 1 << 20])
def test_damage_inside_is_reported_once_and_reading_resumes(segment_file, tmp_path, split):
    recs = _records(segment_file)
    victim, after = recs[len(recs) // 2], recs[len(recs) // 2 + 1]
    buf = bytearray(segment_file.read_bytes())
    buf[victim.payload_offset - 1] ^= 0xFF  # a CRC byte: the record no longer checks
    seg = tmp_path / "wal-0000000000000001.log"
    seg.write_bytes(bytes(buf))
    rows, edges = _read_all(seg, split)
    assert [r[2] for r in rows] == [r.offset for r in recs if r is not victim]
    found = grade("n", 1, len(buf), True, edges)
    assert [(f.kind, f.severity) for f in found] == [(model.CORRUPT_RECORD, model.VIOLATION)]
    assert f"[{victim.offset}, {after.offset})" in found[0].detail


@pytest.mark.parametrize("newest", [True, False])
def test_torn_tail_is_a_note_only_in_the_newest_segment(segment_file, tmp_path, newest):
    rec = wal.encode(wal.RecordType.ENTRY, b"g0", 1, 999, 0, b"z" * 50)
    seg = tmp_path / "wal-0000000000000001.log"
    seg.write_bytes(segment_file.read_bytes() + rec[:-10])
    _, edges = _read_all(seg, 100)
    found = grade("n", 1, seg.stat().st_size, newest, edges)
    want = (model.TORN_TAIL, model.NOTE) if newest else (model.CORRUPT_RECORD, model.VIOLATION)
    assert [(f.kind, f.severity) for f in found] == [want]


@pytest.mark.parametrize("split", [7, 100, 4096, 1 << 20])
@pytest.mark.parametrize("newest", [True, False])
def test_a_zero_runway_after_the_records_is_no_damage(segment_file, tmp_path, split, newest):
    """A segment the node left with its preallocated zeros (a crash, or a roll: older
    segments keep theirs) tiles cleanly; zeros followed by record bytes do not."""
    seg = tmp_path / "wal-0000000000000001.log"
    seg.write_bytes(segment_file.read_bytes() + bytes(5000))
    rows, edges = _read_all(seg, split)
    assert len(rows) == len(_records(segment_file))
    assert grade("n", 1, seg.stat().st_size, newest, edges) == []
    rec = wal.encode(wal.RecordType.ENTRY, b"g0", 1, 999, 0, b"z" * 50)
    seg.write_bytes(segment_file.read_bytes() + bytes(5000) + rec[:-10])
    _, edges = _read_all(seg, split)
    found = grade("n", 1, seg.stat().st_size, newest, edges)
    assert len(found) == 1 and found[0].kind == model.CORRUPT_RECORD \
        or [f.kind for f in found] == [model.TORN_TAIL]


def test_empty_segment_reads_as_nothing(tmp_path):
    seg = tmp_path / "wal-0000000000000001.log"
    seg.write_bytes(b"")
    rows, edges = read_split("n", 1, str(seg), 0, 0)
    assert list(rows) == [] and grade("n", 1, 0, True, [edges]) == []


# ---- the per-log pass ---------------------------------------------------------------

E, HS, SNAP, COMPACT, DROP, COPY = 1, 2, 3, 4, 5, 6


def _rows(spec: list[tuple]) -> list[SimpleNamespace]:
    """spec in file order: (rtype, term, idx[, vote]); returned newest first, as Spark sorts."""
    out = []
    for pos, (rtype, term, idx, *rest) in enumerate(spec):
        out.append(SimpleNamespace(node="n", grp="g", seg=1, off=pos, rtype=rtype, term=term,
                                   idx=idx, etype=0, digest=bytes([idx % 256]),
                                   vote=rest[0] if rest else None, conf=None))
    return out[::-1]


def _pass(spec: list[tuple]) -> dict[str, list]:
    out: dict[str, list] = {}
    for row in one_log("n", "g", _rows(spec)):
        out.setdefault(row[0], []).append(row)
    return out


def test_a_later_entry_supersedes_the_tail_and_a_snapshot_the_whole_log():
    got = _pass([(E, 1, 1), (E, 1, 2), (E, 1, 3), (E, 2, 2), (E, 2, 3), (HS, 2, 3, 1)])
    assert [(r[3], r[4]) for r in got["E"]] == [(3, 2), (2, 2), (1, 1)]  # newest first
    assert [(r[3], r[4]) for r in got["T"]] == [(2, 2)]
    got = _pass([(E, 1, 1), (E, 1, 2), (SNAP, 3, 10), (E, 3, 11)])
    assert [r[3] for r in got["E"]] == [11]
    assert "G" not in got


def test_hole_term_regression_and_double_vote_are_found():
    got = _pass([(HS, 1, 0, 1), (HS, 1, 0, 2), (E, 1, 1), (E, 3, 2), (E, 2, 4)])
    assert [(r[3], r[9]) for r in got["G"]] == [(3, '{"hi": 3}')]
    kinds = sorted(model.Finding.from_json(__import__("json").loads(r[9])).kind
                   for r in got["F"])
    assert kinds == [model.TERM_REGRESSION, model.VOTE_CHANGED]


def test_copies_stand_in_only_for_originals_that_are_gone():
    # Originals there: the copies change nothing, survivors are the originals.
    got = _pass([(E, 1, 1), (E, 1, 2), (E, 1, 3), (COPY, 1, 2), (COPY, 1, 3), (E, 1, 4)])
    assert [(r[3], r[8]) for r in got["E"]] == [(4, 5), (3, 2), (2, 1), (1, 0)]
    # Their segment deleted: the copies are the entries.
    got = _pass([(COMPACT, 1, 1), (COPY, 1, 2), (COPY, 1, 3), (E, 1, 4)])
    assert [(r[3], r[8]) for r in got["E"]] == [(4, 3), (3, 2), (2, 1)]
    assert "G" not in got
    # A torn run of copies (3 never copied) cuts nothing: unlike an ENTRY at 2 would.
    got = _pass([(E, 1, 1), (E, 1, 2), (E, 1, 3), (COPY, 1, 2)])
    assert [r[3] for r in got["E"]] == [3, 2, 1]


def test_a_drop_starts_a_new_incarnation_of_the_group():
    got = _pass([(E, 1, 1), (E, 1, 2), (HS, 1, 2, 1), (DROP, 0, 0), (SNAP, 2, 5),
                 (E, 2, 6), (HS, 2, 6, 2)])
    assert [r[3] for r in got["E"]] == [6]
    summary = __import__("json").loads(got["S"][0][9])
    assert (summary["commit"], summary["installed_at"]) == (6, 5)
    assert sorted((r[4], r[9]) for r in got["V"]) == [(1, '{"vote": 1}'), (2, '{"vote": 2}')]
    # Dropped and never back: nothing of the old log or its commit index is this node's now.
    got = _pass([(E, 1, 1), (E, 1, 2), (HS, 1, 2, 1), (DROP, 0, 0)])
    summary = __import__("json").loads(got["S"][0][9])
    assert "E" not in got and summary["commit"] == 0


# ---- verdicts -------------------------------------------------------------------------


def _info(**kw) -> dict:
    base = {"commit": 10, "first": 1, "last": 10, "installed_at": None, "max_compact": 0}
    return {**base, **kw}


def test_missing_committed_entries_in_a_hole_and_at_the_end():
    cov, found = judge_log("n", "g", _info(last=8), [(4, 4)], complete=True)
    assert cov.checked == [(1, 3), (5, 8)]
    assert [(f.kind, f.index, f.index_hi) for f in found] == [
        (model.COMMITTED_MISSING, 4, None), (model.COMMITTED_MISSING, 9, 10)]
    # Only what the node's own commit covers counts: a hole above it is no promise broken.
    _, found = judge_log("n", "g", _info(commit=8), [(7, 9)], complete=True)
    assert [(f.index, f.index_hi) for f in found] == [(7, 8)]
    _, found = judge_log("n", "g", _info(commit=5), [(7, 9)], complete=True)
    assert found == []


def test_missing_start_is_lost_data_only_when_every_segment_is_there():
    _, found = judge_log("n", "g", _info(first=5), [], complete=True)
    assert [(f.kind, f.index, f.index_hi) for f in found] == [(model.COMMITTED_MISSING, 1, 4)]
    cov, found = judge_log("n", "g", _info(first=5, max_compact=4), [], complete=False)
    assert cov.unavailable == (1, 4)
    assert [f.kind for f in found] == [model.HISTORY_TRUNCATED]
    _, found = judge_log("n", "g", _info(first=5, max_compact=2), [], complete=False)
    assert [f.kind for f in found] == [model.HISTORY_TRUNCATED, model.PREFIX_MISSING]


def test_a_term_starting_at_two_indexes_names_both_sides():
    found = two_leaders([("a", "g", 5, 2), ("b", "g", 5, 2), ("c", "g", 7, 2),
                         ("a", "g", 9, 3)])
    assert sorted((f.node, f.index) for f in found) == [("a", 5), ("b", 5), ("c", 7)]


def test_the_minority_is_named_and_a_tie_names_everyone():
    from audit.verdicts import minority

    assert minority([("x", ["a", "c"]), ("y", ["b"])]) == (["b"], ["a", "c"])
    assert minority([("x", ["a"]), ("y", ["b"])]) == (["a", "b"], [])


# ---- acknowledged writes --------------------------------------------------------------


def test_ack_lines():
    a = parse_line('{"group": "g0", "data": "w1", "index": 3}', 1)
    assert (a.group, a.digest, a.index, a.retried) == ("g0", digest_of(b"w1"), 3, False)
    full = __import__("hashlib").sha256(b"w1").hexdigest()
    assert parse_line(f'{{"group": "g0", "digest": "{full}"}}', 2).digest == a.digest
    for bad in ('{"data": "x"}', '{"group": "g"}', '{"group": "g", "digest": "abc"}',
                '{"group": "g", "data": "x", "index": 0}', "nope"):
        with pytest.raises(AckFileError, match="line 7"):
            parse_line(bad, 7)


def test_jetstream_ack_lines_name_a_stream(tmp_path):
    from audit.acked import StreamAck, check_file, parse_any, parse_numbered, stream_acks

    a = parse_any('{"stream": "K", "seq": 4, "data": "p0-1"}', 3)
    assert a == StreamAck(3, "K", digest_of(b"p0-1"), 4, False)
    assert isinstance(parse_any('{"group": "g0", "data": "w1"}', 1), type(parse_line(
        '{"group": "g0", "data": "w1"}', 1)))
    for bad in ('{"stream": "K", "seq": 0, "data": "x"}', '{"stream": "K"}'):
        with pytest.raises(AckFileError, match="line 9"):
            parse_any(bad, 9)
    path = tmp_path / "acked.jsonl"
    path.write_text('{"group": "g0", "data": "w1"}\n\n{"stream": "K", "data": "x"}\n')
    assert check_file(str(path)) == 2
    assert [s.line for s in stream_acks(str(path))] == [3]
    # The Spark join takes the group lines only: the stream hook checks the others.
    assert parse_numbered(('{"stream": "K", "data": "x"}', 2)) is None
    assert parse_numbered(('{"group": "g0", "data": "w1"}', 0))[:2] == (1, "g0")


def test_node_dirs_find_the_wal_and_refuse_two(tmp_path):
    from audit.layout import LayoutError, node_dirs

    write_log(tmp_path / "n1" / "wal", n=5, archive=False)
    (tmp_path / "n1" / "snap").mkdir()
    [n] = node_dirs([str(tmp_path / "n1")])
    assert n.wal.endswith("wal") and n.snap and n.complete
    os.makedirs(tmp_path / "n1" / "other" / "wal")
    with pytest.raises(LayoutError, match="several"):
        node_dirs([str(tmp_path / "n1")])

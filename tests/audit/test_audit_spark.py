"""The audit on real logs from real `python -m raft.node` processes, in Spark local mode.

Healthy logs (leader transfers, compaction, a snapshot install, a member added
and one removed) give no violation; each injected fault gives exactly the
finding it should, naming the node, group, index and term.
"""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("pyspark")  # the Java check is in the `spark` fixture

from audit import model  # noqa: E402
from audit.job import run  # noqa: E402
from audit.report import build, write_reports  # noqa: E402
from tests.audit.conftest import segment  # noqa: E402
from tests.audit.faults import commit_of, delete, entries, rewrite  # noqa: E402

pytestmark = pytest.mark.timeout(600)


def audit(spark, logs, acked=True, split_bytes=16 << 20, out_dir=None) -> dict:
    out = run(spark, [str(d) for d in logs["dirs"]],
              str(logs["acked"]) if acked else None, split_bytes)
    if out_dir is not None:
        write_reports(out, str(out_dir))
    return build(out)


def violations(report: dict) -> list[tuple]:
    return sorted((f["kind"], f.get("node"), f.get("group"), f.get("index"), f.get("term"))
                  for f in report["findings"] if f["severity"] == model.VIOLATION)


def test_healthy_cluster_logs_have_no_violation(spark, logs):
    # Small splits: many tasks per segment, so records straddle task boundaries.
    report = audit(spark, logs, split_bytes=997, out_dir=logs["tmp"] / "report")
    assert report["verdict"]["ok"], report["findings"]
    assert report["findings"] == []
    g0 = {c["node"]: c for c in report["groups"]["g0"]["logs"]}
    assert set(g0) == {"n1", "n2", "n3", "n4"}
    assert g0["n4"]["snapshot"][1] > 1  # the joiner installed a snapshot
    assert g0["n3"]["commit"] < g0["n1"]["commit"]  # removed: stopped following
    assert max(c["conf_changes"] for c in g0.values()) == 2  # add node 4, remove node 3
    assert len(report["groups"]["g0"]["leaders"]) >= 3  # two transfers: three terms
    assert report["stats"]["splits"] > 4
    assert report["stats"]["replayed_groups"] == ["g0"]  # the LMDB store = replay hook ran
    saved = json.loads((logs["tmp"] / "report" / "report.json").read_text())
    assert saved["verdict"]["text"] == "PASS: 0 violations, 0 notes"


def _committed_data_entry(seg, skip: int = 20):
    commit = commit_of(seg)
    return [e for e in entries(seg) if e.payload and e.index <= commit][skip]


def test_changed_payload_is_a_log_matching_violation(spark, logs):
    seg = segment(logs["dirs"][1])
    # An entry n1 and n3 hold too (a follower slow under load may have got a snapshot
    # instead): with two copies against one, the changed copy is the one named.
    others = [{x.index for x in entries(segment(d))} for d in (logs["dirs"][0], logs["dirs"][2])]
    e = next(x for x in entries(seg)[20:] if x.payload and x.index <= commit_of(seg)
             and all(x.index in held for held in others))
    flipped = bytearray(e.payload)
    # A byte no acked write holds (they are text): a flipped digit could turn it into
    # another acked write's payload, which the audit would rightly call committed twice.
    flipped[0] = 0xFF
    rewrite(seg, e, payload=bytes(flipped))
    report = audit(spark, logs)
    assert violations(report) == [(model.LOG_MATCHING, "n2", "g0", e.index, e.term)]
    assert not report["verdict"]["ok"]


def test_entry_with_another_term_is_a_committed_mismatch(spark, logs):
    seg = segment(logs["dirs"][0])
    last = entries(seg)[-1]
    assert last.index <= commit_of(seg)
    # A term no leader had (the fixture's run may have elected a later leader under load:
    # its term, reused here, would also start at two indexes: two_leaders).
    term = max(e.term for d in logs["dirs"] for e in entries(segment(d))) + 1
    rewrite(seg, last, term=term)
    report = audit(spark, logs)
    assert violations(report) == [(model.COMMITTED_MISMATCH, "n1", "g0", last.index, term)]


def test_deleted_committed_entry_is_reported_missing(spark, logs):
    seg = segment(logs["dirs"][1])
    e = _committed_data_entry(seg, skip=30)
    delete(seg, e)
    report = audit(spark, logs)
    assert violations(report) == [(model.COMMITTED_MISSING, "n2", "g0", e.index, e.term)]


def test_acked_write_missing_from_every_node_or_committed_twice(spark, logs):
    acked = {a["data"]: a for a in map(json.loads, logs["acked"].read_text().splitlines())}
    # Every replica lost b7 and turned c3 into a second b8, WAL and store alike: the
    # replicas still agree with each other, only the clients' acks show the loss.
    for d in logs["dirs"]:
        seg = segment(d)
        for old, new in ((b"b7", b"x7"), (b"c3", b"b8")):
            for e in entries(seg):
                if e.payload == old:
                    rewrite(seg, e, payload=new)
            _set_store(d, acked[old.decode()]["index"], old, new)
    # And a client was told the wrong index for one write (sent once: no retry).
    lines = logs["acked"].read_text().splitlines()
    moved = next(a for k, a in acked.items() if k.startswith("d") and not a["retried"])
    told = moved["index"] + 1
    logs["acked"].write_text("".join(
        (json.dumps({**moved, "index": told}) if json.loads(x) == moved else x) + "\n"
        for x in lines))
    report = audit(spark, logs)
    assert violations(report) == [
        (model.ACKED_DUPLICATED, None, "g0", acked["b8"]["index"], None),
        (model.ACKED_MISPLACED, None, "g0", told, None),
        (model.ACKED_MISSING, None, "g0", acked["b7"]["index"], None),
        (model.ACKED_MISSING, None, "g0", acked["c3"]["index"], None)]


def _set_store(node_dir, index: int, old: bytes, new: bytes | None) -> bool:
    """Change one entry in raft.node's LMDB store (None deletes it), if the node holds it."""
    import lmdb

    env = lmdb.open(str(node_dir / "sm"), max_dbs=16)
    try:
        with env.begin(write=True, db=env.open_db(b"g0", create=False)) as txn:
            key = b"e" + index.to_bytes(8, "big")
            if txn.get(key) is None:
                return False
            assert txn.get(key) == old
            txn.delete(key) if new is None else txn.put(key, new)
            return True
    finally:
        env.close()


def test_store_that_differs_from_the_replayed_log(spark, logs):
    seg = segment(logs["dirs"][1])
    gone, changed = _committed_data_entry(seg, skip=40), _committed_data_entry(seg, skip=41)
    assert _set_store(logs["dirs"][1], gone.index, gone.payload, None)
    assert _set_store(logs["dirs"][2], changed.index, changed.payload, b"?")
    report = audit(spark, logs, acked=False)
    assert violations(report) == [(model.STORE_MISMATCH, "n2", "g0", gone.index, gone.term),
                                  (model.STORE_MISMATCH, "n3", "g0", changed.index, changed.term)]


def test_torn_tail_is_a_note_and_corruption_a_violation(spark, logs):
    from raft import wal

    torn = segment(logs["dirs"][0])
    rec = wal.encode(wal.RecordType.ENTRY, b"g0", 9, 10**6, 0, b"y" * 200)
    with open(torn, "ab") as f:
        f.write(rec[: len(rec) // 2])  # a write cut short by a crash, never fsynced
    bad = segment(logs["dirs"][1])
    e = _committed_data_entry(bad, skip=10)
    buf = bytearray(bad.read_bytes())
    buf[e.payload_offset] ^= 0x40  # CRC no longer matches: fsynced data damaged
    bad.write_bytes(bytes(buf))
    report = audit(spark, logs, acked=False)
    notes = [(f["kind"], f["node"]) for f in report["findings"] if f["severity"] == "note"]
    assert notes == [(model.TORN_TAIL, "n1")]
    assert violations(report) == sorted([
        (model.COMMITTED_MISSING, "n2", "g0", e.index, e.term),
        (model.CORRUPT_RECORD, "n2", None, None, None)])


def test_archive_gives_full_history_and_without_it_ranges_are_reported(spark, tmp_path):
    from tests.audit.nodelogs import write_log

    write_log(tmp_path / "a" / "wal")
    assert len(list((tmp_path / "a" / "wal" / "archive").glob("wal-*.log"))) > 3
    shutil.copytree(tmp_path / "a", tmp_path / "b", ignore=shutil.ignore_patterns("archive"))
    report = audit(spark, {"dirs": [tmp_path / "a", tmp_path / "b"]}, acked=False)
    assert violations(report) == []
    assert report["stats"]["archived_segments"] > 3
    for grp in ("g0", "g1"):
        cov = {c["node"]: c for c in report["groups"][grp]["logs"]}
        assert cov["a"]["checked"] == [[1, 400]] and cov["a"]["unavailable"] is None
        lo, hi = cov["b"]["unavailable"]
        assert lo == 1 and hi == cov["b"]["first"] - 1 > 0
        assert cov["b"]["checked"] == [[hi + 1, 400]]
    notes = sorted((f["kind"], f["node"], f["group"]) for f in report["findings"])
    assert notes == [(model.HISTORY_TRUNCATED, "b", "g0"), (model.HISTORY_TRUNCATED, "b", "g1")]

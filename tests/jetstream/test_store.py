"""One suite for every StreamStore: MemStore and LmdbStore (real LMDB in a temp dir)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from node.jetstream.store import CorruptRecordError, StoredMsg, StreamStore
from node.jetstream.store.base import decode_record, encode_record
from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv
from node.jetstream.store.memstore import MemStore


@pytest.fixture(params=["mem", "lmdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StreamStore]:
    if request.param == "mem":
        yield MemStore("S")
        return
    env = NodeEnv(str(tmp_path / "env"))
    try:
        yield LmdbStore(env, "S")
    finally:
        env.close()


def _msg(seq: int, subject: str = "a", data: bytes = b"x", hdr: bytes = b"") -> StoredMsg:
    return StoredMsg(seq, subject, hdr, data, ts_ns=1000 + seq)


def test_store_load_remove_roundtrip(store: StreamStore) -> None:
    msg = _msg(1, "orders.1", b"payload", b"NATS/1.0\r\nA: b\r\n\r\n")
    store.store(msg)
    assert store.load(1) == msg
    assert store.load(2) is None
    assert (store.msgs(), store.bytes()) == (1, store.sizer(msg.subject, msg.hdr, msg.data))
    assert store.remove(1) == msg
    assert store.remove(1) is None
    assert (store.msgs(), store.bytes(), store.first_seq()) == (0, 0, 0)


def test_per_subject_index(store: StreamStore) -> None:
    for seq, subject in enumerate(["a", "b", "a", "ab", "a", "b"], start=1):
        store.store(_msg(seq, subject))
    assert store.last_for_subject("a") == 5
    assert store.last_for_subject("b") == 6
    assert store.last_for_subject("ab") == 4
    assert store.last_for_subject("zz") == 0
    assert store.first_for_subject("a") == 1
    assert store.first_for_subject("a", start=2) == 3
    assert store.first_for_subject("a", start=6) == 0
    assert store.subject_count("a") == 3
    assert list(store.subjects()) == [("a", 3), ("ab", 1), ("b", 2)]
    store.remove(5)
    assert store.last_for_subject("a") == 3
    store.remove(4)
    assert store.subject_count("ab") == 0
    assert list(store.subjects()) == [("a", 2), ("b", 2)]


def test_seqs_iterates_in_order_from_start(store: StreamStore) -> None:
    with store.batch():  # one commit: outside a batch every LMDB write is its own fsync
        for seq in range(1, 2501):
            store.store(_msg(seq))
    store.remove(1)
    store.remove(1500)
    assert store.first_seq() == 2
    got = list(store.seqs(1000))
    assert got[0] == 1000 and got[-1] == 2500 and 1500 not in got
    assert len(got) == 1500


def test_batch_groups_writes(store: StreamStore) -> None:
    with store.batch():
        for seq in range(1, 11):
            store.store(_msg(seq))
        assert store.msgs() == 10  # reads inside the batch see its writes
        store.remove(3)
    assert store.msgs() == 9 and store.load(3) is None


def test_meta_and_consumer_records(store: StreamStore) -> None:
    store.put_meta("last_seq", b"\x05")
    assert store.get_meta("last_seq") == b"\x05"
    assert store.get_meta("nope") is None
    store.put_consumer("c2", b"two")
    store.put_consumer("c1", b"one")
    assert store.consumers() == ["c1", "c2"]
    assert store.get_consumer("c1") == b"one"
    store.delete_consumer("c1")
    assert store.consumers() == ["c2"] and store.get_consumer("c1") is None


def test_record_crc_detects_any_flipped_byte() -> None:
    raw = encode_record(_msg(7, "s.x", b"hello", b"h"))
    assert decode_record("S", 7, raw).data == b"hello"
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x01
        with pytest.raises(CorruptRecordError):
            decode_record("S", 7, bytes(bad))
    with pytest.raises(CorruptRecordError):
        decode_record("S", 8, raw)  # a record read under another sequence


def test_lmdb_streams_share_one_env_without_mixing(tmp_path: Path) -> None:
    env = NodeEnv(str(tmp_path / "env"))
    try:
        a, ab = LmdbStore(env, "A"), LmdbStore(env, "AB")
        a.store(_msg(1, "x"))
        ab.store(_msg(1, "x", b"other"))
        ab.store(_msg(2, "y"))
        assert a.load(1).data == b"x" and ab.load(1).data == b"other"
        assert list(a.seqs()) == [1] and list(ab.seqs()) == [1, 2]
        assert list(a.subjects()) == [("x", 1)]
        assert a.msgs() == 1 and ab.msgs() == 2
    finally:
        env.close()


def test_lmdb_corrupted_bytes_on_disk_give_an_error_not_data(tmp_path: Path) -> None:
    path = tmp_path / "env"
    env = NodeEnv(str(path), sync=True)
    store = LmdbStore(env, "S")
    payload = b"Q" * 64 + b"UNIQUE-MARKER" + b"Q" * 64
    store.store(_msg(1, "a", payload))
    env.close()
    data = bytearray((path / "data.mdb").read_bytes())
    at = data.find(b"UNIQUE-MARKER")
    assert at > 0
    data[at] ^= 0xFF
    (path / "data.mdb").write_bytes(bytes(data))
    env = NodeEnv(str(path))
    try:
        with pytest.raises(CorruptRecordError, match="crc mismatch"):
            LmdbStore(env, "S").load(1)
        msgs, corrupt = LmdbStore(env, "S").load_many([1, 2])  # a delivery round's read
        assert msgs == {} and "crc mismatch" in corrupt[1] and list(corrupt) == [1]
    finally:
        env.close()


def test_load_many_is_load_of_each(store: StreamStore) -> None:
    for seq in (1, 2, 4):
        store.store(_msg(seq, f"s{seq}"))
    msgs, corrupt = store.load_many([4, 3, 1, 2])
    assert msgs == {s: store.load(s) for s in (4, 1, 2)} and corrupt == {}


def test_lmdb_state_survives_reopen(tmp_path: Path) -> None:
    env = NodeEnv(str(tmp_path / "env"), sync=True)
    store = LmdbStore(env, "S")
    with store.batch():
        for seq in range(1, 6):
            store.store(_msg(seq, f"s.{seq % 2}"))
        store.put_meta("applied", b"42")
    env.close()
    env = NodeEnv(str(tmp_path / "env"))
    try:
        store = LmdbStore(env, "S")
        assert store.msgs() == 5 and store.get_meta("applied") == b"42"
        assert store.last_for_subject("s.1") == 5 and store.subject_count("s.0") == 2
    finally:
        env.close()


def test_seqs_desc(store: StreamStore) -> None:
    with store.batch():
        for seq in range(1, 2502):
            store.store(_msg(seq))
    store.remove(2501)
    store.remove(7)
    got = list(store.seqs_desc())
    assert got[0] == 2500 and got[-1] == 1 and len(got) == 2499 and 7 not in got


def test_ttl_index(store: StreamStore) -> None:
    store.add_ttl(500, 3)
    store.add_ttl(100, 9)
    store.add_ttl(100, 2)
    store.add_ttl(900, 1)
    assert store.due_ttls(499, 10) == [(100, 2), (100, 9)]
    assert store.due_ttls(1000, 2) == [(100, 2), (100, 9)]
    store.remove_ttl(100, 2)
    assert store.due_ttls(600, 10) == [(100, 9), (500, 3)]


def test_dedup_index_prunes_in_time_order(store: StreamStore) -> None:
    store.put_dedup("a", 1, 100)
    store.put_dedup("b", 2, 200)
    store.put_dedup("c", 3, 300)
    store.put_dedup("a", 4, 400)  # the same id again: its old time no longer counts
    assert store.get_dedup("a") == (4, 400)
    assert store.prune_dedup(before_ns=350, limit=10) == 2
    assert store.get_dedup("b") is None and store.get_dedup("c") is None
    assert store.get_dedup("a") == (4, 400)
    assert store.prune_dedup(before_ns=1000, limit=0) == 0


def test_lmdb_batch_in_a_worker_thread_does_not_leak_to_readers(tmp_path: Path) -> None:
    """While a worker thread holds the batch txn, another thread reads committed data only
    (through its own read txn), never the worker's uncommitted writes."""
    import threading

    env = NodeEnv(str(tmp_path / "env"))
    try:
        store = LmdbStore(env, "S")
        store.store(_msg(1))
        inside, release = threading.Event(), threading.Event()

        def worker() -> None:
            with store.batch():
                store.store(_msg(2))
                inside.set()
                release.wait(10)

        t = threading.Thread(target=worker)
        t.start()
        assert inside.wait(10)
        assert store.load(2) is None and store.msgs() == 1  # not committed yet
        release.set()
        t.join(10)
        assert store.load(2) is not None and store.msgs() == 2
    finally:
        env.close()

"""Encryption at rest, the pieces (node/jetstream/crypt.py and where it plugs in): key file
and epochs, sealed records, sealed files, the WAL and LMDB with a sealer, on real files."""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path

import pytest

from node.jetstream import crypt
from node.jetstream.store.base import CorruptRecordError, StoredMsg
from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv
from raft.storage import CorruptLogError, NodeLog
from raft.types import Entry
from raft.wal import Scanner

KEY = "unit-test-key-0123456789abcdef"
MARK = b"CLEARTEXT-MARKER"


def _open(path: Path, cipher: str = "chacha", key: str = KEY) -> crypt.StoreCrypt:
    path.mkdir(parents=True, exist_ok=True)
    sc = crypt.open_store(str(path), key, cipher)
    assert sc is not None
    return sc


@pytest.fixture(params=["chacha", "aes"])
def cipher(request: pytest.FixtureRequest) -> str:
    return request.param


def test_epoch_rises_at_every_open_so_nonces_never_repeat(tmp_path: Path, cipher: str) -> None:
    first = crypt.open_store(str(tmp_path), KEY, cipher)
    second = crypt.open_store(str(tmp_path), KEY, cipher)
    assert first is not None and second is not None
    assert second.epoch == first.epoch + 1
    a = {first.lmdb.seal(b"x", b"")[:crypt.NONCE] for _ in range(100)}
    b = {second.lmdb.seal(b"x", b"")[:crypt.NONCE] for _ in range(100)}
    assert len(a) == len(b) == 100 and not a & b
    # WAL and LMDB draw from one counter: no nonce twice within a process either
    assert first.wal.seal(b"x", b"")[:crypt.NONCE] not in a


def test_key_file_refuses_wrong_key_cipher_and_missing_key(tmp_path: Path) -> None:
    crypt.open_store(str(tmp_path), KEY, "chacha")
    raw = (tmp_path / crypt.KEY_FILE).read_bytes()
    assert KEY.encode() not in raw
    with pytest.raises(crypt.KeyFileError, match="wrong key"):
        crypt.open_store(str(tmp_path), KEY + "x", "chacha")
    with pytest.raises(crypt.KeyFileError, match="encrypted with cipher 'chacha'"):
        crypt.open_store(str(tmp_path), KEY, "aes")
    with pytest.raises(crypt.KeyFileError, match="no jetstream.key"):
        crypt.open_store(str(tmp_path), None, "chacha")
    assert (tmp_path / crypt.KEY_FILE).read_bytes() == raw  # refusals write nothing


def test_a_key_on_a_store_with_clear_data_is_refused(tmp_path: Path) -> None:
    (tmp_path / "lmdb").mkdir()
    (tmp_path / "lmdb" / "data.mdb").write_bytes(b"x")
    with pytest.raises(crypt.KeyFileError, match="unencrypted data"):
        crypt.open_store(str(tmp_path), KEY, "aes")
    assert not (tmp_path / crypt.KEY_FILE).exists()


def test_sealed_record_fails_when_damaged_moved_or_other_key(tmp_path: Path,
                                                            cipher: str) -> None:
    sc = _open(tmp_path / "a", cipher)
    other = _open(tmp_path / "b", cipher)  # same key, other store salt
    blob = sc.lmdb.seal(MARK, b"here")
    assert MARK not in blob and len(blob) == len(MARK) + crypt.OVERHEAD
    assert sc.lmdb.open(blob, b"here") == MARK
    flipped = bytearray(blob)
    flipped[-1] ^= 1
    for bad, aad, who in ((bytes(flipped), b"here", sc), (blob, b"there", sc),
                          (blob, b"here", other)):
        with pytest.raises(crypt.SealError):
            who.lmdb.open(bad, aad)


def test_sealed_files_round_trip_and_refuse_truncation(tmp_path: Path, cipher: str) -> None:
    sc = crypt.open_store(str(tmp_path), KEY, cipher)
    assert sc is not None
    body = MARK * 20000  # several chunks
    f = io.BytesIO()
    crypt.write_file(sc.files, f, lambda out: out.write(body))
    sealed = f.getvalue()
    assert MARK not in sealed
    assert crypt.read_file(sc.files, io.BytesIO(sealed)).read() == body
    # Another store with the same master key reads it (a snapshot sent to a follower).
    peer = _open(tmp_path / "peer", cipher)
    assert crypt.read_file(peer.files, io.BytesIO(sealed)).read() == body
    first_chunk_end = len(crypt.FILE_MAGIC) + 16 + 4 + crypt.FILE_CHUNK + crypt.TAG
    for bad in (sealed[:first_chunk_end], sealed[:-1], sealed + b"x"):
        with pytest.raises(crypt.SealError):
            crypt.read_file(sc.files, io.BytesIO(bad)).read()
    with pytest.raises(crypt.SealError, match="unencrypted"):
        crypt.read_file(sc.files, io.BytesIO(b"plain image"))


def _entries(n: int) -> list[Entry]:
    return [Entry(1, i, data=MARK + b"%d" % i) for i in range(1, n + 1)]


def test_wal_payloads_are_sealed_and_a_forged_record_is_corruption(tmp_path: Path,
                                                                   cipher: str) -> None:
    sc = crypt.open_store(str(tmp_path), KEY, cipher)
    assert sc is not None
    wal = tmp_path / "wal"
    log = NodeLog(str(wal), sealer=sc.wal)
    log.append("g1", _entries(5))
    log.sync()
    log.close()
    seg = next(wal.glob("wal-*.log"))
    assert MARK not in seg.read_bytes()
    log = NodeLog(str(wal), sealer=sc.wal)
    assert [e.data for e in log.group("g1").entries(1, 6)] == [e.data for e in _entries(5)]
    log.close()
    # The record CRC covers the ciphertext; a byte changed and the CRC recomputed (what the
    # CRC cannot see) still fails the AEAD tag: reported as corruption, never served.
    raw = bytearray(seg.read_bytes())
    rec = next(r for r in Scanner(bytes(raw)) if r.index == 3)
    raw[rec.payload_offset + crypt.NONCE] ^= 0x40
    crc_at = rec.payload_offset - 4
    head = bytes(raw[rec.offset:crc_at])
    payload = bytes(raw[rec.payload_offset:rec.payload_offset + rec.payload_len])
    raw[crc_at:rec.payload_offset] = struct.pack("<I", zlib.crc32(payload, zlib.crc32(head)))
    seg.write_bytes(bytes(raw))
    log = NodeLog(str(wal), sealer=sc.wal)
    assert log.group("g1").entries(2, 3)[0].data == MARK + b"2"
    with pytest.raises(CorruptLogError, match="does not decrypt"):
        log.group("g1").entries(3, 4)
    log.close()


def test_wal_read_with_another_key_is_corruption(tmp_path: Path) -> None:
    sc = _open(tmp_path / "a")
    other = _open(tmp_path / "b")
    log = NodeLog(str(tmp_path / "wal"), sealer=sc.wal)
    log.append("g1", _entries(2))
    log.close()
    log = NodeLog(str(tmp_path / "wal"), sealer=other.wal)
    with pytest.raises(CorruptLogError):
        log.group("g1").entries(1, 2)
    log.close()


def test_lmdb_values_are_sealed_and_a_damaged_one_is_never_served(tmp_path: Path,
                                                                  cipher: str) -> None:
    sc = crypt.open_store(str(tmp_path), KEY, cipher)
    assert sc is not None
    env = NodeEnv(str(tmp_path / "lmdb"), sealer=sc.lmdb, files=sc.files, sync_interval=None)
    store = LmdbStore(env, "S")
    with store.batch():
        for seq in (1, 2):
            store.store(StoredMsg(seq, "a.b", b"NATS/1.0\r\nX: " + MARK + b"\r\n\r\n",
                                  MARK, 5))
        store.put_consumer("C", MARK)
        store.put_meta("config", MARK)
    assert store.load(1).data == MARK and store.get_consumer("C") == MARK
    assert store.get_meta("config") == MARK
    env.close()
    for name in os.listdir(tmp_path / "lmdb"):
        assert MARK not in (tmp_path / "lmdb" / name).read_bytes(), name
    env = NodeEnv(str(tmp_path / "lmdb"), sealer=sc.lmdb, files=sc.files, sync_interval=None)
    store = LmdbStore(env, "S")
    key = store._msg_key(2)
    with env.env.begin(write=True) as txn:
        raw = bytearray(txn.get(key, db=env.dbs["js_msgs"]))
        raw[-3] ^= 1
        txn.put(key, bytes(raw), db=env.dbs["js_msgs"])
    assert store.load(1).data == MARK
    with pytest.raises(CorruptRecordError, match="does not decrypt"):
        store.load(2)
    env.close()

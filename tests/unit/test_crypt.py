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


# ---- key rotation (envelope keys: docs/jetstream.md "Key rotation") -------------------------

NEW = "unit-test-new-key-fedcba9876543210"


def _sealed_bits(sc: crypt.StoreCrypt) -> tuple[bytes, bytes, bytes]:
    """A sealed record, an index token and a sealed file, as a store holds them."""
    f = io.BytesIO()
    crypt.write_file(sc.files, f, lambda out: out.write(MARK * 5000))
    return sc.lmdb.seal(MARK, b"aad"), sc.tokens.subject("orders.1"), f.getvalue()


def _readable(sc: crypt.StoreCrypt, bits: tuple[bytes, bytes, bytes]) -> None:
    record, token, blob = bits
    assert sc.lmdb.open(record, b"aad") == MARK
    assert sc.tokens.subject("orders.1") == token  # index lookups keep working
    assert crypt.read_file(sc.files, io.BytesIO(blob)).read() == MARK * 5000


def test_rotation_rewraps_only_the_key_file(tmp_path: Path, cipher: str) -> None:
    first = crypt.open_store(str(tmp_path), KEY, cipher)
    assert first is not None and not first.rotated
    bits = _sealed_bits(first)
    path = tmp_path / crypt.KEY_FILE
    raw = path.read_bytes()
    with pytest.raises(crypt.KeyFileError, match="give the old one as jetstream.prev_key"):
        crypt.open_store(str(tmp_path), NEW, cipher)
    with pytest.raises(crypt.KeyFileError, match="neither jetstream.key nor"):
        crypt.open_store(str(tmp_path), NEW, cipher, prev_key=NEW + "x")
    assert path.read_bytes() == raw  # refusals write nothing
    rotated = crypt.open_store(str(tmp_path), NEW, cipher, prev_key=KEY)
    assert rotated is not None and rotated.rotated and rotated.epoch == first.epoch + 1
    _readable(rotated, bits)
    assert KEY.encode() not in path.read_bytes() and NEW.encode() not in path.read_bytes()
    with pytest.raises(crypt.KeyFileError, match="wrong key"):
        crypt.open_store(str(tmp_path), KEY, cipher)
    again = crypt.open_store(str(tmp_path), NEW, cipher, prev_key=KEY)  # prev_key left set
    assert again is not None and not again.rotated and again.epoch == rotated.epoch + 1
    _readable(again, bits)
    ro = crypt.open_readonly(str(tmp_path), NEW)
    _readable(ro, bits)
    with pytest.raises(RuntimeError):
        ro.lmdb.seal(b"x", b"")


def _v1_key_file(path: Path, master: bytes, cipher: str, salt: bytes, epoch: int) -> None:
    """The key file as the code before envelope keys wrote it (docs/jetstream.md)."""
    body = b"JRCRYPT1\n" + struct.pack("<B32s32sI", {"chacha": 1, "aes": 2}[cipher], salt,
                                       crypt.derive(master, salt, "key-check", cipher), epoch)
    path.write_bytes(body + struct.pack("<I", zlib.crc32(body)))


def test_a_v1_store_keeps_its_keys_and_rotates(tmp_path: Path, cipher: str) -> None:
    salt = os.urandom(32)
    _v1_key_file(tmp_path / crypt.KEY_FILE, KEY.encode(), cipher, salt, 7)
    # What the v1 code sealed with: every key derived from the configured key itself.
    bits = _sealed_bits(crypt.StoreCrypt(KEY.encode(), cipher, salt, 7))
    with pytest.raises(crypt.KeyFileError, match="wrong key"):
        crypt.open_store(str(tmp_path), NEW, cipher)
    ro = crypt.open_readonly(str(tmp_path), KEY)  # the audit reads a v1 store as it is
    _readable(ro, bits)
    upgraded = crypt.open_store(str(tmp_path), KEY, cipher)
    assert upgraded is not None and upgraded.epoch == 8
    assert (tmp_path / crypt.KEY_FILE).read_bytes().startswith(b"JRCRYPT2\n")
    _readable(upgraded, bits)
    rotated = crypt.open_store(str(tmp_path), NEW, cipher, prev_key=KEY)
    assert rotated is not None and rotated.rotated and rotated.epoch == 9
    _readable(rotated, bits)


def test_a_v1_store_rotates_directly(tmp_path: Path) -> None:
    salt = os.urandom(32)
    _v1_key_file(tmp_path / crypt.KEY_FILE, KEY.encode(), "aes", salt, 0)
    bits = _sealed_bits(crypt.StoreCrypt(KEY.encode(), "aes", salt, 0))
    rotated = crypt.open_store(str(tmp_path), NEW, "aes", prev_key=KEY)
    assert rotated is not None and rotated.rotated
    _readable(rotated, bits)
    _readable(crypt.open_readonly(str(tmp_path), NEW), bits)


def test_fresh_stores_have_their_own_data_keys_and_share_the_cluster_secret(
        tmp_path: Path) -> None:
    a = _open(tmp_path / "a")
    b = _open(tmp_path / "b")
    # A node created after the rotation, told the old key: same tokens and files as its peers.
    (tmp_path / "c").mkdir()
    c = crypt.open_store(str(tmp_path / "c"), NEW, "chacha", prev_key=KEY)
    assert c is not None
    assert a.root != b.root and len(a.root) == 32
    record, token, blob = _sealed_bits(a)
    for other in (b, c):
        assert other.tokens.subject("orders.1") == token
        assert crypt.read_file(other.files, io.BytesIO(blob)).read() == MARK * 5000
        with pytest.raises(crypt.SealError):
            other.lmdb.open(record, b"aad")


def test_a_damaged_key_file_is_refused(tmp_path: Path) -> None:
    _open(tmp_path)
    path = tmp_path / crypt.KEY_FILE
    raw = bytearray(path.read_bytes())
    raw[20] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(crypt.KeyFileError, match="damaged"):
        crypt.open_store(str(tmp_path), KEY, "chacha")
    # An epoch lowered on purpose (nonce reuse) with the CRC fixed: the wrap's AAD fails.
    _open(tmp_path / "b")
    path = tmp_path / "b" / crypt.KEY_FILE
    raw = bytearray(path.read_bytes())
    epoch_at = len(b"JRCRYPT2\n") + 1 + 32
    raw[epoch_at] ^= 1
    body = bytes(raw[:-4])
    path.write_bytes(body + struct.pack("<I", zlib.crc32(body)))
    with pytest.raises(crypt.KeyFileError, match="wrong key"):
        crypt.open_store(str(tmp_path / "b"), KEY, "chacha")

"""LmdbStore: a stream's messages in the node's one LMDB environment.

`NodeEnv` opens the environment once per node with named databases; every stream's keys carry
its prefix (u16 name length + name), so all streams share the databases:

    js_msgs       prefix | seq u64 BE              -> record (store/base.py: CRC, ts, subject, ...)
    js_subj       prefix | subject | 0x00 | seq BE -> b""    per-subject index (ordered by seq)
    js_subjcount  prefix | subject                 -> count u64 LE
    js_meta       prefix | key                     -> value  (counters, last seq, applied index)
    js_consumers  prefix | consumer name           -> consumer state record
    js_ttl        prefix | expires_ns BE | seq BE  -> b""    per-message TTL index
    js_dedup      prefix | msg id                  -> seq u64 LE | ts_ns i64 LE
    js_dedup_ts   prefix | ts_ns BE | msg id       -> b""    (prunes the window in order)

Subjects never contain NUL (stream subjects are validated), so `subject | 0x00` sorts every
sequence of one subject together and before any longer subject.

Writes made inside `batch()` share one write transaction: a batch of Raft entries applied
together costs one LMDB commit. Nothing per message stays in memory, so memory is bounded
whatever the stream's size. The durability argument is in docs/jetstream.md.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lmdb

from node.jetstream.dirs import fsync_dir
from node.jetstream.store.base import (
    CorruptRecordError,
    Sizer,
    StoredMsg,
    decode_record,
    encode_record,
    file_size,
)

_U64 = struct.Struct("<Q")
DB_NAMES = ("js_msgs", "js_subj", "js_subjcount", "js_meta", "js_consumers", "js_ttl",
            "js_dedup", "js_dedup_ts")


# Databases whose every value is sealed when the store is encrypted; in js_meta, the values
# written by put_meta (keys not starting with NUL; the NUL-prefixed ones are the msgs/bytes
# counters). Subjects and msg ids in KEYS are not (docs/jetstream.md, what is not encrypted).
SEALED_DBS = ("js_msgs", "js_consumers")
SYNCED_META = "synced-meta"  # the meta pages of the last synced transaction (see NodeEnv)
_SIDE_MAGIC = b"JRLMDBMETA1\n"
SYNC_INTERVAL_S = 0.25


class NodeEnv:
    """The node's LMDB environment and its named databases (opened once, shared).

    Commits are NOT fsynced (MDB_NOSYNC): the Raft WAL is the durable record, and LMDB is made
    durable only at sync points (`sync()`: every SYNC_INTERVAL_S by a background thread, and by
    every snapshot before the WAL is compacted). What makes that safe on power loss, where
    plain MDB_NOSYNC is not (docs/jetstream.md, durability argument):

    * a read transaction stays open on the last synced transaction S (the pin), so LMDB never
      reuses a page that S's tree references: S's pages are on disk and stay unchanged;
    * S's two meta pages are saved in `synced-meta` (written, fsynced, renamed, dir fsynced)
      before the pin moves on;
    * opening the environment first writes those meta pages back: LMDB then opens at S,
      whatever later meta page or data page did or did not reach the disk, and the driver
      re-applies the entries after S's applied indexes from the WAL (which is never
      compacted past an index read before a sync).

    So after any crash the store is exactly the state of the last sync point, never a torn one.
    sync=False (tests only) drops the sync points: a power loss could then corrupt the file.
    """

    MAP_SIZE = 1 << 40  # address space only; the file grows as data is written

    def __init__(self, path: str, *, sync: bool = True,
                 sync_interval: float | None = SYNC_INTERVAL_S,
                 on_fatal: Callable[[BaseException], None] | None = None,
                 sealer: Any = None, files: Any = None, tokens: Any = None) -> None:
        self.path = path
        self.tokens = tokens  # crypt.IndexTokens: subjects and msg ids in keys, or None
        self.files = files  # crypt.FileCodec for the snapshot images (machines.py), or None
        # Encryption at rest (node/jetstream/crypt.py `Sealer`; None: values in the clear):
        # the values of SEALED_DBS and of every `put_meta` key are sealed, with the database
        # and the key as associated data (docs/jetstream.md, "Encryption at rest").
        self.sealer = sealer
        self.durable = sync
        # A failed sync point is fatal: the page cache may have dropped what it held, and a
        # later fsync can report success over the loss. Every later sync raises, and
        # `on_fatal` (called from the syncer thread) stops the node.
        self.failed: BaseException | None = None
        self.on_fatal = on_fatal
        if sync:
            _roll_back_to_synced(path)
        self.env = lmdb.open(path, map_size=self.MAP_SIZE, max_dbs=16, sync=False,
                             metasync=False, readahead=False)
        self.dbs = {name: self.env.open_db(name.encode()) for name in DB_NAMES}
        # lmdb.open may have just created data.mdb: its directory entry must be durable
        # before anything relies on the file (a power loss could take it back otherwise).
        fsync_dir(path)
        self._sync_lock = threading.Lock()
        self._pin: Any = None
        self._synced_txn = -1
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        self.syncs = 0
        if sync:
            self.sync()
            if sync_interval:
                self._syncer = threading.Thread(target=self._sync_loop, args=(sync_interval,),
                                                name="lmdb-sync", daemon=True)
                self._syncer.start()

    def sync(self) -> None:
        """Make everything committed so far durable and the new recovery point. Read the
        applied indexes BEFORE calling it: those are then durable, and the WAL may be
        compacted up to them. A failed fsync raises (the node stops: fail-stop)."""
        if not self.durable:
            self.env.sync(True)
            return
        if self.failed is not None:
            raise RuntimeError("an LMDB sync point failed earlier; refusing") from self.failed
        try:
            self._sync_point()
        except BaseException as exc:
            self.failed = exc
            raise

    def _sync_point(self) -> None:
        with self._sync_lock:
            # Under the write lock nothing commits: the pin and the meta pages read here are
            # both exactly the last committed transaction S.
            wtxn = self.env.begin(write=True)
            try:
                pin = self.env.begin()
                txn_id = pin.id()
                psize = self.env.stat()["psize"]
                fd = os.open(os.path.join(self.path, "data.mdb"), os.O_RDONLY)
                try:
                    pages = os.pread(fd, 2 * psize, 0)
                finally:
                    os.close(fd)
            finally:
                wtxn.abort()
            if txn_id == self._synced_txn:
                pin.abort()
                return
            self.env.sync(True)  # S's pages and meta pages are on disk
            _write_side(self.path, pages)  # then the record that points at them
            old, self._pin, self._synced_txn = self._pin, pin, txn_id
            self.syncs += 1
            if old is not None:
                old.abort()  # the previous sync point's pages may be reused from now on

    def _sync_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                if self.env.info()["last_txnid"] != self._synced_txn:
                    self.sync()
            except Exception as exc:  # noqa: BLE001 - fail-stop, whatever it was
                if not self._stop.is_set() and self.on_fatal is not None:
                    self.on_fatal(exc)
                return

    def close(self) -> None:
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join()
        if self.durable and self.failed is None:
            self.sync()  # a clean stop replays nothing
        with self._sync_lock:
            if self._pin is not None:
                self._pin.abort()
                self._pin = None
        self.env.close()


def _write_side(path: str, pages: bytes) -> None:
    body = _SIDE_MAGIC + struct.pack("<II", zlib.crc32(pages), len(pages)) + pages
    tmp = os.path.join(path, SYNCED_META + ".tmp")
    with open(tmp, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, SYNCED_META))
    dfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _roll_back_to_synced(path: str) -> None:
    """Put the last sync point's meta pages back before LMDB opens the file."""
    side = os.path.join(path, SYNCED_META)
    data = os.path.join(path, "data.mdb")
    if not os.path.exists(side) or not os.path.exists(data):
        return
    with open(side, "rb") as f:
        raw = f.read()
    head = len(_SIDE_MAGIC)
    ok = raw.startswith(_SIDE_MAGIC) and len(raw) >= head + 8
    crc, size = struct.unpack("<II", raw[head:head + 8]) if ok else (0, -1)
    pages = raw[head + 8:]
    if not ok or len(pages) != size or zlib.crc32(pages) != crc:
        # renamed into place only once fsynced: a bad file is damage, not a torn write
        raise RuntimeError(f"{side} is damaged: refusing to open the store")
    fd = os.open(data, os.O_WRONLY)
    try:
        os.pwrite(fd, pages, 0)
        os.fdatasync(fd)
    finally:
        os.close(fd)


class _Borrowed:
    """The batch's open txn, lent to one store call: leaving the `with` ends nothing."""

    __slots__ = ("txn",)

    def __init__(self, txn: Any) -> None:
        self.txn = txn

    def __enter__(self) -> Any:
        return self.txn

    def __exit__(self, *exc: object) -> None:
        return None


class _Batch:
    """One open write transaction and the counters it has not written back yet.

    A stored message changes three counters (the stream's messages and bytes, its subject's
    count): read-modify-writes that cost more than the message's own two puts. Inside a
    batch they are read once, kept here, and put once when the batch commits. Their keys
    and values end up exactly as if every message had written them (a counter touched in
    the batch is written even when its net change is zero), so a store does not depend on
    where the batch boundaries fell (the audit replays with other boundaries)."""

    __slots__ = ("txn", "msgs", "bytes", "counts", "dirty")

    def __init__(self, txn: Any) -> None:
        self.txn = txn
        self.msgs: int | None = None  # None: not touched in this batch
        self.bytes = 0
        # js_subjcount key -> [count, value tail]: b"" in the clear; encrypted, the sealed
        # subject (None until sealed), kept from the stored value as the old code kept it
        self.counts: dict[bytes, list[Any]] = {}
        self.dirty: set[bytes] = set()


_INF = 1 << 64  # above every u64 key time: "no entry in this index"
_HEADS_MAX = 4096  # subjects whose index key head a store remembers (then starts over)


class LmdbStore:
    def __init__(self, node_env: NodeEnv, name: str, sizer: Sizer = file_size) -> None:
        raw = name.encode()
        self.name = name
        self.sizer = sizer
        self._env = node_env.env
        self._db = node_env.dbs
        self._msgs_db = node_env.dbs["js_msgs"]
        self._subj_db = node_env.dbs["js_subj"]
        self._count_db = node_env.dbs["js_subjcount"]
        self._meta_db = node_env.dbs["js_meta"]
        self._sealer = node_env.sealer
        self._tokens = node_env.tokens
        self._prefix = len(raw).to_bytes(2, "big") + raw
        self._msgs_key = self._prefix + b"\x00msgs"
        self._bytes_key = self._prefix + b"\x00bytes"
        # The open batch belongs to the thread that opened it: applies may run in a
        # worker thread while the event loop serves reads from its own read txns.
        self._local = threading.local()
        # Lower bounds of the earliest key time in js_ttl and js_dedup_ts (None: unknown;
        # _INF: empty). Every applied entry asks for due TTLs and prunes the dedup window:
        # below these bounds the answer is "nothing" without opening a cursor. Only the
        # applying thread uses them; an aborted batch or a replaced stream resets them.
        self._ttl_floor: int | None = None
        self._dedup_floor: int | None = None
        self._heads: dict[str, bytes] = {}  # subject -> its index key head (_head_key)

    def _batch_now(self) -> _Batch | None:
        return getattr(self._local, "batch", None)

    @property
    def _txn(self) -> Any:
        b = getattr(self._local, "batch", None)
        return None if b is None else b.txn

    # -- transactions ----------------------------------------------------------------------

    @contextmanager
    def batch(self) -> Iterator[None]:
        if getattr(self._local, "batch", None) is not None:  # nested: the outer one commits
            yield
            return
        txn = self._env.begin(write=True)
        b = self._local.batch = _Batch(txn)
        try:
            yield
            self._write_back(b)
        except BaseException:
            txn.abort()
            self._forget_floors()  # the aborted batch may have moved them
            raise
        else:
            txn.commit()
        finally:
            self._local.batch = None

    def _forget_floors(self) -> None:
        self._ttl_floor = self._dedup_floor = None

    def _write_back(self, b: _Batch) -> None:
        """Put the counters the batch kept in memory (before the commit)."""
        self._write_counts(b)
        if b.msgs is not None:
            assert b.msgs >= 0 and b.bytes >= 0, (self.name, b.msgs, b.bytes)
            b.txn.put(self._msgs_key, _U64.pack(b.msgs), db=self._meta_db)
            b.txn.put(self._bytes_key, _U64.pack(b.bytes), db=self._meta_db)

    def _write_counts(self, b: _Batch) -> None:
        for key in b.dirty:
            count, tail = b.counts[key]
            assert count >= 0, (self.name, key, count)
            if count:
                b.txn.put(key, _U64.pack(count) + tail, db=self._count_db)
            else:
                b.txn.delete(key, db=self._count_db)
        b.dirty.clear()

    # `with self._write() as txn`: the open batch's txn, else a txn of its own (LMDB's
    # Transaction is a context manager: commit, or abort on an exception). Not generator
    # context managers: an applied message makes several of these calls, and a generator's
    # set-up and tear-down cost more than the LMDB work of most of them.
    def _write(self) -> Any:
        b = getattr(self._local, "batch", None)
        return _Borrowed(b.txn) if b is not None else self._env.begin(write=True)

    def _read(self) -> Any:
        b = getattr(self._local, "batch", None)
        return _Borrowed(b.txn) if b is not None else self._env.begin()

    # -- keys ------------------------------------------------------------------------------

    def _msg_key(self, seq: int) -> bytes:
        return self._prefix + seq.to_bytes(8, "big")

    def _skey(self, subject: str) -> bytes:
        """A subject as it appears in index keys: itself, or (encrypted store) its keyed
        token, fixed length, so `token | 0x00 | seq` still groups one subject's sequences."""
        return subject.encode() if self._tokens is None else self._tokens.subject(subject)

    def _mkey(self, msg_id: str) -> bytes:
        return msg_id.encode() if self._tokens is None else self._tokens.msg_id(msg_id)

    def _subj_key(self, subject: str, seq: int) -> bytes:
        return self._prefix + self._skey(subject) + b"\x00" + seq.to_bytes(8, "big")

    def _counter(self, txn: Any, key: str) -> int:
        raw = txn.get(self._prefix + key.encode(), db=self._meta_db)
        return _U64.unpack(raw)[0] if raw else 0

    # -- counters kept by the batch --------------------------------------------------------

    def _totals(self, b: _Batch, msgs: int, size: int) -> None:
        if b.msgs is None:
            raw = b.txn.get(self._msgs_key, db=self._meta_db)
            b.msgs = _U64.unpack(raw)[0] if raw else 0
            raw = b.txn.get(self._bytes_key, db=self._meta_db)
            b.bytes = _U64.unpack(raw)[0] if raw else 0
        b.msgs += msgs
        b.bytes += size

    def _count_entry(self, b: _Batch, key: bytes) -> list[Any]:
        entry = b.counts.get(key)
        if entry is None:
            raw = b.txn.get(key, db=self._count_db)
            if raw is None:
                entry = [0, b"" if self._tokens is None else None]
            else:
                entry = [_U64.unpack_from(raw)[0], bytes(raw[8:])]
            b.counts[key] = entry
        return entry

    def _bump(self, b: _Batch, key: bytes, subject: str, delta: int) -> None:
        entry = self._count_entry(b, key)
        entry[0] += delta
        if entry[1] is None:
            # Encrypted: the count is followed by the sealed subject (subjects() lists it),
            # sealed once when the subject first appears and kept as is after that.
            entry[1] = self._seal("js_subjcount", key, subject.encode())
        b.dirty.add(key)

    # -- messages --------------------------------------------------------------------------

    def store(self, msg: StoredMsg) -> None:
        b = getattr(self._local, "batch", None)
        if b is None:
            with self.batch():
                self.store(msg)
            return
        seq = msg.seq.to_bytes(8, "big")
        key = self._prefix + seq
        record = encode_record(msg)
        if self._sealer is not None:
            record = self._seal("js_msgs", key, record)
        txn = b.txn
        added = txn.put(key, record, db=self._msgs_db, overwrite=False)
        assert added, f"seq {msg.seq} stored twice"
        subject = msg.subject
        head = self._heads.get(subject)
        if head is None:
            head = self._head_key(subject)
        txn.put(head + b"\x00" + seq, b"", db=self._subj_db)
        entry = b.counts.get(head)
        if entry is not None and entry[1] is not None:  # the subject's count, already read
            entry[0] += 1
            b.dirty.add(head)
        else:
            self._bump(b, head, subject, 1)
        size = self.sizer(subject, msg.hdr, msg.data)
        if b.msgs is None:
            self._totals(b, 1, size)
        else:
            b.msgs += 1
            b.bytes += size

    def _head_key(self, subject: str) -> bytes:
        """`prefix | skey(subject)`, the subject's index key head, remembered for the next
        messages on it (encrypted stores: the keyed token is a MAC per call otherwise)."""
        heads = self._heads
        if len(heads) >= _HEADS_MAX:
            heads.clear()
        head = heads[subject] = self._prefix + self._skey(subject)
        return head

    def load(self, seq: int) -> StoredMsg | None:
        with self._read() as txn:
            raw = txn.get(self._msg_key(seq), db=self._db["js_msgs"])
            return None if raw is None else self._decode(seq, raw)

    def load_many(self, seqs: list[int]) -> tuple[dict[int, StoredMsg], dict[int, str]]:
        """`load` of several sequences in ONE read transaction (a consumer's delivery
        round): (messages found, damaged records' errors by sequence)."""
        msgs: dict[int, StoredMsg] = {}
        corrupt: dict[int, str] = {}
        with self._read() as txn:
            for seq in seqs:
                raw = txn.get(self._msg_key(seq), db=self._msgs_db)
                if raw is None:
                    continue
                try:
                    msgs[seq] = self._decode(seq, raw)
                except CorruptRecordError as exc:
                    corrupt[seq] = str(exc)
        return msgs, corrupt

    def remove(self, seq: int) -> StoredMsg | None:
        b = getattr(self._local, "batch", None)
        if b is None:
            with self.batch():
                return self.remove(seq)
        txn, key = b.txn, self._msg_key(seq)
        raw = txn.get(key, db=self._msgs_db)
        if raw is None:
            return None
        msg = self._decode(seq, raw)
        txn.delete(key, db=self._msgs_db)
        head = self._prefix + self._skey(msg.subject)
        txn.delete(head + b"\x00" + seq.to_bytes(8, "big"), db=self._subj_db)
        self._bump(b, head, msg.subject, -1)
        self._totals(b, -1, -self.sizer(msg.subject, msg.hdr, msg.data))
        return msg

    def _seal(self, db: str, key: bytes, value: bytes) -> bytes:
        if self._sealer is None:
            return value
        return self._sealer.seal(value, db.encode() + b"\x00" + key)

    def _open(self, db: str, key: bytes, value: Any) -> bytes:
        if self._sealer is None:
            return bytes(value)
        return self._sealer.open(bytes(value), db.encode() + b"\x00" + key)

    def _decode(self, seq: int, raw: Any) -> StoredMsg:
        """The AEAD tag is checked first (a failure is corruption, as a CRC mismatch is),
        then the record's own CRC over the plaintext."""
        try:
            record = self._open("js_msgs", self._msg_key(seq), raw)
        except Exception as exc:  # noqa: BLE001 - crypt.SealError: nothing is served
            raise CorruptRecordError(self.name, seq, f"does not decrypt: {exc}") from exc
        return decode_record(self.name, seq, record)

    def first_seq(self) -> int:
        return next(self.seqs(1), 0)

    def seqs(self, start: int = 1) -> Iterator[int]:
        """Reads in short read transactions so a long walk never pins one. The chunks start
        small and grow to 1,000 keys: most callers want only the first few sequences (a
        consumer's next message), and reading 1,000 keys to use one was the main CPU cost of
        a pull consumer's delivery."""
        key = self._msg_key(start)
        size = 8
        while True:
            chunk: list[int] = []
            with self._read() as txn:
                cur = txn.cursor(db=self._db["js_msgs"])
                if not cur.set_range(key):
                    return
                for k in cur.iternext(keys=True, values=False):
                    if not k.startswith(self._prefix) or len(chunk) >= size:
                        break
                    chunk.append(int.from_bytes(k[len(self._prefix):], "big"))
            if not chunk:
                return
            yield from chunk
            key = self._msg_key(chunk[-1] + 1)
            size = min(size * 4, 1000)

    def seqs_desc(self) -> Iterator[int]:
        """Highest first, in short read transactions of 1,000 keys."""
        key = self._prefix + b"\xff" * 8
        while True:
            chunk: list[int] = []
            with self._read() as txn:
                cur = txn.cursor(db=self._db["js_msgs"])
                found = cur.set_range(key)
                moved = cur.prev() if found else cur.last()
                if not moved:
                    return
                for k in cur.iterprev(keys=True, values=False):
                    if not k.startswith(self._prefix) or len(chunk) >= 1000:
                        break
                    chunk.append(int.from_bytes(k[len(self._prefix):], "big"))
            if not chunk:
                return
            yield from chunk
            key = self._msg_key(chunk[-1])

    def msgs(self) -> int:
        b = getattr(self._local, "batch", None)
        if b is not None and b.msgs is not None:
            return b.msgs
        with self._read() as txn:
            return self._counter(txn, "\x00msgs")

    def bytes(self) -> int:
        b = getattr(self._local, "batch", None)
        if b is not None and b.msgs is not None:
            return b.bytes
        with self._read() as txn:
            return self._counter(txn, "\x00bytes")

    # -- per-subject index -----------------------------------------------------------------

    def last_for_subject(self, subject: str) -> int:
        head = self._prefix + self._skey(subject) + b"\x00"
        with self._read() as txn:
            cur = txn.cursor(db=self._db["js_subj"])
            if cur.set_range(head + b"\xff" * 8):
                if not cur.prev():
                    return 0
            elif not cur.last():
                return 0
            key = cur.key()
            return int.from_bytes(key[len(head):], "big") if key.startswith(head) else 0

    def first_for_subject(self, subject: str, start: int = 1) -> int:
        head = self._prefix + self._skey(subject) + b"\x00"
        with self._read() as txn:
            cur = txn.cursor(db=self._db["js_subj"])
            if not cur.set_range(head + start.to_bytes(8, "big")):
                return 0
            key = cur.key()
            return int.from_bytes(key[len(head):], "big") if key.startswith(head) else 0

    def subject_count(self, subject: str) -> int:
        b = getattr(self._local, "batch", None)
        if b is not None:
            return self._count_entry(b, self._prefix + self._skey(subject))[0]
        with self._read() as txn:
            raw = txn.get(self._prefix + self._skey(subject), db=self._db["js_subjcount"])
            return _U64.unpack_from(raw)[0] if raw else 0

    def subjects(self) -> Iterator[tuple[str, int]]:
        b = getattr(self._local, "batch", None)
        if b is not None:
            self._write_counts(b)  # the walk below reads js_subjcount itself
        if self._tokens is not None:
            # Keys are tokens: open each sealed name; sorted, so callers see subject order
            # as in the clear store (this holds one list of the stream's subjects).
            yield from sorted(self._sealed_subjects())
            return
        with self._read() as txn:
            cur = txn.cursor(db=self._db["js_subjcount"])
            if not cur.set_range(self._prefix):
                return
            for key, value in cur:
                if not key.startswith(self._prefix):
                    return
                yield key[len(self._prefix):].decode(), _U64.unpack(value)[0]

    def _sealed_subjects(self) -> list[tuple[str, int]]:
        out = []
        with self._read() as txn:
            cur = txn.cursor(db=self._db["js_subjcount"])
            if not cur.set_range(self._prefix):
                return out
            for key, value in cur:
                if not key.startswith(self._prefix):
                    break
                name = self._open("js_subjcount", bytes(key), value[8:]).decode()
                out.append((name, _U64.unpack_from(value)[0]))
        return out

    # -- meta and consumers ----------------------------------------------------------------

    def _ttl_key(self, expires_ns: int, seq: int) -> bytes:
        return self._prefix + max(expires_ns, 0).to_bytes(8, "big") + seq.to_bytes(8, "big")

    def add_ttl(self, expires_ns: int, seq: int) -> None:
        with self._write() as txn:
            txn.put(self._ttl_key(expires_ns, seq), b"", db=self._db["js_ttl"])
        if self._ttl_floor is not None:
            self._ttl_floor = min(self._ttl_floor, max(expires_ns, 0))

    def remove_ttl(self, expires_ns: int, seq: int) -> None:
        with self._write() as txn:
            txn.delete(self._ttl_key(expires_ns, seq), db=self._db["js_ttl"])

    def due_ttls(self, now_ns: int, limit: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        if self._ttl_floor is not None and now_ns < self._ttl_floor:
            return out  # the earliest expiry in the index is later
        earliest = _INF
        with self._read() as txn:
            cur = txn.cursor(db=self._db["js_ttl"])
            if cur.set_range(self._prefix):
                for key in cur.iternext(keys=True, values=False):
                    if not key.startswith(self._prefix) or len(out) >= limit:
                        break
                    rest = key[len(self._prefix):]
                    expires = int.from_bytes(rest[:8], "big")
                    earliest = min(earliest, expires)
                    if expires > now_ns:
                        break
                    out.append((expires, int.from_bytes(rest[8:], "big")))
        # Removing keys keeps a lower bound true; add_ttl lowers it.
        self._ttl_floor = earliest
        return out

    def put_dedup(self, msg_id: str, seq: int, ts_ns: int) -> None:
        key = self._prefix + self._mkey(msg_id)
        with self._write() as txn:
            old = txn.get(key, db=self._db["js_dedup"])
            if old is not None:
                old_ts = struct.unpack("<Qq", old)[1]
                txn.delete(self._dedup_ts_key(old_ts, msg_id), db=self._db["js_dedup_ts"])
            txn.put(key, struct.pack("<Qq", seq, ts_ns), db=self._db["js_dedup"])
            txn.put(self._dedup_ts_key(ts_ns, msg_id), b"", db=self._db["js_dedup_ts"])
        if self._dedup_floor is not None:
            self._dedup_floor = min(self._dedup_floor, max(ts_ns, 0))

    def _dedup_ts_key(self, ts_ns: int, msg_id: str) -> bytes:
        return self._prefix + max(ts_ns, 0).to_bytes(8, "big") + self._mkey(msg_id)

    def get_dedup(self, msg_id: str) -> tuple[int, int] | None:
        with self._read() as txn:
            raw = txn.get(self._prefix + self._mkey(msg_id), db=self._db["js_dedup"])
            return None if raw is None else struct.unpack("<Qq", raw)

    def prune_dedup(self, before_ns: int, limit: int) -> int:
        if self._dedup_floor is not None and before_ns <= self._dedup_floor:
            return 0  # the oldest remembered id is inside the window
        pruned = 0
        earliest: int | None = _INF
        with self._write() as txn:
            cur = txn.cursor(db=self._db["js_dedup_ts"])
            if cur.set_range(self._prefix):
                while True:
                    key = cur.key()
                    if not key.startswith(self._prefix):
                        break
                    rest = key[len(self._prefix):]
                    earliest = int.from_bytes(rest[:8], "big")
                    if earliest >= before_ns or pruned >= limit:
                        break
                    txn.delete(self._prefix + rest[8:], db=self._db["js_dedup"])
                    pruned += 1
                    earliest = _INF
                    if not cur.delete():
                        earliest = None  # cannot happen (the cursor is on a key); unknown
                        break
        self._dedup_floor = earliest
        return pruned

    def put_meta(self, key: str, value: bytes) -> None:
        full = self._prefix + key.encode()
        with self._write() as txn:
            txn.put(full, self._seal("js_meta", full, value), db=self._db["js_meta"])

    def put_metas(self, items: list[tuple[str, bytes]]) -> None:
        """Several `put_meta`s in one txn: a stream's progress after every applied run."""
        db = self._db["js_meta"]
        prefix = self._prefix
        with self._write() as txn:
            for key, value in items:
                full = prefix + key.encode()
                txn.put(full, self._seal("js_meta", full, value), db=db)

    def get_meta(self, key: str) -> bytes | None:
        full = self._prefix + key.encode()
        with self._read() as txn:
            raw = txn.get(full, db=self._db["js_meta"])
            return None if raw is None else self._open("js_meta", full, raw)

    def put_consumer(self, name: str, state: bytes) -> None:
        full = self._prefix + name.encode()
        with self._write() as txn:
            txn.put(full, self._seal("js_consumers", full, state), db=self._db["js_consumers"])

    def get_consumer(self, name: str) -> bytes | None:
        full = self._prefix + name.encode()
        with self._read() as txn:
            raw = txn.get(full, db=self._db["js_consumers"])
            return None if raw is None else self._open("js_consumers", full, raw)

    def delete_consumer(self, name: str) -> None:
        with self._write() as txn:
            txn.delete(self._prefix + name.encode(), db=self._db["js_consumers"])

    def consumers(self) -> list[str]:
        out = []
        with self._read() as txn:
            cur = txn.cursor(db=self._db["js_consumers"])
            if cur.set_range(self._prefix):
                for key in cur.iternext(keys=True, values=False):
                    if not key.startswith(self._prefix):
                        break
                    out.append(key[len(self._prefix):].decode())
        return out

    def drop(self) -> None:
        """Delete every key of this stream in every database (stream deleted, or its group
        starts again from the empty state). One write transaction: all or nothing."""
        self._forget_floors()
        b = getattr(self._local, "batch", None)
        if b is not None:  # counters kept by the batch describe keys about to go
            b.msgs, b.counts, b.dirty = None, {}, set()
        with self._write() as txn:
            for db in self._db.values():
                cur = txn.cursor(db=db)
                if not cur.set_range(self._prefix):
                    continue
                while cur.key().startswith(self._prefix):
                    if not cur.delete():
                        break



IMAGE_MAGIC = b"JSIMG1\n"
_REC = struct.Struct("<BII")  # database index, key length, value length
_END = 255


def dump_image(store: LmdbStore, f: Any) -> int:
    """Every key of `store`'s stream, read in ONE read transaction, written to the open
    binary file `f` (magic, then records `db u8 | klen u32 | vlen u32 | key | value` with
    keys stripped of the stream's prefix, then 0xff). Returns the applied index that same
    transaction held: the image is exactly the state at that index."""
    applied = 0
    f.write(IMAGE_MAGIC)
    with store._env.begin() as txn:
        for i, name in enumerate(DB_NAMES):
            cur = txn.cursor(db=store._db[name])
            if not cur.set_range(store._prefix):
                continue
            for key, value in cur:
                if not key.startswith(store._prefix):
                    break
                short = key[len(store._prefix):]
                if _sealed(name, short):
                    value = store._open(name, bytes(key), value)  # the file is sealed whole
                elif name == "js_subjcount" and store._tokens is not None:
                    value = value[:8] + store._open(name, bytes(key), value[8:])
                if name == "js_meta" and short == b"applied":
                    applied = _U64.unpack(value)[0]
                f.write(_REC.pack(i, len(short), len(value)))
                f.write(short)
                f.write(value)
    f.write(bytes([_END]))
    return applied


def _sealed(db: str, short_key: bytes) -> bool:
    """Whether values of this database and key are sealed in an encrypted store."""
    return db in SEALED_DBS or (db == "js_meta" and not short_key.startswith(b"\x00"))


def load_image(store: LmdbStore, f: Any) -> None:
    """Replace `store`'s stream by the image in `f` (after its magic): one write
    transaction, so a crash leaves the old state or the new one, never a mix."""
    store._forget_floors()
    with store._env.begin(write=True) as txn:
        for db in store._db.values():
            cur = txn.cursor(db=db)
            if cur.set_range(store._prefix):
                while cur.key().startswith(store._prefix):
                    if not cur.delete():
                        break
        while True:
            head = f.read(1)
            if not head or head[0] == _END:
                if not head:
                    raise ValueError("stream image truncated")
                return
            rest = f.read(_REC.size - 1)
            if len(rest) != _REC.size - 1:
                raise ValueError("stream image truncated")
            i, klen, vlen = _REC.unpack(head + rest)
            key, value = f.read(klen), f.read(vlen)
            if len(key) != klen or len(value) != vlen or i >= len(DB_NAMES):
                raise ValueError("stream image damaged")
            full = store._prefix + key
            if _sealed(DB_NAMES[i], key):
                value = store._seal(DB_NAMES[i], full, value)  # under THIS node's key
            elif DB_NAMES[i] == "js_subjcount" and store._tokens is not None:
                value = value[:8] + store._seal(DB_NAMES[i], full, value[8:])
            txn.put(full, value, db=store._db[DB_NAMES[i]])


def stored_names(node_env: NodeEnv) -> set[str]:
    """Every store name with a key in `js_meta` (each applied stream has its `applied`).
    `js_meta` holds a handful of keys per stream and consumer: a full walk is cheap."""
    names: set[str] = set()
    with node_env.env.begin() as txn:
        for key in txn.cursor(db=node_env.dbs["js_meta"]).iternext(keys=True, values=False):
            size = int.from_bytes(key[:2], "big")
            names.add(bytes(key[2:2 + size]).decode())
    return names

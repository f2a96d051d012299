"""MemStore: a stream's messages in memory (memory storage; also the reference for tests).

Records are kept encoded, CRC included, so the read path is the same as LmdbStore's.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from node.jetstream.store.base import (
    CorruptRecordError,
    Sizer,
    StoredMsg,
    decode_record,
    encode_record,
    memory_size,
)


class MemStore:
    def __init__(self, name: str, sizer: Sizer = memory_size) -> None:
        self.name = name
        self.sizer = sizer
        self._records: dict[int, bytes] = {}  # insertion order == ascending seq
        self._by_subject: dict[str, dict[int, None]] = {}
        self._bytes = 0
        self._meta: dict[str, bytes] = {}
        self._consumers: dict[str, bytes] = {}
        self._ttls: set[tuple[int, int]] = set()
        # A lower bound of the earliest expiry in _ttls (None: unknown): every applied entry
        # asks for due TTLs, and scanning the whole set each time made applies O(n).
        self._ttl_floor: int | None = None
        self._dedup: dict[str, tuple[int, int]] = {}

    @contextmanager
    def batch(self) -> Iterator[None]:
        yield

    def store(self, msg: StoredMsg) -> None:
        assert msg.seq not in self._records, msg.seq
        assert not self._records or msg.seq > next(reversed(self._records)), "seq must grow"
        self._records[msg.seq] = encode_record(msg)
        self._by_subject.setdefault(msg.subject, {})[msg.seq] = None
        self._bytes += self.sizer(msg.subject, msg.hdr, msg.data)

    def load(self, seq: int) -> StoredMsg | None:
        raw = self._records.get(seq)
        return None if raw is None else decode_record(self.name, seq, raw)

    def load_many(self, seqs: list[int]) -> tuple[dict[int, StoredMsg], dict[int, str]]:
        """`load` of several sequences: (messages found, damaged records' errors)."""
        msgs: dict[int, StoredMsg] = {}
        corrupt: dict[int, str] = {}
        for seq in seqs:
            try:
                msg = self.load(seq)
            except CorruptRecordError as exc:
                corrupt[seq] = str(exc)
                continue
            if msg is not None:
                msgs[seq] = msg
        return msgs, corrupt

    def remove(self, seq: int) -> StoredMsg | None:
        msg = self.load(seq)
        if msg is None:
            return None
        del self._records[seq]
        seqs = self._by_subject[msg.subject]
        del seqs[seq]
        if not seqs:
            del self._by_subject[msg.subject]
        self._bytes -= self.sizer(msg.subject, msg.hdr, msg.data)
        return msg

    def first_seq(self) -> int:
        return next(iter(self._records), 0)

    def seqs(self, start: int = 1) -> Iterator[int]:
        for seq in list(self._records):
            if seq >= start:
                yield seq

    def seqs_desc(self) -> Iterator[int]:
        yield from reversed(list(self._records))

    def msgs(self) -> int:
        return len(self._records)

    def bytes(self) -> int:
        return self._bytes

    def last_for_subject(self, subject: str) -> int:
        seqs = self._by_subject.get(subject)
        return next(reversed(seqs)) if seqs else 0

    def first_for_subject(self, subject: str, start: int = 1) -> int:
        for seq in self._by_subject.get(subject, ()):
            if seq >= start:
                return seq
        return 0

    def subject_count(self, subject: str) -> int:
        return len(self._by_subject.get(subject, ()))

    def subjects(self) -> Iterator[tuple[str, int]]:
        for subject in sorted(self._by_subject):
            yield subject, len(self._by_subject[subject])

    def add_ttl(self, expires_ns: int, seq: int) -> None:
        self._ttls.add((expires_ns, seq))
        if self._ttl_floor is not None:
            self._ttl_floor = min(self._ttl_floor, expires_ns)

    def remove_ttl(self, expires_ns: int, seq: int) -> None:
        self._ttls.discard((expires_ns, seq))

    def due_ttls(self, now_ns: int, limit: int) -> list[tuple[int, int]]:
        if not self._ttls or (self._ttl_floor is not None and now_ns < self._ttl_floor):
            return []
        self._ttl_floor = min(t[0] for t in self._ttls)  # removals keep it a lower bound
        return sorted(t for t in self._ttls if t[0] <= now_ns)[:limit]

    def put_dedup(self, msg_id: str, seq: int, ts_ns: int) -> None:
        self._dedup.pop(msg_id, None)  # re-insert: dict order stays ts order
        self._dedup[msg_id] = (seq, ts_ns)

    def get_dedup(self, msg_id: str) -> tuple[int, int] | None:
        return self._dedup.get(msg_id)

    def prune_dedup(self, before_ns: int, limit: int) -> int:
        # Oldest first (put_dedup keeps the dict in ts order): only what goes is visited,
        # not a copy of the whole window per applied entry.
        gone = []
        for msg_id, (_seq, ts_ns) in self._dedup.items():
            if ts_ns >= before_ns or len(gone) >= limit:
                break
            gone.append(msg_id)
        for msg_id in gone:
            del self._dedup[msg_id]
        return len(gone)

    def put_meta(self, key: str, value: bytes) -> None:
        self._meta[key] = value

    def put_metas(self, items: list[tuple[str, bytes]]) -> None:
        self._meta.update(items)

    def get_meta(self, key: str) -> bytes | None:
        return self._meta.get(key)

    def put_consumer(self, name: str, state: bytes) -> None:
        self._consumers[name] = state

    def get_consumer(self, name: str) -> bytes | None:
        return self._consumers.get(name)

    def delete_consumer(self, name: str) -> None:
        self._consumers.pop(name, None)

    def consumers(self) -> list[str]:
        return sorted(self._consumers)


# ------------------------------------------------------------------------------------------
# Images: a clustered memory stream's Raft snapshot (a replica that joins or lags past a
# compaction installs it; a restarting replica restores it before replaying its WAL).

MEM_IMAGE_MAGIC = b"JSMEM1\n"
_REC = struct.Struct("<BII")  # kind u8 | key length u32 | value length u32
_MSG, _META, _CONSUMER, _TTL, _DEDUP, _END = 0, 1, 2, 3, 4, 255
_U64 = struct.Struct("<Q")
_U64X2 = struct.Struct("<QQ")


def dump_mem_image(store: MemStore, f: Any) -> None:
    """Every part of `store` to the open binary file `f`: magic, records (messages kept
    as their CRC'd encoded records), then 0xff. The caller holds the stream's lock."""
    f.write(MEM_IMAGE_MAGIC)

    def rec(kind: int, key: bytes, value: bytes) -> None:
        f.write(_REC.pack(kind, len(key), len(value)))
        f.write(key)
        f.write(value)

    for seq, raw in store._records.items():
        rec(_MSG, _U64.pack(seq), raw)
    for key, value in store._meta.items():
        rec(_META, key.encode(), value)
    for name, state in store._consumers.items():
        rec(_CONSUMER, name.encode(), state)
    for expires, seq in sorted(store._ttls):
        rec(_TTL, _U64X2.pack(expires, seq), b"")
    for msg_id, (seq, ts) in store._dedup.items():  # in ts order, as put_dedup keeps it
        rec(_DEDUP, msg_id.encode(), _U64X2.pack(seq, ts))
    f.write(bytes([_END]))


def load_mem_image(name: str, f: Any) -> MemStore:
    """A new MemStore from an image (after its magic). Each message's CRC is checked as it
    is read back, so a damaged image is refused rather than served."""
    store = MemStore(name)
    while True:
        head = f.read(1)
        if not head:
            raise ValueError("memory stream image truncated")
        if head[0] == _END:
            return store
        rest = f.read(_REC.size - 1)
        if len(rest) != _REC.size - 1:
            raise ValueError("memory stream image truncated")
        kind, klen, vlen = _REC.unpack(head + rest)
        key, value = f.read(klen), f.read(vlen)
        if len(key) != klen or len(value) != vlen:
            raise ValueError("memory stream image truncated")
        if kind == _MSG:
            seq = _U64.unpack(key)[0]
            store.store(decode_record(name, seq, value))
        elif kind == _META:
            store.put_meta(key.decode(), value)
        elif kind == _CONSUMER:
            store.put_consumer(key.decode(), value)
        elif kind == _TTL:
            store.add_ttl(*_U64X2.unpack(key))
        elif kind == _DEDUP:
            store.put_dedup(key.decode(), *_U64X2.unpack(value))
        else:
            raise ValueError("memory stream image damaged")

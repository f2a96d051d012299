"""MemStore: a stream's messages in memory (memory storage; also the reference for tests).

Records are kept encoded, CRC included, so the read path is the same as LmdbStore's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from node.jetstream.store.base import (
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

    def remove_ttl(self, expires_ns: int, seq: int) -> None:
        self._ttls.discard((expires_ns, seq))

    def due_ttls(self, now_ns: int, limit: int) -> list[tuple[int, int]]:
        return sorted(t for t in self._ttls if t[0] <= now_ns)[:limit]

    def put_dedup(self, msg_id: str, seq: int, ts_ns: int) -> None:
        self._dedup.pop(msg_id, None)  # re-insert: dict order stays ts order
        self._dedup[msg_id] = (seq, ts_ns)

    def get_dedup(self, msg_id: str) -> tuple[int, int] | None:
        return self._dedup.get(msg_id)

    def prune_dedup(self, before_ns: int, limit: int) -> int:
        pruned = 0
        for msg_id, (_seq, ts_ns) in list(self._dedup.items())[:limit]:
            if ts_ns >= before_ns:
                break
            del self._dedup[msg_id]
            pruned += 1
        return pruned

    def put_meta(self, key: str, value: bytes) -> None:
        self._meta[key] = value

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

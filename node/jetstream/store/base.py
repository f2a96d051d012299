"""The `StreamStore` interface and the stored-message record format.

A store holds what the stream state machine decided: it never decides anything itself. Every
message record carries a CRC32 over its sequence and its bytes; `load` checks it on every read
and raises `CorruptRecordError` instead of handing out damaged (or misplaced) data.

Record layout (little-endian), the same in memory and in LMDB:

    crc32 u32 | ts_ns i64 | subject_len u16 | hdr_len u32 | subject | hdr | data

The CRC covers `seq u64 || everything after the crc field`, so a record copied under the wrong
sequence fails the check as well.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import NamedTuple, Protocol

_HEAD = struct.Struct("<IqHI")
_SEQ = struct.Struct("<Q")
MAX_SUBJECT_LEN = 0xFFFF


class CorruptRecordError(Exception):
    """A stored record failed its CRC or length check: the store must not serve it."""

    def __init__(self, stream: str, seq: int, why: str) -> None:
        super().__init__(f"stream {stream!r} message {seq}: corrupt record ({why})")
        self.stream = stream
        self.seq = seq


class StoredMsg(NamedTuple):
    """A stored message (a tuple: one is made per message applied or read, and a frozen
    dataclass's __init__ cost twice as much)."""
    seq: int
    subject: str
    hdr: bytes
    data: bytes
    ts_ns: int

    @property
    def size(self) -> int:
        """nats-server's accounting size in a memory stream: what max_bytes limits there."""
        return memory_size(self.subject, self.hdr, self.data)


def memory_size(subject: str, hdr: bytes, data: bytes) -> int:
    """nats-server's memstore size: subject + headers + data + 16 bytes of overhead."""
    return len(subject.encode()) + len(hdr) + len(data) + 16


def file_size(subject: str, hdr: bytes, data: bytes) -> int:
    """nats-server's filestore size: a 22-byte record head, an 8-byte hash, and 4 more bytes
    when there are headers. Streams report it in `bytes` and max_bytes limits it."""
    return 22 + len(subject.encode()) + len(hdr) + len(data) + 8 + (4 if hdr else 0)


Sizer = Callable[[str, bytes, bytes], int]


def encode_record(msg: StoredMsg) -> bytes:
    subject = msg.subject.encode()
    if len(subject) > MAX_SUBJECT_LEN:
        raise ValueError("subject too long for a record")
    body = struct.pack("<qHI", msg.ts_ns, len(subject), len(msg.hdr)) + subject + msg.hdr \
        + msg.data
    crc = zlib.crc32(body, zlib.crc32(_SEQ.pack(msg.seq)))
    return struct.pack("<I", crc) + body


def decode_record(stream: str, seq: int, raw: bytes) -> StoredMsg:
    if len(raw) < _HEAD.size:
        raise CorruptRecordError(stream, seq, "short record")
    crc, ts_ns, subject_len, hdr_len = _HEAD.unpack_from(raw)
    if zlib.crc32(raw[4:], zlib.crc32(_SEQ.pack(seq))) != crc:
        raise CorruptRecordError(stream, seq, "crc mismatch")
    start = _HEAD.size
    if start + subject_len + hdr_len > len(raw):
        raise CorruptRecordError(stream, seq, "lengths exceed record")
    subject = raw[start:start + subject_len].decode()
    hdr = raw[start + subject_len:start + subject_len + hdr_len]
    data = raw[start + subject_len + hdr_len:]
    return StoredMsg(seq, subject, bytes(hdr), bytes(data), ts_ns)


class StreamStore(Protocol):
    """What the stream state machine needs from storage. Sequences are assigned by the caller
    and only grow; `meta` holds small named values (last sequence, applied index, ...) written
    in the same batch as the messages they describe."""

    name: str
    sizer: Sizer

    def batch(self) -> AbstractContextManager[None]:
        """Group the writes inside into one transaction (one LMDB write txn)."""

    def store(self, msg: StoredMsg) -> None: ...

    def load(self, seq: int) -> StoredMsg | None:
        """The message, None if absent; CorruptRecordError if damaged."""

    def load_many(self, seqs: list[int]) -> tuple[dict[int, StoredMsg], dict[int, str]]:
        """`load` of several: (the messages present, damaged records' errors by seq)."""

    def remove(self, seq: int) -> StoredMsg | None:
        """Remove and return the message (None if absent)."""

    def first_seq(self) -> int:
        """Lowest stored sequence, 0 when empty."""

    def seqs(self, start: int = 1) -> Iterator[int]:
        """Stored sequences >= start, ascending (lazily: bounded memory)."""

    def seqs_desc(self) -> Iterator[int]:
        """Stored sequences, highest first (lazily)."""

    def msgs(self) -> int: ...

    def bytes(self) -> int: ...

    def last_for_subject(self, subject: str) -> int:
        """Highest stored sequence with exactly this subject, 0 if none."""

    def first_for_subject(self, subject: str, start: int = 1) -> int:
        """Lowest stored sequence >= start with exactly this subject, 0 if none."""

    def subject_count(self, subject: str) -> int: ...

    def subjects(self) -> Iterator[tuple[str, int]]:
        """(subject, stored count) for every subject with messages, in subject order."""

    def add_ttl(self, expires_ns: int, seq: int) -> None:
        """Index a message with a per-message TTL by its expiry time."""

    def remove_ttl(self, expires_ns: int, seq: int) -> None: ...

    def due_ttls(self, now_ns: int, limit: int) -> list[tuple[int, int]]:
        """Up to `limit` (expires_ns, seq) with expires_ns <= now_ns, earliest first."""

    def put_dedup(self, msg_id: str, seq: int, ts_ns: int) -> None:
        """Remember a Nats-Msg-Id (replacing an older entry of the same id)."""

    def get_dedup(self, msg_id: str) -> tuple[int, int] | None:
        """(seq, ts_ns) of a remembered Nats-Msg-Id."""

    def prune_dedup(self, before_ns: int, limit: int) -> int:
        """Forget up to `limit` ids remembered before `before_ns`; returns how many."""

    def put_meta(self, key: str, value: bytes) -> None: ...

    def put_metas(self, items: list[tuple[str, bytes]]) -> None:
        """`put_meta` of each (key, value), in order."""

    def get_meta(self, key: str) -> bytes | None: ...

    def put_consumer(self, name: str, state: bytes) -> None: ...

    def get_consumer(self, name: str) -> bytes | None: ...

    def delete_consumer(self, name: str) -> None: ...

    def consumers(self) -> list[str]: ...

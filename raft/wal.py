"""The write-ahead log record format: pure encoding and scanning, no I/O.

One record, all integers little-endian (see docs/raft.md, "On-disk log format"):

    magic      2  b"JR"
    type       1  RecordType
    group_len  1  length of the group id in bytes (1..255)
    group      group_len ASCII bytes
    term       8
    index      8
    entry_type 1  EntryType for ENTRY records, 0 otherwise
    payload_len 4
    crc        4  zlib.crc32 over every header byte before it, then the payload
    payload    payload_len bytes

The format is deliberately flat so an offline job (the PySpark audit) can
read a segment with nothing but `struct` and `zlib`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

from raft.types import ConfState, HardState

MAGIC = b"JR"
_PREFIX = struct.Struct("<2sBB")  # magic, type, group_len
_BODY = struct.Struct("<QQBI")  # term, index, entry_type, payload_len
_CRC = struct.Struct("<I")
FIXED_HEADER = _PREFIX.size + _BODY.size + _CRC.size  # 29 bytes + the group id
MAX_PAYLOAD = (1 << 32) - 1
_VOTE = struct.Struct("<Q")
_CONF_COUNTS = struct.Struct("<HH")


class RecordType(IntEnum):
    # Append only: the value is on disk.
    ENTRY = 1  # term, index, entry_type, payload = entry data
    HARD_STATE = 2  # term = hs.term, index = hs.commit, payload = vote (u64)
    SNAPSHOT_META = 3  # a snapshot was installed: drop the whole log; payload = ConfState
    COMPACT = 4  # drop entries <= index; payload = ConfState, or empty to keep it
    DROP = 5  # the group left this node: forget its entries, hard state and snapshot
    # An entry copied forward (same term, index, entry_type, data) so an old segment can
    # go. Unlike ENTRY it supersedes nothing while the group still holds that entry, so
    # a torn run of copies never cuts the log short; where the original is gone it acts
    # as an ENTRY.
    COPY = 6


class CorruptLogError(Exception):
    """A record that was fsynced is unreadable: the node must not serve this log."""


@dataclass(slots=True)
class Record:
    type: RecordType
    group: str
    term: int
    index: int
    entry_type: int
    offset: int  # of the record's first byte in its segment
    payload_offset: int
    payload_len: int
    payload: bytes


def header_len(group_bytes: bytes) -> int:
    return FIXED_HEADER + len(group_bytes)


def encode(
    rtype: RecordType,
    group: bytes,
    term: int,
    index: int,
    entry_type: int = 0,
    payload: bytes = b"",
) -> bytes:
    """One record ready to append to a segment."""
    if not 0 < len(group) < 256:
        raise ValueError(f"group id must be 1..255 bytes, got {len(group)}")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError("payload too large for one record")
    head = (
        _PREFIX.pack(MAGIC, rtype, len(group))
        + group
        + _BODY.pack(term, index, entry_type, len(payload))
    )
    crc = zlib.crc32(payload, zlib.crc32(head))
    return b"".join((head, _CRC.pack(crc), payload))


def encode_entries(group: bytes, entries: list[tuple[int, int, int, bytes]]) -> list[bytes]:
    """`encode(RecordType.ENTRY, group, term, index, entry_type, payload)` for each
    (term, index, entry_type, payload), byte for byte: a run of appends pays the
    record's fixed prefix and the checks once, not once per entry."""
    if not 0 < len(group) < 256:
        raise ValueError(f"group id must be 1..255 bytes, got {len(group)}")
    prefix = _PREFIX.pack(MAGIC, RecordType.ENTRY, len(group)) + group
    body, crc_of, crc, join = _BODY.pack, zlib.crc32, _CRC.pack, b"".join
    out = []
    for term, index, etype, payload in entries:
        if len(payload) > MAX_PAYLOAD:
            raise ValueError("payload too large for one record")
        head = prefix + body(term, index, etype, len(payload))
        out.append(join((head, crc(crc_of(payload, crc_of(head))), payload)))
    return out


def encode_hard_state(group: bytes, hs: HardState) -> bytes:
    return encode(RecordType.HARD_STATE, group, hs.term, hs.commit, 0, _VOTE.pack(hs.vote))


def decode_vote(payload: bytes | memoryview) -> int:
    return _VOTE.unpack(payload)[0]


def encode_conf_state(cs: ConfState | None) -> bytes:
    # Empty payload means "no change" (COMPACT only); a present ConfState,
    # even with no members, always encodes its two counts.
    if cs is None:
        return b""
    ids = (*cs.voters, *cs.learners)
    return _CONF_COUNTS.pack(len(cs.voters), len(cs.learners)) + struct.pack(
        f"<{len(ids)}Q", *ids
    )


def decode_conf_state(payload: bytes | memoryview) -> ConfState | None:
    if not payload:
        return None
    nv, nl = _CONF_COUNTS.unpack_from(payload)
    if len(payload) != _CONF_COUNTS.size + 8 * (nv + nl):
        raise CorruptLogError("conf state payload length does not match its counts")
    ids = struct.unpack_from(f"<{nv + nl}Q", payload, _CONF_COUNTS.size)
    return ConfState(voters=tuple(ids[:nv]), learners=tuple(ids[nv:]))


class Scanner:
    """Iterates the valid records of one segment image (bytes or mmap).

    Stops at the first short or corrupt record; afterwards `end` is the
    length of the valid prefix and `error` says why it stopped (None at a
    clean end of data). Zero bytes from the stop to the end of `buf` are a
    clean end too: a segment is preallocated with zeros ahead of its records
    (raft/storage.py), and no record starts with a zero byte (magic "JR").
    Payloads are copied out as bytes (so `buf` can be an mmap that closes
    afterwards); `entry_payloads=False` skips copying ENTRY
    payloads, which recovery does not need (only their offsets).
    """

    def __init__(self, buf: bytes | memoryview, start: int = 0, entry_payloads: bool = True):
        self._view = memoryview(buf)
        self._entry_payloads = entry_payloads
        self.end = start
        self.error: str | None = None

    def __iter__(self) -> Iterator[Record]:
        view, size = self._view, len(self._view)
        pos = self.end
        while pos < size:
            rec = self._parse(view, pos, size)
            if rec is None:
                if view[pos:] == bytes(size - pos):
                    self.error = None  # the unwritten (zeroed) runway
                return
            pos = rec.payload_offset + rec.payload_len
            self.end = pos
            yield rec

    def close(self) -> None:
        self._view.release()

    def _parse(self, view: memoryview, pos: int, size: int) -> Record | None:
        if size - pos < _PREFIX.size:
            return self._fail(pos, "short record prefix")
        magic, rtype, glen = _PREFIX.unpack_from(view, pos)
        if magic != MAGIC:
            return self._fail(pos, "bad magic")
        body_at = pos + _PREFIX.size + glen
        crc_at = body_at + _BODY.size
        if size - pos < FIXED_HEADER + glen:
            return self._fail(pos, "short record header")
        term, index, etype, plen = _BODY.unpack_from(view, body_at)
        payload_at = crc_at + _CRC.size
        if size - payload_at < plen:
            return self._fail(pos, "short record payload")
        with view[payload_at : payload_at + plen] as pv, view[pos:crc_at] as hv:
            crc = zlib.crc32(pv, zlib.crc32(hv))
            want = _CRC.unpack_from(view, crc_at)[0]
            if crc != want:
                return self._fail(pos, "crc mismatch")
            try:
                kind = RecordType(rtype)
                group = bytes(view[pos + _PREFIX.size : body_at]).decode("ascii")
            except (ValueError, UnicodeDecodeError):
                return self._fail(pos, f"unknown record type {rtype} or bad group id")
            keep = kind not in (RecordType.ENTRY, RecordType.COPY) or self._entry_payloads
            payload = bytes(pv) if keep else b""
        return Record(kind, group, term, index, etype, pos, payload_at, plen, payload)

    def _fail(self, pos: int, why: str) -> None:
        self.error = f"{why} at offset {pos}"
        return None

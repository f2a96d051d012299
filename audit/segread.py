"""Decode one byte range of one WAL segment: pure apart from reading the file.

A task owns the records whose first byte lies in [start, end). It finds its
first record boundary by scanning forward from `start` for a record that
decodes with a valid CRC (`raft.wal.Scanner` does the decoding), then decodes
record after record. At a bad record it never stops silently: it reports the
damaged range [p, q), q being the next valid record (or the end of the file),
and carries on from q. What a task saw at its edges (`SplitEdges`) goes to the
driver, which checks that the tasks of a segment tile it (`stitch.py`).

The segment is mmapped: the executor's memory holds one record at a time,
whatever the size of the log; entry payloads are only hashed, never copied.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from audit.keyring import UNOPENED
from audit.model import DIGEST_BYTES, ENTRY_TYPES
from raft.storage import payload_aad
from raft.wal import MAGIC, Record, RecordType, Scanner, decode_conf_state, decode_vote

Row = tuple  # RECORD_FIELDS, see audit/model.py


@dataclass
class SplitEdges:
    """What one task saw: its first piece, where its last one ends, and the damage inside."""

    start: int
    end: int
    first: int | None = None  # offset of the first record or damage this task reports
    last_end: int | None = None  # where the last record or damage it reports ends
    damage: list[tuple[int, int, str]] = field(default_factory=list)  # [p, q), why
    # Encrypted store: entry records whose CRC is valid but whose payload does not open
    # (altered and re-checksummed, or moved): (offset, why). Never a torn write.
    unopened: list[tuple[int, str]] = field(default_factory=list)


def conf_text(payload: bytes) -> str:
    cs = decode_conf_state(payload)
    if cs is None:
        return ""
    return ",".join(map(str, cs.voters)) + "|" + ",".join(map(str, cs.learners))


def _digest(rec: Record, view: memoryview, opener: Any, edges: SplitEdges) -> bytes:
    """The payload's digest: of the plaintext when the store is encrypted (sealed bytes
    differ on every node: each has its own data key and nonces)."""
    with view[rec.payload_offset : rec.payload_offset + rec.payload_len] as pv:
        if opener is None:
            return hashlib.sha256(pv).digest()[:DIGEST_BYTES]
        aad = payload_aad(rec.group.encode("ascii"), rec.index, rec.term, rec.entry_type)
        try:
            plain = opener.open(bytes(pv), aad)
        except ValueError as e:  # crypt.SealError
            edges.unopened.append((rec.offset, str(e)))
            plain = UNOPENED + bytes(pv)
    return hashlib.sha256(plain).digest()[:DIGEST_BYTES]


def _row(node: str, seq: int, rec: Record, view: memoryview, opener: Any = None,
         edges: SplitEdges | None = None) -> Row:
    digest, vote, conf = None, None, None
    if int(rec.type) in ENTRY_TYPES:
        digest = _digest(rec, view, opener, edges if edges is not None else SplitEdges(0, 0))
    elif rec.type is RecordType.HARD_STATE:
        vote = decode_vote(rec.payload)
    else:
        conf = conf_text(rec.payload)
    return (node, seq, rec.offset, int(rec.type), rec.group, rec.term, rec.index,
            rec.entry_type, rec.payload_len, digest, vote, conf)


def valid_at(buf: bytes | mmap.mmap, pos: int) -> int | None:
    """The end of the record at `pos` if one decodes there with a valid CRC."""
    sc = Scanner(buf, start=pos, entry_payloads=False)
    try:
        rec = next(iter(sc), None)
        return None if rec is None else rec.payload_offset + rec.payload_len
    finally:
        sc.close()


def next_valid(buf: bytes | mmap.mmap, pos: int) -> int | None:
    """The first offset >= pos where a valid record starts (None: none left)."""
    size = len(buf)
    while pos < size:
        pos = buf.find(MAGIC, pos)
        if pos < 0:
            return None
        if valid_at(buf, pos) is not None:
            return pos
        pos += 1
    return None


def scan(node: str, seq: int, buf: bytes | mmap.mmap, start: int, end: int,
         edges: SplitEdges, opener: Any = None) -> Iterator[Row]:
    """Rows of the records this task owns; fills `edges` as it goes."""
    size = len(buf)
    pos = start if start == 0 else next_valid(buf, start)
    if pos is None or pos >= end:
        edges.last_end = None
        return
    edges.first = pos
    view = memoryview(buf)
    try:
        while pos is not None and pos < end:
            sc = Scanner(buf, start=pos, entry_payloads=False)
            split_end = False  # stopped at a record the next task owns
            try:
                for rec in sc:
                    if rec.offset >= end:
                        split_end = True
                        break
                    yield _row(node, seq, rec, view, opener, edges)
                    edges.last_end = rec.payload_offset + rec.payload_len
                stopped, why = sc.end, sc.error
            finally:
                sc.close()
            if why is None and not split_end and stopped < size:
                # Zeros from `stopped` to the end of the file: the WAL's preallocated
                # runway (raft/storage.py), no record and no damage.
                edges.last_end = size
                return
            if why is None or stopped >= end:
                return  # clean end of data, or the next record is the next task's
            resume = next_valid(buf, stopped + 1)
            edges.damage.append((stopped, size if resume is None else resume, why))
            edges.last_end = size if resume is None else resume
            pos = resume
    finally:
        view.release()


def read_split(node: str, seq: int, path: str, start: int, end: int, opener: Any = None
               ) -> tuple[list[Row] | Iterator[Row], SplitEdges]:
    """Open and map the segment, then `scan` it; the caller drains the iterator. `opener`:
    the node's WAL sealer (crypt.Sealer) when its store is encrypted."""
    edges = SplitEdges(start, end)
    if os.path.getsize(path) == 0:
        return [], edges
    return _mapped_scan(node, seq, path, start, end, edges, opener), edges


def _mapped_scan(node: str, seq: int, path: str, start: int, end: int,
                 edges: SplitEdges, opener: Any) -> Iterator[Row]:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        yield from scan(node, seq, mm, start, end, edges, opener)

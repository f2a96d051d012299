"""Fault injection into copied WAL segments: rewrite records in place, CRC fixed up.

Records are found and re-encoded with the node's own format code
(`raft.wal.Scanner` / `raft.wal.encode`), so the damage is exactly what a
test says: one payload byte, one term, one missing record.
"""

from __future__ import annotations

from pathlib import Path

from raft.wal import Record, RecordType, Scanner, encode


def records(seg: Path) -> list[Record]:
    sc = Scanner(seg.read_bytes())
    out = list(sc)
    assert sc.error is None, sc.error
    return out


def entries(seg: Path, group: str = "g0") -> list[Record]:
    return [r for r in records(seg) if r.type is RecordType.ENTRY and r.group == group]


def commit_of(seg: Path, group: str = "g0") -> int:
    hs = [r for r in records(seg) if r.type is RecordType.HARD_STATE and r.group == group]
    return hs[-1].index


def _splice(seg: Path, rec: Record, new: bytes) -> None:
    buf = bytearray(seg.read_bytes())
    end = rec.payload_offset + rec.payload_len
    buf[rec.offset:end] = new
    seg.write_bytes(bytes(buf))


def rewrite(seg: Path, rec: Record, *, term: int | None = None,
            payload: bytes | None = None) -> None:
    """Re-encode one record with a new term and/or payload; its CRC is valid."""
    new = encode(rec.type, rec.group.encode(), rec.term if term is None else term, rec.index,
                 rec.entry_type, rec.payload if payload is None else payload)
    _splice(seg, rec, new)


def delete(seg: Path, rec: Record) -> None:
    _splice(seg, rec, b"")

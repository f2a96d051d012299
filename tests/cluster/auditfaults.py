"""Faults injected into copies of a stopped cluster node's data directory (WAL and LMDB),
for the audit tests. Records are found and re-encoded with the node's own code
(`raft.wal.Scanner`/`encode` through tests/audit/faults.py, `node.jetstream.ops`,
`store.base.encode_record`), so each fault is exactly what the test says: CRCs stay valid
unless the fault is a damaged CRC.

A node's log lives in several segments (live and archived), and an entry can sit there twice
(an ENTRY and a COPY carried forward at a segment roll): the WAL faults change every record
of the (group, index) they name, on that node only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from raft.wal import Record, RecordType, Scanner
from tests.audit.faults import delete, rewrite

ENTRY_TYPES = (RecordType.ENTRY, RecordType.COPY)


def segments(node_dir: Path) -> list[Path]:
    from audit.layout import find_wal, list_segments

    return [Path(s.path) for s in list_segments(find_wal(str(node_dir)))]


def scan(seg: Path) -> list[Record]:
    return list(Scanner(seg.read_bytes()))


def entries(node_dir: Path, group: str) -> list[Record]:
    """Every entry record of `group` on this node, in segment order (copies included)."""
    return [r for seg in segments(node_dir) for r in scan(seg)
            if r.type in ENTRY_TYPES and r.group == group]


def commit_of(node_dir: Path, group: str) -> int:
    hs = [r for seg in segments(node_dir) for r in scan(seg)
          if r.type is RecordType.HARD_STATE and r.group == group]
    return hs[-1].index


def _each_copy(node_dir: Path, group: str, index: int,
               change: Callable[[Path, Record], None]) -> int:
    """Apply `change` to every record of (group, index), rescanning after each (a change
    can move the bytes after it). Returns how many records were changed."""
    done = 0
    for seg in segments(node_dir):
        skip = 0
        while True:
            hits = [r for r in scan(seg) if r.type in ENTRY_TYPES and r.group == group
                    and r.index == index]
            if len(hits) <= skip:
                break
            change(seg, hits[skip])
            done += 1
            if _still_there(seg, hits[skip]):
                skip += 1  # rewritten in place: the next one
    assert done, (node_dir, group, index)
    return done


def _still_there(seg: Path, rec: Record) -> bool:
    return any(r.offset == rec.offset and r.group == rec.group and r.index == rec.index
               for r in scan(seg))


def flip_payload_byte(node_dir: Path, group: str, index: int) -> None:
    """The last payload byte of one committed entry changed; the CRC recomputed."""
    def change(seg: Path, rec: Record) -> None:
        payload = bytearray(rec.payload)
        payload[-1] ^= 0x01
        rewrite(seg, rec, payload=bytes(payload))
    _each_copy(node_dir, group, index, change)


def set_term(node_dir: Path, group: str, index: int, term: int) -> None:
    _each_copy(node_dir, group, index, lambda seg, rec: rewrite(seg, rec, term=term))


def delete_entry(node_dir: Path, group: str, index: int) -> None:
    _each_copy(node_dir, group, index, lambda seg, rec: delete(seg, rec))


def rewrite_message_data(node_dir: Path, group: str, old: bytes, new: bytes) -> list[int]:
    """Every publish entry of `group` whose message data is `old` now carries `new`
    (same op otherwise). Returns their indexes."""
    from node.jetstream import ops

    found = []
    for rec in entries(node_dir, group):
        op = _decoded(rec.payload)
        if isinstance(op, ops.StreamMsg) and op.data == old and rec.index not in found:
            found.append(rec.index)
    for index in found:
        def change(seg: Path, rec: Record) -> None:
            op = ops.decode(rec.payload)
            rewrite(seg, rec, payload=ops.encode(
                ops.StreamMsg(op.now_ns, op.subject, op.reply, op.hdr, new)))
        _each_copy(node_dir, group, index, change)
    return found


def _decoded(payload: bytes) -> Any:
    from node.jetstream import ops

    try:
        return ops.decode(payload) if payload else None
    except Exception:  # noqa: BLE001 (not a stream op: skip it)
        return None


# ---- LMDB ----------------------------------------------------------------------------


def lmdb_edit(node_dir: Path, db: str, key: bytes, change: Callable[[bytes], bytes | None]
              ) -> None:
    """Rewrite one value of the node's JetStream LMDB (`change(old)`, None deletes it)."""
    import lmdb

    from audit.jsstore import find_lmdb

    env = lmdb.open(find_lmdb(str(node_dir)), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            handle = env.open_db(db.encode(), txn=txn, create=False)
            old = txn.get(key, db=handle)
            assert old is not None, (db, key)
            new = change(bytes(old))
            if new is None:
                txn.delete(key, db=handle)
            else:
                txn.put(key, new, db=handle)
    finally:
        env.close()


def msg_key(group: str, seq: int) -> bytes:
    from audit.jsstore import prefix

    return prefix(group) + seq.to_bytes(8, "big")


def alter_message_byte(node_dir: Path, group: str, seq: int) -> None:
    """One byte of a stored message's data flipped (its record CRC no longer matches)."""
    lmdb_edit(node_dir, "js_msgs", msg_key(group, seq),
              lambda old: old[:-1] + bytes([old[-1] ^ 1]))


def replace_message_data(node_dir: Path, group: str, seq: int, new: bytes) -> None:
    """A stored message's data replaced, its record re-encoded with a valid CRC."""
    from node.jetstream.store.base import StoredMsg, decode_record, encode_record

    def change(old: bytes) -> bytes:
        m = decode_record("fault", seq, old)
        return encode_record(StoredMsg(seq, m.subject, m.hdr, new, m.ts_ns))
    lmdb_edit(node_dir, "js_msgs", msg_key(group, seq), change)


def move_ack_floor(node_dir: Path, group: str, consumer: str, by: int) -> None:
    from audit.jsstore import prefix
    from node.jetstream.consumer import ConsumerState

    def change(old: bytes) -> bytes:  # the record as the node wrote it (binary, or old JSON)
        state = ConsumerState.decode(old)
        state.floor_sseq, state.floor_cseq = state.floor_sseq + by, state.floor_cseq + by
        return state.encode()
    lmdb_edit(node_dir, "js_consumers", prefix(group) + consumer.encode(), change)


def applied(node_dir: Path, group: str) -> int:
    from audit.jsstore import NodeStore, find_lmdb

    store = NodeStore(find_lmdb(str(node_dir)))
    try:
        return store.applied(group)
    finally:
        store.close()

"""Snapshot data files of the driver: one file per group, written atomically.

The WAL (`raft/storage.py`) keeps only snapshot *metadata*; the bytes a
state machine returned from `snapshot()` (or received from a leader) live
here, so a restarted node can `restore()` them and serve them to lagging
members. Layout of `<dir>/<hex(group)>.snap`:

    magic b"JRSN" | u64 index | u64 term | u16 voters | u16 learners |
    u64 ids... | u32 crc32(everything before it and the data) | data

Written to a temporary file, fsynced, renamed over the old one, directory
fsynced: a crash leaves either the old or the new snapshot, never a mix.
"""

from __future__ import annotations

import os
import struct
import zlib

from raft.types import ConfState, SnapshotMeta

_MAGIC = b"JRSN"
_HEAD = struct.Struct("<4sQQHH")
_CRC = struct.Struct("<I")


class SnapshotFileError(Exception):
    """A snapshot file exists but cannot be trusted."""


def _path(dir: str, group: str) -> str:
    return os.path.join(dir, group.encode("ascii").hex() + ".snap")


def encode(meta: SnapshotMeta, data: bytes) -> bytes:
    cs = meta.conf_state
    ids = struct.pack(f"<{len(cs.voters) + len(cs.learners)}Q", *cs.voters, *cs.learners)
    head = _HEAD.pack(_MAGIC, meta.index, meta.term, len(cs.voters), len(cs.learners)) + ids
    return head + _CRC.pack(zlib.crc32(data, zlib.crc32(head))) + data


def decode(buf: bytes) -> tuple[SnapshotMeta, bytes]:
    if len(buf) < _HEAD.size:
        raise SnapshotFileError("short snapshot header")
    magic, index, term, nv, nl = _HEAD.unpack_from(buf)
    if magic != _MAGIC:
        raise SnapshotFileError("bad snapshot magic")
    end = _HEAD.size + 8 * (nv + nl)
    if len(buf) < end + _CRC.size:
        raise SnapshotFileError("short snapshot header")
    ids = struct.unpack_from(f"<{nv + nl}Q", buf, _HEAD.size)
    (crc,) = _CRC.unpack_from(buf, end)
    data = bytes(buf[end + _CRC.size :])
    if zlib.crc32(data, zlib.crc32(buf[:end])) != crc:
        raise SnapshotFileError("snapshot checksum mismatch")
    return SnapshotMeta(index, term, ConfState(tuple(ids[:nv]), tuple(ids[nv:]))), data


def save(dir: str, group: str, meta: SnapshotMeta, data: bytes) -> None:
    """Durably replace the group's snapshot (blocking: run it in a thread)."""
    os.makedirs(dir, exist_ok=True)
    path = _path(dir, group)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(encode(meta, data))
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load(dir: str, group: str) -> tuple[SnapshotMeta, bytes] | None:
    try:
        with open(_path(dir, group), "rb") as f:
            return decode(f.read())
    except FileNotFoundError:
        return None


def remove(dir: str, group: str) -> None:
    try:
        os.unlink(_path(dir, group))
    except FileNotFoundError:
        pass

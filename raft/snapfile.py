"""Snapshot files of the driver: a data file per group plus a small meta file.

The WAL (`raft/storage.py`) keeps only snapshot *metadata*; the image a
state machine wrote with `snapshot_to(path)` (or a leader streamed to us)
lives here as a plain file, so a restarted node can `restore_from()` it and
serve it to lagging members by reading it in chunks. Nothing here holds an
image in memory: data is copied and checksummed in fixed-size pieces.

Files in `dir`, `<g>` the hex of the group id:

* `<g>.<nonce>.part` -- an image being written or received, not yet trusted.
* `<g>.<nonce>.data` -- the committed image the meta file names.
* `<g>.meta` -- the head below, then u16 name length and the data file name,
  then u32 crc32 of everything before it.
* `<g>.pending` -- same format: a received snapshot staged (`stage`) while
  the WAL record that describes it is not yet known durable.
* `<g>.<nonce>.export` -- a catch-up image a state machine exported for one
  transfer to a lagging member (`new_export`); deleted once sent, never
  trusted, never named by a meta file.

The head (also the first bytes of a streamed snapshot, so the receiver can
check what it got end to end):

    magic b"JRS2" | u64 index | u64 term | u16 voters | u16 learners |
    u64 size | u32 crc32(data) | u64 ids...

Commit order: data fsynced and renamed to `.data`, a meta written to a tmp
file, fsynced, renamed to `<g>.pending`, directory fsynced (`stage`); for a
received snapshot the caller now fsyncs the WAL's SNAPSHOT_META; then
`<g>.pending` is renamed over `<g>.meta`, the directory fsynced and older data
files deleted (`promote`). A crash leaves the old or the new snapshot, never
a mix: `load(..., log_index=)` promotes a pending snapshot the log already
describes and forgets one it does not.
A 0-byte image is the empty state (the bootstrap snapshot at index 1).

Every file operation goes through a `raft.disk.Disk` (the `disk=` keyword,
default the real filesystem), so the simulation can crash any of them.
"""

from __future__ import annotations

import os
import secrets
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from raft.disk import OS_DISK, Disk
from raft.types import ConfState, SnapshotMeta

CHUNK = 256 << 10
_MAGIC = b"JRS2"
_HEAD = struct.Struct("<4sQQHHQI")
_U16 = struct.Struct("<H")
_CRC = struct.Struct("<I")
_LEFTOVERS = (".part", ".data", ".export")  # unnamed files a crash (or a removal) leaves


class SnapshotFileError(Exception):
    """A snapshot file exists but cannot be trusted."""


@dataclass(frozen=True)
class Stored:
    """A committed snapshot: its metadata and data file (None = empty state)."""

    meta: SnapshotMeta
    path: str | None
    size: int = 0
    crc: int = 0


def _prefix(group: str) -> str:
    return group.encode("ascii").hex()


def _meta_path(dir: str, group: str) -> str:
    return os.path.join(dir, _prefix(group) + ".meta")


def _pending_path(dir: str, group: str) -> str:
    return os.path.join(dir, _prefix(group) + ".pending")


def new_part(dir: str, group: str, disk: Disk = OS_DISK) -> str:
    """A fresh path for an image about to be written."""
    disk.makedirs(dir)
    return os.path.join(dir, f"{_prefix(group)}.{secrets.token_hex(6)}.part")


def new_export(dir: str, group: str, disk: Disk = OS_DISK) -> str:
    """A fresh path for a catch-up image exported for one transfer."""
    disk.makedirs(dir)
    return os.path.join(dir, f"{_prefix(group)}.{secrets.token_hex(6)}.export")


# ---- head encoding ---------------------------------------------------------------


def encode_head(meta: SnapshotMeta, size: int, crc: int) -> bytes:
    cs = meta.conf_state
    ids = struct.pack(f"<{len(cs.voters) + len(cs.learners)}Q", *cs.voters, *cs.learners)
    return _HEAD.pack(_MAGIC, meta.index, meta.term, len(cs.voters), len(cs.learners),
                      size, crc) + ids


def parse_head(buf: bytes | bytearray) -> tuple[SnapshotMeta, int, int, int] | None:
    """(meta, size, crc, head length), or None while `buf` is too short."""
    if len(buf) < _HEAD.size:
        return None
    magic, index, term, nv, nl, size, crc = _HEAD.unpack_from(buf)
    if magic != _MAGIC:
        raise SnapshotFileError("bad snapshot magic")
    end = _HEAD.size + 8 * (nv + nl)
    if len(buf) < end:
        return None
    ids = struct.unpack_from(f"<{nv + nl}Q", buf, _HEAD.size)
    meta = SnapshotMeta(index, term, ConfState(tuple(ids[:nv]), tuple(ids[nv:])))
    return meta, size, crc, end


# ---- data files --------------------------------------------------------------------


def seal(path: str, disk: Disk = OS_DISK) -> tuple[int, int]:
    """fsync a written image and return its (size, crc32), read in chunks."""
    return checksum(path, disk, fsync=True)


def checksum(path: str, disk: Disk = OS_DISK, fsync: bool = False) -> tuple[int, int]:
    """(size, crc32) of a written file, read in chunks; no fsync unless asked (an
    exported image is sent and deleted: the receiver fsyncs its own copy)."""
    crc, size = 0, 0
    fd = disk.open(path)
    try:
        while piece := disk.pread(fd, CHUNK, size):
            crc = zlib.crc32(piece, crc)
            size += len(piece)
        if fsync:
            disk.fsync(fd)
    finally:
        disk.close(fd)
    return size, crc


def read_chunks(fd: int, size: int, chunk: int = CHUNK,
                disk: Disk = OS_DISK) -> Iterator[bytes]:
    """Exactly `size` bytes of a data file opened with `disk.open`, `chunk` at a time."""
    left = size
    while left > 0:
        piece = disk.pread(fd, min(chunk, left), size - left)
        if not piece:
            raise SnapshotFileError("snapshot data file shorter than its meta says")
        left -= len(piece)
        yield piece


def commit(dir: str, group: str, meta: SnapshotMeta, part: str | None,
           size: int, crc: int, disk: Disk = OS_DISK) -> Stored:
    """Make a sealed `.part` image (None = empty state) the group's snapshot:
    `stage` then `promote`. For an image of our own state, whose log records
    are already durable. Blocking (fsyncs): run it in a thread."""
    stored = stage(dir, group, meta, part, size, crc, disk)
    promote(dir, group, disk)
    return stored


def stage(dir: str, group: str, meta: SnapshotMeta, part: str | None,
          size: int, crc: int, disk: Disk = OS_DISK) -> Stored:
    """Step 1 of installing a received snapshot: its data and a `<g>.pending`
    meta become durable, and nothing switches yet. Step 2 (the caller) fsyncs
    the WAL's SNAPSHOT_META; step 3 is `promote`. `load` resolves a crash
    between them from the log's snapshot index."""
    disk.makedirs(dir)
    data = None
    if part is not None:
        data = part[: -len(".part")] + ".data"
        disk.rename(part, data)
    name = os.path.basename(data).encode() if data else b""
    body = encode_head(meta, size, crc) + _U16.pack(len(name)) + name
    _write_durably(disk, _pending_path(dir, group), body + _CRC.pack(zlib.crc32(body)))
    disk.fsync_dir(dir)
    return Stored(meta, data, size, crc)


def promote(dir: str, group: str, disk: Disk = OS_DISK) -> None:
    """Step 3: the staged snapshot becomes the committed one; older data goes."""
    disk.rename(_pending_path(dir, group), _meta_path(dir, group))
    disk.fsync_dir(dir)
    stored = _read_meta(disk, _meta_path(dir, group), group)
    _remove_files(disk, dir, group, keep=stored[1] if stored else None, suffixes=(".data",))


def _write_durably(disk: Disk, path: str, buf: bytes) -> None:
    tmp = path + ".tmp"
    fd = disk.open(tmp, create=True, truncate=True)
    try:
        disk.pwrite(fd, buf, 0)
        disk.fsync(fd)
    finally:
        disk.close(fd)
    disk.rename(tmp, path)


def _remove_files(disk: Disk, dir: str, group: str, keep: str | None,
                  suffixes: tuple[str, ...]) -> None:
    head = _prefix(group) + "."
    if not disk.exists(dir):
        return  # nothing was ever written there
    for name in disk.listdir(dir):
        path = os.path.join(dir, name)
        if name.startswith(head) and name.endswith(suffixes) and path != keep:
            discard(path, disk)


def discard(path: str | None, disk: Disk = OS_DISK) -> None:
    if path is None:
        return
    try:
        disk.unlink(path)
    except FileNotFoundError:
        pass


def empty_image(dir: str, disk: Disk = OS_DISK) -> str:
    """A 0-byte image file: what `restore_from` takes as the empty state."""
    path = os.path.join(dir, "empty.image")
    if not disk.exists(path):
        disk.makedirs(dir)
        disk.close(disk.open(path, create=True))
    return path


# ---- loading -------------------------------------------------------------------------


def _read_file(disk: Disk, path: str) -> bytes:
    fd = disk.open(path)
    try:
        return disk.pread(fd, disk.size(fd), 0)
    finally:
        disk.close(fd)


def _read_meta(disk: Disk, path: str, group: str) -> tuple[Stored, str | None] | None:
    """A meta (or pending meta) file: (Stored, data path), None if absent."""
    try:
        buf = _read_file(disk, path)
    except FileNotFoundError:
        return None
    body = buf[: -_CRC.size]
    if len(buf) < _CRC.size or zlib.crc32(body) != _CRC.unpack_from(buf, len(body))[0]:
        raise SnapshotFileError(f"{group}: snapshot meta checksum mismatch in {path}")
    head = parse_head(buf)
    if head is None:
        raise SnapshotFileError(f"{group}: short snapshot meta in {path}")
    meta, size, crc, end = head
    (n,) = _U16.unpack_from(buf, end)
    name = buf[end + 2 : end + 2 + n].decode()
    data = os.path.join(os.path.dirname(path), name) if name else None
    return Stored(meta, data, size, crc), data


def _resolve_pending(dir: str, group: str, log_index: int | None, disk: Disk) -> None:
    """A crash left a staged snapshot: promote it if the log's snapshot index
    shows its SNAPSHOT_META became durable, else forget it."""
    pending = _read_meta(disk, _pending_path(dir, group), group)
    if pending is None:
        return
    if log_index is None:
        raise SnapshotFileError(f"{group}: staged snapshot found; load() needs log_index")
    current = _read_meta(disk, _meta_path(dir, group), group)
    index = pending[0].meta.index
    if index <= log_index and (current is None or current[0].meta.index < index):
        promote(dir, group, disk)
    else:
        discard(_pending_path(dir, group), disk)
        if pending[1] is not None and (current is None or current[1] != pending[1]):
            discard(pending[1], disk)
        disk.fsync_dir(dir)


def load(dir: str, group: str, verify: bool = True, disk: Disk = OS_DISK,
         log_index: int | None = None) -> Stored | None:
    """The group's committed snapshot (data checksummed unless `verify` is
    False); leftover `.part` and unnamed `.data` files of the group are
    deleted. `log_index`, the log's snapshot index after replay, resolves a
    snapshot `stage`d before a crash (required if one exists)."""
    _resolve_pending(dir, group, log_index, disk)
    found = _read_meta(disk, _meta_path(dir, group), group)
    if found is None:
        _remove_files(disk, dir, group, keep=None, suffixes=_LEFTOVERS)
        return None
    stored, data = found
    _remove_files(disk, dir, group, keep=data, suffixes=_LEFTOVERS)
    if data is not None and verify:
        try:
            got = seal(data, disk)
        except FileNotFoundError:
            name = os.path.basename(data)
            raise SnapshotFileError(f"{group}: snapshot data file {name} missing") from None
        if got != (stored.size, stored.crc):
            raise SnapshotFileError(
                f"{group}: snapshot data {got} != meta {(stored.size, stored.crc)}")
    return stored


def remove(dir: str, group: str, disk: Disk = OS_DISK) -> None:
    discard(_meta_path(dir, group), disk)
    discard(_pending_path(dir, group), disk)
    if disk.exists(dir):
        _remove_files(disk, dir, group, keep=None, suffixes=_LEFTOVERS)


class Receiver:
    """Writes one streamed snapshot (head + data) to a `.part` file, checking
    size and CRC; `feed` and `finish` block on the disk (call them in a thread)."""

    def __init__(self, dir: str, group: str, disk: Disk = OS_DISK) -> None:
        self._disk = disk
        self.path = new_part(dir, group, disk)
        self._fd = disk.open(self.path, create=True, truncate=True)
        self._head = bytearray()
        self.meta: SnapshotMeta | None = None
        self.size = self.crc = 0
        self._want: tuple[int, int] = (0, 0)

    def feed(self, piece: bytes) -> None:
        if self.meta is None:
            self._head += piece
            parsed = parse_head(self._head)
            if parsed is None:
                return
            self.meta, size, crc, end = parsed
            self._want = (size, crc)
            piece, self._head = bytes(self._head[end:]), bytearray()
        self.crc = zlib.crc32(piece, self.crc)
        self.size += len(piece)
        if self.size > self._want[0]:
            raise SnapshotFileError("snapshot stream longer than announced")
        self._disk.pwrite(self._fd, piece, self.size - len(piece))

    def finish(self) -> None:
        """fsync and check the image is complete and intact."""
        try:
            if self.meta is None or (self.size, self.crc) != self._want:
                raise SnapshotFileError(
                    f"snapshot stream incomplete or corrupt: {(self.size, self.crc)} "
                    f"!= {self._want}")
            self._disk.fsync(self._fd)
        finally:
            self.close()

    def close(self) -> None:
        if self._fd >= 0:
            self._disk.close(self._fd)
            self._fd = -1

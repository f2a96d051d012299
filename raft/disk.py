"""The filesystem seam of the Raft storage: every byte the WAL and the snapshot
files put on or take off disk goes through a `Disk`.

`OsDisk` is the real one (plain `os` calls). The deterministic simulation
plugs in a disk that can crash at any call and forget what was not fsynced,
so the set of calls here is exactly the set of crash points of the storage.

File handles are plain ints, as returned by `open`. `pwrite` writes all of
`data` (the OS may write less per call; `OsDisk` loops). There is no
sequential read/write: callers track offsets, so a simulated disk needs no
file position. A failed call raises `OSError`, as `os` does; the callers turn
a failed write or fsync into `StorageFatalError` (see `raft/storage.py`).
"""

from __future__ import annotations

import os
from typing import Protocol

__all__ = ["OS_DISK", "Disk", "OsDisk", "StorageFatalError"]


class StorageFatalError(Exception):
    """A write or fsync failed. The data may or may not be on disk, and the page
    cache may already have dropped it, so retrying would trust it blindly: the
    storage refuses every later write and the node must stop (fail-stop)."""


class Disk(Protocol):
    def open(self, path: str, *, create: bool = False, truncate: bool = False) -> int:
        """Open read-write (FileNotFoundError unless `create`)."""
        ...

    def close(self, fd: int) -> None: ...

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        """Up to `n` bytes at `offset` (fewer only at end of file)."""
        ...

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        """All of `data` at `offset`, extending the file if needed."""
        ...

    def fsync(self, fd: int) -> None: ...

    def fdatasync(self, fd: int) -> None:
        """The file's bytes (and its size, if it changed) durable; other metadata
        (mtime) may wait. Into a preallocated region it writes no inode."""
        ...

    def ftruncate(self, fd: int, size: int) -> None: ...

    def size(self, fd: int) -> int: ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace `dst` by `src` (durable only after `fsync_dir`)."""
        ...

    def unlink(self, path: str) -> None:
        """FileNotFoundError if absent (durable only after `fsync_dir`)."""
        ...

    def listdir(self, path: str) -> list[str]: ...

    def makedirs(self, path: str) -> None:
        """Create `path` and missing parents; no error if it exists."""
        ...

    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (creates, renames, unlinks) durable."""
        ...

    def exists(self, path: str) -> bool: ...


class OsDisk:
    """The real filesystem."""

    def open(self, path: str, *, create: bool = False, truncate: bool = False) -> int:
        flags = os.O_RDWR | (os.O_CREAT if create else 0) | (os.O_TRUNC if truncate else 0)
        return os.open(path, flags, 0o644)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            piece = os.pread(fd, n - len(out), offset + len(out))
            if not piece:
                break  # end of file
            out += piece
        return bytes(out)

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        view = memoryview(data)
        pos = 0
        while pos < len(view):
            pos += os.pwrite(fd, view[pos:], offset + pos)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)


OS_DISK = OsDisk()

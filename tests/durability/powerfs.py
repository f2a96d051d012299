"""powerfs: a FUSE filesystem that forgets, at a power cut, everything that was not fsynced.

    python -m tests.durability.powerfs --image IMG --mount MNT [--torn P --seed S] [--stats F]

The daemon loads the directory tree IMG (all of it counts as durable), serves it at MNT and
keeps every file in memory twice: the content processes see (volatile) and the content the
"disk" holds (durable). A power cut is: the test kills the process using the mount
(`kill -9`), then unmounts (`fusermount3 -u`); the daemon's loop ends and it writes only the
DURABLE state back to IMG, which the next mount serves. Remounting also throws away every
kernel cache (pages, dentries, attributes), so nothing volatile survives through them.

What counts as durable (POSIX taken literally, as ext4/xfs are allowed to behave):
* file data: what an `fsync`/`fdatasync` of the file (or `msync(MS_SYNC)` of a mapping, which
  the kernel turns into an fsync) covered; a write through an O_SYNC/O_DSYNC descriptor is
  durable on its own. Size changes (extension, truncation) follow the same rule.
* directory entries: a create, mkdir, rename or unlink is durable only once its directory
  was fsynced; until then a cut reverts the directory to the entries of its last fsync
  (a new file disappears even if its data was fsynced; a rename goes back).

`--torn P` models reordered write-back instead of a clean revert: at the cut, each dirty
4 KiB page of a file independently reached the disk with probability P (seeded), and so did
a pending size change. That is what a real page cache may do before the power goes; it is
the model under which a store that skips its own fsyncs (LMDB's MDB_NOSYNC) can be torn.
Directory entries always revert strictly.

LMDB (py-lmdb, `writemap=False`) writes its pages with pwrite and reads them through a
read-only shared mapping; both go through this layer: the page cache (direct_io off, the
default) serves the mapping with pages it read from us, and every write reaches `write`
below before the syscall returns (FUSE's default write-through mode). The lock file
`lock.mdb` is written through a shared writable mapping: those pages come to us through
kernel write-back, and are volatile like anything else.

`--stats F` writes per-file counters (writes, bytes, fsyncs, pages dropped at the cut) as
JSON when the daemon stops: the test's evidence that the layer saw the store's I/O.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import shutil
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Any

PAGE = 4096


@dataclass
class Inode:
    ino: int
    is_dir: bool
    mode: int
    data: bytearray = field(default_factory=bytearray)       # volatile content
    durable: bytearray = field(default_factory=bytearray)    # content on "disk"
    dirty: set[int] = field(default_factory=set)              # pages written since the sync
    size_dirty: bool = False                                   # size changed since the sync
    entries: dict[str, int] = field(default_factory=dict)     # directory: volatile entries
    dentries: dict[str, int] = field(default_factory=dict)    # directory: durable entries
    name: str = ""                                             # last path seen (for stats)
    mtime_ns: int = 0


@dataclass
class FileStats:
    writes: int = 0
    bytes: int = 0
    fsyncs: int = 0
    sync_writes: int = 0
    dropped_pages: int = 0
    dropped_bytes: int = 0


def _fuse_error(code: int) -> Exception:
    from mfusepy import FuseOSError

    return FuseOSError(code)


class PowerFS:
    """The filesystem state and its operations (mfusepy's path-based interface)."""

    use_ns = True

    def __init__(self, image: str, torn: float | None = None, seed: int = 0) -> None:
        self.lock = threading.RLock()
        self.torn = torn
        self.rng = random.Random(seed)
        self.inodes: dict[int, Inode] = {}
        self.fhs: dict[int, tuple[int, int]] = {}  # fh -> (ino, open flags)
        self.next_ino = 1
        self.next_fh = 1
        self.stats: dict[str, FileStats] = {}
        self.root = self._new(True, 0o755)
        self._load(image, self.root)

    # -- model -------------------------------------------------------------------------------

    def _new(self, is_dir: bool, mode: int) -> Inode:
        node = Inode(self.next_ino, is_dir, mode, mtime_ns=time.time_ns())
        self.inodes[node.ino] = node
        self.next_ino += 1
        return node

    def _load(self, path: str, into: Inode) -> None:
        """Everything already on the image is durable."""
        for name in sorted(os.listdir(path)):
            full = os.path.join(path, name)
            st = os.lstat(full)
            if stat.S_ISDIR(st.st_mode):
                child = self._new(True, stat.S_IMODE(st.st_mode))
                self._load(full, child)
            else:
                child = self._new(False, stat.S_IMODE(st.st_mode))
                with open(full, "rb") as f:
                    child.data = bytearray(f.read())
                child.durable = bytearray(child.data)
            child.name = name
            into.entries[name] = into.dentries[name] = child.ino

    def _lookup(self, path: str) -> Inode:
        node = self.root
        for part in [p for p in path.split("/") if p]:
            if not node.is_dir:
                raise _fuse_error(errno.ENOTDIR)
            ino = node.entries.get(part)
            if ino is None:
                raise _fuse_error(errno.ENOENT)
            node = self.inodes[ino]
        return node

    def _parent(self, path: str) -> tuple[Inode, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._lookup(head or "/")
        if not parent.is_dir:
            raise _fuse_error(errno.ENOTDIR)
        return parent, name

    def _node(self, path: str | None, fh: int | None) -> Inode:
        if fh is not None and fh in self.fhs:
            return self.inodes[self.fhs[fh][0]]
        if path is None:
            raise _fuse_error(errno.EBADF)
        return self._lookup(path)

    def _stats(self, node: Inode) -> FileStats:
        return self.stats.setdefault(node.name, FileStats())

    def _referenced(self) -> set[int]:
        live = {self.root.ino} | {ino for ino, _ in self.fhs.values()}
        for node in self.inodes.values():
            if node.is_dir:
                live.update(node.entries.values())
                live.update(node.dentries.values())
        return live

    def _collect(self) -> None:
        """Forget inodes nothing points at any more (no entry, durable or not; no fh)."""
        live = self._referenced()
        for ino in [i for i in self.inodes if i not in live]:
            del self.inodes[ino]

    def _sync_file(self, node: Inode) -> None:
        """The file's content and size become durable (fsync/fdatasync)."""
        size = len(node.data)
        if len(node.durable) > size:
            del node.durable[size:]
        elif len(node.durable) < size:
            node.durable.extend(bytes(size - len(node.durable)))
        for page in node.dirty:
            start = page * PAGE
            if start < size:
                end = min(start + PAGE, size)
                node.durable[start:end] = node.data[start:end]
        node.dirty.clear()
        node.size_dirty = False

    def _write_durable(self, node: Inode, data: bytes, offset: int) -> None:
        end = offset + len(data)
        if len(node.durable) < end:
            node.durable.extend(bytes(end - len(node.durable)))
        node.durable[offset:end] = data

    # -- the cut -----------------------------------------------------------------------------

    def durable_file(self, node: Inode) -> bytes:
        """What the disk holds for this file after the power went."""
        if self.torn is None or not (node.dirty or node.size_dirty):
            dropped = [p for p in node.dirty if p * PAGE < len(node.data)]
            st = self._stats(node)
            st.dropped_pages += len(dropped)
            st.dropped_bytes += max(0, len(node.data) - len(node.durable)) if node.size_dirty \
                else 0
            return bytes(node.durable)
        out = bytearray(node.durable)
        size = len(node.data) if (node.size_dirty and self.rng.random() < self.torn) \
            else len(out)
        if size > len(out):
            out.extend(bytes(size - len(out)))
        else:
            del out[size:]
        st = self._stats(node)
        for page in sorted(node.dirty):
            start = page * PAGE
            end = min(start + PAGE, size, len(node.data))
            if start >= end:
                continue
            if self.rng.random() < self.torn:
                out[start:end] = node.data[start:end]
            else:
                st.dropped_pages += 1
        return bytes(out)

    def dump(self, image: str) -> None:
        """Write the durable tree to `image` (replacing it): the state after the cut."""
        tmp = image.rstrip("/") + ".next"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        with self.lock:
            self._dump(self.root, tmp)
        shutil.rmtree(image, ignore_errors=True)
        os.rename(tmp, image)

    def _dump(self, node: Inode, path: str) -> None:
        for name, ino in sorted(node.dentries.items()):
            child = self.inodes.get(ino)
            if child is None:
                continue
            full = os.path.join(path, name)
            if child.is_dir:
                os.mkdir(full, child.mode or 0o755)
                self._dump(child, full)
            else:
                with open(full, "wb") as f:
                    f.write(self.durable_file(child))
                os.chmod(full, child.mode or 0o644)

    # -- operations: attributes and directories ----------------------------------------------

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self.lock:
            node = self._node(path, fh)
            kind = stat.S_IFDIR if node.is_dir else stat.S_IFREG
            size = 4096 if node.is_dir else len(node.data)
            return {"st_mode": kind | node.mode, "st_nlink": 2 if node.is_dir else 1,
                    "st_size": size, "st_uid": os.getuid(), "st_gid": os.getgid(),
                    "st_blocks": (size + 511) // 512, "st_blksize": PAGE,
                    "st_atime": node.mtime_ns, "st_mtime": node.mtime_ns,
                    "st_ctime": node.mtime_ns}

    def access(self, path: str, amode: int) -> int:
        with self.lock:
            self._lookup(path)
        return 0

    def chmod(self, path: str | None, mode: int) -> int:
        with self.lock:
            self._lookup(path or "/").mode = stat.S_IMODE(mode)
        return 0

    def chown(self, path: str | None, uid: int, gid: int) -> int:
        return 0

    def utimens(self, path: str | None, times: Any = None) -> int:
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        blocks = 1 << 28  # 1 TiB of 4 KiB blocks: the LMDB map size is address space only
        return {"f_bsize": PAGE, "f_frsize": PAGE, "f_blocks": blocks, "f_bfree": blocks,
                "f_bavail": blocks, "f_files": 1 << 20, "f_ffree": 1 << 20, "f_namemax": 255}

    def readdir(self, path: str | None, fh: int) -> list[str]:
        with self.lock:
            node = self._node(path, fh)
            return [".", "..", *node.entries]

    def mkdir(self, path: str, mode: int) -> int:
        with self.lock:
            parent, name = self._parent(path)
            if name in parent.entries:
                raise _fuse_error(errno.EEXIST)
            child = self._new(True, stat.S_IMODE(mode))
            child.name = name
            parent.entries[name] = child.ino
        return 0

    def rmdir(self, path: str) -> int:
        with self.lock:
            parent, name = self._parent(path)
            node = self._lookup(path)
            if not node.is_dir:
                raise _fuse_error(errno.ENOTDIR)
            if node.entries:
                raise _fuse_error(errno.ENOTEMPTY)
            del parent.entries[name]
            self._collect()
        return 0

    def unlink(self, path: str) -> int:
        with self.lock:
            parent, name = self._parent(path)
            node = self._lookup(path)
            if node.is_dir:
                raise _fuse_error(errno.EISDIR)
            del parent.entries[name]
            self._collect()
        return 0

    def rename(self, old: str, new: str) -> int:
        with self.lock:
            src_parent, src_name = self._parent(old)
            node = self._lookup(old)
            dst_parent, dst_name = self._parent(new)
            target = dst_parent.entries.get(dst_name)
            if target is not None and self.inodes[target].is_dir:
                if not node.is_dir:
                    raise _fuse_error(errno.EISDIR)
                if self.inodes[target].entries:
                    raise _fuse_error(errno.ENOTEMPTY)
            del src_parent.entries[src_name]
            dst_parent.entries[dst_name] = node.ino
            node.name = dst_name
            self._collect()
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        with self.lock:
            node = self._node(path, fh)
            node.dentries = dict(node.entries)
            self._stats(node).fsyncs += 1
            self._collect()
        return 0

    # -- operations: files -------------------------------------------------------------------

    def _open_fh(self, node: Inode, flags: int) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.fhs[fh] = (node.ino, flags)
        return fh

    def create(self, path: str, mode: int, flags: int = os.O_RDWR) -> int:
        with self.lock:
            parent, name = self._parent(path)
            ino = parent.entries.get(name)
            if ino is None:
                node = self._new(False, stat.S_IMODE(mode))
                node.name = name
                parent.entries[name] = node.ino
            else:
                node = self.inodes[ino]
            if flags & os.O_TRUNC:
                self._truncate(node, 0)
            return self._open_fh(node, flags)

    def open(self, path: str, flags: int) -> int:
        with self.lock:
            node = self._lookup(path)
            node.name = path.rpartition("/")[2]
            if flags & os.O_TRUNC:
                self._truncate(node, 0)
            return self._open_fh(node, flags)

    def opendir(self, path: str) -> int:
        with self.lock:
            return self._open_fh(self._lookup(path), os.O_RDONLY)

    def releasedir(self, path: str | None, fh: int) -> int:
        return self.release(path, fh)

    def release(self, path: str | None, fh: int) -> int:
        with self.lock:
            self.fhs.pop(fh, None)
            self._collect()
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self.lock:
            node = self._node(path, fh)
            return bytes(node.data[offset:offset + size])

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self.lock:
            node = self._node(path, fh)
            end = offset + len(data)
            if len(node.data) < end:
                node.data.extend(bytes(end - len(node.data)))
                node.size_dirty = True
            node.data[offset:end] = data
            node.dirty.update(range(offset // PAGE, (end - 1) // PAGE + 1))
            node.mtime_ns = time.time_ns()
            st = self._stats(node)
            st.writes += 1
            st.bytes += len(data)
            flags = self.fhs.get(fh, (0, 0))[1]
            if flags & (os.O_SYNC | os.O_DSYNC):
                self._write_durable(node, data, offset)
                st.sync_writes += 1
            return len(data)

    def _truncate(self, node: Inode, length: int) -> None:
        if length < len(node.data):
            del node.data[length:]
        else:
            node.data.extend(bytes(length - len(node.data)))
        node.size_dirty = True
        node.mtime_ns = time.time_ns()

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self.lock:
            self._truncate(self._node(path, fh), length)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        with self.lock:
            node = self._node(path, fh)
            if node.is_dir:
                node.dentries = dict(node.entries)
            else:
                self._sync_file(node)
            self._stats(node).fsyncs += 1
        return 0


def _operations(fs: PowerFS) -> Any:
    """An mfusepy `Operations` whose methods are the PowerFS ones (mfusepy looks for
    overridden methods on the class)."""
    from mfusepy import Operations

    names = ["getattr", "access", "chmod", "chown", "utimens", "statfs", "readdir", "mkdir",
             "rmdir", "unlink", "rename", "fsyncdir", "create", "open", "opendir",
             "releasedir", "release", "flush", "read", "write", "truncate", "fsync"]
    # Paths stay on (no nullpath_ok): mfusepy's libfuse3 truncate passes no file handle.
    attrs: dict[str, Any] = {"use_ns": True}

    def forward(name: str) -> Any:
        target = getattr(fs, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return target(*args, **kwargs)

        method.__name__ = name
        return method

    for name in names:
        attrs[name] = forward(name)
    return type("PowerOps", (Operations,), attrs)()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", required=True, help="directory tree: the disk's durable state")
    p.add_argument("--mount", required=True)
    p.add_argument("--torn", type=float, default=None,
                   help="probability that a dirty page reached the disk before the cut")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stats", default=None, help="write per-file counters here at the cut")
    args = p.parse_args(argv)

    from mfusepy import FUSE

    os.makedirs(args.image, exist_ok=True)
    fs = PowerFS(args.image, args.torn, args.seed)
    # Single-threaded: one request at a time keeps the model's order the kernel's order.
    # hard_remove: an unlinked open file stays reachable by its handle, not renamed to
    # .fuse_hidden*; auto_unmount: a daemon that dies never leaves a dead mount behind.
    # The cut is an unmount (`fusermount3 -u`): the loop then ends normally and the durable
    # state is written out. A signal ends it with an error instead, and nothing is written.
    FUSE(_operations(fs), args.mount, foreground=True, nothreads=True, hard_remove=True,
         auto_unmount=True, fsname="powerfs")
    fs.dump(args.image)
    if args.stats:
        with open(args.stats, "w") as f:
            json.dump({k: vars(v) for k, v in sorted(fs.stats.items())}, f, indent=1)


if __name__ == "__main__":
    main()

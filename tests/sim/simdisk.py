"""A simulated disk: an in-memory file system that forgets what was not fsynced.

`SimDisk` implements `raft.disk.Disk`, so it is handed to the storage as its
disk; `patch_modules` also routes the default `OS_DISK` and any remaining
direct `os` calls of the driver to it. Paths are absolute; the first component names the node
(`/n3/wal/...` belongs to node 3), so one SimDisk holds a whole cluster and a
crash hits one node only.

Durability model (per node):

* A file's content is durable up to its last `fsync`; later writes are a
  list of pending operations. A directory's entries (create, rename, unlink)
  are durable only after the directory itself is fsynced. Making a directory
  is durable at once (the operator created it).
* On a crash each directory reverts to its durable entries (files never
  linked durably vanish, unlinks and renames not fsynced are undone). Each
  file keeps a random prefix of its pending writes, the last one torn at a
  random byte, or none of them; sometimes one bit flips in the bytes past
  the durable length (the unsynced tail). Fsynced bytes never change.
* Every mutating operation is a crash point. A `CrashPlan` decides, per
  node, at which operation the node dies: the operation raises `SimCrash`
  (a BaseException, so no `except Exception` in the code under test can
  swallow it) and every later operation of that node raises too, until the
  node is revived for a restart.

Operations are named by call site (`fsync@raft.storage._write`): the
simulation arms crashes at sites and reports which sites were crash points.
"""

from __future__ import annotations

import os as _os
import posixpath
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

MUTATING = ("create", "write", "truncate", "fsync", "rename", "unlink", "fsync_dir")


class SimCrash(BaseException):
    """The simulated node died at this disk operation."""

    def __init__(self, node: int, site: str) -> None:
        super().__init__(f"node {node} crashed at {site}")
        self.node = node
        self.site = site


@dataclass
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    ops: list[tuple[str, int, bytes]] = field(default_factory=list)  # since the last fsync


@dataclass
class _Dir:
    entries: dict[str, _Inode] = field(default_factory=dict)
    durable: dict[str, _Inode] = field(default_factory=dict)


@dataclass
class _Fd:
    node: int
    path: str
    inode: _Inode | None  # None: a directory
    pos: int = 0


@dataclass
class CrashPlan:
    """When a node dies: at its `countdown`-th mutating operation from now,
    or at the first operation whose site is `site` (`nth` occurrence)."""

    countdown: int | None = None
    site: str | None = None
    nth: int = 1
    eio: bool = False  # fail that operation with EIO instead of crashing the node


@dataclass
class CrashRecord:
    node: int
    site: str
    contexts: frozenset[str]


def _node_of(path: str) -> int:
    head = path.split("/", 2)[1] if path.startswith("/") else ""
    if not head.startswith("n") or not head[1:].isdigit():
        raise ValueError(f"sim path {path!r} does not start with /n<id>/")
    return int(head[1:])


def call_site(kind: str) -> str:
    """`kind@module.function` of the innermost frame in the `raft` package."""
    f = sys._getframe(2)
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        if mod.startswith("raft.") and mod != "raft.disk":
            return f"{kind}@{mod}.{f.f_code.co_name}"
        f = f.f_back
    return f"{kind}@sim"


def stack_functions() -> set[str]:
    """Names of the functions on the stack (crash context classification)."""
    out: set[str] = set()
    f = sys._getframe(1)
    while f is not None:
        out.add(f.f_code.co_name)
        f = f.f_back
    return out


class _Path:
    """The `os.path` subset storage uses, over the simulated disk."""

    join = staticmethod(posixpath.join)
    basename = staticmethod(posixpath.basename)
    dirname = staticmethod(posixpath.dirname)

    def __init__(self, disk: SimDisk) -> None:
        self._disk = disk

    def exists(self, path: str) -> bool:
        return self._disk.exists(path)

    def isdir(self, path: str) -> bool:
        return path.rstrip("/") in self._disk._dirs

    def getsize(self, path: str) -> int:
        return self._disk.getsize(path)


class SimDisk:
    def __init__(self, rng: random.Random, *, tear: float = 0.5, flip: float = 0.1) -> None:
        self.rng = rng
        self.tear = tear  # chance a file keeps part of its pending writes on a crash
        self.flip = flip  # chance of one flipped bit in a kept unsynced tail
        self.path = _Path(self)
        self.sep = "/"
        self._dirs: dict[str, _Dir] = {"": _Dir()}
        self._fds: dict[int, _Fd] = {}
        self._next_fd = 1000
        self.dead: set[int] = set()
        self.plans: dict[int, CrashPlan] = {}
        self.site_counts: dict[str, int] = {}  # every mutating op seen, by site
        self.crashes: list[CrashRecord] = []
        self.eio: list[tuple[int, str]] = []  # injected I/O errors (node, site)
        self.node_ops: dict[int, int] = {}  # mutating operations per node so far
        self.ops = 0
        # Called at a planned crash, before the node's files are rolled back:
        # returns context tags ("roll", "compaction", "install") and lets the
        # cluster mark the node down at once.
        self.on_crash: Callable[[int, str, set[str]], frozenset[str]] | None = None
        self.on_eio: Callable[[int, str], None] | None = None
        # Called when a directory fsync makes an unlink in it durable (node, dir): the
        # cluster probes that a crash right there would recover (crash-image probe).
        self.on_durable_unlink: Callable[[int, str], None] | None = None
        self._unlinked: set[str] = set()  # directories with unlinks not yet durable

    # ---- crash machinery -------------------------------------------------------

    def _op(self, kind: str, node: int) -> None:
        if node in self.dead:
            raise SimCrash(node, "already dead")
        if kind not in MUTATING:
            return
        self.ops += 1
        self.node_ops[node] = self.node_ops.get(node, 0) + 1
        site = call_site(kind)
        self.site_counts[site] = self.site_counts.get(site, 0) + 1
        plan = self.plans.get(node)
        if plan is None:
            return
        hit = False
        if plan.countdown is not None:
            plan.countdown -= 1
            hit = plan.countdown <= 0
        if plan.site is not None and plan.site == site:
            plan.nth -= 1
            hit = hit or plan.nth <= 0
        if hit:
            del self.plans[node]
            if plan.eio:
                self.eio.append((node, site))
                if self.on_eio is not None:
                    self.on_eio(node, site)
                raise OSError(5, f"simulated EIO at {site}")
            self.fail(node, site, stack_functions())

    def fail(self, node: int, site: str, stack: set[str] | None = None) -> None:
        """Crash `node` now (inside an operation: raises SimCrash)."""
        ctx = frozenset()
        if self.on_crash is not None:
            ctx = self.on_crash(node, site, stack or set())
        self.crashes.append(CrashRecord(node, site, ctx))
        self.crash(node)
        raise SimCrash(node, site)

    def crash(self, node: int) -> None:
        """Power loss on `node`: keep only what its disk had made durable."""
        self.plans.pop(node, None)
        self.dead.add(node)
        prefix = f"/n{node}"
        self._unlinked = {p for p in self._unlinked
                          if p != prefix and not p.startswith(prefix + "/")}
        for fd in [fd for fd, f in self._fds.items() if f.node == node]:
            del self._fds[fd]
        inodes: dict[int, _Inode] = {}
        for path, d in self._dirs.items():
            if path == prefix or path.startswith(prefix + "/"):
                for ino in (*d.entries.values(), *d.durable.values()):
                    inodes[id(ino)] = ino
                d.entries = dict(d.durable)
        for ino in inodes.values():
            self._lose_tail(ino)

    def _lose_tail(self, ino: _Inode) -> None:
        data = bytearray(ino.durable)
        if ino.ops and self.rng.random() < self.tear:
            keep = self.rng.randrange(len(ino.ops))
            for kind, off, buf in ino.ops[:keep]:
                _apply(data, kind, off, buf)
            kind, off, buf = ino.ops[keep]
            if kind == "w" and buf:
                _apply(data, kind, off, buf[: self.rng.randrange(len(buf) + 1)])
            if len(data) > len(ino.durable) and self.rng.random() < self.flip:
                pos = self.rng.randrange(len(ino.durable), len(data))
                data[pos] ^= 1 << self.rng.randrange(8)
        ino.data = data
        ino.durable = bytes(data)
        ino.ops = []

    def durable_image(self, node: int) -> SimDisk:
        """A new SimDisk holding what a crash of `node` right now would surely keep
        (fsynced bytes, durable directory entries; no torn tails): its files only,
        with its own random stream, so probing it changes nothing here."""
        img = SimDisk(random.Random(0), tear=0.0, flip=0.0)
        prefix = f"/n{node}"
        copies: dict[int, _Inode] = {}
        for path, d in self._dirs.items():
            if path != prefix and not path.startswith(prefix + "/"):
                continue
            new = img._dirs[path] = _Dir()
            for name, ino in d.durable.items():
                c = copies.get(id(ino))
                if c is None:
                    c = copies[id(ino)] = _Inode(bytearray(ino.durable), ino.durable)
                new.entries[name] = new.durable[name] = c
        return img

    def revive(self, node: int) -> None:
        self.dead.discard(node)

    # ---- directories --------------------------------------------------------------

    def _dir_of(self, path: str) -> tuple[_Dir, str]:
        parent, name = posixpath.split(path.rstrip("/"))
        d = self._dirs.get(parent.rstrip("/"))
        if d is None:
            raise FileNotFoundError(2, "no such directory", parent)
        return d, name

    def makedirs(self, path: str) -> None:
        path = path.rstrip("/")
        if path in self._dirs:
            return
        self._op("mkdir", _node_of(path))
        parts = path.split("/")
        for i in range(2, len(parts) + 1):
            self._dirs.setdefault("/".join(parts[:i]), _Dir())

    def listdir(self, path: str) -> list[str]:
        path = path.rstrip("/")
        d = self._dirs.get(path)
        if d is None:
            raise FileNotFoundError(2, "no such directory", path)
        self._op("listdir", _node_of(path))
        subdirs = [p.rsplit("/", 1)[1] for p in self._dirs if p.rsplit("/", 1)[0] == path and p]
        return sorted([*d.entries, *subdirs])

    def exists(self, path: str) -> bool:
        path = path.rstrip("/")
        if path in self._dirs:
            return True
        try:
            d, name = self._dir_of(path)
        except FileNotFoundError:
            return False
        return name in d.entries

    def _inode(self, path: str) -> _Inode:
        d, name = self._dir_of(path)
        ino = d.entries.get(name)
        if ino is None:
            raise FileNotFoundError(2, "no such file", path)
        return ino

    def getsize(self, path: str) -> int:
        return len(self._inode(path).data)

    def rename(self, src: str, dst: str) -> None:
        self._op("rename", _node_of(src))
        sd, sname = self._dir_of(src)
        dd, dname = self._dir_of(dst)
        ino = sd.entries.pop(sname, None)
        if ino is None:
            raise FileNotFoundError(2, "no such file", src)
        dd.entries[dname] = ino

    def unlink(self, path: str) -> None:
        node = _node_of(path)
        d, name = self._dir_of(path)
        if name not in d.entries:
            self._op("stat", node)
            raise FileNotFoundError(2, "no such file", path)
        self._op("unlink", node)
        del d.entries[name]
        self._unlinked.add(posixpath.dirname(path.rstrip("/")))

    def fsync_dir(self, path: str) -> None:
        path = path.rstrip("/")
        self._op("fsync_dir", _node_of(path))
        d = self._dirs[path]
        d.durable = dict(d.entries)
        if path in self._unlinked:
            self._unlinked.discard(path)
            if self.on_durable_unlink is not None:
                self.on_durable_unlink(_node_of(path), path)

    # ---- files (the raft.disk.Disk protocol) -----------------------------------------

    def open(self, path: str, *, create: bool = False, truncate: bool = False) -> int:
        node = _node_of(path)
        if path.rstrip("/") in self._dirs:
            self._op("open", node)
            return self._new_fd(_Fd(node, path.rstrip("/"), None))
        d, name = self._dir_of(path)
        ino = d.entries.get(name)
        if ino is None:
            if not create:
                self._op("open", node)
                raise FileNotFoundError(2, "no such file", path)
            self._op("create", node)
            ino = d.entries[name] = _Inode()
        else:
            self._op("open", node)
        if truncate and ino.data:
            self._op("truncate", node)
            ino.data = bytearray()
            ino.ops.append(("t", 0, b""))
        return self._new_fd(_Fd(node, path, ino))

    def _new_fd(self, f: _Fd) -> int:
        self._next_fd += 1
        self._fds[self._next_fd] = f
        return self._next_fd

    def _fd(self, fd: int) -> _Fd:
        f = self._fds.get(fd)
        if f is None:
            raise OSError(9, "bad file descriptor (node crashed or closed)")
        if f.node in self.dead:
            raise SimCrash(f.node, "already dead")
        return f

    def close(self, fd: int) -> None:
        f = self._fds.pop(fd, None)
        if f is not None and f.node in self.dead:
            raise SimCrash(f.node, "already dead")

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        f = self._fd(fd)
        assert f.inode is not None, "write to a directory"
        buf = bytes(data)
        self._op("write", f.node)
        _apply(f.inode.data, "w", offset, buf)
        f.inode.ops.append(("w", offset, buf))

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        f = self._fd(fd)
        assert f.inode is not None
        return bytes(f.inode.data[offset : offset + n])

    def ftruncate(self, fd: int, n: int) -> None:
        f = self._fd(fd)
        assert f.inode is not None
        self._op("truncate", f.node)
        _apply(f.inode.data, "t", n, b"")
        f.inode.ops.append(("t", n, b""))

    def fsync(self, fd: int) -> None:
        f = self._fd(fd)
        if f.inode is None:
            self.fsync_dir(f.path)
            return
        self._op("fsync", f.node)
        f.inode.durable = bytes(f.inode.data)
        f.inode.ops = []

    # Same durability in this model: file bytes and size (no separate metadata).
    fdatasync = fsync

    def size(self, fd: int) -> int:
        f = self._fd(fd)
        return len(f.inode.data) if f.inode is not None else 0

    # ---- helpers for the simulated state machine --------------------------------------

    def read_file(self, path: str) -> bytes:
        fd = self.open(path)
        try:
            return self.pread(fd, self.size(fd), 0)
        finally:
            self.close(fd)

    def write_file(self, path: str, data: bytes) -> None:
        """Create/truncate and write, no fsync (the caller seals it)."""
        fd = self.open(path, create=True, truncate=True)
        try:
            self.pwrite(fd, data, 0)
        finally:
            self.close(fd)


def _apply(data: bytearray, kind: str, off: int, buf: bytes) -> None:
    if kind == "t":
        del data[off:]
        return
    if off > len(data):
        data.extend(b"\0" * (off - len(data)))
    data[off : off + len(buf)] = buf


class _File:
    """Enough of a file object for `open(path, 'wb').close()` and reading."""

    def __init__(self, disk: SimDisk, fd: int) -> None:
        self._disk = disk
        self._fd = fd
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        size = self._disk.size(self._fd)
        n = size - self._pos if n < 0 else n
        out = self._disk.pread(self._fd, n, self._pos)
        self._pos += len(out)
        return out

    def write(self, data: bytes) -> int:
        self._disk.pwrite(self._fd, data, self._pos)
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        self._disk.close(self._fd)

    def __enter__(self) -> _File:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _OsShim:
    """What a `raft.*` module that still calls `os` directly sees: file calls
    go to the SimDisk, everything else to the real `os`."""

    O_RDONLY, O_WRONLY, O_RDWR = _os.O_RDONLY, _os.O_WRONLY, _os.O_RDWR
    O_CREAT, O_TRUNC = _os.O_CREAT, _os.O_TRUNC

    def __init__(self, disk: SimDisk) -> None:
        self._disk = disk
        self.path = disk.path

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return self._disk.open(path, create=bool(flags & _os.O_CREAT),
                               truncate=bool(flags & _os.O_TRUNC))

    def makedirs(self, path: str, mode: int = 0o777, exist_ok: bool = False) -> None:
        self._disk.makedirs(path)

    def rename(self, src: str, dst: str) -> None:
        self._disk.rename(src, dst)

    def __getattr__(self, name: str) -> object:
        if name in ("close", "pread", "pwrite", "fsync", "ftruncate", "unlink", "listdir"):
            return getattr(self._disk, name)
        return getattr(_os, name)


def open_file(disk: SimDisk, path: str, mode: str = "r") -> _File:
    write = "w" in mode or "a" in mode
    return _File(disk, disk.open(path, create=write, truncate="w" in mode))


_DISK_METHODS = ("open", "close", "pread", "pwrite", "fsync", "ftruncate", "size", "rename",
                 "unlink", "listdir", "makedirs", "fsync_dir", "exists")


def patch_modules(disk: SimDisk, modules: list[object]) -> Callable[[], None]:
    """Route the default `raft.disk.OS_DISK` and any direct `os`/`open` use in
    `modules` to `disk` (code not yet threading a Disk through); returns an undo."""
    import raft.disk

    saved: list[tuple[object, str, object, bool]] = []

    def put(obj: object, name: str, value: object) -> None:
        had = name in vars(obj)
        saved.append((obj, name, vars(obj).get(name), had))
        setattr(obj, name, value)

    for name in _DISK_METHODS:
        put(raft.disk.OS_DISK, name, getattr(disk, name))
    shim = _OsShim(disk)
    for mod in modules:
        if "os" in vars(mod):
            put(mod, "os", shim)
        put(mod, "open", lambda path, mode="r", *a, **k: open_file(disk, path, mode))

    def undo() -> None:
        for obj, name, old, had in reversed(saved):
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)

    return undo

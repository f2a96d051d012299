"""A deterministic crashing disk for storage tests: `raft.disk.Disk` in memory.

Unlike the simulation's random disk (tests/sim), the test chooses exactly
where the crash happens (`crash_at`, the n-th mutating call) and what the
crash keeps of each file's unsynced writes (`crashed(policy)`), so a test can
enumerate every crash point of a short workload under adversarial losses.

Model: a file's bytes are durable up to its last fsync; later writes and
truncations are pending operations. Directory entries (create, rename,
unlink) are durable only after `fsync_dir` of that directory; `makedirs` is
durable at once. After a crash each directory holds its durable entries and
each file its durable bytes plus what the policy keeps of its pending ops.
"""

from __future__ import annotations

import errno
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field

MUTATING = ("create", "pwrite", "ftruncate", "fsync", "rename", "unlink", "fsync_dir")


class Crash(BaseException):
    """The node died at this disk call (BaseException: nothing may swallow it)."""


@dataclass
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    pending: list[tuple[str, int, bytes]] = field(default_factory=list)  # (kind, offset, bytes)


# A policy sees every file's pending ops ({path: ops}) and returns what survives of each.
Ops = list[tuple[str, int, bytes]]
Policy = Callable[[dict[str, Ops]], dict[str, Ops]]


def lose_all(files):
    return {p: [] for p in files}


def keep_all(files):
    return dict(files)


def tear_oldest(files):
    """The first file (by name) with unsynced writes keeps half of the first
    one, torn; the others keep everything: the page cache flushed newer files first."""
    out = dict(files)
    written = sorted(p for p, ops in files.items() if ops)
    if written:
        kind, off, buf = files[written[0]][0]
        out[written[0]] = [(kind, off, buf[: len(buf) // 2])] if kind == "w" else []
    return out


def _apply(data: bytearray, op: tuple[str, int, bytes]) -> None:
    kind, off, buf = op
    if kind == "t":
        del data[off:]
        return
    if len(data) < off:
        data.extend(bytes(off - len(data)))
    data[off : off + len(buf)] = buf


class CrashDisk:
    def __init__(self) -> None:
        self.dirs: dict[str, dict[str, _Inode]] = {}
        self.durable_dirs: dict[str, dict[str, _Inode]] = {}
        self.fds: dict[int, _Inode] = {}
        self.ops = 0  # mutating calls so far
        self.crash_at: int | None = None  # raise Crash at this mutating call
        self.fail: tuple[str, int] | None = None  # (kind, n): the n-th such call raises EIO
        self.hooks: dict[str, Callable[[], None]] = {}  # one-shot, before a call of that kind
        self.log: list[str] = []
        self._kinds: dict[str, int] = {}

    # ---- crash control ------------------------------------------------------

    def _mut(self, kind: str, what: str) -> None:
        hook = self.hooks.pop(kind, None)
        if hook is not None:
            hook()
        self.ops += 1
        self._kinds[kind] = self._kinds.get(kind, 0) + 1
        self.log.append(f"{kind} {what}")
        if self.crash_at is not None and self.ops >= self.crash_at:
            raise Crash(f"crash at {kind} {what}")
        if self.fail is not None and self.fail == (kind, self._kinds[kind]):
            raise OSError(errno.EIO, f"injected {kind} failure")

    def crashed(self, policy: Policy = lose_all) -> CrashDisk:
        """The disk as a restarted node finds it."""
        new = CrashDisk()
        files = {}
        for d, entries in self.durable_dirs.items():
            for name, ino in entries.items():
                files[posixpath.join(d, name)] = ino
        kept = policy({p: list(ino.pending) for p, ino in files.items()})
        copies: dict[int, _Inode] = {}
        for d, entries in self.durable_dirs.items():
            new.dirs[d], new.durable_dirs[d] = {}, {}
            for name, ino in entries.items():
                if id(ino) not in copies:
                    data = bytearray(ino.durable)
                    for op in kept.get(posixpath.join(d, name), []):
                        _apply(data, op)
                    copies[id(ino)] = _Inode(data, bytes(data))
                new.dirs[d][name] = new.durable_dirs[d][name] = copies[id(ino)]
        return new

    def file(self, path: str) -> bytearray:
        """Current bytes (tests read or damage them; damage counts as durable)."""
        d, name = posixpath.split(path)
        return self.dirs[d][name].data

    def damage(self, path: str, offset: int) -> None:
        d, name = posixpath.split(path)
        ino = self.dirs[d][name]
        ino.data[offset] ^= 1
        ino.durable = bytes(ino.data)

    # ---- Disk -------------------------------------------------------------------

    def _split(self, path: str) -> tuple[dict[str, _Inode], str]:
        d, name = posixpath.split(path)
        if d not in self.dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", d)
        return self.dirs[d], name

    def open(self, path: str, *, create: bool = False, truncate: bool = False) -> int:
        entries, name = self._split(path)
        ino = entries.get(name)
        if ino is None:
            if not create:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            self._mut("create", path)
            ino = entries[name] = _Inode()
        if truncate and ino.data:
            self._mut("ftruncate", path)
            ino.data.clear()
            ino.pending.append(("t", 0, b""))
        fd = 3 + len(self.log) + len(self.fds)
        while fd in self.fds:
            fd += 1
        self.fds[fd] = ino
        return fd

    def close(self, fd: int) -> None:
        del self.fds[fd]

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        return bytes(self.fds[fd].data[offset : offset + n])

    def pwrite(self, fd: int, data, offset: int) -> None:
        ino = self.fds[fd]
        self._mut("pwrite", f"fd{fd}@{offset}+{len(data)}")
        op = ("w", offset, bytes(data))
        _apply(ino.data, op)
        ino.pending.append(op)

    def fsync(self, fd: int) -> None:
        ino = self.fds[fd]
        self._mut("fsync", f"fd{fd}")
        ino.durable, ino.pending = bytes(ino.data), []

    # Same durability in these models: file bytes and size (no separate metadata).
    fdatasync = fsync

    def ftruncate(self, fd: int, size: int) -> None:
        ino = self.fds[fd]
        self._mut("ftruncate", f"fd{fd}->{size}")
        op = ("t", size, b"")
        _apply(ino.data, op)
        ino.pending.append(op)

    def size(self, fd: int) -> int:
        return len(self.fds[fd].data)

    def rename(self, src: str, dst: str) -> None:
        s_entries, s_name = self._split(src)
        d_entries, d_name = self._split(dst)
        if s_name not in s_entries:
            raise FileNotFoundError(errno.ENOENT, "no such file", src)
        self._mut("rename", f"{src} -> {dst}")
        d_entries[d_name] = s_entries.pop(s_name)

    def unlink(self, path: str) -> None:
        entries, name = self._split(path)
        if name not in entries:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        self._mut("unlink", path)
        del entries[name]

    def listdir(self, path: str) -> list[str]:
        entries, _ = self._split(posixpath.join(path, "x"))
        return sorted(entries)

    def makedirs(self, path: str) -> None:
        path = path.rstrip("/")
        while path and path not in self.dirs:
            self.dirs[path], self.durable_dirs[path] = {}, {}
            path = posixpath.dirname(path)

    def fsync_dir(self, path: str) -> None:
        path = path.rstrip("/")
        self._mut("fsync_dir", path)
        self.durable_dirs[path] = dict(self.dirs[path])

    def exists(self, path: str) -> bool:
        path = path.rstrip("/")
        if path in self.dirs:
            return True
        d, name = posixpath.split(path)
        return name in self.dirs.get(d, {})

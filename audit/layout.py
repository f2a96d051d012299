"""Where each node keeps its log, and how the segments are cut into Spark tasks.

A data directory is a node's `--dir` (raft.node: `<dir>/wal`, `<dir>/snap`),
or a WAL directory itself, or any directory holding exactly one of those a few
levels down (a copied tree). In the audit retention mode compaction moves old
segments into `<wal dir>/archive/`; both places are read, and a segment found
in both is read once, from the live directory.

Only file names and sizes are read here, on the driver: the bytes are read by
the executors, one byte range per task.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from audit.keyring import Keyring, KeyringError, encrypted, store_of

SEGMENT_RE = re.compile(r"^wal-(\d{16})\.log$")
ARCHIVE = "archive"
SPLIT_BYTES = 16 << 20  # one task reads at most this much of a segment (plus one record)
_SEARCH_DEPTH = 3


class LayoutError(Exception):
    """A data directory that holds no Raft log, or several."""


@dataclass(frozen=True)
class Segment:
    seq: int
    path: str
    size: int
    archived: bool


@dataclass(frozen=True)
class NodeDirs:
    name: str  # how findings name the node: the data directory's base name
    wal: str
    snap: str | None
    segments: tuple[Segment, ...] = field(default_factory=tuple)
    root: str = ""  # the data directory as given (replay hooks find the stores there)

    @property
    def seqs(self) -> list[int]:
        return [s.seq for s in self.segments]

    @property
    def complete(self) -> bool:
        """True when the first segment ever written is here: no history was deleted."""
        return bool(self.segments) and self.segments[0].seq == 1


@dataclass(frozen=True)
class Split:
    node: str
    seq: int
    path: str
    start: int
    end: int  # this task owns the records whose first byte is in [start, end)
    size: int


def _has_segments(path: str) -> bool:
    try:
        return any(SEGMENT_RE.match(n) for n in os.listdir(path))
    except OSError:
        return False


def find_wal(data_dir: str) -> str:
    """The WAL directory inside `data_dir` (see the module docstring)."""
    if not os.path.isdir(data_dir):
        raise LayoutError(f"{data_dir}: not a directory")
    found: list[str] = []
    for root, dirs, _ in os.walk(data_dir):
        depth = os.path.relpath(root, data_dir).count(os.sep) + (root != data_dir)
        dirs[:] = [d for d in dirs if d != ARCHIVE and depth < _SEARCH_DEPTH]
        if _has_segments(root) or (os.path.basename(root) == "wal" and root != data_dir):
            found.append(root)
            dirs[:] = []
    if not found:
        raise LayoutError(f"{data_dir}: no Raft WAL (wal-<seq>.log files) found")
    if len(found) > 1:
        raise LayoutError(f"{data_dir}: several WAL directories: {sorted(found)}; name one")
    return found[0]


def list_segments(wal: str) -> tuple[Segment, ...]:
    by_seq: dict[int, Segment] = {}
    for where, archived in ((os.path.join(wal, ARCHIVE), True), (wal, False)):
        if not os.path.isdir(where):
            continue
        for name in os.listdir(where):
            m = SEGMENT_RE.match(name)
            if m:
                path = os.path.join(where, name)
                seg = Segment(int(m.group(1)), path, os.path.getsize(path), archived)
                by_seq[seg.seq] = seg  # the live copy, read second, wins
    return tuple(by_seq[k] for k in sorted(by_seq))


def _check_key(d: str, name: str, wal: str, keyring: Keyring | None) -> None:
    """The audit reads WAL payloads and LMDB values; an encrypted store's are sealed. Without
    its key, or with a key that does not open it, refuse clearly: never compare sealed bytes
    as if they were data."""
    store = store_of(wal)
    if not encrypted(store):
        return
    if keyring is None:
        raise LayoutError(f"{d}: the store is encrypted at rest (jetstream.key); give its key "
                          "with --key-file FILE or --config NODE.CONF: refusing")
    try:
        keyring.check(name, store)
    except KeyringError as e:
        raise LayoutError(f"{d}: {e}: refusing") from None


def node_dirs(data_dirs: list[str], keyring: Keyring | None = None) -> list[NodeDirs]:
    """Each data directory's log; with `keyring`, every encrypted store's key is checked
    (and remembered in it for the executors)."""
    out: list[NodeDirs] = []
    names: set[str] = set()
    for d in data_dirs:
        wal = find_wal(d)
        name = os.path.basename(os.path.normpath(d)) or d
        if name in names:
            name = os.path.normpath(d)
        if name in names:
            raise LayoutError(f"{d}: given twice")
        names.add(name)
        _check_key(d, name, wal, keyring)
        snap = os.path.join(os.path.dirname(wal), "snap")
        out.append(NodeDirs(name, wal, snap if os.path.isdir(snap) else None,
                            list_segments(wal), os.path.abspath(d)))
    return out


def plan_splits(nodes: list[NodeDirs], split_bytes: int = SPLIT_BYTES) -> list[Split]:
    """Byte ranges of at most `split_bytes`; an empty segment gets one empty split."""
    assert split_bytes > 0
    out: list[Split] = []
    for n in nodes:
        for s in n.segments:
            start = 0
            while True:
                end = min(s.size, start + split_bytes)
                out.append(Split(n.name, s.seq, s.path, start, end, s.size))
                if end >= s.size:
                    break
                start = end
    return out

"""The node's Raft log on disk: one write-ahead log shared by every group.

All groups append to the same segmented WAL (`wal-<seq>.log`), so one
`fsync` in `sync()` makes every record buffered since the previous sync
durable, whatever group it belongs to (group commit). Writes are buffered in
memory until `sync()`; reads see buffered records too (the driver only tells
the core about entries after the sync, so this is just convenience).

Memory stays bounded: per group we keep compact arrays (term, segment,
offset, length, type per index) and a small shared byte-bounded cache of
recent entries; older payloads are read back with `Disk.pread`.

Every file operation goes through an injected `raft.disk.Disk` (default: the
real filesystem), the seam where the simulation's crashing disk plugs in.

Record format and recovery rules: `raft/wal.py` and docs/raft.md.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import os
import re
import struct
from array import array
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from raft.disk import OS_DISK, Disk, StorageFatalError
from raft.types import (
    CompactedError,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Snapshot,
    SnapshotMeta,
    UnavailableError,
)
from raft.wal import (
    CorruptLogError,
    Record,
    RecordType,
    Scanner,
    decode_conf_state,
    decode_vote,
    encode,
    encode_conf_state,
    encode_entries,
    encode_hard_state,
    header_len,
)

log = logging.getLogger(__name__)

_SEGMENT_RE = re.compile(r"^wal-(\d{16})\.log$")
CACHE_BYTES = 8 << 20
SCAN_CHUNK = 4 << 20  # recovery reads segments in pieces this big
RELOCATE_ENTRIES_MAX = 64  # a pinning group's live tail is copied forward if this short
RELOCATE_SCAN_MAX = 1024  # pinning groups looked at per roll
# Per-entry size overhead for `max_bytes`, equal to raft.log.ENTRY_OVERHEAD (not imported to keep
# storage independent of the core); tests/raft/test_storage.py checks both agree.
ENTRY_OVERHEAD = 16  # recent entries kept decoded in memory, across all groups
# Zeros written ahead of the records of the segment being written (its runway): a sync
# inside it changes no file size, so its fdatasync writes the data and no inode (one
# device wait less per sync on ext4). Extended by this much when a write reaches its end.
PREALLOC_BYTES = 1 << 20

__all__ = [
    "ARCHIVE_DIR", "CorruptLogError", "GroupLog", "NodeLog", "StorageFatalError", "WalStats",
]
ARCHIVE_DIR = "archive"  # the audit job reads <wal dir>/archive by default
_AAD = struct.Struct("<QQB")  # index, term, entry type: where a sealed payload belongs


def payload_aad(group_key: bytes, index: int, term: int, entry_type: int) -> bytes:
    """The associated data a sealed entry payload is bound to (the audit opens them too)."""
    return group_key + _AAD.pack(index, term, entry_type)


class PayloadSealer(Protocol):
    """Encryption at rest of entry payloads (node/jetstream/crypt.py `Sealer`). `open` raises
    on a payload that does not authenticate; the log reports that as corruption."""

    def seal(self, data: bytes, aad: bytes) -> bytes: ...

    def open(self, blob: bytes, aad: bytes) -> bytes: ...


def segment_name(seq: int) -> str:
    return f"wal-{seq:016d}.log"


@dataclass(slots=True)
class WalStats:
    fsyncs: int = 0  # incremented exactly where Disk.fsync / fsync_dir is called
    syncs: int = 0
    bytes_written: int = 0
    records: int = 0
    segments_deleted: int = 0
    torn_bytes_truncated: int = 0
    entries_relocated: int = 0  # copied forward at a roll (see _relocate_short_tails)


@dataclass(slots=True)
class _Chunk:
    """Bytes buffered for one segment, starting at file offset `start`."""

    seg: int
    start: int
    buf: bytearray = field(default_factory=bytearray)


class _GroupState:
    """In-memory index of one group's log. Pure: no I/O.

    Entry `i` lives at position `i - snap.index - 1` of the arrays. `segs` is
    non-decreasing (later entries are written later), which `pinned` relies on.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.key = name.encode("ascii")
        self.hs = HardState()
        self.snap = SnapshotMeta()
        self.hole = 0  # replay only: entries <= hole were never seen; a later COMPACT must cover
        # Replay only: the last real compaction point seen. While a hole is open, `snap`
        # is a placeholder at the hole and this is the true start of the log.
        self.known = SnapshotMeta()
        self.terms = array("Q")
        self.segs = array("I")
        self.offs = array("Q")
        self.lens = array("I")
        self.types = array("B")
        # Segments holding at least one of our entries above the snapshot, oldest first
        # (an ordered set): exactly the segments this group keeps from being deleted.
        self.pinned: dict[int, None] = {}
        self.ckpt: tuple[bytes, int] | None = None  # cached checkpoint, record count

    def last_index(self) -> int:
        return self.snap.index + len(self.terms)

    def truncate_from(self, index: int) -> None:
        """Forget entries >= index (index > snap.index)."""
        del self.terms[index - self.snap.index - 1 :]
        del self.segs[index - self.snap.index - 1 :]
        del self.offs[index - self.snap.index - 1 :]
        del self.lens[index - self.snap.index - 1 :]
        del self.types[index - self.snap.index - 1 :]

    def put(self, term: int, index: int, etype: int, seg: int, off: int, n: int) -> None:
        if index > self.last_index() + 1:
            raise ValueError(f"{self.name}: gap, entry {index} after {self.last_index()}")
        if index <= self.last_index():
            self.truncate_from(index)
        self.terms.append(term)
        self.segs.append(seg)
        self.offs.append(off)
        self.lens.append(n)
        self.types.append(etype)

    def compact_to(self, index: int, term: int, conf: ConfState | None) -> None:
        """Drop entries <= index; the snapshot now ends at (index, term)."""
        self.ckpt = None
        cs = conf if conf is not None else self.snap.conf_state
        if index >= self.known.index:
            self.known = SnapshotMeta(index=index, term=term, conf_state=cs)
        if index < self.snap.index or (index == self.snap.index and not self.hole):
            return
        if index >= self.last_index():
            self.truncate_from(self.snap.index + 1)
        else:
            drop = index - self.snap.index
            for arr in (self.terms, self.segs, self.offs, self.lens, self.types):
                del arr[:drop]
        self.snap = SnapshotMeta(index=index, term=term, conf_state=cs)
        if index >= self.hole:
            self.hole = 0

    def install(self, meta: SnapshotMeta) -> None:
        """A snapshot from the leader replaces the whole log."""
        self.ckpt = None
        self.truncate_from(self.snap.index + 1)
        self.snap = SnapshotMeta(meta.index, meta.term, meta.conf_state)
        if self.hs.commit < meta.index:
            # A snapshot holds committed entries only. Said here (live and in replay),
            # the hard state stays valid when the HARD_STATE after the record is lost.
            self.hs = HardState(self.hs.term, self.hs.vote, meta.index)
        self.known = self.snap
        self.hole = 0  # whatever its index: nothing before the snapshot is needed any more

    def open_hole(self, index: int) -> None:
        """Replay only: entries <= index sat in deleted segments; a later COMPACT covers them."""
        self.ckpt = None
        self.truncate_from(self.snap.index + 1)
        self.snap = SnapshotMeta(index, 0, self.snap.conf_state)
        self.hole = index

    def rewind(self, index: int) -> None:
        """Replay only, hole open: an entry at `index` supersedes everything from there on,
        placeholder range included. Only the part between the true start and it stays unseen."""
        self.ckpt = None
        if index - 1 == self.known.index:
            self.truncate_from(self.snap.index + 1)
            self.snap, self.hole = self.known, 0
        else:
            self.open_hole(index - 1)

    def checkpoint(self) -> tuple[bytes, int]:
        """COMPACT + HARD_STATE records restating this group's position (bytes,
        record count), cached until the position changes."""
        if self.ckpt is None:
            out, n = b"", 0
            if self.snap.index or self.snap.conf_state != ConfState():
                cs = encode_conf_state(self.snap.conf_state)
                out = encode(RecordType.COMPACT, self.key, self.snap.term, self.snap.index, 0, cs)
                n = 1
            if self.hs != HardState():
                out += encode_hard_state(self.key, self.hs)
                n += 1
            self.ckpt = (out, n)
        return self.ckpt


class _EntryCache:
    """Recently appended entries, bounded by payload bytes. Entries sit in one dict per
    group; eviction goes by whole runs (as they were put), oldest first, so a run of
    appends costs one dict store per entry and one queue item, not an ordered-dict
    move per entry. Entries are kept as given (no copy) when their data is `bytes`:
    nothing changes an Entry once it is in the log (the core sets a proposal's term and
    index before it appends it), and reads hand out the cached objects anyway.
    Evicting a run whose indexes were re-put since may drop the newer entries too: a
    cache miss (read from the file), never a wrong entry."""

    MAX_RUNS = 1 << 16  # runs remembered; past it the oldest go whatever their bytes

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._bytes = 0
        self._groups: dict[str, dict[int, Entry]] = {}
        self._runs: deque[tuple[str, int, int]] = deque()  # (group, lo, hi) in put order

    def put(self, group: str, e: Entry) -> None:
        self.put_run(group, [e])

    def put_run(self, group: str, entries: list[Entry]) -> None:
        limit = self._max // 4  # one huge entry would flush everything useful
        d = self._groups.get(group)
        if d is None:
            d = self._groups[group] = {}
        added = 0
        for e in entries:
            if type(e.data) is not bytes:  # a view into a buffer that may be reused
                e = Entry(e.term, e.index, e.type, bytes(e.data))
            n = len(e.data)
            if n > limit:
                continue
            old = d.get(e.index)
            if old is not None:
                added -= len(old.data)
            d[e.index] = e
            added += n
        self._bytes += added
        self._runs.append((group, entries[0].index, entries[-1].index + 1))
        while self._runs and (self._bytes > self._max or len(self._runs) > self.MAX_RUNS):
            self.drop(*self._runs.popleft())

    def get(self, group: str, index: int) -> Entry | None:
        d = self._groups.get(group)
        return None if d is None else d.get(index)

    def drop(self, group: str, lo: int, hi: int) -> None:
        d = self._groups.get(group)
        if not d:
            return
        pop = d.pop
        for i in range(lo, hi):
            old = pop(i, None)
            if old is not None:
                self._bytes -= len(old.data)
        if not d:
            del self._groups[group]


class GroupLog:
    """One group's view of the node log; implements `raft.types.Storage`."""

    def __init__(self, node: NodeLog, state: _GroupState) -> None:
        self._node = node
        self._g = state

    @property
    def name(self) -> str:
        return self._g.name

    def initial_state(self) -> tuple[HardState, ConfState]:
        hs = self._g.hs
        return HardState(hs.term, hs.vote, hs.commit), self._g.snap.conf_state

    def first_index(self) -> int:
        return self._g.snap.index + 1

    def last_index(self) -> int:
        g = self._g  # inline _GroupState.last_index: the Raft log asks many times a commit
        return g.snap.index + len(g.terms)

    def term(self, index: int) -> int:
        g = self._g
        if index == g.snap.index:
            return g.snap.term
        if index < g.snap.index:
            raise CompactedError(f"{g.name}: index {index} compacted (<= {g.snap.index})")
        if index > g.last_index():
            raise UnavailableError(f"{g.name}: index {index} > last {g.last_index()}")
        return g.terms[index - g.snap.index - 1]

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        g = self._g
        if lo <= g.snap.index:
            raise CompactedError(f"{g.name}: entries from {lo} compacted (<= {g.snap.index})")
        if hi > g.last_index() + 1:
            raise UnavailableError(f"{g.name}: entries up to {hi - 1} > last {g.last_index()}")
        out: list[Entry] = []
        size = 0
        for i in range(lo, hi):
            pos = i - g.snap.index - 1
            size += g.lens[pos] + ENTRY_OVERHEAD  # same measure as raft.log.entry_size
            if out and max_bytes is not None and size > max_bytes:
                break
            out.append(self._node._load(g, i))
        return out

    def snapshot(self) -> Snapshot:
        """Metadata only: snapshot data lives in the state machine (LMDB)."""
        s = self._g.snap
        return Snapshot(meta=SnapshotMeta(s.index, s.term, s.conf_state))


class NodeLog:
    """All groups' Raft logs of one node in one segmented, CRC-checked WAL.

    `repair=False` (default): a corrupt record anywhere but the torn tail of
    the write that was in flight raises CorruptLogError (fsynced data was
    lost: the operator decides). `repair=True` keeps the valid prefix and
    drops the rest. `archive_dir` (relative to `dir` unless absolute; the
    audit job reads `ARCHIVE_DIR`): obsolete segments are moved there instead
    of deleted. A failed write or fsync raises StorageFatalError and every
    later write is refused.
    """

    def __init__(
        self,
        dir: str,
        segment_bytes: int = 64 << 20,
        *,
        cache_bytes: int = CACHE_BYTES,
        repair: bool = False,
        disk: Disk | None = None,
        archive_dir: str | None = None,
        sealer: PayloadSealer | None = None,
        prealloc: int = PREALLOC_BYTES,
    ) -> None:
        self.dir = dir
        # Entry payloads are sealed on their way into records and opened on their way out
        # of the file (the cache holds them open): the core never sees ciphertext.
        self.sealer = sealer
        self.disk: Disk = disk if disk is not None else OS_DISK
        self.archive_dir = os.path.join(dir, archive_dir) if archive_dir else None
        self.stats = WalStats()
        self._segment_bytes = segment_bytes
        self._prealloc = max(0, min(prealloc, segment_bytes))
        self._alloc: dict[int, int] = {}  # segment -> file size (records + zero runway)
        self._groups: dict[str, _GroupState] = {}
        self._views: dict[str, GroupLog] = {}
        self._fds: dict[int, int] = {}  # segment seq -> fd, ascending seq order
        # segment -> groups with live entries in it (ordered set): empty = deletable.
        self._pins: dict[int, dict[_GroupState, None]] = {}
        self._pending: list[_Chunk] = []
        self._inflight: list[_Chunk] = []
        self._doomed: list[int] = []  # segments the in-flight sync makes obsolete
        self._cache = _EntryCache(cache_bytes)
        self._cur_seg = 0
        self._cur_size = 0
        self._seg_base = 0  # bytes of the current segment's checkpoint and copied tails
        self._rolling = False
        self._dir_dirty = False
        self._failed: BaseException | None = None
        self._sync_lock = asyncio.Lock()
        with self._fatal("open"):
            self.disk.makedirs(dir)
            if self.archive_dir:
                self.disk.makedirs(self.archive_dir)
                self._fsync_dir()
            self._recover(repair)

    # ---- group access ------------------------------------------------

    def group(self, group: str) -> GroupLog:
        view = self._views.get(group)
        if view is None:
            state = self._state(group)
            view = self._views[group] = GroupLog(self, state)
        return view

    def groups(self) -> list[str]:
        return list(self._groups)

    def _state(self, group: str) -> _GroupState:
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = _GroupState(group)
        return g

    # ---- buffered writes -----------------------------------------------

    def append(self, group: str, entries: list[Entry]) -> None:
        """Append entries; an entry at index i supersedes this group's entries >= i."""
        g = self._state(group)
        if entries and entries[0].index == g.last_index() + 1 > g.snap.index:
            self._append_run(g, entries)
            return
        self._append_each(g, entries)

    def _append_run(self, g: _GroupState, entries: list[Entry]) -> None:
        """The common case, entries that extend the log: encoded together, buffered
        as one piece, indexed with one extend per array. The records and where
        they land are exactly those of `_append_each` (a run that would cross a
        segment roll is emitted record by record, so rolls fall where they did)."""
        first = entries[0].index
        for k, e in enumerate(entries):
            if e.index != first + k:
                raise ValueError(f"{g.name}: gap, entry {e.index} after {first + k - 1}")
        datas = [self._seal(g, e) for e in entries]
        recs = encode_entries(g.key, [(e.term, e.index, e.type, d)
                                      for e, d in zip(entries, datas, strict=True)])
        total = sum(map(len, recs))
        hlen = header_len(g.key)
        if self._rolling or self._cur_size - self._seg_base + total - len(recs[-1]) \
                < self._segment_bytes:
            seg, off = self._emit(b"".join(recs), count=len(recs))
            offs = []
            for r in recs:
                offs.append(off + hlen)
                off += len(r)
            g.terms.extend(e.term for e in entries)
            g.segs.extend([seg] * len(recs))
            g.offs.extend(offs)
            g.lens.extend(map(len, datas))
            g.types.extend(e.type for e in entries)
            if seg not in g.pinned:
                g.pinned[seg] = None
                self._pins.setdefault(seg, {})[g] = None
        else:
            for e, d, r in zip(entries, datas, recs, strict=True):
                seg, off = self._emit(r)
                self._put(g, e.term, e.index, e.type, seg, off + hlen, len(d))
        self._cache.put_run(g.name, entries)

    def _append_each(self, g: _GroupState, entries: list[Entry]) -> None:
        group = g.name
        for e in entries:
            if e.index <= g.snap.index:
                continue  # already covered by the snapshot
            if e.index > g.last_index() + 1:
                raise ValueError(f"{group}: gap, entry {e.index} after {g.last_index()}")
            if e.index <= g.last_index():
                self._cache.drop(group, e.index, g.last_index() + 1)
            data = self._seal(g, e)
            rec = encode(RecordType.ENTRY, g.key, e.term, e.index, e.type, data)
            seg, off = self._emit(rec)
            self._put(g, e.term, e.index, e.type, seg, off + header_len(g.key), len(data))
            self._cache.put(group, Entry(e.term, e.index, e.type, bytes(e.data)))

    def set_hard_state(self, group: str, hs: HardState) -> None:
        g = self._state(group)
        self._emit(encode_hard_state(g.key, hs))
        g.hs = HardState(hs.term, hs.vote, hs.commit)
        g.ckpt = None

    def apply_snapshot(self, group: str, meta: SnapshotMeta) -> bool:
        """Install a snapshot received from the leader: the log restarts after it.

        Returns False (and writes nothing) for a snapshot older than ours.
        """
        g = self._state(group)
        if meta.index <= g.snap.index:
            return False
        payload = encode_conf_state(meta.conf_state)
        self._emit(encode(RecordType.SNAPSHOT_META, g.key, meta.term, meta.index, 0, payload))
        self._cache.drop(group, g.snap.index + 1, g.last_index() + 1)
        g.install(meta)
        self._repin(g)
        return True

    def compact(self, group: str, index: int, conf_state: ConfState | None = None) -> None:
        """Drop entries <= index after the state machine snapshotted them.

        `conf_state` is the membership as of `index` (None keeps the known one).
        """
        g = self._state(group)
        if index <= g.snap.index:
            return
        if index > g.last_index():
            raise UnavailableError(f"{group}: compact {index} > last {g.last_index()}")
        term = self.group(group).term(index)
        payload = encode_conf_state(conf_state)
        self._emit(encode(RecordType.COMPACT, g.key, term, index, 0, payload))
        g.compact_to(index, term, conf_state)
        self._repin(g)

    def drop_group(self, group: str) -> None:
        """The group left this node: forget it (entries, hard state, snapshot).

        After the next sync `group(name)` is fresh, as if never seen; the group
        no longer pins segments nor appears in checkpoints.
        """
        g = self._groups.get(group)
        if g is None:
            return
        self._emit(encode(RecordType.DROP, g.key, 0, 0))
        self._forget(g)

    def _forget(self, g: _GroupState) -> None:
        self._cache.drop(g.name, g.snap.index + 1, g.last_index() + 1)
        g.truncate_from(g.snap.index + 1)
        self._repin(g)
        del self._groups[g.name]
        self._views.pop(g.name, None)

    # ---- which segments each group pins -----------------------------------

    def _put(self, g: _GroupState, term: int, index: int, etype: int, seg: int, off: int,
             n: int) -> None:
        """Record an entry (live or replayed) and the segment it pins."""
        if index <= g.last_index():
            g.truncate_from(index)  # superseded: their segments may be free now
            self._repin(g)
        g.put(term, index, etype, seg, off, n)
        if seg not in g.pinned:
            g.pinned[seg] = None
            self._pins.setdefault(seg, {})[g] = None

    def _repin(self, g: _GroupState) -> None:
        """After entries left g's arrays (a prefix by compaction, a suffix by
        truncation, or all): unpin the segments that no longer hold any.
        Costs one step per segment released, never a scan of all groups."""
        lo = g.segs[0] if g.segs else None
        hi = g.segs[-1] if g.segs else None
        while g.pinned:
            seg = next(iter(g.pinned))
            if lo is not None and seg >= lo:
                break
            self._unpin(g, seg)
        while g.pinned:
            seg = next(reversed(g.pinned))
            if hi is not None and seg <= hi:
                break
            self._unpin(g, seg)

    def _unpin(self, g: _GroupState, seg: int) -> None:
        del g.pinned[seg]
        pins = self._pins.get(seg)
        if pins is not None:
            pins.pop(g, None)

    def _emit(self, rec: bytes, count: int = 1) -> tuple[int, int]:
        """Buffer records; returns the (segment, offset) of the first."""
        if self._failed is not None:
            raise StorageFatalError("the log failed earlier; refusing writes") from self._failed
        if self._cur_size - self._seg_base >= self._segment_bytes and not self._rolling:
            self._roll()
        if not self._pending or self._pending[-1].seg != self._cur_seg:
            self._pending.append(_Chunk(self._cur_seg, self._cur_size))
        off = self._cur_size
        self._pending[-1].buf += rec
        self._cur_size += len(rec)
        self.stats.records += count
        return self._cur_seg, off

    def _roll(self) -> None:
        """Start a new segment, opening it with a checkpoint of every live group.

        The checkpoint (COMPACT + HARD_STATE per group) lets older segments be
        deleted as a prefix without losing any group's snapshot or vote. Each
        group's records are cached bytes, rebuilt only after it changed, so a
        roll is one join however many groups there are.
        """
        self._open_segment(self._cur_seg + 1)
        self._rolling = True
        try:
            parts = [g.checkpoint() for g in self._groups.values()]
            blob = b"".join(p for p, _ in parts)
            if blob:
                self._emit(blob, count=sum(n for _, n in parts))
            self._relocate_short_tails(self._segment_bytes // 8)
        finally:
            self._rolling = False
        # A segment holds segment_bytes besides its checkpoint: with many groups and
        # small segments, a checkpoint alone must not trigger the next roll.
        self._seg_base = self._cur_size

    def _relocate_short_tails(self, budget: int) -> None:
        """Copy forward (COPY records) the whole live tail of groups that pin the
        oldest segment with only a few entries (an idle group's last writes), so
        that segment can go without forcing each of them to snapshot. Replay
        ignores a copy while the original is there (a torn run of copies changes
        nothing) and uses it once the original's segment is gone. Bounded per roll
        by `budget` bytes and RELOCATE_SCAN_MAX groups looked at."""
        oldest = next(iter(self._fds))
        if oldest == self._cur_seg:
            return
        for g in list(itertools.islice(self._pins.get(oldest, {}), RELOCATE_SCAN_MAX)):
            if len(g.terms) > RELOCATE_ENTRIES_MAX or sum(g.lens) > budget:
                continue
            budget -= sum(g.lens)
            tail = [self._load(g, i) for i in range(g.snap.index + 1, g.last_index() + 1)]
            for e in tail:
                data = self._seal(g, e)
                rec = encode(RecordType.COPY, g.key, e.term, e.index, e.type, data)
                seg, off = self._emit(rec)
                self._put(g, e.term, e.index, e.type, seg, off + header_len(g.key), len(data))
            self.stats.entries_relocated += len(tail)

    def _open_segment(self, seq: int) -> None:
        path = os.path.join(self.dir, segment_name(seq))
        with self._fatal("create segment"):
            self._fds[seq] = self.disk.open(path, create=True)
        self._cur_seg, self._cur_size, self._seg_base = seq, 0, 0
        self._dir_dirty = True

    @contextlib.contextmanager
    def _fatal(self, what: str) -> Iterator[None]:
        """A failed disk call poisons the log: the caller must stop the node."""
        try:
            yield
        except OSError as e:
            self._failed = e
            raise StorageFatalError(f"wal {self.dir}: {what} failed: {e}") from e

    # ---- durability ----------------------------------------------------

    def sync(self) -> int:
        """Write everything buffered and fsync once; returns bytes written."""
        if self._inflight:
            raise RuntimeError("sync() while sync_async() is in flight")
        batch = self._take()
        try:
            n = self._write(batch)
        finally:
            self._inflight = []
        self._after_sync()
        return n

    def pending_bytes(self) -> int:
        """Bytes buffered for the next sync (what it would write)."""
        return sum(len(ch.buf) for ch in self._pending)

    async def sync_async(self, run: Callable[..., Awaitable[Any]] | None = None,
                         then: Callable[[], Any] | None = None) -> int:
        """Like sync(), but the write+fsync runs in `run` (default: a thread);
        the loop keeps serving. Records buffered meanwhile go to the next sync.
        `then()` runs as soon as the batch is durable, before the segments it
        made obsolete are deleted (unlinks and directory fsyncs that nothing
        waiting on this batch needs: the driver's answers leave first)."""
        async with self._sync_lock:
            batch = self._take()
            try:
                n = await (run or asyncio.to_thread)(self._write, batch)
            finally:
                self._inflight = []
            if then is not None:
                then()
            self._after_sync()
            return n

    def _take(self) -> list[_Chunk]:
        if self._failed is not None:
            raise StorageFatalError("the log failed earlier; refusing writes") from self._failed
        batch, self._pending = self._pending, []
        self._inflight = batch
        # Decided now, not after the write: a segment is obsolete only by records
        # in this batch or earlier (defect: a COMPACT buffered during the write
        # would otherwise justify a delete while it is still only in memory).
        self._doomed = self._obsolete()
        return batch

    def _write(self, batch: list[_Chunk]) -> int:
        """pwrite and fsync segment by segment, in order (normally one).

        A later segment gets its first byte only once the earlier one is
        durable, so after a crash a torn older segment is followed only by
        empty ones: recovery can tell a torn batch from lost fsynced data.
        """
        written = 0
        with self._fatal("write"):
            if self._dir_dirty:
                self._fsync_dir()
            for i, ch in enumerate(batch):
                self.disk.pwrite(self._fds[ch.seg], ch.buf, ch.start)
                if zeros := self._runway(ch):
                    self.disk.pwrite(self._fds[ch.seg], bytes(zeros), ch.start + len(ch.buf))
                written += len(ch.buf)
                if i + 1 == len(batch) or batch[i + 1].seg != ch.seg:
                    # fdatasync makes the bytes and a changed size durable: all a
                    # reader of the records needs (mtime may lag).
                    self.disk.fdatasync(self._fds[ch.seg])
                    self.stats.fsyncs += 1
        self.stats.syncs += 1
        self.stats.bytes_written += written
        return written

    def _runway(self, ch: _Chunk) -> int:
        """How many zeros to write right after the chunk (same sync): `_prealloc` when
        it reaches the end of the segment's runway, else 0. Written after the records
        (a separate write: a crash model that tears the first write tears records, as
        without a runway). Recovery reads a zero tail as the end of the records
        (`wal.Scanner`)."""
        end = ch.start + len(ch.buf)
        if not self._prealloc or end <= self._alloc.get(ch.seg, 0):
            return 0
        self._alloc[ch.seg] = end + self._prealloc
        return self._prealloc

    def _fsync_dir(self, path: str | None = None) -> None:
        if path is None:
            self._dir_dirty = False
        self.disk.fsync_dir(path or self.dir)
        self.stats.fsyncs += 1

    # ---- segment garbage collection --------------------------------------

    def pinning_groups(self, limit: int | None = None) -> list[str]:
        """Groups whose unsnapshotted entries keep the oldest segment alive
        (at most `limit`, so callers can spread the snapshots they force)."""
        if len(self._fds) < 2:
            return []
        pins = self._pins.get(next(iter(self._fds)), {})
        names = (g.name for g in pins if self._groups.get(g.name) is g)
        return list(itertools.islice(names, limit))

    def segments(self) -> list[int]:
        return sorted(self._fds)

    def _obsolete(self) -> list[int]:
        """Oldest segments no live entry needs: a prefix, never the current one."""
        out: list[int] = []
        for seq in self._fds:
            if seq >= self._cur_seg or self._pins.get(seq):
                break
            out.append(seq)
        return out

    def _after_sync(self) -> None:
        # Delete oldest-first only: recovery relies on the survivors being a
        # suffix that starts with a checkpoint (emitted, hence synced, before
        # `_take` chose these segments).
        doomed, self._doomed = self._doomed, []
        if not doomed:
            return
        with self._fatal("retire segment"):
            for seq in doomed:
                self._retire(seq)
            if self.archive_dir:
                # The archive entry is durable before the log's entry goes away.
                self._fsync_dir(self.archive_dir)
            self._fsync_dir(self.dir)

    def _retire(self, seq: int) -> None:
        path = os.path.join(self.dir, segment_name(seq))
        self.disk.close(self._fds.pop(seq))
        self._pins.pop(seq, None)
        self._alloc.pop(seq, None)
        if self.archive_dir:
            self.disk.rename(path, os.path.join(self.archive_dir, segment_name(seq)))
        else:
            self.disk.unlink(path)
        self.stats.segments_deleted += 1

    @property
    def _seg_max(self) -> dict[int, dict[str, int]]:
        """Diagnostics: segment -> group -> highest live entry index in it."""
        out: dict[int, dict[str, int]] = {seq: {} for seq in self._fds}
        for g in self._groups.values():
            for seg in g.pinned:
                top = g.snap.index + bisect.bisect_right(g.segs, seg)
                out.setdefault(seg, {})[g.name] = top
        return out

    # ---- reads -----------------------------------------------------------

    def _load(self, g: _GroupState, index: int) -> Entry:
        e = self._cache.get(g.name, index)
        if e is not None:
            return e
        pos = index - g.snap.index - 1
        data = self._read(g.segs[pos], g.offs[pos], g.lens[pos])
        if self.sealer is not None:
            aad = payload_aad(g.key, index, g.terms[pos], g.types[pos])
            try:
                data = self.sealer.open(data, aad)
            except Exception as exc:  # noqa: BLE001 - any failure to open is corruption
                raise CorruptLogError(f"{g.name}: entry {index} does not decrypt: {exc}") \
                    from exc
        return Entry(g.terms[pos], index, EntryType(g.types[pos]), data)

    def _seal(self, g: _GroupState, e: Entry) -> bytes:
        if self.sealer is None:
            return e.data
        return self.sealer.seal(e.data, payload_aad(g.key, e.index, e.term, e.type))

    def _read(self, seg: int, off: int, n: int) -> bytes:
        for ch in (*self._inflight, *self._pending):
            if ch.seg == seg and ch.start <= off < ch.start + len(ch.buf):
                return bytes(ch.buf[off - ch.start : off - ch.start + n])
        with self._fatal("read"):
            data = self.disk.pread(self._fds[seg], n, off)
        if len(data) != n:
            raise CorruptLogError(f"short read in {segment_name(seg)} at {off}")
        return data

    # ---- recovery ----------------------------------------------------------

    def _recover(self, repair: bool) -> None:
        names = self.disk.listdir(self.dir)
        seqs = sorted(int(m.group(1)) for name in names if (m := _SEGMENT_RE.match(name)))
        dropped = False
        for k, seq in enumerate(seqs):
            path = os.path.join(self.dir, segment_name(seq))
            self._fds[seq] = self.disk.open(path)
            end, error = self._replay_segment(seq)
            self._cur_seg, self._cur_size = seq, end
            self._alloc[seq] = self.disk.size(self._fds[seq])  # zeros past `end` if clean
            if error is None:
                continue
            later = seqs[k + 1 :]
            if later and not repair and not self._all_empty(later):
                raise CorruptLogError(f"{path}: {error} (not the last segment; see repair=True)")
            self._truncate_tail(seq, path, end, error)
            self._drop_segments(later)
            if later:
                # New records go after every dropped number: should the unlinks be
                # undone anyway, the newer records still replay last and win.
                self._cur_seg = later[-1]
                dropped = True
            break
        for g in self._groups.values():
            self._repin(g)
        holes = [g.name for g in self._groups.values() if g.hole]
        if holes:
            raise CorruptLogError(f"groups with missing log prefix: {holes[:5]}")
        if dropped or len(self._fds) > 1:
            # Never write on in the last segment found: the crash may have taken
            # its opening checkpoint (created, its first batch lost), and records
            # added after an empty start would let the segments before it go (a
            # truncation or compaction unpins them) with no COMPACT / HARD_STATE
            # left anywhere (tests/sim seed 444). A fresh segment opens with a
            # checkpoint of every group. A single survivor needs none: either it is
            # the first segment, or its checkpoint was durable before its
            # predecessors were deleted.
            self._roll()
        if not self._fds:
            self._open_segment(self._first_free_seq())
            self._fsync_dir()

    def _all_empty(self, seqs: list[int]) -> bool:
        """True if these segments hold no record (no byte, or zeros only): the torn
        segment before them was the one being written when the node stopped (see
        `_write`), not lost data."""
        for seq in seqs:
            fd = self.disk.open(os.path.join(self.dir, segment_name(seq)))
            try:
                size, at = self.disk.size(fd), 0
                while at < size:
                    piece = self.disk.pread(fd, min(SCAN_CHUNK, size - at), at)
                    if not piece:
                        break
                    if piece != bytes(len(piece)):
                        return False
                    at += len(piece)
            finally:
                self.disk.close(fd)
        return True

    def _drop_segments(self, seqs: list[int]) -> None:
        """Unlink segments after a truncated one, durably: if the unlinks were
        lost in a crash, their old records would replay after newer ones."""
        for seq in seqs:
            # Emptied durably first: even an unlink the crash undid leaves no records.
            fd = self._fds.pop(seq, None)
            self._alloc.pop(seq, None)
            if fd is None:
                fd = self.disk.open(os.path.join(self.dir, segment_name(seq)))
            self.disk.ftruncate(fd, 0)
            self.disk.fsync(fd)
            self.stats.fsyncs += 1
            self.disk.close(fd)
            self.disk.unlink(os.path.join(self.dir, segment_name(seq)))
            log.error("wal: dropped segment %s after a torn or corrupt one", segment_name(seq))
        if seqs:
            self._fsync_dir()

    def _first_free_seq(self) -> int:
        """1, or after the archived segments (a reused number would overwrite one)."""
        if not self.archive_dir:
            return 1
        names = self.disk.listdir(self.archive_dir)
        return max((int(m.group(1)) for n in names if (m := _SEGMENT_RE.match(n))), default=0) + 1

    def _replay_segment(self, seq: int) -> tuple[int, str | None]:
        """Replay one segment, read in SCAN_CHUNK pieces; (valid length, error)."""
        fd = self._fds[seq]
        size = self.disk.size(fd)
        buf, base, read_at = bytearray(), 0, 0
        while True:
            if read_at < size:
                piece = self.disk.pread(fd, min(SCAN_CHUNK, size - read_at), read_at)
                read_at += len(piece)
                size = read_at if not piece else size
                buf += piece
            scanner = Scanner(buf, entry_payloads=False)
            try:
                for rec in scanner:
                    self._replay(seq, rec, base)
            finally:
                scanner.close()  # buf cannot shrink while a view into it exists
            if read_at >= size:
                return base + scanner.end, scanner.error
            # The stop may only mean the record continues in the next piece.
            del buf[: scanner.end]
            base += scanner.end

    def _replay(self, seq: int, rec: Record, base: int) -> None:
        if rec.type is RecordType.DROP:
            if (gone := self._groups.get(rec.group)) is not None:
                self._forget(gone)
            return
        g = self._state(rec.group)
        if rec.type is RecordType.COPY and self._holds(g, rec.index, rec.term):
            return  # the original is still here: the copy changes nothing
        if rec.type in (RecordType.ENTRY, RecordType.COPY):
            if g.hole and g.known.index < rec.index <= g.snap.index:
                g.rewind(rec.index)
            if rec.index <= g.snap.index:
                return
            if rec.index > g.last_index() + 1:
                # Older segments were deleted; a later COMPACT must cover this.
                g.open_hole(rec.index - 1)
            self._put(g, rec.term, rec.index, rec.entry_type, seq, base + rec.payload_offset,
                      rec.payload_len)
        elif rec.type is RecordType.HARD_STATE:
            g.hs = HardState(rec.term, decode_vote(rec.payload), rec.index)
        elif rec.type is RecordType.SNAPSHOT_META:
            conf = decode_conf_state(rec.payload) or ConfState()
            g.install(SnapshotMeta(rec.index, rec.term, conf))
        elif rec.type is RecordType.COMPACT:
            g.compact_to(rec.index, rec.term, decode_conf_state(rec.payload))

    @staticmethod
    def _holds(g: _GroupState, index: int, term: int) -> bool:
        return g.snap.index < index <= g.last_index() and g.terms[index - g.snap.index - 1] == term

    def _truncate_tail(self, seq: int, path: str, end: int, error: str) -> None:
        size = self.disk.size(self._fds[seq])
        log.warning("wal: %s: %s; truncating %d bytes of torn tail", path, error, size - end)
        self.disk.ftruncate(self._fds[seq], end)
        self.disk.fsync(self._fds[seq])
        self.stats.fsyncs += 1
        self.stats.torn_bytes_truncated += size - end
        self._alloc[seq] = end

    def close(self) -> None:
        """Flush what is buffered, cut the zero runway off, then release the files."""
        if self._pending and self._failed is None:
            self.sync()
        fd = self._fds.get(self._cur_seg)
        if self._failed is None and fd is not None \
                and self._alloc.get(self._cur_seg, 0) > self._cur_size:
            # A cleanly closed log ends at its last record (a crash may leave zeros,
            # which recovery reads as the end too).
            with self._fatal("trim runway"):
                self.disk.ftruncate(fd, self._cur_size)
                self.disk.fsync(fd)
                self.stats.fsyncs += 1
        for fd in self._fds.values():
            self.disk.close(fd)
        self._fds.clear()
        self._alloc.clear()

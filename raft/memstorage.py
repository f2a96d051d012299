"""In-memory `Storage` for tests and the simulation.

The core only reads it. The driver (or the test network) writes it, and only
after a simulated fsync: `append`, `set_hard_state`, `apply_snapshot`,
`create_snapshot`, `compact`. A test models a crash by keeping this object and
dropping the core: whatever never reached these methods is lost.
"""

from __future__ import annotations

from raft.core import bootstrap_log
from raft.log import entry_size, invariant
from raft.types import (
    CompactedError,
    ConfState,
    Entry,
    HardState,
    Snapshot,
    SnapshotMeta,
    UnavailableError,
)


class SnapshotOutOfDateError(Exception):
    """The snapshot is older than the one already stored."""


class MemoryStorage:
    def __init__(self, conf_state: ConfState | None = None) -> None:
        # _ents[0] is a dummy holding the snapshot's index and term, so that
        # term(first_index - 1) is always answerable.
        self._ents: list[Entry] = [Entry(term=0, index=0)]
        self._hard_state = HardState()
        self._snapshot = Snapshot(SnapshotMeta(conf_state=conf_state or ConfState()))

    @classmethod
    def bootstrap(cls, conf_state: ConfState) -> MemoryStorage:
        """A founding member's storage: initial membership as committed entries."""
        st = cls()
        ents, hs = bootstrap_log(conf_state)
        st.append(ents)
        st.set_hard_state(hs)
        return st

    # -- Storage protocol (read side) --------------------------------------
    def initial_state(self) -> tuple[HardState, ConfState]:
        hs = self._hard_state
        return HardState(hs.term, hs.vote, hs.commit), self._snapshot.meta.conf_state

    def _offset(self) -> int:
        return self._ents[0].index

    def first_index(self) -> int:
        return self._offset() + 1

    def last_index(self) -> int:
        return self._offset() + len(self._ents) - 1

    def term(self, index: int) -> int:
        off = self._offset()
        if index < off:
            raise CompactedError(index)
        if index - off >= len(self._ents):
            raise UnavailableError(index)
        return self._ents[index - off].term

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        off = self._offset()
        if lo <= off:
            raise CompactedError(lo)
        invariant(hi <= self.last_index() + 1, "memstorage: entries hi out of bound", hi=hi,
                  last=self.last_index())
        out: list[Entry] = []
        size = 0
        for e in self._ents[lo - off : hi - off]:
            size += entry_size(e)
            if out and max_bytes is not None and size > max_bytes:
                break
            out.append(e)
        return out

    def snapshot(self) -> Snapshot:
        return self._snapshot

    # -- driver side (write) -----------------------------------------------
    def hard_state(self) -> HardState:
        return self._hard_state

    def set_hard_state(self, hs: HardState) -> None:
        self._hard_state = HardState(hs.term, hs.vote, hs.commit)

    def apply_snapshot(self, snap: Snapshot) -> None:
        if snap.meta.index <= self._snapshot.meta.index:
            raise SnapshotOutOfDateError(snap.meta.index)
        self._snapshot = snap
        self._ents = [Entry(term=snap.meta.term, index=snap.meta.index)]

    def create_snapshot(self, index: int, conf_state: ConfState, data: bytes) -> Snapshot:
        """Record the application's state at `index` (already applied)."""
        if index <= self._snapshot.meta.index:
            raise SnapshotOutOfDateError(index)
        invariant(index <= self.last_index(), "memstorage: snapshot past log", index=index,
                  last=self.last_index())
        self._snapshot = Snapshot(SnapshotMeta(index, self.term(index), conf_state), data)
        return self._snapshot

    def compact(self, index: int) -> None:
        """Drop entries up to `index` (which must be covered by the snapshot)."""
        off = self._offset()
        if index <= off:
            raise CompactedError(index)
        invariant(index <= self.last_index(), "memstorage: compact past log", index=index,
                  last=self.last_index())
        keep = self._ents[index - off + 1 :]
        self._ents = [Entry(term=self._ents[index - off].term, index=index), *keep]

    def append(self, entries: list[Entry]) -> None:
        """Append, replacing any stored suffix from the first new index on."""
        if not entries:
            return
        first = self.first_index()
        if entries[-1].index < first:
            return  # all of it is already compacted away
        if entries[0].index < first:
            entries = entries[first - entries[0].index :]
        at = entries[0].index - self._offset()
        invariant(at <= len(self._ents), "memstorage: gap in append", first_new=entries[0].index,
                  last=self.last_index())
        self._ents = self._ents[:at] + list(entries)

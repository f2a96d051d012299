"""raftLog: the stable log in `Storage` plus an unstable in-memory tail.

Entries enter the unstable tail when appended (leader proposal or follower
APP), are handed to the driver in `Ready.entries`, and leave the tail once the
driver reports them persisted (`stable_to`). The tail therefore only holds
what is not yet fsynced: it stays bounded by the driver's persist cadence.
"""

from __future__ import annotations

from raft.types import CompactedError, Entry, Snapshot, Storage, UnavailableError

ENTRY_OVERHEAD = 16  # rough per-entry framing cost, for max_size_per_msg


class InvariantError(AssertionError):
    """A broken Raft invariant: the process must stop, not limp on."""


def invariant(cond: bool, what: str, **numbers: object) -> None:
    """Always-on check (survives `python -O`), reporting the numbers involved."""
    if not cond:
        detail = " ".join(f"{k}={v}" for k, v in numbers.items())
        raise InvariantError(f"{what}: {detail}")


def entry_size(e: Entry) -> int:
    return len(e.data) + ENTRY_OVERHEAD


def limit_size(ents: list[Entry], max_bytes: int | None) -> list[Entry]:
    """Keep the first entry always, then as many as fit in `max_bytes`."""
    if max_bytes is None or not ents:
        return ents
    size = 0
    for i, e in enumerate(ents):
        size += entry_size(e)
        if i > 0 and size > max_bytes:
            return ents[:i]
    return ents


class Unstable:
    """Entries (and maybe a snapshot) not yet known to be persisted."""

    __slots__ = ("snapshot", "entries", "offset")

    def __init__(self, offset: int) -> None:
        self.snapshot: Snapshot | None = None
        self.entries: list[Entry] = []
        self.offset = offset  # index of entries[0]

    def maybe_first_index(self) -> int | None:
        return self.snapshot.meta.index + 1 if self.snapshot else None

    def maybe_last_index(self) -> int | None:
        if self.entries:
            return self.offset + len(self.entries) - 1
        return self.snapshot.meta.index if self.snapshot else None

    def maybe_term(self, i: int) -> int | None:
        if i < self.offset:
            if self.snapshot and self.snapshot.meta.index == i:
                return self.snapshot.meta.term
            return None
        last = self.maybe_last_index()
        if last is None or i > last:
            return None
        return self.entries[i - self.offset].term

    def stable_to(self, i: int, t: int) -> None:
        # Only if the entry is still the one that was persisted: a conflicting
        # append may have replaced it since the Ready was taken.
        if i >= self.offset and self.maybe_term(i) == t:
            del self.entries[: i + 1 - self.offset]
            self.offset = i + 1

    def stable_snap_to(self, i: int) -> None:
        if self.snapshot and self.snapshot.meta.index == i:
            self.snapshot = None

    def restore(self, snap: Snapshot) -> None:
        self.offset = snap.meta.index + 1
        self.entries = []
        self.snapshot = snap

    def truncate_and_append(self, ents: list[Entry]) -> None:
        after = ents[0].index
        if after == self.offset + len(self.entries):
            self.entries.extend(ents)
        elif after <= self.offset:
            # Replaces the whole tail and possibly some stable entries too.
            self.offset = after
            self.entries = list(ents)
        else:
            self.entries = self.entries[: after - self.offset] + list(ents)

    def slice(self, lo: int, hi: int) -> list[Entry]:
        return self.entries[lo - self.offset : hi - self.offset]


class RaftLog:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        first = storage.first_index()
        last = storage.last_index()
        self.unstable = Unstable(last + 1)
        self.committed = first - 1
        self.applied = first - 1

    # -- index / term ------------------------------------------------------
    # first_index / last_index / term run dozens of times per commit (every
    # append built, every slice, every commit check): the unstable tail's
    # answers are read inline here, the same values as its maybe_* methods.
    def first_index(self) -> int:
        snap = self.unstable.snapshot
        return snap.meta.index + 1 if snap is not None else self.storage.first_index()

    def last_index(self) -> int:
        u = self.unstable
        if u.entries:
            return u.offset + len(u.entries) - 1
        return u.snapshot.meta.index if u.snapshot is not None else self.storage.last_index()

    def stable_last_index(self) -> int:
        """Last index known persisted (the leader's own durable match)."""
        if self.unstable.snapshot is not None:
            return 0
        return self.unstable.offset - 1

    def term(self, i: int) -> int:
        """Term of entry i; 0 past the end; CompactedError before the start."""
        u = self.unstable
        k = i - u.offset
        if 0 <= k < len(u.entries):
            # An entry still in the unstable tail is in the log with this term
            # (etcd's raftLog.term asks the tail first too). Not always the same
            # answer as the checks below: a written prefix stays in the tail when
            # a conflicting append replaced the Ready's last entry (stable_to
            # trims nothing), and a compaction may pass it; there the checks
            # raised CompactedError. Callers then slice (which raises), ask at
            # or above the commit index, or (find_conflict_by_term) get a lower
            # hint, whose probe the follower answers with its commit index.
            return u.entries[k].term
        # Below: i is not in the tail. first_index / last_index / maybe_term read
        # inline, same order and answers (a leader asks this for every append it
        # builds, where the entry before it is long stable): outside the tail,
        # maybe_term answers only for the pending snapshot's own index.
        snap = u.snapshot
        if snap is None:
            if i < self.storage.first_index() - 1:
                raise CompactedError(i)
            if i > (u.offset + len(u.entries) - 1 if u.entries else self.storage.last_index()):
                return 0
        else:
            meta = snap.meta
            if i < meta.index:
                raise CompactedError(i)
            if i > (u.offset + len(u.entries) - 1 if u.entries else meta.index):
                return 0
            if i < u.offset and i == meta.index:
                return meta.term
        try:
            return self.storage.term(i)
        except UnavailableError:
            return 0

    def term_or_zero(self, i: int) -> int:
        try:
            return self.term(i)
        except CompactedError:
            return 0

    def last_term(self) -> int:
        return self.term(self.last_index())

    def match_term(self, i: int, t: int) -> bool:
        try:
            return self.term(i) == t
        except CompactedError:
            return False

    def is_up_to_date(self, lasti: int, term: int) -> bool:
        """Raft §5.4.1: the candidate's log is at least as up-to-date as ours."""
        lt = self.last_term()
        return term > lt or (term == lt and lasti >= self.last_index())

    # -- append / conflict -------------------------------------------------
    def find_conflict(self, ents: list[Entry]) -> int:
        """Index of the first entry whose term differs (or is new); 0 if none."""
        for e in ents:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """Largest i <= index with term(i) <= term: a fast-backtracking hint."""
        while index > 0:
            try:
                t = self.term(index)
            except CompactedError:
                return index, 0
            if t <= term:
                return index, t
            index -= 1
        return 0, 0

    def maybe_append(
        self, index: int, log_term: int, commit: int, ents: list[Entry]
    ) -> int | None:
        """Follower side of AppendEntries; returns the last new index or None.

        Raft §5.3: truncate only from the first conflicting entry; entries
        that match are kept, so a stale or duplicated APP never erases
        entries a newer APP already delivered.
        """
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(ents)
        ci = self.find_conflict(ents)
        if ci:
            invariant(ci > self.committed, "log: conflict at committed entry", conflict=ci,
                      committed=self.committed)
            self.append(ents[ci - ents[0].index :])
        self.commit_to(min(commit, last_new))
        return last_new

    def append(self, ents: list[Entry]) -> int:
        if not ents:
            return self.last_index()
        if ents[0].index - 1 < self.committed:  # hot path: numbers built only on failure
            invariant(False, "log: append below commit", after=ents[0].index - 1,
                      committed=self.committed)
        self.unstable.truncate_and_append(ents)
        return self.last_index()

    # -- reads ---------------------------------------------------------------
    def slice(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi); raises CompactedError if lo is compacted."""
        if lo >= hi:
            return []
        last = self.last_index()
        if hi > last + 1:
            invariant(False, "log: slice past end", hi=hi, last=last)
        if lo < self.first_index():
            raise CompactedError(lo)
        out: list[Entry] = []
        off = self.unstable.offset
        if lo < off:
            out = self.storage.entries(lo, min(hi, off), max_bytes)
            if len(out) < min(hi, off) - lo:
                return out  # size limit reached inside storage
        if hi > off:
            out = out + self.unstable.slice(max(lo, off), hi)
        return limit_size(out, max_bytes)

    def has_pending_snapshot(self) -> bool:
        return self.unstable.snapshot is not None

    def next_committed_ents(self, max_bytes: int | None = None) -> list[Entry]:
        if self.has_pending_snapshot():
            return []
        lo = max(self.applied + 1, self.first_index())
        hi = self.committed + 1
        return self.slice(lo, hi, max_bytes) if lo < hi else []

    def has_next_committed_ents(self) -> bool:
        if self.has_pending_snapshot():
            return False
        return self.committed + 1 > max(self.applied + 1, self.first_index())

    # -- commit / apply ------------------------------------------------------
    def commit_to(self, c: int) -> None:
        if c > self.committed:
            last = self.last_index()
            if c > last:
                invariant(False, "log: commit past last index", commit=c, last=last)
            self.committed = c

    def maybe_commit(self, max_index: int, term: int) -> bool:
        """Raft §5.4.2: only entries of the current term commit by counting."""
        if max_index > self.committed and self.term_or_zero(max_index) == term:
            self.commit_to(max_index)
            return True
        return False

    def applied_to(self, i: int) -> None:
        if i == 0:
            return
        if not self.applied <= i <= self.committed:
            invariant(False, "log: applied out of range", applied=i, prev=self.applied,
                      committed=self.committed)
        self.applied = i

    def restore(self, snap: Snapshot) -> None:
        self.committed = snap.meta.index
        self.unstable.restore(snap)

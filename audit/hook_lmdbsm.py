"""Store = replay for `python -m raft.node`'s LMDB append-log state machine.

raft.node's `LmdbSM` (raft/node.py) keeps, per group, every applied entry
under key `b"e" + index (8 bytes, big-endian)` and the applied index under
`b"m:applied"`, in the named database `<group>` of the node's one LMDB
environment `<data dir>/sm`. Replaying the committed log
must give exactly that store: every normal, non-empty committed entry up to
`applied` is there with the same bytes (no-ops and membership entries are not
applied), and the store holds nothing else in the replayed range. The
environment is opened read-only and without the lock file, so a copied
directory is never changed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from audit.hooks import CommittedEntry
from audit.model import STORE_MISMATCH, VIOLATION, Finding

_ENTRY = b"e"
_APPLIED = b"m:applied"


_MAX_DBS = 100_000  # read-only opens of every group's named database


def _env_path(data_dir: str) -> str:
    return os.path.join(data_dir, "sm")


def _open_group(path: str, group: str):  # -> (env, db) or None
    import lmdb

    env = lmdb.open(path, readonly=True, lock=False, subdir=True, max_dbs=_MAX_DBS)
    try:
        return env, env.open_db(group.encode(), create=False)
    except lmdb.NotFoundError:
        env.close()
        return None


class LmdbAppendLogHook:
    name = "raft.node LmdbSM"

    def wants(self, group: str, data_dirs: dict[str, str]) -> bool:
        return any(os.path.exists(os.path.join(_env_path(d), "data.mdb"))
                   for d in data_dirs.values())

    def replay(self, group: str, entries: Iterable[CommittedEntry],
               data_dirs: dict[str, str]) -> Iterator[Finding]:
        stores = {}
        try:
            for node, d in sorted(data_dirs.items()):
                path = _env_path(d)
                opened = None
                if os.path.exists(os.path.join(path, "data.mdb")):
                    opened = _open_group(path, group)
                if opened is not None:
                    stores[node] = _Store(node, group, *opened)
            for e in entries:
                # Leader no-ops and membership changes are never applied.
                applied = e.entry_type == 0 and bool(e.payload)
                for s in stores.values():
                    yield from s.check(e, applied)
            for s in stores.values():
                yield from s.rest()
        finally:
            for s in stores.values():
                s.close()


class _Store:
    """One node's store, walked with a cursor in step with the replayed entries."""

    def __init__(self, node: str, group: str, env, db) -> None:
        self.node, self.group, self.env = node, group, env
        self.txn = env.begin(db=db)
        raw = self.txn.get(_APPLIED)
        self.applied = int.from_bytes(raw, "big") if raw else 0
        self.cursor = self.txn.cursor()
        self.at = self._first()
        self.last: int | None = None  # the last replayed index

    def _first(self) -> tuple[int, bytes] | None:
        if not self.cursor.set_range(_ENTRY):
            return None
        return self._current()

    def _current(self) -> tuple[int, bytes] | None:
        k = self.cursor.key()
        if not k.startswith(_ENTRY):
            return None
        return int.from_bytes(k[1:], "big"), bytes(self.cursor.value())

    def _advance(self) -> None:
        self.at = self._current() if self.cursor.next() else None

    def _finding(self, index: int, term: int | None, what: str) -> Finding:
        return Finding(STORE_MISMATCH, VIOLATION, what, node=self.node, group=self.group,
                       index=index, term=term)

    def check(self, e: CommittedEntry, applied: bool) -> Iterator[Finding]:
        """`applied`: the state machine stores this entry (a normal, non-empty one)."""
        contiguous = self.last is not None and e.index == self.last + 1
        while self.at is not None and self.at[0] < e.index:
            if contiguous:  # else: before the replay or in a range no log let us read
                yield self._extra()
            self._advance()
        self.last = e.index
        if e.index > self.applied:
            return
        here = self.at is not None and self.at[0] == e.index
        if not applied:
            if here:
                yield self._extra()
                self._advance()
            return
        if not here:
            yield self._finding(e.index, e.term, "a committed entry is missing from the store")
            return
        if self.at[1] != e.payload:
            yield self._finding(e.index, e.term, "the store's copy differs from the committed "
                                "entry")
        self._advance()

    def _extra(self) -> Finding:
        return self._finding(self.at[0], None, "the store holds an entry the committed log "
                             "does not")

    def rest(self) -> Iterator[Finding]:
        while self.at is not None and self.at[0] <= self.applied:
            yield self._extra()
            self._advance()

    def close(self) -> None:
        self.txn.abort()
        self.env.close()

"""Reading a JetStream node's LMDB store from the audit (read-only, copies never changed).

A node's JetStream data directory is its `store_dir`: `raft/wal`, `raft/snap`, `lmdb/`
(docs/jetstream.md). The audit is given that directory, or a directory holding it a few
levels down (a copied tree). One LMDB environment per node; every key of a store starts
with the store's prefix (u16 name length | name): a stream group's store is named after
its group (`js.<stream>.<created_ns>`), the catalogue is the store `$js.meta`.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Iterator
from typing import Any

from audit.model import NOTE, STORE_UNCHECKED, Finding

DB_NAMES = ("js_msgs", "js_subj", "js_subjcount", "js_meta", "js_consumers", "js_ttl",
            "js_dedup", "js_dedup_ts")
META_STORE = "$js.meta"
_U64 = struct.Struct("<Q")
_SEARCH_DEPTH = 3
# Every group of a fresh log starts from a snapshot at index 1 holding only its
# configuration: the empty state (raft/multigroup.py `add_group`). A log whose first entry
# is BOOTSTRAP + 1 is complete.
BOOTSTRAP = 1


def find_lmdb(data_dir: str) -> str | None:
    """The JetStream LMDB directory (`.../lmdb` with a data.mdb next to a `raft` dir)."""
    for root, dirs, files in os.walk(data_dir):
        depth = os.path.relpath(root, data_dir).count(os.sep) + (root != data_dir)
        if os.path.basename(root) == "lmdb" and "data.mdb" in files:
            return root
        dirs[:] = [d for d in dirs if depth < _SEARCH_DEPTH and d not in ("wal", "archive")]
    return None


def prefix(store: str) -> bytes:
    raw = store.encode()
    return len(raw).to_bytes(2, "big") + raw


def _short(key: bytes) -> bytes:
    """A key without its store prefix."""
    return key[2 + int.from_bytes(key[:2], "big"):]


class NodeStore:
    """One node's environment, opened read-only without the lock file. `crypt` (a read-only
    node/jetstream/crypt.py StoreCrypt): the store is encrypted at rest, and every sealed
    value is opened here, so the hooks compare plaintext (a value that does not open reads
    as keyring.UNOPENED + its bytes, and so differs from any replay)."""

    def __init__(self, path: str, crypt: Any = None) -> None:
        import lmdb

        self.crypt = crypt
        self.env = lmdb.open(path, readonly=True, lock=False, max_dbs=16, subdir=True)
        self.dbs: dict[str, Any] = {}
        for name in DB_NAMES:
            try:
                self.dbs[name] = self.env.open_db(name.encode(), create=False)
            except lmdb.NotFoundError:
                pass  # a node that never stored such a key
        self.txn = self.env.begin()

    def get(self, db: str, key: bytes) -> bytes | None:
        if db not in self.dbs:
            return None
        raw = self.txn.get(key, db=self.dbs[db])
        return None if raw is None else self._plain(db, key, bytes(raw))

    def _plain(self, db: str, key: bytes, raw: bytes) -> bytes:
        """The value as the node wrote it before sealing (node/jetstream/store/lmdbstore.py:
        the values of js_msgs, js_consumers and the non-counter js_meta keys are sealed; a
        js_subjcount value is a count and the sealed subject)."""
        if self.crypt is None:
            return raw
        from audit.keyring import UNOPENED
        from node.jetstream.store.lmdbstore import SEALED_DBS

        aad = db.encode() + b"\x00" + key
        try:
            if db in SEALED_DBS or (db == "js_meta" and not _short(key).startswith(b"\x00")):
                return self.crypt.lmdb.open(raw, aad)
            if db == "js_subjcount":
                return raw[:8] + self.crypt.lmdb.open(raw[8:], aad)
        except ValueError:  # crypt.SealError
            return UNOPENED + raw
        return raw

    def meta(self, store: str, key: str) -> bytes | None:
        return self.get("js_meta", prefix(store) + key.encode())

    def applied(self, store: str) -> int:
        raw = self.meta(store, "applied")
        return _U64.unpack(raw)[0] if raw else 0

    def catalogue(self) -> dict[str, Any]:
        """Stream name -> assignment, from either catalogue layout (audit/hook_jsmeta.py)."""
        raw = self.meta(META_STORE, "catalogue")
        if raw is not None:
            return dict(json.loads(raw).get("streams", {}))
        raw = self.meta(META_STORE, "streams")
        return json.loads(raw) if raw else {}

    def items(self, db: str, store: str) -> Iterator[tuple[bytes, bytes]]:
        """(key without the prefix, value) of one store in one database, in key order."""
        if db not in self.dbs:
            return
        head = prefix(store)
        cur = self.txn.cursor(db=self.dbs[db])
        if not cur.set_range(head):
            return
        for key, value in cur:
            if not key.startswith(head):
                return
            yield bytes(key[len(head):]), self._plain(db, bytes(key), bytes(value))

    def close(self) -> None:
        self.txn.abort()
        self.env.close()


def open_nodes(data_dirs: dict[str, str], keyring: Any = None) -> dict[str, NodeStore]:
    """`keyring` (audit/keyring.py): opens the values of the nodes encrypted at rest."""
    out: dict[str, NodeStore] = {}
    for node, d in sorted(data_dirs.items()):
        path = find_lmdb(d)
        if path is not None:
            out[node] = NodeStore(path, keyring.crypt(node) if keyring is not None else None)
    return out


def diff_items(mine: Iterator[tuple[bytes, bytes]], theirs: Iterator[tuple[bytes, bytes]]
               ) -> Iterator[tuple[bytes, bytes | None, bytes | None]]:
    """Merge two key-ordered streams: (key, node value, replay value) where they differ
    (None = absent on that side)."""
    a, b = next(mine, None), next(theirs, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a[0] < b[0]):
            yield a[0], a[1], None
            a = next(mine, None)
        elif a is None or b[0] < a[0]:
            yield b[0], None, b[1]
            b = next(theirs, None)
        else:
            if a[1] != b[1]:
                yield a[0], a[1], b[1]
            a, b = next(mine, None), next(theirs, None)


def beyond_replay(what: str, group: str, applied: dict[str, int], checkpoints: Iterable[int],
                  last: int) -> Iterator[Finding]:
    """A note for each node whose `what` applied past the last committed entry the audit
    could replay (its store cannot be checked there)."""
    for index in checkpoints:
        for node in sorted(n for n, a in applied.items() if a == index):
            yield Finding(STORE_UNCHECKED, NOTE, f"the {what} applied up to {index}, beyond "
                          f"the committed entries the audit could replay (to {last})",
                          node=node, group=group, index=last + 1, index_hi=index)

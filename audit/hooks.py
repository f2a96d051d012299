"""Per-group replay hooks: checks that replay one group's committed log in Spark.

The JetStream checks live here: "store = replay" (audit/hook_jsstream.py:
replay a stream group's committed entries through the node's pure JetStream
functions and compare with each node's LMDB store) and "meta group"
(audit/hook_jsmeta.py: replay `$js` and compare with what each node believes).
A hook says which groups it wants; the job hands it, inside one Spark task
per group, the group's committed entries in index order with their payloads
read back from the segments (one at a time: bounded memory), and the data
directories, and collects its findings.
A third checks `python -m raft.node`'s LMDB append-log state machine
(audit/hook_lmdbsm.py).
A group no hook wants costs nothing (the stage is skipped).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby
from typing import Any, Protocol

from audit.model import Finding


@dataclass(frozen=True)
class CommittedEntry:
    index: int
    term: int
    entry_type: int
    payload: bytes


class ReplayHook(Protocol):
    """`wants` and `replay` run in the executors. A hook may also have `prepare_from` (a
    group name) and `prepare(entries)`: the driver hands it that group's committed entries
    before the replay stage (the stream hook takes each stream's created config from the
    meta group this way)."""

    name: str

    def wants(self, group: str, data_dirs: dict[str, str]) -> bool: ...

    def replay(self, group: str, entries: Iterable[CommittedEntry],
               data_dirs: dict[str, str]) -> Iterator[Finding]: ...


def default_hooks(keyring: Any = None) -> list[ReplayHook]:
    """Every registered hook, the first that wants a group replays it: JetStream's stream
    groups (`js.*`), consumer groups (`jc.*`) and meta group (`$js`), then raft.node's
    LMDB append log. `keyring` (audit/keyring.py) opens the LMDB values of stores
    encrypted at rest."""
    from audit.hook_jsconsumer import JetStreamConsumerHook
    from audit.hook_jsmeta import JetStreamMetaHook
    from audit.hook_jsstream import JetStreamStreamHook
    from audit.hook_lmdbsm import LmdbAppendLogHook

    return [JetStreamStreamHook(keyring), JetStreamConsumerHook(keyring),
            JetStreamMetaHook(keyring), LmdbAppendLogHook()]


def header_len_at(head: bytes) -> int:
    """Bytes of the whole record starting at head[0] (fields as in raft/wal.py)."""
    from raft.wal import FIXED_HEADER

    glen = head[3]
    plen = int.from_bytes(head[21 + glen : 25 + glen], "little")
    return FIXED_HEADER + glen + plen


class PayloadReader:
    """Reads ENTRY records back by (segment path, offset), CRC checked; keeps fds open. With
    a keyring, an encrypted node's payload is opened; one that does not open reads as
    `keyring.UNOPENED` + its bytes (the read stage reported it; the replay then differs)."""

    def __init__(self, keyring: Any = None) -> None:
        self._fds: dict[str, int] = {}
        self._keyring = keyring

    def read_of(self, node: str, path: str, off: int) -> tuple[int, bytes]:
        etype, payload, rec = self._record(path, off)
        crypt = self._keyring.crypt(node) if self._keyring is not None else None
        if crypt is None:
            return etype, payload
        from audit.keyring import UNOPENED
        from raft.storage import payload_aad

        try:
            return etype, crypt.wal.open(payload, payload_aad(
                rec.group.encode("ascii"), rec.index, rec.term, rec.entry_type))
        except ValueError:
            return etype, UNOPENED + payload

    def read(self, path: str, off: int) -> tuple[int, bytes]:
        etype, payload, _ = self._record(path, off)
        return etype, payload

    def _record(self, path: str, off: int) -> tuple[int, bytes, Any]:
        from raft.wal import Scanner

        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        head = os.pread(fd, 512, off)
        need = header_len_at(head)
        buf = head[:need] if len(head) >= need else os.pread(fd, need, off)
        rec = next(iter(Scanner(buf)), None)
        if rec is None:
            raise ValueError(f"{path}: no valid record at {off}")
        return rec.entry_type, rec.payload, rec

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def read_entries(rows: Iterable[Any], paths: dict[tuple[str, int], str], keyring: Any = None
                 ) -> Iterator[CommittedEntry]:
    """Rows (grp, idx, node, term, etype, seg, off) -> entries with their payloads."""
    reader = PayloadReader(keyring)
    try:
        for r in rows:
            yield CommittedEntry(r.idx, r.term,
                                 *reader.read_of(r.node, paths[(r.node, r.seg)], r.off))
    finally:
        reader.close()


def run_hooks(rows: Iterable[Any], hooks: list[ReplayHook], data_dirs: dict[str, str],
              paths: dict[tuple[str, int], str], keyring: Any = None) -> Iterator[str]:
    """Spark task: rows (grp, idx, node, term, etype, seg, off) sorted by group and
    index, one per committed index; yields findings as JSON text."""
    reader = PayloadReader(keyring)
    try:
        for grp, group_rows in groupby(rows, key=lambda r: r.grp):
            hook = next((h for h in hooks if h.wants(grp, data_dirs)), None)
            if hook is None:
                continue
            entries = (CommittedEntry(r.idx, r.term,
                                      *reader.read_of(r.node, paths[(r.node, r.seg)], r.off))
                       for r in group_rows)
            for f in hook.replay(grp, entries, data_dirs):
                yield json.dumps(f.to_json())
    finally:
        reader.close()

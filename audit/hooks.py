"""Per-group replay hooks: checks that replay one group's committed log in Spark.

The JetStream checks slot in here: "store = replay" (replay a stream group's
committed entries through the node's pure JetStream functions and compare
with each node's LMDB store) and "meta group" (replay `$meta` and compare
with what each node believes). A hook says which groups it wants; the job
hands it, inside one Spark task per group, the group's committed entries in
index order with their payloads read back from the segments (one at a time:
bounded memory), and the data directories, and collects its findings.
No hooks are registered until JetStream exists; the job skips the stage then.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from audit.model import Finding


@dataclass(frozen=True)
class CommittedEntry:
    index: int
    term: int
    entry_type: int
    payload: bytes


class ReplayHook(Protocol):
    name: str

    def wants(self, group: str) -> bool: ...

    def replay(self, group: str, entries: Iterable[CommittedEntry],
               data_dirs: dict[str, str]) -> Iterator[Finding]: ...


HOOKS: list[ReplayHook] = []  # JetStream registers its stream and meta hooks here


def header_len_at(head: bytes) -> int:
    """Bytes of the whole record starting at head[0] (fields as in raft/wal.py)."""
    from raft.wal import FIXED_HEADER

    glen = head[3]
    plen = int.from_bytes(head[21 + glen : 25 + glen], "little")
    return FIXED_HEADER + glen + plen


def read_payload(path: str, off: int) -> tuple[int, bytes]:
    """(entry_type, payload) of the ENTRY record at `off` of a segment file."""
    from raft.wal import Scanner

    fd = os.open(path, os.O_RDONLY)
    try:
        head = os.pread(fd, 512, off)
        need = header_len_at(head)
        buf = head if len(head) >= need else os.pread(fd, need, off)
    finally:
        os.close(fd)
    rec = next(iter(Scanner(buf)), None)
    if rec is None:
        raise ValueError(f"{path}: no valid record at {off}")
    return rec.entry_type, rec.payload

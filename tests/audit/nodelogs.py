"""WALs written by the node's own storage (raft.storage.NodeLog, real fsync) with
small segments, so compaction deletes segments; `archive=True` keeps each
segment in `<wal>/archive/` as the audit retention mode does (a hard link made
when the segment appears survives its deletion; live ones are unlinked from
the archive at the end, as if moved there on compaction)."""

from __future__ import annotations

import os
from pathlib import Path

from raft.storage import NodeLog
from raft.types import Entry, HardState


def _link_new(wal: Path) -> None:
    arch = wal / "archive"
    arch.mkdir(exist_ok=True)
    for seg in wal.glob("wal-*.log"):
        if not (arch / seg.name).exists():
            os.link(seg, arch / seg.name)


def write_log(wal: Path, n: int = 400, groups: tuple[str, ...] = ("g0", "g1"),
              archive: bool = True) -> None:
    log = NodeLog(str(wal), segment_bytes=2048)
    try:
        for i in range(1, n + 1):
            for g in groups:
                log.append(g, [Entry(1, i, data=f"{g}-{i}".encode())])
                log.set_hard_state(g, HardState(1, 1, i))
            log.sync()
            if archive:
                _link_new(wal)
            if i % 50 == 0:
                for g in groups:
                    log.compact(g, i - 10)
    finally:
        log.close()
    if archive:
        for seg in wal.glob("wal-*.log"):
            os.unlink(wal / "archive" / seg.name)

"""Read the snapshot meta files (`snap/<hex group>.meta`) without touching them.

`raft.snapfile.load` tidies the directory as it reads (it deletes leftover
files): the audit may run on a live node's directory, so it parses the same
format read-only, with the pure `raft.snapfile.parse_head`, and checks the
meta file's own CRC. The data file is not read: what matters here is the
(index, term) the node claims its snapshot covers.
"""

from __future__ import annotations

import os
import struct
import zlib

from audit.model import SNAPSHOT_META_BAD, VIOLATION, Finding
from raft.snapfile import SnapshotFileError, parse_head

_CRC = struct.Struct("<I")


def read_metas(node: str, snap_dir: str | None) -> tuple[list[tuple[str, int, int]],
                                                         list[Finding]]:
    """[(group, index, term)] of every committed snapshot, and unreadable metas."""
    if snap_dir is None:
        return [], []
    metas, bad = [], []
    for name in sorted(os.listdir(snap_dir)):
        if not name.endswith(".meta"):
            continue
        try:
            group = bytes.fromhex(name[: -len(".meta")]).decode("ascii")
            with open(os.path.join(snap_dir, name), "rb") as f:
                buf = f.read()
            body = buf[: -_CRC.size]
            if len(buf) < _CRC.size or zlib.crc32(body) != _CRC.unpack_from(buf, len(body))[0]:
                raise SnapshotFileError("checksum mismatch")
            head = parse_head(buf)
            if head is None:
                raise SnapshotFileError("short meta")
        except (ValueError, OSError, SnapshotFileError) as e:
            bad.append(Finding(SNAPSHOT_META_BAD, VIOLATION, f"snapshot meta {name}: {e}",
                               node=node))
            continue
        meta = head[0]
        metas.append((group, meta.index, meta.term))
    return metas, bad

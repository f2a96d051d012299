"""`jetraft serve` whose Raft WAL fsyncs wait while a gate file exists (tests only).

    python tests/integration/fsync_gate_node.py serve ...   (JETRAFT_FSYNC_GATE=<path>)

While `<path>` exists, every WAL `fdatasync` (raft/disk.py `OsDisk.fdatasync`, the WAL's
only sync) first creates `<path>.held`, then waits until the test removes `<path>`. LMDB
syncs in C and is not held. Lets a test hold a publish between its WAL write and the
end of its fsync, from outside the node process."""

from __future__ import annotations

import os
import sys
import time

from raft import disk

GATE = os.environ["JETRAFT_FSYNC_GATE"]
_fdatasync = disk.OsDisk.fdatasync


def _held_fdatasync(self: disk.OsDisk, fd: int) -> None:
    if os.path.exists(GATE):
        with open(GATE + ".held", "w"):
            pass
        while os.path.exists(GATE):
            time.sleep(0.005)
    _fdatasync(self, fd)


disk.OsDisk.fdatasync = _held_fdatasync  # type: ignore[method-assign]

if __name__ == "__main__":
    from node import cli

    sys.argv = ["jetraft", *sys.argv[1:]]
    cli.main()

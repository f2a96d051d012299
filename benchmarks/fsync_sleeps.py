"""How many times a thread sleeps in one WAL-style write+sync, by the way the file is kept.

    python benchmarks/fsync_sleeps.py [DIR] [--n 500] [--rounds 3] [--size 322]

Appends `--size` bytes (an R1 publish's WAL record is ~322 B) and syncs, `--n` times, in
three modes, interleaved over `--rounds`:
  append            the WAL today: pwrite past the end of the file, fsync
  append-fdatasync  the same with fdatasync (the file size still changes: journal commit)
  prezero-fdatasync pwrite into a region written with zeros and synced beforehand, fdatasync
Prints per op: wall time, voluntary and involuntary context switches of the calling thread
(getrusage RUSAGE_THREAD) and its system CPU. On ext4 a size-changing sync waits for the
journal commit (about 3 sleeps per op), a sync that changes no metadata does not (about 2).
Each sleep is a wake-up, and on a loaded machine each wake-up of a CPU-heavy process waits
in the run queue (r1lat: ~0.7-1.5 ms per wake-up of a jetraft node at load 20): the count,
not the wall time, is the figure to compare. DIR must be on the disk under test (default:
a temporary directory in $TMPDIR).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

MODES = ("append", "append-fdatasync", "prezero-fdatasync")


def one(path: str, mode: str, n: int, size: int) -> tuple[float, float, float, float]:
    if os.path.exists(path):
        os.unlink(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if mode.startswith("prezero"):
            os.pwrite(fd, b"\0" * (n * size + 4096), 0)
            os.fsync(fd)
        sync = os.fdatasync if mode.endswith("fdatasync") else os.fsync
        rec = b"x" * size
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        t0 = time.perf_counter()
        for i in range(n):
            os.pwrite(fd, rec, i * size)
            sync(fd)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
    finally:
        os.close(fd)
    return (wall / n * 1e6, (r1.ru_nvcsw - r0.ru_nvcsw) / n, (r1.ru_nivcsw - r0.ru_nivcsw) / n,
            (r1.ru_stime - r0.ru_stime) / n * 1e6)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", default=None)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=322)
    args = ap.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="fsync-sleeps-")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "wal-test.log")
    print(f"load {os.getloadavg()[0]:.1f}, dir {d}")
    print("| mode | wall us/op | voluntary switches/op | involuntary/op | sys us/op |")
    print("|---|---|---|---|---|")
    try:
        for _ in range(args.rounds):
            for mode in MODES:
                wall, vol, invol, sys_us = one(path, mode, args.n, args.size)
                print(f"| {mode} | {wall:.0f} | {vol:.2f} | {invol:.2f} | {sys_us:.0f} |")
    finally:
        if os.path.exists(path):
            os.unlink(path)
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

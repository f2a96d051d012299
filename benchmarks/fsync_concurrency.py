"""Does one disk serialise concurrent fsyncs? p10/p50/p90 of one fsync with 1
writer and with 3 writers starting each round together (threads, each on its
own file), two ways: append + fsync (a size change: the floor's way in
raft_bench) and pwrite into a zero-filled file + fdatasync (the WAL's way).

    python benchmarks/fsync_concurrency.py [DIR]     # default: the temp dir

On the shared machine, run it beside the A/B it explains; docs/notes/w3.md.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time


def latencies(dir: str, writers: int, mode: str, seconds: float = 1.0,
              size: int = 128) -> list[float]:
    """Seconds of each write+fsync, sorted: `writers` threads, one file each, every
    round started together. `append` (a size change) or `prealloc` (pwrite into zeros
    + fdatasync)."""
    stop = time.perf_counter() + seconds
    over = [False]  # decided once per round: every writer leaves the same round
    bar = threading.Barrier(writers, action=lambda: over.__setitem__(
        0, time.perf_counter() > stop))
    lat: list[float] = []

    def one(k: int) -> None:
        path = os.path.join(dir, f".fsync-{os.getpid()}-{k}")
        flags = os.O_RDWR | os.O_CREAT | (os.O_APPEND if mode == "append" else 0)
        fd = os.open(path, flags, 0o600)
        off = 0
        try:
            if mode == "prealloc":
                os.pwrite(fd, b"\0" * (4 << 20), 0)
                os.fsync(fd)
            while True:
                bar.wait()
                if over[0]:
                    return
                t = time.perf_counter()
                if mode == "append":
                    os.write(fd, b"x" * size)
                    os.fsync(fd)
                else:
                    os.pwrite(fd, b"x" * size, off)
                    off += size
                    os.fdatasync(fd)
                lat.append(time.perf_counter() - t)  # list.append is atomic
        finally:
            os.close(fd)
            os.unlink(path)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(lat)


def run(dir: str, writers: int, mode: str, seconds: float = 1.0) -> str:
    lat = latencies(dir, writers, mode, seconds)
    n = len(lat)
    return (f"p10 {1e6 * lat[n // 10]:.0f} p50 {1e6 * lat[n // 2]:.0f} "
            f"p90 {1e6 * lat[9 * n // 10]:.0f} us, n={n}")


def main() -> None:
    dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
    for _ in range(2):
        for mode in ("append", "prealloc"):
            for writers in (1, 3, 1):
                print(f"{mode:8} writers={writers}: {run(dir, writers, mode)}  "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()

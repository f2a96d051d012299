"""The power-loss disk itself: what survives a cut, and that LMDB's I/O goes through it."""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable

import lmdb
import pytest

from tests.durability.disk import PowerDisk


def _fsync_dir(path: object) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: object, data: bytes, *, sync: bool, mode: str = "wb") -> None:
    with open(path, mode) as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def test_only_fsynced_data_and_directory_entries_survive(
        power_disk: Callable[..., PowerDisk]) -> None:
    disk = power_disk()
    m = disk.path
    _write(m / "kept", b"hello", sync=True)
    _fsync_dir(m)
    _write(m / "kept", b" world", sync=False, mode="ab")        # appended, not synced
    os.mkdir(m / "d")
    _fsync_dir(m)
    _write(m / "renamed", b"r", sync=True)
    _fsync_dir(m)
    os.rename(m / "renamed", m / "moved")                        # the rename not synced
    _write(m / "d" / "mapped", b"\0" * 8192, sync=True)
    _fsync_dir(m / "d")
    _write(m / "d" / "orphan", b"synced data", sync=True)       # its entry never synced
    fd = os.open(m / "d" / "mapped", os.O_RDWR)
    with mmap.mmap(fd, 8192) as mp:  # writes through a shared mapping: msync = fsync
        mp[0:5] = b"MMAP!"
        mp.flush()
        mp[4096:4100] = b"LOST"
    os.close(fd)
    assert (m / "kept").read_bytes() == b"hello world"           # the live view has it all

    stats = disk.cut()
    disk.mount()
    assert sorted(os.listdir(m)) == ["d", "kept", "renamed"]
    assert (m / "kept").read_bytes() == b"hello"
    assert sorted(os.listdir(m / "d")) == ["mapped"]
    data = (m / "d" / "mapped").read_bytes()
    assert data[:5] == b"MMAP!" and data[4096:4100] == b"\0\0\0\0"
    assert stats["mapped"]["fsyncs"] >= 2 and stats["mapped"]["dropped_pages"] >= 1
    assert stats["kept"]["dropped_bytes"] == 6


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "nosync"])
def test_lmdb_commits_go_through_the_layer(power_disk: Callable[..., PowerDisk],
                                           sync: bool) -> None:
    """py-lmdb as the node opens it (writemap off: pwrite + fdatasync, reads by mmap): a
    synced commit survives the cut; with MDB_NOSYNC the commit is gone."""
    disk = power_disk()
    path = disk.path / "env"
    os.mkdir(path)
    _fsync_dir(disk.path)
    env = lmdb.open(str(path), map_size=1 << 30, sync=sync, metasync=False)
    _fsync_dir(path)
    with env.begin(write=True) as txn:
        txn.put(b"first", b"1")
    with env.begin(write=True) as txn:  # NOMETASYNC: this commit syncs the first one's meta
        txn.put(b"second", b"2")
    with env.begin() as txn:  # read back through the mapping
        assert txn.get(b"first") == b"1"
    env.close()
    stats = disk.cut()
    assert stats["data.mdb"]["writes"] >= 2
    assert (stats["data.mdb"]["fsyncs"] >= 2) == sync
    disk.mount()
    env = lmdb.open(str(path), map_size=1 << 30)
    try:
        with env.begin() as txn:
            assert (txn.get(b"first") == b"1") == sync
    finally:
        env.close()

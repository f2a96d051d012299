"""raft/snapfile.py on real files: the staged install (stage, promote, load(log_index))."""

from __future__ import annotations

import os
import zlib

import pytest

from raft import snapfile
from raft.types import ConfState, SnapshotMeta

CS = ConfState((1, 2, 3), ())


def sealed_part(dir: str, group: str, data: bytes) -> tuple[str, int, int]:
    part = snapfile.new_part(dir, group)
    with open(part, "wb") as f:
        f.write(data)
    size, crc = snapfile.seal(part)
    assert (size, crc) == (len(data), zlib.crc32(data))
    return part, size, crc


def test_load_of_a_group_without_snapshot_dir_is_none(tmp_path):
    assert snapfile.load(str(tmp_path / "never-created"), "g", log_index=5) is None


def test_staged_snapshot_is_promoted_only_if_the_log_describes_it(tmp_path):
    d = str(tmp_path)
    part, size, crc = sealed_part(d, "g", b"old")
    snapfile.commit(d, "g", SnapshotMeta(10, 1, CS), part, size, crc)
    part, size, crc = sealed_part(d, "g", b"new image")
    staged = snapfile.stage(d, "g", SnapshotMeta(50, 2, CS), part, size, crc)
    assert os.path.exists(staged.path) and not os.path.exists(part)
    # nothing switched yet; and a pending snapshot cannot be judged without the log
    with pytest.raises(snapfile.SnapshotFileError, match="log_index"):
        snapfile.load(d, "g")
    # crash before the WAL record was durable: the log still says 10
    kept = snapfile.load(d, "g", log_index=10)
    assert kept.meta.index == 10 and open(kept.path, "rb").read() == b"old"
    assert not os.path.exists(staged.path)
    assert sorted(n.rsplit(".", 1)[1] for n in os.listdir(d)) == ["data", "meta"]
    # again, and this time the log says 50: the staged one wins, the old data goes
    part, size, crc = sealed_part(d, "g", b"new image")
    staged = snapfile.stage(d, "g", SnapshotMeta(50, 2, CS), part, size, crc)
    got = snapfile.load(d, "g", log_index=50)
    assert got.meta == SnapshotMeta(50, 2, CS) and got.path == staged.path
    assert open(got.path, "rb").read() == b"new image"
    assert sorted(n.rsplit(".", 1)[1] for n in os.listdir(d)) == ["data", "meta"]


def test_promote_switches_and_removes_older_data(tmp_path):
    d = str(tmp_path)
    part, size, crc = sealed_part(d, "g", b"one")
    first = snapfile.commit(d, "g", SnapshotMeta(5, 1, CS), part, size, crc)
    part, size, crc = sealed_part(d, "g", b"two")
    second = snapfile.stage(d, "g", SnapshotMeta(9, 1, CS), part, size, crc)
    assert os.path.exists(first.path)  # staging switches nothing
    snapfile.promote(d, "g")
    assert not os.path.exists(first.path)
    assert snapfile.load(d, "g", log_index=9) == second

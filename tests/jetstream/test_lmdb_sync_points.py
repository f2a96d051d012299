"""LMDB commits are not fsynced; the store is durable at sync points (NodeEnv docstring).

A power loss keeps on disk everything synced and an arbitrary subset of the 4 KiB pages
written since. These tests build such disk images page by page from two real files (the file
at the sync point, the file after more commits), including the worst ones (newer meta pages
over missing data pages), open them and require exactly the sync point's state. The
compaction test shows the rule the WAL relies on: an index named by `snapshot_to` survives a
crash, because the snapshot synced before naming it.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import pytest

from node.jetstream import config as stream_config
from node.jetstream import ops
from node.jetstream.machines import StoreLostError, StreamMachine
from node.jetstream.store.base import StoredMsg
from node.jetstream.store.lmdbstore import SYNCED_META, LmdbStore, NodeEnv

PAGE = 4096


def _msg(seq: int, subject: str, data: bytes) -> StoredMsg:
    return StoredMsg(seq=seq, subject=subject, hdr=b"", data=data, ts_ns=seq)


def _state(store: LmdbStore) -> tuple[list[tuple[int, bytes]], list[tuple[str, int]], int]:
    msgs = []
    for seq in store.seqs():
        m = store.load(seq)
        assert m is not None
        msgs.append((seq, m.data))
    return msgs, list(store.subjects()), store.msgs()


def _churn(store: LmdbStore, first: int, count: int, rng: random.Random) -> None:
    """Commits that store, overwrite and remove: LMDB frees and reuses pages."""
    for seq in range(first, first + count):
        with store.batch():
            store.store(_msg(seq, f"s.{seq % 7}", bytes([seq % 251]) * rng.randint(10, 3000)))
            store.put_meta("applied", seq.to_bytes(8, "little"))
            if seq > 5 and rng.random() < 0.6:
                victim = rng.choice(list(store.seqs()))
                store.remove(victim)


def _mix(at_sync: bytes, latest: bytes, rng: random.Random, mode: str) -> bytes:
    pages = []
    for i in range(0, max(len(at_sync), len(latest)), PAGE):
        old, new = at_sync[i:i + PAGE], latest[i:i + PAGE]
        if mode == "random":
            pick = new if (rng.random() < 0.5 or not old) else old
        elif mode == "new-meta-old-data":
            pick = new if (i < 2 * PAGE or not old) else old
        else:
            pick = new or old
        pages.append(pick)
    return b"".join(pages)


def _crash_image(src: Path, dst: Path, data: bytes) -> None:
    dst.mkdir()
    (dst / "data.mdb").write_bytes(data)
    shutil.copy(src / SYNCED_META, dst / SYNCED_META)


@pytest.mark.parametrize("seed", range(6))
def test_power_loss_at_any_page_subset_opens_at_the_last_sync_point(tmp_path: Path,
                                                                     seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "env"
    env = NodeEnv(str(path), sync_interval=None)
    store = LmdbStore(env, "S")
    _churn(store, 1, 60, rng)
    env.sync()
    want = _state(store)
    at_sync = (path / "data.mdb").read_bytes()
    _churn(store, 61, 120, rng)  # not synced: any subset of these pages may be lost
    latest = (path / "data.mdb").read_bytes()
    assert latest != at_sync
    for n, mode in enumerate(("random", "random", "random", "new-meta-old-data", "all-new")):
        crash = tmp_path / f"crash{n}"
        _crash_image(path, crash, _mix(at_sync, latest, rng, mode))
        again = NodeEnv(str(crash), sync_interval=None)
        try:
            assert _state(LmdbStore(again, "S")) == want, mode
        finally:
            again.close()
    env.close()


def test_a_clean_close_keeps_everything(tmp_path: Path) -> None:
    env = NodeEnv(str(tmp_path / "env"), sync_interval=None)
    store = LmdbStore(env, "S")
    _churn(store, 1, 30, random.Random(1))
    want = _state(store)
    env.close()
    env = NodeEnv(str(tmp_path / "env"), sync_interval=None)
    try:
        assert _state(LmdbStore(env, "S")) == want
    finally:
        env.close()


def test_the_background_syncer_moves_the_sync_point(tmp_path: Path) -> None:
    env = NodeEnv(str(tmp_path / "env"), sync_interval=0.02)
    try:
        before = env.syncs
        LmdbStore(env, "S").store(_msg(1, "a", b"x"))
        for _ in range(200):
            if env.syncs > before:
                break
            time.sleep(0.01)
        assert env.syncs > before
    finally:
        env.close()


def _publish(i: int) -> bytes:
    return ops.encode(ops.StreamMsg(1_700_000_000_000_000_000 + i, "x", "", b"", b"m%d" % i))


def _cfg() -> stream_config.Config:
    cfg, pedantic = stream_config.parse_request(b'{"name":"S","subjects":["x"]}')
    return stream_config.check_create("S", cfg, pedantic, {})[0]


@pytest.mark.parametrize("clustered", [False, True])
def test_compaction_never_outruns_the_synced_store(tmp_path: Path, clustered: bool) -> None:
    """`snapshot_to` names an index; the driver then compacts the WAL up to it. After a crash
    the store must still hold that index, or entries only the compacted WAL had are lost
    (`restore_from` would refuse: StoreLostError). Remove the sync from `snapshot_to` and this
    fails, for one node and clustered alike (a clustered stream's compaction writes the same
    marker; its images are exported only for a member catching up)."""
    path = tmp_path / "env"
    env = NodeEnv(str(path), sync_interval=None)
    cfg = _cfg()
    sm = StreamMachine("S", "js.S.1", cfg, env, lambda _sm, _e: None, 1)
    sm.full_images = clustered
    sm.apply_batch([(i, _publish(i)) for i in range(1, 41)])
    image = str(tmp_path / "image")
    index = sm.snapshot_to(image)
    assert index == 40
    sm.apply_batch([(i, _publish(i)) for i in range(41, 61)])  # after the snapshot: unsynced
    crash = tmp_path / "crash"
    _crash_image(path, crash, (path / "data.mdb").read_bytes())
    env2 = NodeEnv(str(crash), sync_interval=None)
    try:
        again = StreamMachine("S", "js.S.1", cfg, env2, lambda _sm, _e: None, 1)
        assert again.applied_index() >= index
        again.restore_from(image)  # a restarting node: accepted, nothing dropped
        assert again.store.msgs() >= index
    finally:
        env2.close()
    env.close()


def test_a_store_behind_the_snapshot_is_refused(tmp_path: Path) -> None:
    """The check the compaction rule protects: restore refuses a store that lost the index."""
    env = NodeEnv(str(tmp_path / "env"), sync_interval=None)
    cfg = _cfg()
    sm = StreamMachine("S", "js.S.1", cfg, env, lambda _sm, _e: None, 1)
    image = str(tmp_path / "image")
    sm.apply_batch([(1, _publish(1))])
    sm.snapshot_to(image)
    env.close()
    env = NodeEnv(str(tmp_path / "env2"), sync_interval=None)
    try:
        with pytest.raises(StoreLostError):
            StreamMachine("S", "js.S.1", cfg, env, lambda _sm, _e: None, 1).restore_from(image)
    finally:
        env.close()


def test_a_failed_sync_point_is_fatal_and_every_later_sync_refuses(tmp_path: Path) -> None:
    """Fail-stop: after a failed sync point the page cache cannot be trusted, so the node
    stops (`on_fatal`) and no later sync may claim durability. The failure here is real: the
    side file's temporary name is taken by a directory, so its open fails."""
    path = tmp_path / "env"
    fatal: list[BaseException] = []
    env = NodeEnv(str(path), sync_interval=0.02, on_fatal=fatal.append)
    try:
        (path / (SYNCED_META + ".tmp")).mkdir()
        LmdbStore(env, "S").store(_msg(1, "a", b"x"))
        for _ in range(300):
            if fatal:
                break
            time.sleep(0.01)
        assert fatal and isinstance(fatal[0], OSError)
        with pytest.raises(RuntimeError, match="failed earlier"):
            env.sync()
    finally:
        env.close()  # no sync attempted after the failure

"""`StreamStore.put_metas` (r3lead): the same records as one `put_meta` per item, in the
caller's batch (an aborted batch leaves none of them), sealed under each record's own key
in an encrypted store (review rev-r3lead, session 12)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.jetstream import crypt
from node.jetstream.store.base import StoredMsg
from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv
from node.jetstream.store.memstore import MemStore

ITEMS = [("applied", b"\x07" * 8), ("last_seq", b"\x05" * 8), ("last_ts", b"\x01" * 8),
         ("last_msg_id", b"id-1")]


def _env(tmp_path: Path, encrypted: bool) -> NodeEnv:
    if not encrypted:
        return NodeEnv(str(tmp_path / "lmdb"), sync_interval=None)
    sc = crypt.open_store(str(tmp_path), "put-metas-test-key-0123456789ab", "chacha")
    assert sc is not None
    return NodeEnv(str(tmp_path / "lmdb"), sealer=sc.lmdb, files=sc.files, sync_interval=None)


@pytest.mark.parametrize("encrypted", [False, True])
def test_put_metas_equals_put_meta_each_and_survives_reopen(tmp_path: Path,
                                                            encrypted: bool) -> None:
    env = _env(tmp_path, encrypted)
    store = LmdbStore(env, "S")
    with store.batch():
        store.store(StoredMsg(1, "a", b"", b"x", 5))
        store.put_metas(ITEMS)
    env.close()
    env = _env(tmp_path, encrypted)
    try:
        store = LmdbStore(env, "S")
        assert [store.get_meta(k) for k, _ in ITEMS] == [v for _, v in ITEMS]
        assert LmdbStore(env, "SX").get_meta("applied") is None  # the stream's own prefix
    finally:
        env.close()
    mem = MemStore("S")
    mem.put_metas(ITEMS)
    assert [mem.get_meta(k) for k, _ in ITEMS] == [v for _, v in ITEMS]


def test_put_metas_is_in_the_callers_batch(tmp_path: Path) -> None:
    """Progress never lands without the data it describes: a batch that fails after
    put_metas leaves neither."""
    env = _env(tmp_path, False)
    try:
        store = LmdbStore(env, "S")
        with pytest.raises(RuntimeError), store.batch():
            store.store(StoredMsg(1, "a", b"", b"x", 5))
            store.put_metas(ITEMS)
            raise RuntimeError("apply failed")
        assert store.load(1) is None
        assert all(store.get_meta(k) is None for k, _ in ITEMS)
    finally:
        env.close()

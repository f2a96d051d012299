"""The Raft state machines of JetStream (node/jetstream/machines.py) on a real LMDB env.

The compaction rule: `snapshot_to` names only an index LMDB has committed, never the stream's
in-memory counter, which runs ahead while an apply's write transaction is open. The driver
compacts the WAL up to that index, so naming an uncommitted one would let a crash (the open
transaction lost) take acknowledged entries with it: the WAL no longer has them either.
"""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from node.jetstream import config, ops
from node.jetstream.machines import MetaMachine, StoreLostError, StreamMachine
from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv, dump_image


def _cfg(name: str = "S") -> config.Config:
    cfg, pedantic = config.parse_request(f'{{"name":"{name}","subjects":["s.>"]}}'.encode())
    return config.check_create(name, cfg, pedantic, {})[0]


def _msg(i: int) -> bytes:
    return ops.encode(ops.StreamMsg(1_000 + i, "s.x", f"_r.{i}", b"", f"m{i}".encode()))


def _machine(env: NodeEnv, sink: Any = None) -> StreamMachine:
    return StreamMachine("S", "js.S.1", _cfg(), env, sink or (lambda sm, effects: None), 1)


def test_applies_in_one_transaction_and_sends_pub_acks(tmp_path: Path) -> None:
    env = NodeEnv(str(tmp_path / "env"), sync_interval=None)
    seen: list[Any] = []
    sm = _machine(env, lambda _sm, effects: seen.extend(effects))
    before = env.env.info()["last_txnid"]
    sm.apply_batch([(i, _msg(i)) for i in range(2, 7)])
    # ONE commit: the messages, their counters and the applied index are one LMDB
    # transaction, so a sync point (and so a restart, which trusts the counters) has all
    # of them or none.
    assert env.env.info()["last_txnid"] == before + 1
    assert sm.store.msgs() == 5
    acks = [e.payload for e in seen if type(e).__name__ == "Reply"]
    assert acks[0] == b'{"stream":"S","seq":1}' and len(acks) == 5
    assert sm.applied_index() == 6
    sm.apply_batch([(i, _msg(i)) for i in range(2, 8)])  # a replay after a restart
    assert sm.stream.last_seq == 6 and sm.applied_index() == 7
    env.close()


@pytest.mark.parametrize("clustered", [False, True])
def test_snapshot_names_only_the_committed_index(tmp_path: Path, clustered: bool) -> None:
    """An apply is stopped inside its write transaction (after the stream counted the
    entries, before the commit) while the driver asks for an image from another thread.
    Clustered, compaction takes the same path (a marker; images only for catch-up)."""
    env = NodeEnv(str(tmp_path / "env"))
    sm = _machine(env)
    sm.full_images = clustered
    sm.apply_batch([(2, _msg(2)), (3, _msg(3))])
    inside, release = threading.Event(), threading.Event()

    def slow(_saved: Any) -> None:  # the last step inside the write transaction
        inside.set()
        release.wait(10)
        raise RuntimeError("crash before the commit")  # the write transaction aborts

    sm.stream._save_progress = slow  # type: ignore[method-assign]
    worker = threading.Thread(target=lambda: _swallow(sm.apply_batch, [(4, _msg(4))]))
    worker.start()
    assert inside.wait(10)
    assert sm.stream.applied == 4  # the in-memory counter is ahead of LMDB
    index = sm.snapshot_to(str(tmp_path / "image"))
    release.set()
    worker.join(10)
    assert index == sm.applied_index() == 3, "the image names an index LMDB never committed"
    env.close()


def _swallow(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except RuntimeError:
        pass


def test_restore_refuses_a_store_that_lost_the_snapshot(tmp_path: Path) -> None:
    env = NodeEnv(str(tmp_path / "env"))
    sm = _machine(env)
    sm.apply_batch([(i, _msg(i)) for i in range(2, 12)])
    image = str(tmp_path / "image")
    assert sm.snapshot_to(image) == 11
    sm.restore_from(image)  # LMDB holds it: nothing to do
    assert sm.stream.last_seq == 10
    sm.store.drop()  # the store lost its data (e.g. a wiped lmdb dir)
    with pytest.raises(StoreLostError):
        sm.restore_from(image)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    sm.restore_from(str(empty))
    assert sm.stream.last_seq == 0 and sm.applied_index() == 0
    env.close()


def test_meta_catalogue_survives_reopen_and_skips_replays(tmp_path: Path) -> None:
    env = NodeEnv(str(tmp_path / "env"))
    changes: list[int] = []
    meta = MetaMachine(env, lambda: changes.append(1))
    create = b'{"op":"create","name":"S","config":{},"created_ns":1,"group":"js.S.1"}'
    meta.apply_batch([(2, create), (3, b'{"op":"create","name":"T","config":{},'
                                      b'"created_ns":2,"group":"js.T.2"}')])
    meta.apply_batch([(4, b'{"op":"delete","name":"T"}')])
    env.close()
    env = NodeEnv(str(tmp_path / "env"))
    again = MetaMachine(env, lambda: changes.append(2))
    assert list(again.streams) == ["S"] and again.applied_index() == 4
    again.apply_batch([(3, b'{"op":"delete","name":"S"}')])  # at or below applied: skipped
    assert list(again.streams) == ["S"]
    env.close()


def test_orphans_are_what_the_catalogue_does_not_name(tmp_path: Path) -> None:
    from node.jetstream.service import orphans
    from node.jetstream.store.lmdbstore import LmdbStore, stored_names

    env = NodeEnv(str(tmp_path / "env"))
    live = _machine(env)  # group js.S.1
    live.apply_batch([(2, _msg(2))])
    gone = StreamMachine("T", "js.T.9", _cfg("T"), env, lambda sm, e: None, 9)
    gone.apply_batch([(2, _msg(2))])
    catalogue = {"S": {"group": "js.S.1"}}
    names = stored_names(env)
    assert names == {"js.S.1", "js.T.9"}
    groups, stale = orphans(catalogue, ["$js", "js.S.1", "js.T.9"], names)
    assert (groups, stale) == (["js.T.9"], ["js.T.9"])
    LmdbStore(env, "js.T.9").drop()
    assert stored_names(env) == {"js.S.1"} and live.store.msgs() == 1
    # a consumer's own group (cgroup.py) is live while the catalogue names it
    catalogue["S"]["consumers"] = {"c": {"group": "jc.S.c.3"}}
    assert orphans(catalogue, ["jc.S.c.3", "jc.S.d.4"], {"jc.S.c.3"}) == (["jc.S.d.4"], [])
    env.close()


def test_full_image_moves_a_stream_to_an_empty_store(tmp_path: Path) -> None:
    """Clustered compaction writes only a marker; the image a replica catches up from is
    exported when it is needed: a replica with an empty store installs it and holds the same
    messages, consumers and applied index (catch-up by snapshot)."""
    src_env = NodeEnv(str(tmp_path / "a"))
    src = _machine(src_env)
    src.full_images = True
    src.apply_batch([(i, _msg(i)) for i in range(2, 12)])
    marker = str(tmp_path / "marker")
    assert src.snapshot_to(marker) == 11
    assert os.path.getsize(marker) < 100, "compaction must not dump the stream"
    assert src.exports_images
    image = str(tmp_path / "image")
    assert src.export_to(image) == 11
    dst_env = NodeEnv(str(tmp_path / "b"))
    dst = _machine(dst_env)
    dst.full_images = True
    dst.apply_batch([(2, _msg(2))])  # something to be replaced
    dst.restore_from(image)
    assert dst.applied_index() == 11 and dst.stream.last_seq == 10
    assert [dst.store.load(s).data for s in range(1, 11)] == \
        [src.store.load(s).data for s in range(1, 11)]
    dst.apply_batch([(12, _msg(12))])  # and goes on from there
    assert dst.stream.last_seq == 11
    with open(image, "r+b") as f:  # a damaged image is refused, the store untouched
        f.truncate(os.path.getsize(image) - 5)
    with pytest.raises(ValueError):
        dst.restore_from(image)
    assert dst.stream.last_seq == 11
    src_env.close()
    dst_env.close()


def test_export_past_the_snapshot_skips_what_it_holds(tmp_path: Path) -> None:
    """The export is taken when a member needs the snapshot, at the leader's applied index,
    past the marker the snapshot names: the replica installs it and then skips the entries
    between (they are in its image), so no message is stored twice."""
    src_env, dst_env = NodeEnv(str(tmp_path / "a")), NodeEnv(str(tmp_path / "b"))
    src, dst = _machine(src_env), _machine(dst_env)
    src.full_images = dst.full_images = True
    src.apply_batch([(i, _msg(i)) for i in range(2, 12)])
    assert src.snapshot_to(str(tmp_path / "marker")) == 11  # the snapshot: index 11
    src.apply_batch([(i, _msg(i)) for i in range(12, 17)])  # applies go on
    image = str(tmp_path / "image")
    assert src.export_to(image) == 16
    dst.restore_from(image)
    dst.apply_batch([(i, _msg(i)) for i in range(12, 19)])  # the log after the snapshot
    assert dst.stream.last_seq == 17 and dst.applied_index() == 18
    assert [dst.store.load(s).data for s in range(1, 18)] == \
        [f"m{i}".encode() for i in range(2, 19)]
    src_env.close()
    dst_env.close()


def test_memory_image_carries_the_messages(tmp_path: Path) -> None:
    """A clustered memory stream (R>1) snapshots its messages, dedup ids, TTLs, consumers
    and applied index; a replica with nothing installs the image and goes on from it. (A
    marker instead would leave the replica empty, or fail-stop it on a restart.)"""
    src = StreamMachine("S", "js.S.1", _cfg(), None, lambda sm, effects: None, 1)
    src.full_images = True
    with_id = [(i, ops.encode(ops.StreamMsg(1_000 + i, f"s.{i % 3}", "",
                                             f"NATS/1.0\r\nNats-Msg-Id: id{i}\r\n\r\n".encode(),
                                             f"m{i}".encode()))) for i in range(2, 12)]
    src.apply_batch(with_id)
    cfg = b'{"durable_name":"d","ack_policy":"explicit","deliver_policy":"all"}'
    src.apply_batch([(12, ops.encode(ops.ConsumerUpsert(2_000, "d", cfg)))])
    image = str(tmp_path / "image")
    assert src.snapshot_to(image) == 12
    dst = StreamMachine("S", "js.S.1", _cfg(), None, lambda sm, effects: None, 1)
    dst.full_images = True
    dst.restore_from(image)
    assert dst.applied_index() == 12 and dst.stream.last_seq == 10
    assert [(m.subject, m.data, m.hdr) for m in map(dst.store.load, range(1, 11))] == \
        [(m.subject, m.data, m.hdr) for m in map(src.store.load, range(1, 11))]
    assert dst.store.get_dedup("id5") == src.store.get_dedup("id5") is not None
    assert dst.store.subject_count("s.1") == src.store.subject_count("s.1") > 0
    assert list(dst.stream.consumers) == ["d"]
    dup = ops.encode(ops.StreamMsg(3_000, "s.0", "", b"NATS/1.0\r\nNats-Msg-Id: id5\r\n\r\n",
                                   b"again"))
    dst.apply_batch([(13, dup), (14, _msg(14))])  # dedup state came along; goes on
    assert dst.stream.last_seq == 11
    with open(image, "r+b") as f:  # a damaged image is refused
        f.truncate(os.path.getsize(image) - 5)
    with pytest.raises(ValueError):
        dst.restore_from(image)
    assert dst.stream.last_seq == 11


def _consumer_machine(sm: StreamMachine, memory: bool = False, sink: Any = None) -> Any:
    from node.jetstream.machines import ConsumerMachine
    return ConsumerMachine(sm, "c", "jc.S.c.1", {"ack_policy": "explicit"}, 1, 0, 1, memory,
                           sink or (lambda _m, _e: None))


def _cops() -> list[bytes]:
    from node.jetstream.consumer import AckKind
    out = [ops.ConsumerDelivered(2_000, "c", s) for s in (1, 2, 3)]
    out += [ops.ConsumerAck(2_001, "c", AckKind.ACK, 2),
            ops.ConsumerAck(2_002, "c", AckKind.NAK, 1), ops.ConsumerDelivered(2_003, "c", 1),
            ops.ConsumerAck(2_004, "c", AckKind.ACK, 1)]
    return [ops.encode(o) for o in out]


def test_consumer_group_machine_persists_resumes_and_catches_up(tmp_path: Path) -> None:
    """A consumer group's replicas applying the same log hold the same state; a restart
    resumes from LMDB (entries at or below its applied index are skipped); a member that
    lags behind a compaction installs the leader's image; a memory one keeps nothing."""
    env = NodeEnv(str(tmp_path / "env"))
    sm = _machine(env)
    sm.apply_batch([(i, _msg(i)) for i in range(2, 6)])
    seen: list[Any] = []
    a = _consumer_machine(sm, sink=lambda _m, effects: seen.extend(effects))
    entries = list(enumerate(_cops(), start=2))
    a.apply_batch(entries[:4])
    a.apply_batch(entries[2:])  # replayed overlap: skipped by index
    assert a.applied_index() == 8 and len([e for e in seen if type(e).__name__ ==
                                           "Delivered"]) == 4
    state = a.core.consumer.state
    assert (state.delivered_sseq, state.floor_sseq, sorted(state.pending)) == (3, 2, [3])
    assert a.core.consumer.state.deliveries == {3: 1}
    again = _consumer_machine(sm)  # a restart: the state comes back from LMDB
    assert again.core.consumer.state.encode() == a.core.consumer.state.encode()
    image = str(tmp_path / "img")
    assert a.snapshot_to(image) == 8
    fresh_env = NodeEnv(str(tmp_path / "env2"))
    b = _consumer_machine(_machine(fresh_env))
    b.restore_from(image)
    assert b.applied_index() == 8 and b.core.consumer.state.encode() == state.encode()
    mem = _consumer_machine(sm, memory=True)
    mem.apply_batch(entries)
    assert mem.core.consumer.state.encode() == state.encode()
    assert _consumer_machine(sm, memory=True).core.consumer.state.delivered_sseq == 0
    assert sm.stream.consumers == {}  # nothing of it in the stream's store


def _kv_cfg() -> config.Config:
    """Per-subject limit 2: most publishes also remove a message (counters go both ways)."""
    raw = b'{"name":"S","subjects":["s.>"],"max_msgs_per_subject":2}'
    cfg, pedantic = config.parse_request(raw)
    return config.check_create("S", cfg, pedantic, {})[0]


def _kv_msg(i: int) -> bytes:
    hdr = f"NATS/1.0\r\nNats-Msg-Id: id{i}\r\n\r\n".encode()
    return ops.encode(ops.StreamMsg(1_000 + i, f"s.{i % 97}", "", hdr, b"x" * (i % 50)))


def _image_state(env: NodeEnv) -> tuple[int, bytes]:
    """The applied index and the exact bytes of the stream's image, from a new store."""
    buf = io.BytesIO()
    index = dump_image(LmdbStore(env, "js.S.1"), buf)
    return index, buf.getvalue()


def test_an_export_taken_while_applies_go_on_is_the_state_at_its_index(
        tmp_path: Path) -> None:
    """The catch-up image is exported in a worker thread while the apply worker commits
    batch after batch: it must be exactly the state at the index it names (ONE read
    transaction), never the messages of one state with the counters, dedup ids or applied
    index of another. Each export, installed on an empty replica, equals a replica that
    applied the log up to that index itself, byte for byte; the replica then applies the
    rest of the log and ends equal to the leader."""
    entries = [(i, _kv_msg(i)) for i in range(2, 3002)]
    src_env = NodeEnv(str(tmp_path / "src"))
    src = StreamMachine("S", "js.S.1", _kv_cfg(), src_env, lambda sm, e: None, 1)
    src.full_images = True
    src.apply_batch(entries[:1500])  # a stream big enough that an export takes a while
    stop = threading.Event()
    exporting = threading.Event()

    def applier() -> None:
        # From the first export on: on a loaded machine the applies started earlier could all
        # be done before it (one export only, nothing overlapped).
        exporting.wait(60)
        for at in range(1500, len(entries), 7):
            src.apply_batch(entries[at:at + 7])
        stop.set()

    worker = threading.Thread(target=applier)
    worker.start()
    exports: list[tuple[int, str]] = []
    # Until two exports name different indices: at load 20 the applier thread did not commit
    # its first batch during the first three exports (all at 1501). An export at the same
    # index as the one before is dropped (the same state again), so a starved applier costs
    # time, not more images to check. Bounded: after the applier stops, the next export is
    # at 3001.
    deadline = time.monotonic() + 120
    attempt = 0
    while len(exports) < 2 or len({i for i, _ in exports}) < 2 or (
            not stop.is_set() and len(exports) < 3):
        assert time.monotonic() < deadline, f"no apply committed during the exports {exports}"
        path = str(tmp_path / f"export{attempt}")
        attempt += 1
        exporting.set()
        index = src.export_to(path)
        if len(exports) >= 2 and index == exports[-1][0]:
            os.unlink(path)
            continue
        exports.append((index, path))
    worker.join(120)
    assert not worker.is_alive(), "the applier did not finish in 120 s"
    assert len({i for i, _ in exports}) > 1, "the applies did not overlap the exports"
    for n, (index, path) in enumerate(exports):
        ref_env = NodeEnv(str(tmp_path / f"ref{n}"))
        ref = StreamMachine("S", "js.S.1", _kv_cfg(), ref_env, lambda sm, e: None, 1)
        ref.apply_batch([e for e in entries if e[0] <= index])
        dst_env = NodeEnv(str(tmp_path / f"dst{n}"))
        dst = StreamMachine("S", "js.S.1", _kv_cfg(), dst_env, lambda sm, e: None, 1)
        dst.full_images = True
        dst.restore_from(path)
        assert _image_state(dst_env) == _image_state(ref_env), \
            f"export {n} (index {index}) is not the state at that index"
        dst.apply_batch(entries)  # the log after the snapshot; what it holds is skipped
        assert _image_state(dst_env) == _image_state(src_env)
        ref_env.close()
        dst_env.close()
    src_env.close()


def test_a_stream_replica_read_by_a_consumer_group_here_applies_without_a_hold(
        tmp_path: Path) -> None:
    """A follower's stream replica may hold committed publishes (defer_apply) only while no
    consumer group hosted on this node delivers from it."""
    env = NodeEnv(str(tmp_path))
    sm = _machine(env)
    assert sm.defer_apply
    cm = _consumer_machine(sm, memory=True)
    assert not sm.defer_apply
    cm.drop()
    assert sm.defer_apply
    cm2 = _consumer_machine(sm, memory=True)
    assert not sm.defer_apply
    del cm2  # dropped without `drop`: gone with the machine
    import gc
    gc.collect()
    assert sm.defer_apply
    env.close()

"""The Stream state machine: deterministic unit tests (time is the entries' now_ns)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.jetstream import config, ops
from node.jetstream.store import StreamStore
from node.jetstream.store.base import file_size
from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Removed, Reply, Republish, Result, Stored, Stream

S = 1_000_000_000
T0 = 1_700_000_000 * S


def make_cfg(**extra: Any) -> config.Config:
    cfg, pedantic = config.parse_request(json.dumps({"name": "T", **extra}).encode())
    return config.check_create("T", cfg, pedantic, {})[0]


@pytest.fixture(params=["mem", "lmdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StreamStore]:
    if request.param == "mem":
        yield MemStore("T")
        return
    env = NodeEnv(str(tmp_path / "env"))
    try:
        yield LmdbStore(env, "T")
    finally:
        env.close()


class Driver:
    """Feeds entries with increasing Raft indexes, as the group's apply loop does."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.index = stream.applied

    def run(self, op: ops.Op) -> list[Any]:
        self.index += 1
        return self.stream.apply_batch([(self.index, ops.encode(op))])

    def pub(self, subject: str, data: bytes = b"x", now: int = T0, **hdrs: str) -> Any:
        hdr = b""
        if hdrs:
            hdr = b"NATS/1.0\r\n" + b"".join(f"{k.replace('_', '-')}: {v}\r\n".encode()
                                             for k, v in hdrs.items()) + b"\r\n"
        effects = self.run(ops.StreamMsg(now, subject, "r", hdr, data))
        replies = [json.loads(e.payload) for e in effects if isinstance(e, Reply)]
        return replies[0] if replies else None


def test_sequences_and_acks(store: StreamStore) -> None:
    d = Driver(Stream(make_cfg(subjects=["a.>"]), store))
    assert d.pub("a.1") == {"stream": "T", "seq": 1}
    assert d.pub("a.2") == {"stream": "T", "seq": 2}
    assert store.load(2).subject == "a.2"


def test_domain_in_ack(store: StreamStore) -> None:
    d = Driver(Stream(make_cfg(), store, domain="hub"))
    assert d.pub("T") == {"stream": "T", "domain": "hub", "seq": 1}


def test_max_age_expires_with_entry_time_only(store: StreamStore) -> None:
    d = Driver(Stream(make_cfg(max_age=10 * S), store))
    d.pub("T", now=T0)
    d.pub("T", now=T0 + 5 * S)
    assert store.msgs() == 2
    effects = d.run(ops.Expire(T0 + 11 * S))
    assert effects == [Removed((1,))] and store.first_seq() == 2
    d.run(ops.Expire(T0 + 100 * S))
    assert store.msgs() == 0
    assert d.stream.state()["first_seq"] == 3 and d.stream.state()["last_seq"] == 2


def test_per_message_ttl(store: StreamStore) -> None:
    d = Driver(Stream(make_cfg(allow_msg_ttl=True), store))
    d.pub("T", now=T0, Nats_TTL="2s")
    d.pub("T", now=T0, Nats_TTL="never")
    d.pub("T", now=T0, Nats_TTL="1h")
    assert d.run(ops.Expire(T0 + 1 * S)) == []
    assert d.run(ops.Expire(T0 + 2 * S)) == [Removed((1,))]
    assert d.run(ops.Expire(T0 + 3601 * S)) == [Removed((3,))]
    assert list(store.seqs()) == [2]


def test_dedup_window_uses_entry_time(store: StreamStore) -> None:
    d = Driver(Stream(make_cfg(duplicate_window=2 * S), store))
    assert d.pub("T", now=T0, Nats_Msg_Id="m")["seq"] == 1
    assert d.pub("T", now=T0 + S, Nats_Msg_Id="m") == {"stream": "T", "seq": 1,
                                                        "duplicate": True}
    assert d.pub("T", now=T0 + 3 * S, Nats_Msg_Id="m") == {"stream": "T", "seq": 2}


def test_discard_old_per_subject_and_bytes(store: StreamStore) -> None:
    d = Driver(Stream(make_cfg(max_msgs_per_subject=1, max_bytes=300), store))
    d.pub("T", b"1")
    effects = d.run(ops.StreamMsg(T0, "T", "", b"", b"2"))
    assert Removed((1,)) in effects and Stored(2, "T") in effects
    for _ in range(5):
        d.run(ops.StreamMsg(T0, "T", "", b"", b"y" * 100))
    assert store.bytes() <= 300 and store.msgs() == 1


def test_sealed_refuses_everything(store: StreamStore) -> None:
    cfg = make_cfg()
    cfg["sealed"] = True
    d = Driver(Stream(cfg, store))
    assert d.pub("T")["error"]["err_code"] == 10109
    assert d.run(ops.DeleteMsg(T0, 1))[-1] == Result(
        {"error": {"code": 400, "err_code": 10109,
                   "description": "invalid operation on sealed stream"}})


def test_republish_headers(store: StreamStore) -> None:
    d = Driver(Stream(make_cfg(subjects=["in.*"], republish={"src": "in.*", "dest": "out.$1"}),
                      store))
    effects = d.run(ops.StreamMsg(T0, "in.a", "", b"", b"hello"))
    rp = [e for e in effects if isinstance(e, Republish)]
    assert rp and rp[0].subject == "out.a" and rp[0].data == b"hello"
    assert b"Nats-Sequence: 1\r\n" in rp[0].hdr and b"Nats-Stream: T\r\n" in rp[0].hdr


def test_reapplied_entries_are_no_ops_after_restart(tmp_path: Path) -> None:
    cfg = make_cfg(subjects=["a.>"])
    entries = [(i, ops.encode(ops.StreamMsg(T0 + i, f"a.{i}", "r", b"", b"d")))
               for i in range(1, 6)]
    env = NodeEnv(str(tmp_path / "env"), sync=True)
    Stream(cfg, LmdbStore(env, "T")).apply_batch(entries[:3])
    env.close()
    env = NodeEnv(str(tmp_path / "env"))
    try:
        stream = Stream(cfg, LmdbStore(env, "T"))
        assert stream.applied == 3 and stream.last_seq == 3
        effects = stream.apply_batch(entries)  # the driver replays from its snapshot
        acks = [json.loads(e.payload)["seq"] for e in effects if isinstance(e, Reply)]
        assert acks == [4, 5] and stream.store.msgs() == 5
    finally:
        env.close()


def _script() -> list[ops.Op]:
    out: list[ops.Op] = []
    for i in range(200):
        hdr = b""
        if i % 7 == 0:
            hdr = f"NATS/1.0\r\nNats-Msg-Id: id{i % 21}\r\n\r\n".encode()
        if i % 11 == 0:
            hdr = b"NATS/1.0\r\nNats-Rollup: sub\r\n\r\n"
        out.append(ops.StreamMsg(T0 + i * S // 10, f"s.{i % 5}", "r", hdr, bytes(i % 50)))
        if i % 37 == 0:
            out.append(ops.Purge(T0 + i * S // 10, "s.1", keep=1))
        if i % 53 == 0:
            out.append(ops.DeleteMsg(T0 + i * S // 10, i // 2))
        if i % 17 == 0:
            out.append(ops.Expire(T0 + i * S // 10))
    return out


def test_replicas_compute_the_same_state(tmp_path: Path) -> None:
    """Two members (memory and LMDB stores) applying the same log, in different batchings,
    produce the same effects and the same stored messages."""
    cfg = make_cfg(subjects=["s.*"], max_msgs=60, max_age=8 * S, allow_rollup_hdrs=True,
                   duplicate_window=2 * S)
    entries = [(i, ops.encode(op)) for i, op in enumerate(_script(), start=1)]
    a = Stream(cfg, MemStore("T", sizer=file_size))
    env = NodeEnv(str(tmp_path / "env"))
    try:
        b = Stream(cfg, LmdbStore(env, "T"))
        effects_a = a.apply_batch(entries)
        effects_b = []
        for start in range(0, len(entries), 13):
            effects_b += b.apply_batch(entries[start:start + 13])
        assert effects_a == effects_b
        assert a.state() == b.state()
        assert [a.store.load(s) for s in a.store.seqs()] == \
            [b.store.load(s) for s in b.store.seqs()]
    finally:
        env.close()


def test_config_and_consumers_come_back_from_the_store(tmp_path: Path) -> None:
    """UPDATE_CONFIG and CONSUMER_UPSERT/DELETE entries are durable with the data: a restarted
    member rebuilds the same stream config and consumers from LMDB alone."""
    cfg = make_cfg(subjects=["a.*"])
    newer = dict(cfg, max_msgs=3)
    entries = [(i, ops.encode(ops.StreamMsg(T0 + i, "a.x", "r", b"", b"d"))) for i in range(1, 6)]
    entries += [
        (6, ops.encode(ops.UpdateConfig(T0, json.dumps(config.to_wire(newer)).encode()))),
        (7, ops.encode(ops.ConsumerUpsert(T0 + 7, "keep", b'{"ack_policy":"explicit"}', 3))),
        (8, ops.encode(ops.ConsumerUpsert(T0, "gone", b'{"ack_policy":"none"}'))),
        (9, ops.encode(ops.ConsumerDelivered(T0, "keep", 3))),
        (10, ops.encode(ops.ConsumerDelete(T0, "gone"))),
        (11, ops.encode(ops.ConsumerUpsert(T0 + 11, "keep", b'{"ack_policy":"explicit",'
                                                           b'"description":"v2"}'))),
    ]
    env = NodeEnv(str(tmp_path / "env"))
    stream = Stream(cfg, LmdbStore(env, "T"))
    stream.apply_batch(entries)
    assert list(stream.store.seqs()) == [3, 4, 5]  # max_msgs 3 applied to what was stored
    env.close()
    env = NodeEnv(str(tmp_path / "env"))
    try:
        again = Stream(cfg, LmdbStore(env, "T"))  # cfg is the old one: the store's wins
        assert again.cfg["max_msgs"] == 3
        assert sorted(again.consumers) == ["keep"]
        keep = again.consumers["keep"]
        assert keep.cfg["description"] == "v2" and list(keep.state.pending) == [3]
        # created: the creating entry's clock, not the update's, and not the restart's
        assert again.consumer_created == {"keep": T0 + 7}
    finally:
        env.close()

"""STREAM_MSGS: publishes merged into one Raft entry are applied exactly as STREAM_MSG entries.

The stream leader merges the publishes queued between two drain passes into one entry
(`MultiRaft.propose_quiet(merge=ops.merge_msgs)`). Each publish must still get its own
PubAck or its own error, evaluated in order as if it were its own entry: dedup by
Nats-Msg-Id, the expected-* headers, discard new, max_msg_size, TTL refusals, a sealed
stream. These tests apply one log of refusals and acceptances both ways and compare every
effect and every database (the Raft `applied` index aside: the merged log is shorter).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from node.jetstream import config, ops
from node.jetstream.store.base import file_size
from node.jetstream.store.lmdbstore import DB_NAMES, LmdbStore, NodeEnv
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Reply, Stream
from tests.jetstream.test_apply_batching import T0, S, _hdr, make_cfg

CFG: dict[str, Any] = {"subjects": ["s.>"], "max_msgs": 40, "discard": "new",
                       "max_msg_size": 48, "duplicate_window": 2 * S,
                       "max_msgs_per_subject": 9, "discard_new_per_subject": True}


def _publishes() -> list[ops.Op]:
    """Publishes that hit every per-message check, built against a reference stream so
    that the expected-* headers are right or wrong on purpose; purges make room again,
    and the stream is sealed near the end."""
    rng = random.Random(11)
    ref = Stream(make_cfg(**CFG), MemStore("T", sizer=file_size))
    out: list[ops.Op] = []
    now = T0
    for i in range(600):
        now += rng.choice((S // 50, S // 10, S // 2))
        pairs: list[tuple[str, str]] = []
        roll = rng.random()
        if roll < 0.2:
            pairs.append(("Nats-Msg-Id", f"id{rng.randint(0, 30)}"))
        elif roll < 0.3:
            right = rng.random() < 0.6
            pairs.append(("Nats-Expected-Last-Sequence", str(ref.last_seq + (0 if right else 1))))
        elif roll < 0.35:
            right = rng.random() < 0.6
            pairs.append(("Nats-Expected-Last-Msg-Id", ref.last_msg_id if right else "nope"))
        elif roll < 0.38:
            pairs.append(("Nats-Expected-Stream", rng.choice(("T", "U"))))
        elif roll < 0.41:
            pairs.append(("Nats-TTL", "5s"))  # TTLs are not allowed on this stream
        elif roll < 0.45:
            pairs.append(("Nats-Expected-Last-Subject-Sequence", str(rng.randint(0, 3))))
        data = bytes(rng.choice((0, 5, 20, 60)))  # 60 > max_msg_size
        op: ops.Op = ops.StreamMsg(now, f"s.{rng.randint(0, 5)}", f"r{i}", _hdr(pairs), data)
        if i % 97 == 96:
            op = ops.Purge(now, keep=5)
        if i == 560:
            sealed = make_cfg(**{**CFG, "sealed": False})
            wire = {**config.to_wire(sealed), "sealed": True}
            op = ops.UpdateConfig(now, json.dumps(wire).encode())
        out.append(op)
        ref.apply_batch([(i + 1, ops.encode(op))])
    return out


def _merge_runs(log: list[ops.Op], rng: random.Random) -> list[ops.Op]:
    """The log with runs of consecutive publishes merged into STREAM_MSGS entries of
    random lengths (1 stays a plain STREAM_MSG, as the driver leaves a run of one)."""
    out: list[ops.Op] = []
    run: list[ops.StreamMsg] = []
    for op in [*log, None]:
        if isinstance(op, ops.StreamMsg) and len(run) < rng.randint(1, 40):
            run.append(op)
            continue
        if len(run) == 1:
            out.append(run[0])
        elif run:
            out.append(ops.StreamMsgs(run[0].now_ns, tuple(run)))
        run = [op] if isinstance(op, ops.StreamMsg) else []
        if op is not None and not isinstance(op, ops.StreamMsg):
            out.append(op)
    if run:
        out.append(run[0] if len(run) == 1 else ops.StreamMsgs(run[0].now_ns, tuple(run)))
    return out


def _dump(env: NodeEnv) -> dict[str, list[tuple[bytes, bytes]]]:
    with env.env.begin() as txn:
        return {name: [(bytes(k), bytes(v)) for k, v in txn.cursor(db=env.dbs[name])
                       if not (name == "js_meta" and bytes(k).endswith(b"applied"))]
                for name in DB_NAMES}


def _run(path: Path, log: list[ops.Op], per_batch: int) -> tuple[list[Any], dict, dict]:
    env = NodeEnv(str(path))
    try:
        stream = Stream(make_cfg(**CFG), LmdbStore(env, "T"))
        entries = [(i, ops.encode(op)) for i, op in enumerate(log, start=1)]
        effects: list[Any] = []
        for lo in range(0, len(entries), per_batch):
            effects += stream.apply_batch(entries[lo:lo + per_batch])
        return effects, stream.state(), _dump(env)
    finally:
        env.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_merged_publishes_apply_exactly_as_separate_entries(tmp_path: Path, seed: int) -> None:
    log = _publishes()
    merged = _merge_runs(log, random.Random(seed))
    assert any(isinstance(op, ops.StreamMsgs) for op in merged)
    ref_effects, ref_state, ref_dump = _run(tmp_path / "one", log, 1)
    effects, state, dump = _run(tmp_path / "merged", merged, 7)
    assert effects == ref_effects
    assert state == ref_state
    for db in DB_NAMES:
        assert dump[db] == ref_dump[db], db
    # the log did exercise the refusals: every publish has exactly one answer, on its own
    # subject, and both acks and several kinds of error are among them
    replies = [e for e in effects if isinstance(e, Reply)]
    publishes = [op for op in log if isinstance(op, ops.StreamMsg)]
    assert [r.subject for r in replies] == [p.reply for p in publishes]
    codes = {json.loads(r.payload).get("error", {}).get("err_code") for r in replies}
    assert {None, 10071, 10070, 10054, 10060, 10077, 10109} <= codes, codes
    assert any(json.loads(r.payload).get("duplicate") for r in replies)


def test_each_merged_message_keeps_its_own_clock() -> None:
    """A merged message is stored with its own proposer clock reading (the entry's clock
    is the first one's), as its own STREAM_MSG entry would be."""
    stream = Stream(make_cfg(subjects=["a"]), MemStore("T", sizer=file_size))
    msgs = tuple(ops.StreamMsg(T0 + k * 1000, "a", "", b"", b"%d" % k) for k in range(3))
    stream.apply_batch([(1, ops.encode(ops.StreamMsgs(T0, msgs)))])
    assert [stream.store.load(s).ts_ns for s in (1, 2, 3)] == [T0, T0 + 1000, T0 + 2000]


def test_the_entry_format_is_checked() -> None:
    a = ops.encode(ops.StreamMsg(T0, "a", "r", b"", b"xy"))
    b = ops.encode(ops.StreamMsg(T0 + 5, "b", "", b"", b""))
    entry = ops.merge_msgs([a, b])
    assert entry[0] == ops.EntryOp.STREAM_MSGS
    assert ops.decode(entry) == ops.StreamMsgs(T0, (ops.decode(a), ops.decode(b)))
    assert ops.decode(memoryview(entry)) == ops.decode(entry)
    assert ops.encode(ops.decode(entry)) == entry
    for cut in range(len(entry)):
        with pytest.raises(ops.EntryFormatError):
            ops.decode(entry[:cut])
    bad = [entry + b"\0",                                       # trailing bytes
           entry[:9] + b"\0\0\0\0",                             # no messages
           entry[:9] + b"\x01\0\0\0" + entry[13:],              # count says 1, two follow
           ops.merge_msgs([b, a])[:1] + entry[1:9] + ops.merge_msgs([b, a])[9:]]  # clock
    delete = ops.encode(ops.DeleteMsg(T0, 3))
    inner = entry[:9] + b"\x01\0\0\0" + len(delete).to_bytes(4, "little") + delete
    for raw in [*bad, inner]:
        with pytest.raises(ops.EntryFormatError):
            ops.decode(raw)
    with pytest.raises(ValueError):
        ops.merge_msgs([a, delete])

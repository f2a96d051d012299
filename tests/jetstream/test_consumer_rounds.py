"""A delivery round as one CONSUMER_DELIVERED_MANY entry, a run of acks as one CONSUMER_ACKS
entry, and the binary consumer state record (version 2).

The leader proposes a whole delivery round, and the acks one read of a client's socket
brought in, as ONE entry each. Applying such an entry must leave exactly what the entries it
replaces (one CONSUMER_DELIVERED / CONSUMER_ACK per message) leave: effects, consumer state,
and every key and value of every database (the audit replays the log and compares them). The
state record is re-encoded incrementally (only pending messages that changed are packed
again), so it must always equal a fresh encoding of the same state, and the JSON records
written before version 2 must still decode to the same state.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from node.jetstream import ops
from node.jetstream.consumer import AckKind, ConsumerState, Pending
from node.jetstream.store.lmdbstore import DB_NAMES, LmdbStore, NodeEnv
from node.jetstream.stream import Stream
from tests.jetstream.test_apply_batching import make_cfg

S = 1_000_000_000
T0 = 1_700_000_000 * S
KINDS = (AckKind.ACK, AckKind.ACK, AckKind.ACK, AckKind.NAK, AckKind.WPI, AckKind.TERM)


def _consumer(name: str, **extra: Any) -> ops.ConsumerUpsert:
    cfg = {"durable_name": name, "ack_policy": "explicit", "ack_wait": 2 * S,
           "max_ack_pending": 40, **extra}
    return ops.ConsumerUpsert(T0, name, json.dumps(cfg).encode())


def _rounds(seed: int, consumers: list[str]) -> list[list[ops.Op]]:
    """Publishes, then rounds: each consumer gets deliveries (new and re-deliveries of
    what it holds), then acks of random kinds (some twice, some for nothing pending)."""
    rng = random.Random(seed)
    out: list[list[ops.Op]] = [[ops.StreamMsg(T0, f"s.{i % 3}", "", b"", b"x")
                                for i in range(120)] + [_consumer(c) for c in consumers]]
    held: dict[str, list[int]] = {c: [] for c in consumers}
    nxt = dict.fromkeys(consumers, 1)
    now = T0
    for _ in range(12):
        now += rng.choice((S // 10, S, 3 * S))  # some ack waits run out between rounds
        for c in consumers:
            again = rng.sample(held[c], min(len(held[c]), rng.randint(0, 3)))
            new = list(range(nxt[c], min(nxt[c] + rng.randint(1, 15), 121)))
            nxt[c] += len(new)
            held[c] += new
            round_ = [*again, *new]
            if round_:
                out.append([ops.ConsumerDeliveredMany(now, c, tuple(round_))])
            acks = []
            for sseq in rng.sample(held[c], min(len(held[c]), rng.randint(0, 12))):
                kind = rng.choice(KINDS)
                acks.append((int(kind), sseq, rng.choice((0, S // 2, 4 * S))))
                if kind in (AckKind.ACK, AckKind.TERM) and rng.random() < 0.8:
                    held[c].remove(sseq)
            acks += [(int(AckKind.ACK), rng.randint(1, 130), 0) for _ in range(2)]  # stale
            out.append([ops.ConsumerAcks(now + 1, c, tuple(acks))])
    return out


def _single(op: ops.Op) -> list[ops.Op]:
    """The one-message entries an entry of a round stands for."""
    if isinstance(op, ops.ConsumerDeliveredMany):
        return [ops.ConsumerDelivered(op.now_ns, op.consumer, s) for s in op.sseqs]
    if isinstance(op, ops.ConsumerAcks):
        return [ops.ConsumerAck(op.now_ns, op.consumer, k, s, d) for k, s, d in op.acks]
    return [op]


def _run(path: Path, retention: str, batches: list[list[ops.Op]], split: bool
         ) -> tuple[list[Any], dict[str, Any], dict[str, list[tuple[bytes, bytes]]]]:
    env = NodeEnv(str(path))
    try:
        stream = Stream(make_cfg(subjects=["s.>"], retention=retention), LmdbStore(env, "T"))
        effects: list[Any] = []
        index = 0
        for batch in batches:
            entries = []
            for op in batch:
                for one in (_single(op) if split else [op]):
                    index += 1
                    entries.append((index, ops.encode(one)))
            effects += stream.apply_batch(entries)
        states = {n: c.state for n, c in stream.consumers.items()}
        stream.applied = 0  # the Raft index differs (fewer entries): not compared
        with stream.store.batch():
            stream.store.put_meta("applied", b"")
        with env.env.begin() as txn:
            dump = {db: [(bytes(k), bytes(v)) for k, v in txn.cursor(db=env.dbs[db])]
                    for db in DB_NAMES}
        return effects, states, dump
    finally:
        env.close()


@pytest.mark.parametrize("retention", ["limits", "interest", "workqueue"])
@pytest.mark.parametrize("seed", [1, 2])
def test_round_entries_apply_as_their_single_entries(tmp_path: Path, retention: str,
                                                     seed: int) -> None:
    consumers = ["a"] if retention == "workqueue" else ["a", "b"]
    batches = _rounds(seed, consumers)
    many = _run(tmp_path / "many", retention, batches, split=False)
    single = _run(tmp_path / "single", retention, batches, split=True)
    assert many[0] == single[0]  # effects: Delivered, advisories, Removed, in order
    assert many[1] == single[1]
    assert many[2] == single[2]  # every database, consumer records included
    a = many[1]["a"]
    assert a.pending and a.floor_sseq > 0 and any(n > 1 for n in a.deliveries.values())
    if retention != "limits":
        assert any(type(e).__name__ == "Removed" for e in many[0])


def test_incremental_record_equals_a_fresh_encoding() -> None:
    """The state record caches each pending message's packed bytes; after any sequence of
    deliveries, redeliveries, naks, progress and acks it must equal the record a state
    without a cache encodes (what a restarted node or the audit writes)."""
    from node.jetstream.consumer import Consumer

    rng = random.Random(5)
    c = Consumer({"ack_policy": "explicit", "ack_wait": S, "backoff": [S, 2 * S]})
    now = T0
    for step in range(400):
        now += rng.randint(0, S)
        pending = list(c.state.pending)
        roll = rng.random()
        if roll < 0.4 or not pending:
            c.apply_delivered(now, c.state.delivered_sseq + 1)
        elif roll < 0.55:
            c.apply_delivered(now, rng.choice(pending))  # a redelivery: count and deadline
        else:
            c.apply_ack(now, rng.choice(KINDS), rng.choice(pending), rng.randint(0, S))
        if step % 3 == 0:
            raw = c.state.encode()
            assert raw == ConsumerState.decode(raw).encode()
            assert ConsumerState.decode(raw) == c.state


def test_json_records_still_decode() -> None:
    """Stores written before version 2 hold JSON; a backup holds JSON (`to_json`)."""
    st = ConsumerState(9, 11, 3, 4, {5: Pending(5, T0, T0 + S, True), 4: Pending(4, T0, T0)},
                       {4: 1, 5: 3}, lps_until=7)
    assert list(st.pending) == [4, 5]  # kept in stream sequence order
    old = (b'{"d":[9,11],"f":[3,4],"l":7,"p":[[4,4,%d,%d,1,0],[5,5,%d,%d,3,1]]}'
           % (T0, T0, T0, T0 + S))
    assert st.to_json() == old
    assert ConsumerState.decode(old) == st == ConsumerState.decode(st.encode())
    assert st.encode()[0] == 2 and st.encode() != old


def test_a_deadline_beyond_64_bits_falls_back_to_json() -> None:
    """A NAK delay near the maximum overflows the deadline's int64: the record is JSON
    then (still exact), never an exception in the apply."""
    st = ConsumerState(1, 1, 0, 0, {1: Pending(1, T0, T0 + (1 << 63))}, {1: 1})
    raw = st.encode()
    assert raw.startswith(b"{") and ConsumerState.decode(raw) == st


def test_a_stale_redelivery_below_the_pending_keeps_the_floor_right() -> None:
    """The ack floor is read from the first pending key in O(1): a delivery of a message
    that was acked already (a stale plan after a leader change) lands below later pending
    ones, and the floor must still be the lowest pending message's."""
    from node.jetstream.consumer import Consumer

    c = Consumer({"ack_policy": "explicit"})
    for sseq in (1, 2, 3, 4):
        c.apply_delivered(T0, sseq)
    c.apply_ack(T0, AckKind.ACK, 1)
    c.apply_delivered(T0, 1)  # again, below 2..4
    c.apply_ack(T0, AckKind.ACK, 2)
    assert (c.state.floor_sseq, c.state.floor_cseq) == (0, 4)  # 1 pends (first cseq 5)
    assert list(c.state.pending) == [1, 3, 4]
    assert ConsumerState.decode(c.state.encode()) == c.state


def test_kept_deliveries_are_bounded_per_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower keeps each entry's Delivered effects and nobody takes them: the bound
    counts deliveries, not entries (one entry holds a whole round)."""
    from node.jetstream import machines
    from tests.jetstream.test_machines import _cfg

    monkeypatch.setattr(machines, "KEEP_MAX", 10)
    sm = machines.StreamMachine("S", "js.S.1", _cfg(), None, lambda _sm, _e: None, 1)
    sm.track = True
    entries: list[ops.Op] = [ops.StreamMsg(T0, "s.a", "", b"", b"x") for _ in range(40)]
    entries += [_consumer("c")]
    entries += [ops.ConsumerDeliveredMany(T0, "c", tuple(range(i, i + 4))) for i in (1, 5, 9, 13)]
    sm.apply_batch([(i, ops.encode(op)) for i, op in enumerate(entries, start=1)])
    assert [len(d) for d in sm.delivered.values()] == [4, 4]  # the two oldest rounds went
    last = len(entries)
    assert [d.sseq for d in sm.take_delivered(last)] == [13, 14, 15, 16]
    assert sm.take_delivered(last) == [] and sm._delivered_kept == 4

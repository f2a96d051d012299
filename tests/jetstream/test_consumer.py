"""The consumer state machine: deliveries, acks, redelivery timing, max_deliver, retention."""

from __future__ import annotations

import json
from typing import Any

import pytest

from node.jetstream import config, ops
from node.jetstream.consumer import (
    AckKind,
    Advisory,
    Consumer,
    ConsumerState,
    Delivery,
    Drop,
    StreamView,
    ack_subject,
    parse_ack_body,
    parse_ack_subject,
)
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import ConsumerEvent, Delivered, Removed, Stream

S = 1_000_000_000
T0 = 1_700_000_000 * S


def stream_with(n: int, subjects: list[str] | None = None, **extra: Any) -> Stream:
    body = json.dumps({"name": "T", "subjects": ["t.>"], **extra}).encode()
    cfg, pedantic = config.parse_request(body)
    stream = Stream(config.check_create("T", cfg, pedantic, {})[0], MemStore("T"))
    for i in range(n):
        subject = subjects[i % len(subjects)] if subjects else "t.a"
        stream.apply(ops.StreamMsg(T0, subject, "", b"", b"m%d" % i))
    return stream


def deliver(c: Consumer, view: StreamView, now: int) -> Delivery | Drop | None:
    """What the leader does: plan, then apply the planned event."""
    step = c.plan(now, view)
    if isinstance(step, Delivery):
        c.apply_delivered(now, step.sseq)
    elif isinstance(step, Drop):
        c.apply_ack(now, step.kind, step.sseq)
    return step


def test_explicit_acks_move_the_floor_only_over_contiguous_acks() -> None:
    stream = stream_with(4)
    c = Consumer({"ack_policy": "explicit"})
    view = StreamView(stream.store, [])
    for _ in range(4):
        deliver(c, view, T0)
    assert sorted(c.state.pending) == [1, 2, 3, 4]
    c.apply_ack(T0, AckKind.ACK, 2)
    assert (c.state.floor_sseq, c.state.floor_cseq) == (0, 0)
    c.apply_ack(T0, AckKind.ACK, 1)
    assert (c.state.floor_sseq, c.state.floor_cseq) == (2, 2)
    c.apply_ack(T0, AckKind.ACK, 1)  # double ack: nothing changes
    assert c.num_ack_pending() == 2
    c.apply_ack(T0, AckKind.ACK, 4)
    c.apply_ack(T0, AckKind.ACK, 3)
    assert (c.state.floor_sseq, c.state.floor_cseq) == (4, 4) and not c.state.pending
    assert deliver(c, view, T0) is None


def test_ack_all_acks_everything_below() -> None:
    stream = stream_with(3)
    c = Consumer({"ack_policy": "all"})
    view = StreamView(stream.store, [])
    for _ in range(3):
        deliver(c, view, T0)
    c.apply_ack(T0, AckKind.ACK, 2)
    assert list(c.state.pending) == [3] and c.state.floor_sseq == 2


def test_ack_none_never_pends() -> None:
    stream = stream_with(2)
    c = Consumer({"ack_policy": "none"})
    view = StreamView(stream.store, [])
    deliver(c, view, T0)
    deliver(c, view, T0)
    assert not c.state.pending and c.state.floor_sseq == 2


def test_ack_wait_redelivers_after_deadline_only() -> None:
    stream = stream_with(1)
    c = Consumer({"ack_wait": 5 * S})
    view = StreamView(stream.store, [])
    assert deliver(c, view, T0) == Delivery(1, 1)
    assert deliver(c, view, T0 + 5 * S - 1) is None
    assert deliver(c, view, T0 + 5 * S) == Delivery(1, 2)
    assert c.state.delivered_cseq == 2 and c.num_redelivered() == 1


def test_backoff_sets_each_wait_and_the_last_repeats() -> None:
    stream = stream_with(1)
    c = Consumer({"backoff": [1 * S, 3 * S], "max_deliver": 10})
    view = StreamView(stream.store, [])
    now = T0
    deliver(c, view, now)
    deadlines = []
    for _ in range(3):
        now = c.next_deadline()
        deadlines.append(now)
        deliver(c, view, now)
    assert [d - T0 for d in deadlines] == [1 * S, 4 * S, 7 * S]


def test_max_deliver_stops_redelivery_with_an_advisory() -> None:
    stream = stream_with(1)
    c = Consumer({"ack_wait": S, "max_deliver": 2})
    view = StreamView(stream.store, [])
    deliver(c, view, T0)
    deliver(c, view, T0 + S)
    step = c.plan(T0 + 2 * S, view)
    assert step == Drop(1, AckKind.MAX_DELIVER)
    assert c.apply_ack(T0 + 2 * S, step.kind, 1) == [Advisory("MAX_DELIVERIES", 1, 2)]
    assert not c.state.pending and c.state.floor_sseq == 1
    assert deliver(c, view, T0 + 10 * S) is None


def test_nak_with_and_without_delay() -> None:
    stream = stream_with(2)
    c = Consumer({"ack_wait": 30 * S})
    view = StreamView(stream.store, [])
    deliver(c, view, T0)
    deliver(c, view, T0)
    c.apply_ack(T0, AckKind.NAK, 2)
    c.apply_ack(T0, AckKind.NAK, 1, delay_ns=3 * S)
    assert deliver(c, view, T0) == Delivery(2, 2)  # no delay: due at once
    assert deliver(c, view, T0 + 3 * S - 1) is None
    assert deliver(c, view, T0 + 3 * S) == Delivery(1, 2)


def test_wpi_restarts_the_wait_and_term_stops_it() -> None:
    stream = stream_with(2)
    c = Consumer({"ack_wait": 10 * S})
    view = StreamView(stream.store, [])
    deliver(c, view, T0)
    deliver(c, view, T0)
    c.apply_ack(T0 + 8 * S, AckKind.WPI, 1)
    assert c.plan(T0 + 10 * S, view) == Delivery(2, 2)  # 1 is still being worked on
    assert c.apply_ack(T0, AckKind.TERM, 2) == [Advisory("MSG_TERMINATED", 2, 1)]
    assert list(c.state.pending) == [1]
    assert c.plan(T0 + 18 * S, view) == Delivery(1, 2)


def test_max_ack_pending_blocks_new_but_not_redeliveries() -> None:
    stream = stream_with(5)
    c = Consumer({"max_ack_pending": 2, "ack_wait": S})
    view = StreamView(stream.store, [])
    deliver(c, view, T0)
    deliver(c, view, T0)
    assert deliver(c, view, T0) is None
    assert deliver(c, view, T0 + S) == Delivery(1, 2)


def test_filters_and_gone_messages() -> None:
    stream = stream_with(6, subjects=["t.a", "t.b", "t.c"])
    c = Consumer({"filter_subjects": ["t.a", "t.c"], "ack_wait": S})
    view = StreamView(stream.store, c.filters())
    got = [deliver(c, view, T0).sseq for _ in range(4)]
    assert got == [1, 3, 4, 6] and deliver(c, view, T0) is None
    stream.apply(ops.DeleteMsg(T0, 3))
    assert c.plan(T0 + S, view) == Delivery(1, 2)
    c.apply_ack(T0, AckKind.ACK, 1)
    assert c.plan(T0 + S, view) == Drop(3, AckKind.GONE)
    assert StreamView(stream.store, ["t.a"]).count_matching(0) == 2


def test_state_record_roundtrip() -> None:
    stream = stream_with(3)
    c = Consumer({"ack_wait": S})
    view = StreamView(stream.store, [])
    for _ in range(3):
        deliver(c, view, T0)
    c.apply_ack(T0, AckKind.ACK, 2)
    deliver(c, view, T0 + S)
    again = ConsumerState.decode(c.state.encode())
    assert again == c.state


def test_stream_group_applies_consumer_entries_and_persists_them() -> None:
    stream = stream_with(3, retention="workqueue")
    stream.attach_consumer("w", {"ack_policy": "explicit"})
    effects = stream.apply_batch([
        (10, ops.encode(ops.ConsumerDelivered(T0, "w", 1))),
        (11, ops.encode(ops.ConsumerDelivered(T0, "w", 2))),
        (12, ops.encode(ops.ConsumerAck(T0, "w", AckKind.ACK, 1))),
        (13, ops.encode(ops.ConsumerAck(T0, "w", AckKind.TERM, 2))),
        (14, ops.encode(ops.ConsumerAck(T0, "nope", AckKind.ACK, 2))),
    ])
    assert Delivered("w", 1, 1, 1, T0) in effects
    assert Removed((1,)) in effects and Removed((2,)) in effects
    assert any(isinstance(e, ConsumerEvent) for e in effects)
    assert list(stream.store.seqs()) == [3]
    resumed = Stream(stream.cfg, stream.store).attach_consumer("w", {"ack_policy": "explicit"})
    assert resumed.state.floor_sseq == 2 and not resumed.state.pending


def test_interest_retention_removes_when_all_interested_acked() -> None:
    stream = stream_with(0, retention="interest")
    stream.attach_consumer("a", {})
    stream.attach_consumer("b", {"filter_subject": "t.x"})
    stream.apply(ops.StreamMsg(T0, "t.x", "", b"", b"1"))  # both want it
    stream.apply(ops.StreamMsg(T0, "t.y", "", b"", b"2"))  # only a
    for name in ("a", "b"):
        stream.apply(ops.ConsumerDelivered(T0, name, 1))
    stream.apply(ops.ConsumerAck(T0, "a", AckKind.ACK, 1))
    assert stream.store.load(1) is not None  # b has not acked
    stream.apply(ops.ConsumerAck(T0, "b", AckKind.ACK, 1))
    assert stream.store.load(1) is None
    stream.apply(ops.ConsumerDelivered(T0, "a", 2))
    stream.apply(ops.ConsumerAck(T0, "a", AckKind.ACK, 2))
    assert stream.store.msgs() == 0


def test_interest_without_consumers_keeps_nothing() -> None:
    stream = stream_with(2, retention="interest")
    assert stream.store.msgs() == 0 and stream.last_seq == 2


@pytest.mark.parametrize("subject,expected", [
    ("$JS.ACK.S.C.2.10.7.1795458436052508053.3", ("S", "C", 2, 10, 7, 3, "")),
    ("$JS.ACK.hub.ACCHASH.S.C.1.5.5.1795458436052508053.0.tok", ("S", "C", 1, 5, 5, 0, "hub")),
    ("$JS.ACK._.ACCHASH.S.C.1.5.5.1795458436052508053.0", ("S", "C", 1, 5, 5, 0, "")),
])
def test_ack_subjects(subject: str, expected: tuple[Any, ...]) -> None:
    info = parse_ack_subject(subject)
    assert info is not None
    assert (info.stream, info.consumer, info.deliveries, info.sseq, info.cseq, info.pending,
            info.domain) == expected


def test_ack_subject_roundtrip_and_garbage() -> None:
    subject = ack_subject("S", "C", 1, 2, 3, 4, 5)
    assert subject == "$JS.ACK.S.C.1.2.3.4.5"
    assert parse_ack_subject(subject).sseq == 2
    assert parse_ack_subject("$JS.ACK.S.C.x.2.3.4.5") is None
    assert parse_ack_subject("foo.bar") is None


@pytest.mark.parametrize("body,expected", [
    (b"", (AckKind.ACK, 0, False)), (b"+ACK", (AckKind.ACK, 0, False)),
    (b"-NAK", (AckKind.NAK, 0, False)),
    (b'-NAK {"delay": 2000000000}', (AckKind.NAK, 2 * S, False)),
    (b"-NAK 1.5s", (AckKind.NAK, 1_500_000_000, False)),
    (b"-NAK {bad", (AckKind.NAK, 0, False)),
    (b"+WPI", (AckKind.WPI, 0, False)), (b"+TERM reason", (AckKind.TERM, 0, False)),
    (b"+NXT", (AckKind.ACK, 0, True)), (b"+NXT 5", (AckKind.ACK, 0, True)),
    (b"+OK", (AckKind.ACK, 0, False)), (b"+BOGUS", (None, 0, False)),
    (b"+ACK ", (None, 0, False)), (b"+WPI now", (None, 0, False)),
])
def test_ack_bodies(body: bytes, expected: tuple[AckKind | None, int, bool]) -> None:
    assert parse_ack_body(body) == expected


def test_pull_queue_unit() -> None:
    from node.jetstream.pull import PullQueue

    q = PullQueue({"max_waiting": 2, "max_bytes": 100})
    assert q.add(0, "r1", b'{"batch":2,"max_bytes":15}') == []
    assert q.add(0, "r2", b"") == []
    refused = q.add(0, "r3", b"1")
    assert refused and b"409 Exceeded MaxWaiting" in refused[0].hdr
    target, refusals = q.take(10)
    assert target is not None and target.reply == "r1" and refusals == []
    target, refusals = q.take(10)  # r1 has 5 bytes left: refused, r2 takes it
    assert target is not None and target.reply == "r2"
    assert refusals and b"409 Message Size Exceeds MaxBytes" in refusals[0].hdr
    assert not q.waiting and q.take(1) == (None, [])


def test_deleting_a_consumer_releases_messages_only_it_held() -> None:
    # nats-server: interest stream, consumer a (all) acked everything, b (t.x) acked nothing;
    # deleting b empties the stream (checked against the oracle by hand, see docs).
    stream = stream_with(0, retention="interest")
    stream.attach_consumer("a", {})
    stream.attach_consumer("b", {"filter_subject": "t.x"})
    for subject in ("t.x", "t.y", "t.x"):
        stream.apply(ops.StreamMsg(T0, subject, "", b"", b"1"))
    for seq in (1, 2, 3):
        stream.apply(ops.ConsumerDelivered(T0, "a", seq))
        stream.apply(ops.ConsumerAck(T0, "a", AckKind.ACK, seq))
    assert list(stream.store.seqs()) == [1, 3]
    assert stream.detach_consumer("b") == [Removed((1, 3))]
    assert stream.store.msgs() == 0 and stream.state()["first_seq"] == 4
    assert stream.detach_consumer("b") == []


def test_a_forgotten_mem_storage_consumer_leaves_its_messages() -> None:
    # nats-server 2.15.1 (probed: interest stream, one mem_storage consumer that acked 2 of 5,
    # restart): the consumer is gone, the 3 unacked messages stay. A delete would remove them.
    stream = stream_with(0, retention="interest")
    stream.attach_consumer("m", {"mem_storage": True})
    for _ in range(5):
        stream.apply(ops.StreamMsg(T0, "t.a", "", b"", b"1"))
    for seq in (1, 2):
        stream.apply(ops.ConsumerDelivered(T0, "m", seq))
        stream.apply(ops.ConsumerAck(T0, "m", AckKind.ACK, seq))
    assert stream.apply(ops.ConsumerForget(T0, "m")) == []
    assert "m" not in stream.consumers and list(stream.store.seqs()) == [3, 4, 5]
    assert stream.apply(ops.ConsumerForget(T0, "m")) == []  # twice: no-op


@pytest.mark.parametrize("seed", range(8))
def test_cached_num_pending_equals_a_fresh_count(seed: int) -> None:
    """The O(1) num_pending bookkeeping agrees with a full scan after every entry, whatever
    mix of publishes, deletes, purges, limits, deliveries and acks."""
    import random

    rng = random.Random(seed)
    stream = stream_with(0, max_msgs_per_subject=4, max_msgs=30)
    filters = rng.choice([{}, {"filter_subject": "t.a"}, {"filter_subjects": ["t.a", "t.c.*"]}])
    consumer = stream.attach_consumer("c", {"ack_policy": "explicit", **filters})
    view = StreamView(stream.store, consumer.filters())
    consumer.num_pending(view)  # start the cache
    for _ in range(300):
        roll = rng.random()
        if roll < 0.55:
            subject = rng.choice(["t.a", "t.b", "t.c.x", "t.c.y"])
            stream.apply(ops.StreamMsg(T0, subject, "", b"", b"x"))
        elif roll < 0.65 and stream.last_seq:
            stream.apply(ops.DeleteMsg(T0, rng.randint(1, stream.last_seq)))
        elif roll < 0.68:
            stream.apply(ops.Purge(T0, rng.choice(["", "t.a", "t.c.*"]), keep=rng.randint(0, 3)))
        else:
            plan = consumer.plan(T0, view)
            if isinstance(plan, Delivery):
                stream.apply(ops.ConsumerDelivered(T0, "c", plan.sseq))
                if rng.random() < 0.7:
                    stream.apply(ops.ConsumerAck(T0, "c", AckKind.ACK, plan.sseq))
        fresh = view.count_matching(consumer.state.delivered_sseq)
        assert consumer.num_pending(view) == fresh


def test_timer_drops_only_ack_wait_expiries() -> None:
    stream = stream_with(2)
    c = Consumer({"ack_wait": S, "max_deliver": 1})
    view = StreamView(stream.store, [])
    deliver(c, view, T0)
    deliver(c, view, T0)
    c.apply_ack(T0, AckKind.NAK, 1)
    assert c.timer_drops(T0 + S - 1) == []
    assert c.timer_drops(T0 + S) == [Drop(2, AckKind.MAX_DELIVER)]  # 1 waits for a pull
    assert c.plan(T0 + S, view) == Drop(1, AckKind.MAX_DELIVER)
    assert ConsumerState.decode(c.state.encode()) == c.state

"""Consumer groups (node/jetstream/cgroup.py): which consumers get a group of their own, where
it is placed, its state machine, and how its acks reach the stream (CONSUMER_GROUP_STATE):
deterministic on every stream replica, never removing a message some consumer still wants."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from node.jetstream import cgroup, ops
from node.jetstream.consumer import AckKind, Consumer
from node.jetstream.stream import Removed, Stream
from tests.jetstream.test_consumer import T0, stream_with


@pytest.mark.parametrize("ccfg, scfg, own", [
    ({}, {"num_replicas": 3}, False),
    ({"num_replicas": 0}, {"num_replicas": 3}, False),   # 0: the stream's
    ({"num_replicas": 3}, {"num_replicas": 3}, False),
    ({"num_replicas": 1}, {"num_replicas": 3}, True),    # R1 consumer on an R3 stream
    ({"num_replicas": 3}, {"num_replicas": 5}, True),
    ({"mem_storage": True}, {"num_replicas": 3, "storage": "file"}, True),
    ({"mem_storage": True}, {"num_replicas": 3, "storage": "memory"}, False),
    ({"mem_storage": False}, {"num_replicas": 3, "storage": "memory"}, False),
    ({"num_replicas": 1}, {"num_replicas": 1}, False),
])
def test_own_group_when_replicas_or_storage_differ(ccfg: dict[str, Any], scfg: dict[str, Any],
                                                    own: bool) -> None:
    assert cgroup.own_group(ccfg, scfg) is own


def test_placement_is_a_subset_of_the_stream_peers() -> None:
    peers = [11, 22, 33, 44, 55]
    up = {11, 22, 33, 55}.__contains__
    three = cgroup.place(peers, 3, up, {33: 2, 11: 1})
    assert set(three[:2]) == {22, 55} and three[2] == 11  # least loaded first
    assert set(cgroup.place(peers, 1, up, {})) <= {11, 22, 33, 55}
    assert cgroup.place(peers, 5, up, {}) == []  # 44 is down: not enough peers
    # ties broken at random: every up peer is chosen for an R1 consumer sometime
    chosen = {cgroup.place(peers, 1, up, {}, random.Random(s).randrange)[0] for s in range(60)}
    assert chosen == {11, 22, 33, 55}


def _core(stream: Stream, name: str) -> cgroup.ConsumerCore:
    """The consumer group's core, started from the stream's copy (as a new group is)."""
    src = stream.consumers[name]
    return cgroup.ConsumerCore(name, Consumer(src.cfg, None, start_sseq=1))


def _deliver_ack(core: cgroup.ConsumerCore, seqs: list[int], acked: list[int]) -> None:
    for s in seqs:
        core.apply(ops.ConsumerDelivered(T0, core.name, s))
    for s in acked:
        core.apply(ops.ConsumerAck(T0, core.name, AckKind.ACK, s))


def test_core_applies_the_stream_groups_consumer_entries_the_same_way() -> None:
    stream = stream_with(5)
    stream.attach_consumer("c", {"ack_policy": "explicit"})
    core = _core(stream, "c")
    script: list[ops.Op] = [ops.ConsumerDelivered(T0, "c", s) for s in (1, 2, 3)]
    script += [ops.ConsumerAck(T0, "c", AckKind.ACK, 2), ops.ConsumerAck(T0, "c", AckKind.NAK, 1),
               ops.ConsumerDelivered(T0 + 1, "c", 1), ops.ConsumerAck(T0, "c", AckKind.ACK, 1),
               ops.ConsumerAck(T0, "other", AckKind.ACK, 3)]
    for op in script:
        stream.apply(op)
        core.apply(op)
    assert core.consumer.state.encode() == stream.consumers["c"].state.encode()
    report = core.report(T0)
    assert (report.delivered_sseq, report.floor_sseq, report.pending) == (3, 2, (3,))
    assert not core.changed


def test_interest_removal_waits_for_every_consumer_wherever_its_state_lives() -> None:
    stream = stream_with(0, retention="interest")
    stream.attach_consumer("in", {"ack_policy": "explicit"})
    stream.attach_consumer("own", {"ack_policy": "explicit", "mem_storage": True})
    for _ in range(4):
        stream.apply(ops.StreamMsg(T0, "t.a", "", b"", b"x"))
    core = _core(stream, "own")
    _deliver_ack(core, [1, 2, 3], [1, 3])
    assert stream.apply(core.report(T0)) == []  # "in" acked nothing yet
    for s in (1, 2, 3):
        stream.apply(ops.ConsumerDelivered(T0, "in", s))
        stream.apply(ops.ConsumerAck(T0, "in", AckKind.ACK, s))
    assert list(stream.store.seqs()) == [2, 4]  # 1 and 3 acked by both; "own" still has 2
    _deliver_ack(core, [], [2])
    assert stream.apply(core.report(T0)) == [Removed((2,))]
    assert list(stream.store.seqs()) == [4]


def test_workqueue_ack_in_a_consumer_group_removes_the_message() -> None:
    stream = stream_with(0, retention="workqueue")
    stream.attach_consumer("w", {"ack_policy": "explicit", "mem_storage": True})
    for _ in range(3):
        stream.apply(ops.StreamMsg(T0, "t.a", "", b"", b"x"))
    core = _core(stream, "w")
    _deliver_ack(core, [1, 2, 3], [2])
    assert stream.apply(core.report(T0)) == [Removed((2,))]
    assert stream.consumers["w"].state.floor_sseq == 0
    _deliver_ack(core, [], [1])
    assert stream.apply(core.report(T0)) == [Removed((1,))]


@pytest.mark.parametrize("seed", range(6))
def test_reports_in_any_order_never_remove_an_unacked_message(seed: int) -> None:
    """Reports of an old and a new consumer leader may reach the stream's log in any order:
    each is the group's state at some index and acks only grow there, so whatever the order
    only acked messages go, and two stream replicas applying the same log agree."""
    rnd = random.Random(seed)
    stream = stream_with(0, retention="interest")
    stream.attach_consumer("own", {"ack_policy": "explicit", "mem_storage": True})
    for _ in range(30):
        stream.apply(ops.StreamMsg(T0, "t.a", "", b"", b"x"))
    core, reports, acked = _core(stream, "own"), [], set()
    for s in range(1, 31):
        core.apply(ops.ConsumerDelivered(T0, "own", s))
        if rnd.random() < 0.6:
            core.apply(ops.ConsumerAck(T0, "own", AckKind.ACK, s))
            acked.add(s)
        if rnd.random() < 0.3:
            reports.append(core.report(T0))
    reports.append(core.report(T0))
    rnd.shuffle(reports)
    replicas = [stream_with(0, retention="interest") for _ in range(2)]
    for r in replicas:
        r.attach_consumer("own", {"ack_policy": "explicit", "mem_storage": True})
        for op in itertools.chain((ops.StreamMsg(T0, "t.a", "", b"", b"x") for _ in range(30)),
                                  reports):
            r.apply(op)
            assert acked >= set(range(1, r.last_seq + 1)) - set(r.store.seqs())
    assert set(range(1, 31)) - set(replicas[0].store.seqs()) == acked  # the newest report's
    assert list(replicas[0].store.seqs()) == list(replicas[1].store.seqs())
    assert replicas[0].consumers["own"].state.encode() == \
        replicas[1].consumers["own"].state.encode()


def test_group_state_for_an_unknown_consumer_changes_nothing() -> None:
    stream = stream_with(2, retention="workqueue")
    assert stream.apply(ops.ConsumerGroupState(T0, "gone", 2, 2, ())) == []
    assert list(stream.store.seqs()) == [1, 2]


def test_group_state_entry_layout() -> None:
    op = ops.ConsumerGroupState(7, "cg", 9, 3, (4, 8))
    raw = ops.encode(op)
    assert raw[0] == 31 and ops.decode(raw) == op
    for bad in (raw[:-1], raw + b"\0", raw[:9] + b"\x09" + raw[10:]):
        with pytest.raises(ops.EntryFormatError):
            ops.decode(bad)


def test_replace_keeps_the_peers_still_in_the_stream_leader_first() -> None:
    """Re-placing a consumer group: its peers that still hold a stream replica stay (the
    group's leader first, so a shrink keeps it), new ones come from the stream's others."""
    up = lambda p: p != 44  # noqa: E731
    assert cgroup.replace([11, 22, 33], [11, 22, 33], 1, up, {}, leader=22) == [22]
    assert cgroup.replace([11, 22, 33], [11, 22, 33], 2, up, {}, leader=33) == [33, 11]
    assert cgroup.replace([11], [11, 22, 33], 3, up, {})[:1] == [11]
    assert sorted(cgroup.replace([11], [11, 22, 33], 3, up, {})) == [11, 22, 33]
    assert cgroup.replace([11], [22, 33], 1, up, {22: 5}) == [33]  # 11 left the stream
    assert cgroup.replace([11], [11, 44], 2, up, {}) == []  # 44 is down: cannot grow


def test_explicit_replicas_above_the_streams_are_lowered() -> None:
    assert cgroup.capped({"num_replicas": 3}, {"num_replicas": 1}) == {"num_replicas": 1}
    assert cgroup.capped({"num_replicas": 1}, {"num_replicas": 3}) is None
    assert cgroup.capped({"num_replicas": 0}, {"num_replicas": 1}) is None

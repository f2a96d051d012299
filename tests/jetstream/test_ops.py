"""Raft entry formats: exact bytes, round trips, and refusal of anything malformed."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.jetstream import ops

SUBJECT = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40)


def test_stream_msg_layout_is_stable() -> None:
    raw = ops.encode(ops.StreamMsg(7, "a.b", "r", b"H", b"data"))
    assert raw == (bytes([1]) + struct.pack("<q", 7) + struct.pack("<HHII", 3, 1, 1, 4)
                   + b"a.b" + b"r" + b"H" + b"data")


def test_other_layouts_are_stable() -> None:
    assert ops.encode(ops.DeleteMsg(5, 9, no_erase=True)) == \
        bytes([2]) + struct.pack("<qQB", 5, 9, 1)
    assert ops.encode(ops.Purge(5, "x.*", 3, 2)) == \
        bytes([3]) + struct.pack("<qQQH", 5, 3, 2, 3) + b"x.*"
    assert ops.encode(ops.Expire(11)) == bytes([4]) + struct.pack("<q", 11)
    assert ops.encode(ops.ConsumerDelivered(3, "c1", 8)) == \
        bytes([16]) + struct.pack("<qHQ", 3, 2, 8) + b"c1"
    assert ops.encode(ops.ConsumerAck(3, "c1", 2, 8, 500)) == \
        bytes([17]) + struct.pack("<qHBQq", 3, 2, 2, 8, 500) + b"c1"


def test_stream_msgs_layout_is_stable() -> None:
    one = ops.encode(ops.StreamMsg(7, "a", "", b"", b"x"))
    two = ops.encode(ops.StreamMsg(9, "b", "r", b"", b""))
    assert ops.encode(ops.StreamMsgs(7, (ops.decode(one), ops.decode(two)))) == \
        bytes([24]) + struct.pack("<qI", 7, 2) + struct.pack("<I", len(one)) + one + \
        struct.pack("<I", len(two)) + two


def test_op_codes_are_append_only() -> None:
    # Released values keep their meaning: old WALs are replayed by new code.
    assert {op.name: op.value for op in ops.EntryOp} == {
        "STREAM_MSG": 1, "DELETE_MSG": 2, "PURGE": 3, "EXPIRE": 4,
        "UPDATE_CONFIG": 5, "CONSUMER_DELIVERED": 16, "CONSUMER_ACK": 17, "STREAM_BATCH": 18,
        "CONSUMER_UPSERT": 19, "CONSUMER_DELETE": 20, "RESTORE_MSGS": 13, "CONSUMER_STATE": 21,
        "SOURCE_MSGS": 12, "CONSUMER_FORGET": 30, "CONSUMER_GROUP_STATE": 31,
        "STREAM_MSGS": 24, "CONSUMER_DELIVERED_MANY": 22, "CONSUMER_ACKS": 23}


def test_consumer_forget_layout() -> None:
    assert ops.encode(ops.ConsumerForget(3, "mc")) == bytes([30]) + struct.pack("<qH", 3, 2) + b"mc"


def test_consumer_round_layouts() -> None:
    """A delivery round and a run of acks as one entry each (docs/jetstream.md)."""
    assert ops.encode(ops.ConsumerDeliveredMany(3, "c1", (8, 9))) == \
        bytes([22]) + struct.pack("<qHI", 3, 2, 2) + b"c1" + struct.pack("<QQ", 8, 9)
    assert ops.encode(ops.ConsumerAcks(3, "c1", ((1, 8, 0), (2, 9, -5)))) == \
        bytes([23]) + struct.pack("<qHI", 3, 2, 2) + b"c1" + struct.pack("<BQqBQq", 1, 8, 0,
                                                                         2, 9, -5)


@given(name=st.text(max_size=20), seqs=st.lists(st.integers(0, (1 << 64) - 1), min_size=1,
                                                max_size=20),
       kinds=st.lists(st.integers(1, 6), min_size=1, max_size=20),
       delay=st.integers(-(1 << 63), (1 << 63) - 1))
def test_consumer_round_roundtrip(name: str, seqs: list[int], kinds: list[int],
                                  delay: int) -> None:
    many = ops.ConsumerDeliveredMany(4, name, tuple(seqs))
    acks = ops.ConsumerAcks(5, name, tuple((k, s, delay) for k, s in zip(kinds, seqs,
                                                                         strict=False)))
    assert ops.decode(ops.encode(many)) == many
    assert ops.decode(ops.encode(acks)) == acks


def test_source_msgs_layout_and_refusals() -> None:
    op = ops.SourceMsgs(7, "O > >", "ID", (ops.SourcedMsg(3, 9, "o.a", b"H", b"dd"),))
    raw = ops.encode(op)
    assert raw == bytes([12]) + struct.pack("<qHHI", 7, 5, 2, 1) + b"O > >ID" + \
        struct.pack("<QqHII", 3, 9, 3, 1, 2) + b"o.aHdd"
    assert ops.decode(raw) == op
    for bad in (raw[:-1], raw + b"x", raw[:9] + struct.pack("<HHI", 5, 2, 0) + raw[17:]):
        with pytest.raises(ops.EntryFormatError):
            ops.decode(bad)


@given(now=st.integers(-(1 << 63), (1 << 63) - 1), subject=SUBJECT, reply=st.text(max_size=20),
       hdr=st.binary(max_size=64), data=st.binary(max_size=256))
def test_stream_msg_roundtrip(now: int, subject: str, reply: str, hdr: bytes,
                              data: bytes) -> None:
    op = ops.StreamMsg(now, subject, reply, hdr, data)
    assert ops.decode(ops.encode(op)) == op


@given(seq=st.integers(0, (1 << 64) - 1), keep=st.integers(0, (1 << 64) - 1),
       filt=st.text(max_size=30), flag=st.booleans())
def test_purge_and_delete_roundtrip(seq: int, keep: int, filt: str, flag: bool) -> None:
    for op in (ops.Purge(1, filt, seq, keep), ops.DeleteMsg(2, seq, flag), ops.Expire(3),
               ops.ConsumerDelivered(4, filt, seq), ops.ConsumerAck(5, filt, 2, seq, -7),
               ops.UpdateConfig(6, filt.encode()), ops.ConsumerDelete(8, filt),
               ops.ConsumerForget(9, filt),
               ops.ConsumerUpsert(7, filt, b'{"a":1}', seq, keep)):
        assert ops.decode(ops.encode(op)) == op


@pytest.mark.parametrize("raw", [
    b"", b"\x01", bytes([99]) + bytes(8), bytes([0]) + bytes(8),
    ops.encode(ops.StreamMsg(1, "a", "", b"", b"xy"))[:-1],
    ops.encode(ops.StreamMsg(1, "a", "", b"", b"xy")) + b"!",
    ops.encode(ops.DeleteMsg(1, 2)) + b"\x00",
    ops.encode(ops.DeleteMsg(1, 2))[:-1] + b"\x80",
    ops.encode(ops.Purge(1, "abc"))[:-1],
    ops.encode(ops.Expire(1)) + b"\x00",
    ops.encode(ops.ConsumerDelivered(1, "c", 5)) + b"x",
    ops.encode(ops.ConsumerAck(1, "c", 9, 5)),
    ops.encode(ops.ConsumerAck(1, "c", 1, 5))[:-2],
    ops.encode(ops.StreamBatch(1, "b", (ops.StreamMsg(1, "a", "", b"", b"x"),)))[:-1],
    ops.encode(ops.StreamBatch(1, "b", (ops.StreamMsg(1, "a", "", b"", b"x"),))) + b"z",
    # A STREAM_MSGS entry (merged publishes) with bytes after its last part.
    ops.encode(ops.StreamMsgs(1, (ops.StreamMsg(1, "a", "", b"", b"x"),
                                  ops.StreamMsg(1, "b", "", b"", b"y")))) + b"z",
    bytes([18]) + struct.pack("<qHI", 1, 1, 0) + b"b",
    ops.encode(ops.UpdateConfig(1, b"{}")) + b"x",
    ops.encode(ops.ConsumerUpsert(1, "c", b"{}"))[:-1],
    ops.encode(ops.ConsumerDelete(1, "c")) + b"x",
    ops.encode(ops.ConsumerForget(1, "c"))[:-1],
    ops.encode(ops.ConsumerDeliveredMany(1, "c", (5, 6)))[:-1],
    ops.encode(ops.ConsumerDeliveredMany(1, "c", (5, 6))) + b"x",
    bytes([22]) + struct.pack("<qHI", 1, 1, 0) + b"c",
    ops.encode(ops.ConsumerAcks(1, "c", ((1, 5, 0),)))[:-1],
    ops.encode(ops.ConsumerAcks(1, "c", ((1, 5, 0), (7, 6, 0)))),
    bytes([23]) + struct.pack("<qHI", 1, 1, 0) + b"c",
])
def test_malformed_entries_are_refused(raw: bytes) -> None:
    with pytest.raises(ops.EntryFormatError):
        ops.decode(raw)


@given(st.binary(max_size=64))
def test_decode_never_crashes_otherwise(raw: bytes) -> None:
    try:
        ops.decode(raw)
    except ops.EntryFormatError:
        pass


@given(batch_id=st.text(max_size=10), msgs=st.lists(
    st.tuples(SUBJECT, st.binary(max_size=20), st.binary(max_size=40)), min_size=1, max_size=5))
def test_stream_batch_roundtrip(batch_id: str, msgs: list[tuple[str, bytes, bytes]]) -> None:
    op = ops.StreamBatch(7, batch_id, tuple(ops.StreamMsg(7, s, "r", hd, d) for s, hd, d in msgs))
    assert ops.decode(ops.encode(op)) == op

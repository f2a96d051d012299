"""The snapshot byte stream (snapshot.py) and the restore entries (RESTORE_MSGS,
CONSUMER_STATE): round trips, any chunking, damaged streams refused."""

from __future__ import annotations

import pytest

from node.jetstream import ops
from node.jetstream.ops import RestoredMsg
from node.jetstream.snapshot import SnapshotError, SnapshotReader, SnapshotWriter

MSGS = [RestoredMsg(s, 1_000 + s, f"a.{s}", b"NATS/1.0\r\nk: v\r\n\r\n" if s % 2 else b"",
                    bytes([s]) * (s * 700)) for s in (1, 2, 4, 7, 9)]
HEADER = {"config": {"name": "S"}, "consumers": [], "last_seq": 10, "last_ts": 99}


def _chunks(size: int) -> list[bytes]:
    return list(SnapshotWriter(HEADER).chunks(MSGS, size))


@pytest.mark.parametrize("size", [1024, 4096, 1 << 20])
def test_round_trip_in_any_chunking(size: int) -> None:
    reader = SnapshotReader()
    got: list[RestoredMsg] = []
    for chunk in _chunks(size):
        assert len(chunk) <= max(size, 1024)
        reader.feed(chunk)
        got += reader.take()
    reader.finish()
    assert reader.header == HEADER and got == MSGS


def test_damage_is_refused() -> None:
    data = b"".join(_chunks(1 << 20))
    for bad in (data[:-3], data + b"x", data[:40] + bytes([data[40] ^ 1]) + data[41:]):
        reader = SnapshotReader()
        with pytest.raises(SnapshotError):
            reader.feed(bad)
            reader.finish()
    with pytest.raises(SnapshotError):
        SnapshotReader().feed(b"not a snapshot at all")


def test_restore_entries_round_trip() -> None:
    op = ops.RestoreMsgs(5, tuple(MSGS), 10, 99)
    assert ops.decode(ops.encode(op)) == op
    state = ops.ConsumerState(6, "c", b'{"d":[3,2]}')
    assert ops.decode(ops.encode(state)) == state
    with pytest.raises(ops.EntryFormatError):
        ops.decode(ops.encode(op) + b"x")


def test_a_flipped_byte_inside_a_message_fails_the_checksum() -> None:
    import zlib

    raw = bytearray(zlib.decompress(b"".join(_chunks(1 << 20))))
    raw[len(raw) // 2] ^= 0x40  # in some message's data: the stream still decompresses
    reader = SnapshotReader()
    with pytest.raises(SnapshotError, match="checksum"):
        reader.feed(zlib.compress(bytes(raw)))
        reader.finish()

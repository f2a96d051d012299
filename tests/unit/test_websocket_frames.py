"""Unit tests for the pure parts of node/websocket.py: the upgrade handshake
and the frame codec. Client frames are also built with the independent
`websockets` library, so our codec is checked against another implementation."""

from __future__ import annotations

import os
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.extensions.permessage_deflate import PerMessageDeflate
from websockets.frames import Frame, Opcode

from node import websocket as ws
from node.websocket import Close, Data, Ping, Pong, WsCodec, WsError

KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # the RFC 6455 section 1.3 example


def request(**overrides: str | None) -> bytes:
    headers = {
        "Host": "127.0.0.1",
        "Upgrade": "websocket",
        "Connection": "keep-alive, Upgrade",
        "Sec-WebSocket-Key": KEY,
        "Sec-WebSocket-Version": "13",
    }
    method = overrides.pop("method", None) or "GET"
    for k, v in overrides.items():
        name = k.replace("_", "-")
        headers.pop(name, None)
        if v is not None:
            headers[name] = v
    lines = [f"{method} / HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def masked(opcode: int, payload: bytes, fin: bool = True, rsv1: bool = False) -> bytes:
    return ws.encode_frame(opcode, payload, fin=fin, mask=os.urandom(4), rsv1=rsv1)


def data_of(events) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, Data))


def parse_server_frames(raw: bytes) -> list[tuple[int, bool, bytes]]:
    """A minimal decoder for unmasked server frames: (opcode, rsv1, payload)."""
    out, i = [], 0
    while i < len(raw):
        b0, b1 = raw[i], raw[i + 1]
        assert not b1 & 0x80, "server frames must not be masked"
        n, i = b1 & 0x7F, i + 2
        if n == 126:
            n, i = int.from_bytes(raw[i:i + 2], "big"), i + 2
        elif n == 127:
            n, i = int.from_bytes(raw[i:i + 8], "big"), i + 8
        out.append((b0 & 0x0F, bool(b0 & 0x40), raw[i:i + n]))
        i += n
    return out


# ----------------------------------------------------------------------- handshake


def test_accept_key_rfc_example():
    assert ws.accept_key(KEY) == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_handshake_ok():
    hs = ws.handshake(request(), compression=False)
    assert hs.ok and not hs.compress
    text = hs.response.decode()
    assert text.startswith("HTTP/1.1 101 Switching Protocols\r\n")
    assert "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in text
    assert text.endswith("\r\n\r\n") and "Extensions" not in text


@pytest.mark.parametrize(
    "overrides",
    [
        {"Upgrade": None},
        {"Upgrade": "h2c"},
        {"Connection": "keep-alive"},
        {"Sec-WebSocket-Key": None},
        {"Sec-WebSocket-Key": "short"},
        {"Sec-WebSocket-Version": "8"},
    ],
)
def test_handshake_rejects_bad_requests(overrides):
    hs = ws.handshake(request(**overrides), compression=True)
    assert not hs.ok and hs.response.startswith(b"HTTP/1.1 400 Bad Request\r\n")


def test_handshake_rejects_other_methods_and_garbage():
    assert ws.handshake(request(method="POST"), False).response.startswith(b"HTTP/1.1 405")
    assert not ws.handshake(b"GET /\r\n\r\n", False).ok
    assert not ws.handshake(b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", False).ok


def test_handshake_negotiates_compression_only_when_both_want_it():
    offer = "permessage-deflate; client_max_window_bits"
    hs = ws.handshake(request(Sec_WebSocket_Extensions=offer), compression=True)
    assert hs.ok and hs.compress
    assert b"permessage-deflate; server_no_context_takeover; client_no_context_takeover" in (
        hs.response
    )
    assert not ws.handshake(request(Sec_WebSocket_Extensions=offer), compression=False).compress
    assert not ws.handshake(request(), compression=True).compress


# ----------------------------------------------------------------------- inbound frames


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 200_000])
def test_lengths_and_masking(size):
    payload = os.urandom(size)
    codec = WsCodec()
    assert data_of(codec.feed(masked(ws.OP_BINARY, payload))) == payload


def test_text_frames_carry_nats_bytes_too():
    assert WsCodec().feed(masked(ws.OP_TEXT, b"PING\r\n")) == [Data(b"PING\r\n")]


def test_byte_by_byte_feed():
    payload = b"PUB foo 5\r\nhello\r\n" * 20
    raw = masked(ws.OP_BINARY, payload) + masked(ws.OP_PING, b"hi")
    codec = WsCodec()
    events = []
    for i in range(len(raw)):
        events += codec.feed(raw[i:i + 1])
    assert data_of(events) == payload
    assert events[-1] == Ping(b"hi")


def test_fragmented_message_with_interleaved_control_frames():
    raw = (
        masked(ws.OP_BINARY, b"PUB a 2\r\n", fin=False)
        + masked(ws.OP_PING, b"p")
        + masked(ws.OP_CONT, b"hi", fin=False)
        + masked(ws.OP_PONG, b"")
        + masked(ws.OP_CONT, b"\r\n", fin=True)
        + masked(ws.OP_BINARY, b"PING\r\n")
    )
    events = WsCodec().feed(raw)
    assert data_of(events) == b"PUB a 2\r\nhi\r\nPING\r\n"
    assert Ping(b"p") in events and Pong(b"") in events


def test_close_frames():
    assert WsCodec().feed(masked(ws.OP_CLOSE, ws.close_payload(1001, "bye"))) == [
        Close(1001, "bye")
    ]
    codec = WsCodec()
    assert codec.feed(masked(ws.OP_CLOSE, b"")) == [Close(ws.CLOSE_NO_STATUS, "")]
    assert codec.closed and codec.feed(masked(ws.OP_BINARY, b"x")) == []


@pytest.mark.parametrize(
    "raw",
    [
        ws.encode_frame(ws.OP_BINARY, b"unmasked"),
        masked(ws.OP_PING, b"x" * 126),
        masked(ws.OP_PING, b"x", fin=False),
        masked(ws.OP_CONT, b"x"),
        masked(ws.OP_BINARY, b"x", rsv1=True),  # compression not negotiated
        masked(0x3, b"x"),
        masked(ws.OP_CLOSE, b"\x03"),
        masked(ws.OP_BINARY, b"a", fin=False) + masked(ws.OP_TEXT, b"b"),
        bytes((0x82, 0xFF)) + (1 << 63).to_bytes(8, "big") + b"mask",
    ],
    ids=["unmasked", "big-control", "fragmented-control", "orphan-cont", "rsv1", "opcode",
         "close-1-byte", "nested-message", "length-msb"],
)
def test_protocol_violations(raw):
    with pytest.raises(WsError) as info:
        WsCodec().feed(raw)
    assert info.value.code == ws.CLOSE_PROTOCOL_ERROR


def test_frames_from_the_websockets_library():
    codec = WsCodec()
    raw = Frame(Opcode.BINARY, b"SUB foo 1\r\n", fin=False).serialize(mask=True)
    raw += Frame(Opcode.PING, b"x").serialize(mask=True)
    raw += Frame(Opcode.CONT, b"PING\r\n").serialize(mask=True)
    events = codec.feed(raw)
    assert data_of(events) == b"SUB foo 1\r\nPING\r\n" and Ping(b"x") in events


def test_compressed_messages_from_the_websockets_library():
    """permessage-deflate, with and without client context takeover."""
    for no_takeover in (True, False):
        ext = PerMessageDeflate(False, no_takeover, 15, 15)
        codec = WsCodec(compress=True)
        sent = [b"PUB foo 11\r\nhello world\r\n" * n for n in (1, 3, 50)] + [b"PING\r\n"]
        raw = b"".join(
            Frame(Opcode.BINARY, m).serialize(mask=True, extensions=[ext]) for m in sent
        )
        assert data_of(codec.feed(raw)) == b"".join(sent)


def test_compressed_fragmented_message():
    deflater = zlib.compressobj(wbits=-15)
    body = deflater.compress(b"PUB x 3\r\nabc\r\n" * 100) + deflater.flush(zlib.Z_SYNC_FLUSH)
    body = body[:-4]
    half = len(body) // 2
    raw = masked(ws.OP_BINARY, body[:half], fin=False, rsv1=True) + masked(
        ws.OP_CONT, body[half:]
    )
    assert data_of(WsCodec(compress=True).feed(raw)) == b"PUB x 3\r\nabc\r\n" * 100


def test_corrupt_compressed_data():
    with pytest.raises(WsError):
        WsCodec(compress=True).feed(masked(ws.OP_BINARY, b"\xff" * 40, rsv1=True))


@settings(max_examples=150, deadline=None)
@given(
    messages=st.lists(st.binary(max_size=300), min_size=1, max_size=6),
    splits=st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=97), min_size=1, max_size=12),
    compress=st.booleans(),
)
def test_fuzz_fragmentation_and_chunking(messages, splits, cuts, compress):
    """Any fragmentation of any messages, fed in any chunking, yields the
    concatenated payloads (and the pings that were interleaved)."""
    raw = b""
    pings = 0
    for m in messages:
        body, rsv1 = m, False
        if compress:
            d = zlib.compressobj(wbits=-15)
            body, rsv1 = (d.compress(m) + d.flush(zlib.Z_SYNC_FLUSH))[:-4], True
        pieces, pos, k = [], 0, 0
        while pos < len(body) or not pieces:
            step = splits[k % len(splits)]
            pieces.append(body[pos:pos + step])
            pos, k = pos + step, k + 1
        for i, piece in enumerate(pieces):
            op = ws.OP_BINARY if i == 0 else ws.OP_CONT
            raw += masked(op, piece, fin=i == len(pieces) - 1, rsv1=rsv1 and i == 0)
            if i % 2:
                raw += masked(ws.OP_PING, b"p")
                pings += 1
    codec = WsCodec(compress=compress)
    events, pos, k = [], 0, 0
    while pos < len(raw):
        step = cuts[k % len(cuts)]
        events += codec.feed(raw[pos:pos + step])
        pos, k = pos + step, k + 1
    assert data_of(events) == b"".join(messages)
    assert sum(isinstance(e, Ping) for e in events) == pings


# ----------------------------------------------------------------------- outbound frames


@pytest.mark.parametrize("size", [0, 10, 125, 126, 70_000])
def test_server_frames_are_unmasked_binary(size):
    payload = os.urandom(size)
    [(op, rsv1, body)] = parse_server_frames(WsCodec().encode(payload))
    assert op == ws.OP_BINARY and not rsv1 and body == payload


def test_server_compression_round_trip():
    payload = b"MSG foo 1 5\r\nhello\r\n" * 40
    [(op, rsv1, body)] = parse_server_frames(WsCodec(compress=True).encode(payload))
    assert op == ws.OP_BINARY and rsv1 and len(body) < len(payload)
    assert zlib.decompressobj(wbits=-15).decompress(body + b"\x00\x00\xff\xff") == payload
    # Tiny messages are not worth compressing.
    [(_, rsv1, body)] = parse_server_frames(WsCodec(compress=True).encode(b"PONG\r\n"))
    assert not rsv1 and body == b"PONG\r\n"


def test_control_frames_out():
    assert parse_server_frames(WsCodec.pong(b"x")) == [(ws.OP_PONG, False, b"x")]
    assert parse_server_frames(WsCodec.close(1000)) == [(ws.OP_CLOSE, False, b"\x03\xe8")]
    assert parse_server_frames(WsCodec.close(ws.CLOSE_NO_STATUS)) == [(ws.OP_CLOSE, False, b"")]


def _deflated(data: bytes) -> bytes:
    deflater = zlib.compressobj(wbits=-15)
    return (deflater.compress(data) + deflater.flush(zlib.Z_SYNC_FLUSH))[:-4]


def test_inflated_size_is_bounded_per_message():
    limit = 10_000
    exact = _deflated(b"x" * limit)
    assert data_of(WsCodec(compress=True, max_inflated=limit).feed(
        masked(ws.OP_BINARY, exact, rsv1=True))) == b"x" * limit
    over = _deflated(b"x" * (limit + 1))
    with pytest.raises(WsError) as info:
        WsCodec(compress=True, max_inflated=limit).feed(masked(ws.OP_BINARY, over, rsv1=True))
    assert info.value.code == ws.CLOSE_TOO_BIG


def test_inflated_budget_restarts_with_each_message():
    codec = WsCodec(compress=True, max_inflated=1000)
    one = masked(ws.OP_BINARY, _deflated(b"y" * 800), rsv1=True)
    assert data_of(codec.feed(one + one)) == b"y" * 1600


def test_a_bomb_is_stopped_without_inflating_it():
    bomb = _deflated(b"z" * 50_000_000)  # ~50 KB on the wire
    codec = WsCodec(compress=True, max_inflated=1 << 20)
    with pytest.raises(WsError):
        codec.feed(masked(ws.OP_BINARY, bomb, rsv1=True))


def test_a_read_of_many_compressed_messages_is_decoded_one_batch_at_a_time():
    """A read full of compressed messages (a bomb spread over many frames, each under the
    per-message bound) is inflated a batch at a time: the caller hands each batch to the
    NATS parser, which closes a client sending garbage before CONNECT, so the rest of the
    read is never inflated (without `limit` one feed inflated all 16 MB)."""
    codec = WsCodec(compress=True, max_inflated=1 << 20)
    one = masked(ws.OP_BINARY, _deflated(b"q" * (1 << 20)), rsv1=True)  # ~1 KB each
    first = data_of(codec.feed(one * 16, codec.max_inflated))
    assert len(first) == 1 << 20
    rest = b""
    while batch := codec.feed(b"", codec.max_inflated):
        rest += data_of(batch)
    assert len(rest) == 15 << 20  # nothing lost for a client that is not closed

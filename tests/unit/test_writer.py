"""Tests of the server->client encoders, checked against nats-py's client regexes and
against the bytes a real nats-server sends for the same deliveries."""

from __future__ import annotations

import json
import socket

from nats.protocol.parser import HMSG_RE, INFO_RE, MSG_RE

from node.protocol import writer


def test_constants() -> None:
    assert (writer.PING, writer.PONG, writer.OK) == (b"PING\r\n", b"PONG\r\n", b"+OK\r\n")


def test_msg() -> None:
    assert writer.msg("foo", "1", None, b"hi") == b"MSG foo 1 2\r\nhi\r\n"
    assert writer.msg("foo", "1", "", b"") == b"MSG foo 1 0\r\n\r\n"
    assert writer.msg("foo", b"9", "_INBOX.x", b"hi") == b"MSG foo 9 _INBOX.x 2\r\nhi\r\n"
    assert writer.msg("caf\u00e9", "1", None, b"x") == b"MSG caf\xc3\xa9 1 1\r\nx\r\n"
    payload = bytes(range(256)) * 10
    assert writer.msg(b"a", b"1", None, payload).endswith(payload + b"\r\n")


def test_hmsg() -> None:
    hdr = b"NATS/1.0\r\nA: b\r\n\r\n"
    assert writer.hmsg("foo", "1", None, hdr, b"hi") == (
        b"HMSG foo 1 %d %d\r\n%bhi\r\n" % (len(hdr), len(hdr) + 2, hdr))
    assert writer.hmsg("foo", "1", "r", hdr, b"") == (
        b"HMSG foo 1 r %d %d\r\n%b\r\n" % (len(hdr), len(hdr), hdr))


def test_err_and_info() -> None:
    assert writer.err("Unknown Protocol Operation") == b"-ERR 'Unknown Protocol Operation'\r\n"
    assert writer.info({"a": 1, "b": [True, None]}) == b'INFO {"a":1,"b":[true,null]} \r\n'
    # Go's encoder: raw UTF-8, HTML characters escaped.
    assert writer.info({"s": "<\u00e9&>\u2028"}) == (
        b'INFO {"s":"\\u003c\xc3\xa9\\u0026\\u003e\\u2028"} \r\n')


def test_nats_py_regexes_accept_our_frames() -> None:
    m = MSG_RE.match(writer.msg("foo.bar", "17", "_INBOX.a", b"hello"))
    assert m is not None and (m.group(1), m.group(2), m.group(4), m.group(5)) == (
        b"foo.bar", b"17", b"_INBOX.a", b"5")
    m = MSG_RE.match(writer.msg("foo", "1", None, b""))
    assert m is not None and m.group(4) is None and m.group(5) == b"0"
    m = HMSG_RE.match(writer.hmsg("foo", "1", "r", b"NATS/1.0\r\n\r\n", b"xy"))
    assert m is not None and (m.group(4), m.group(5), m.group(6)) == (b"r", b"12", b"14")
    m = INFO_RE.match(writer.info({"server_id": "X", "max_payload": 1048576}))
    assert m is not None and json.loads(m.group(1)) == {"server_id": "X", "max_payload": 1048576}


# ---------------------------------------------------------------- differential




def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    out = b""
    sock.settimeout(20)
    while marker not in out:
        chunk = sock.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def test_info_matches_nats_server(nats_port: int) -> None:
    with socket.create_connection(("127.0.0.1", nats_port), timeout=20) as sock:
        line = _read_until(sock, b"\r\n")
    assert line.startswith(b"INFO ")
    assert writer.info(json.loads(line[5:])) == line


def test_msg_and_hmsg_match_nats_server(nats_port: int) -> None:
    hdr = b"NATS/1.0\r\nX-Key: v\r\n\r\n"
    payload = bytes(range(256))
    with socket.create_connection(("127.0.0.1", nats_port), timeout=20) as sock:
        _read_until(sock, b"\r\n")
        sock.sendall(
            b'CONNECT {"verbose":false,"headers":true}\r\nSUB t.* 42\r\n'
            b"PUB t.a 3\r\nabc\r\nPUB t.b _INBOX.r 256\r\n%b\r\n"
            b"HPUB t.c %d %d\r\n%bxy\r\nHPUB t.d rep %d %d\r\n%b\r\nPING\r\n"
            % (payload, len(hdr), len(hdr) + 2, hdr, len(hdr), len(hdr), hdr))
        got = _read_until(sock, b"PONG\r\n")
    expected = (writer.msg("t.a", "42", None, b"abc")
                + writer.msg("t.b", "42", "_INBOX.r", payload)
                + writer.hmsg("t.c", "42", None, hdr, b"xy")
                + writer.hmsg("t.d", "42", "rep", hdr, b"")
                + writer.PONG)
    assert got == expected

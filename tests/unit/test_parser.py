"""Tests of the pure client-protocol parser.

The last part is differential: the same raw bytes go to a real nats-server over a socket
and to our parser, and the outcome (accepted / -ERR text / silent close) must agree.
"""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from node.protocol.events import Connect, HPub, Ping, Pong, Pub, Sub, Unsub
from node.protocol.parser import (
    ERR_MAX_CONTROL_LINE,
    ERR_MAX_PAYLOAD,
    ERR_UNKNOWN_OP,
    Parser,
    ProtocolError,
)

HDR_CONNECT = b'CONNECT {"verbose":false,"headers":true}\r\n'
HDR_EVENT = Connect({"verbose": False, "headers": True})


def parse_all(data: bytes, **kw) -> list:
    return Parser(**kw).feed(data)


def parse_error(data: bytes, **kw) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        Parser(**kw).feed(data)
    return info.value


def feed_chunks(data: bytes, cuts: list[int], **kw) -> tuple[list, ProtocolError | None]:
    """Feed data split at cuts; return all events and the error, if any."""
    parser = Parser(**kw)
    events: list = []
    bounds = [0, *sorted(cuts), len(data)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        try:
            events += parser.feed(data[a:b])
        except ProtocolError as err:
            return events + err.events, err
    return events, None


# ---------------------------------------------------------------- valid input

VALID = [
    (b"PING\r\n", [Ping()]),
    (b"ping\r\n", [Ping()]),
    (b"PiNg x y\r\n", [Ping()]),
    (b"PINGX\r\n", [Ping()]),
    (b"PING\n", [Ping()]),
    (b"PONG\r\n", [Pong()]),
    (b"pongs\n", [Pong()]),
    (b"+OK\r\n+okay\r\n", []),
    (b"INFO {}\r\nINFO{}\r\nINFO null\r\n", []),
    (b"PUB foo 2\r\nhi\r\n", [Pub("foo", None, b"hi")]),
    (b"PUB foo bar 2\r\nhi\r\n", [Pub("foo", "bar", b"hi")]),
    (b"PUB foo  2\r\nhi\r\n", [Pub("foo", None, b"hi")]),  # nats-py's empty reply
    (b"pub\tfoo \t bar\t 2 \r\nhi\r\n", [Pub("foo", "bar", b"hi")]),
    (b"PUB foo 2\nhi\r\n", [Pub("foo", None, b"hi")]),
    (b"PUB foo 0\r\n\r\n", [Pub("foo", None, b"")]),
    (b"PUB foo 000000004\r\n\r\n\r\n\r\n", [Pub("foo", None, b"\r\n\r\n")]),
    (b"PUB caf\xc3\xa9 1\r\nx\r\n", [Pub("caf\u00e9", None, b"x")]),
    (b"PUB foo\rbar 1\r\nx\r\n", [Pub("foo\rbar", None, b"x")]),  # only SP/TAB split PUB
    (b"SUB foo 1\rx\r\n", [Sub("foo", "1", "x")]),  # ...but SUB splits on CR too
    (b"SUB foo 1\r\n", [Sub("foo", None, "1")]),
    (b"sub foo q 1\r\n", [Sub("foo", "q", "1")]),
    (b"SUB\tfoo  \t 1 \r\n", [Sub("foo", None, "1")]),
    (b"UNSUB 1\r\n", [Unsub("1", None)]),
    (b"UNSUB 1 5\r\n", [Unsub("1", 5)]),
    (b"unsub 1 0\r\nUNSUB 2 x\r\nUNSUB 3 -5\r\n",
     [Unsub("1", None), Unsub("2", None), Unsub("3", None)]),
    (b'CONNECT {"verbose":true}\r\n', [Connect({"verbose": True})]),
    (b"CONNECT{}\r\nconnect\t {}\r\nCONNECT null\r\n", [Connect({})] * 3),
    (b'CONNECT {"VERBOSE":true,"zzz":[1]}\r\n', [Connect({"verbose": True, "zzz": [1]})]),
    (b'CONNECT {"verbose":null,"name":"\\ud800"}\r\n', [Connect({"name": "\ufffd"})]),
    (HDR_CONNECT + b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
     [HDR_EVENT, HPub("foo", None, b"NATS/1.0\r\n\r\n", b"hi")]),
    (HDR_CONNECT + b"hpub foo bar 0 0\r\n\r\n", [HDR_EVENT, HPub("foo", "bar", b"", b"")]),
    (b'CONNECT {"Headers":true}\r\nCONNECT null\r\nHPUB a 0 0\r\n\r\n',
     [Connect({"headers": True}), Connect({}), HPub("a", None, b"", b"")]),
    (b"PING\r\nPUB a 1\r\nx\r\nSUB a 9\r\nPONG\r\n",
     [Ping(), Pub("a", None, b"x"), Sub("a", None, "9"), Pong()]),
]


@pytest.mark.parametrize("data,expected", VALID)
def test_valid_frames(data: bytes, expected: list) -> None:
    assert parse_all(data) == expected


@pytest.mark.parametrize("data,expected", VALID)
def test_valid_frames_byte_by_byte(data: bytes, expected: list) -> None:
    assert feed_chunks(data, list(range(1, len(data)))) == (expected, None)


def test_random_chunkings_of_a_long_stream() -> None:
    rng = random.Random(7)
    stream = HDR_CONNECT + b"".join(d.replace(HDR_CONNECT, b"") for d, _ in VALID)
    whole = parse_all(stream)
    assert len(whole) > 30
    for _ in range(300):
        cuts = rng.sample(range(1, len(stream)), rng.randint(1, 40))
        assert feed_chunks(stream, cuts) == (whole, None)


def test_partial_frames_are_kept_and_bounded() -> None:
    parser = Parser(max_payload=100)
    assert parser.feed(b"PUB foo 100\r\n" + b"x" * 50) == []
    assert parser.buffered == len(b"PUB foo 100\r\n") + 50
    assert parser.feed(b"y" * 50 + b"\r") == []
    assert parser.feed(b"\nPING\r\n") == [Pub("foo", None, b"x" * 50 + b"y" * 50), Ping()]
    assert parser.buffered == 0


def test_long_ping_line_is_not_buffered() -> None:
    parser = Parser(max_control_line=16)
    assert parser.feed(b"PING ") == []
    for _ in range(100):
        assert parser.feed(b"z" * 1000) == []
        assert parser.buffered == 0
    assert parser.feed(b"\r\nPONG\r\n") == [Ping(), Pong()]


def test_max_payload_is_mutable() -> None:
    parser = Parser(max_payload=4)
    assert parser.feed(b"PUB a 4\r\nabcd\r\n") == [Pub("a", None, b"abcd")]
    parser.max_payload = 8
    assert parser.feed(b"PUB a 8\r\nabcdefgh\r\n") == [Pub("a", None, b"abcdefgh")]
    parser.max_payload = -1  # negative: no limit
    assert parser.feed(b"PUB a 9\r\nabcdefghi\r\n") == [Pub("a", None, b"abcdefghi")]


def test_control_line_limit_boundary() -> None:
    ok = b"PUB " + b"s" * 62 + b" 1\r\nx\r\n"  # argument of exactly 64 bytes
    assert parse_all(ok, max_control_line=64) == [Pub("s" * 62, None, b"x")]
    assert feed_chunks(ok, list(range(1, len(ok))), max_control_line=64)[1] is None
    too_long = b"PUB " + b"s" * 63 + b" 1\r\nx\r\n"
    assert parse_error(too_long, max_control_line=64).message == ERR_MAX_CONTROL_LINE
    err = feed_chunks(too_long, list(range(1, len(too_long))), max_control_line=64)[1]
    assert err is not None and err.message == ERR_MAX_CONTROL_LINE


def test_headers_need_client_opt_in() -> None:
    assert not parse_error(b"HPUB foo 0 0\r\n\r\n").send_err
    err = parse_error(HDR_CONNECT + b"HPUB foo 0 0\r\n\r\n", headers=False)
    assert err.message == "message headers not supported"
    # A later CONNECT without the field keeps it (Go decodes into the same struct).
    again = HDR_CONNECT + b"CONNECT {}\r\nHPUB a 0 0\r\n\r\n"
    assert parse_all(again)[-1] == HPub("a", None, b"", b"")
    off = HDR_CONNECT + b'CONNECT {"headers":false}\r\nHPUB a 0 0\r\n\r\n'
    assert parse_error(off).message == "message headers not supported"


# ---------------------------------------------------------------- errors

LOUD = [  # nats-server sends -ERR '<text>' and closes
    (b"FOO\r\n", ERR_UNKNOWN_OP),
    (b"FOO", ERR_UNKNOWN_OP),
    (b"\r\n", ERR_UNKNOWN_OP),
    (b" PING\r\n", ERR_UNKNOWN_OP),
    (b"\x00\r\n", ERR_UNKNOWN_OP),
    (b"PUB\r\n", ERR_UNKNOWN_OP),
    (b"PUBX foo 1\r\n", ERR_UNKNOWN_OP),
    (b"PUBX", ERR_UNKNOWN_OP),
    (b"PU\r\n", ERR_UNKNOWN_OP),
    (b"UNSUB\r\n", ERR_UNKNOWN_OP),
    (b"HPUB\r\n", ERR_UNKNOWN_OP),
    (b"+O\r\n", ERR_UNKNOWN_OP),
    (b"-ERR\r\n", ERR_UNKNOWN_OP),
    (b"MSG foo 1 2\r\nhi\r\n", ERR_UNKNOWN_OP),
    (b"PUB foo 2\r\nhix\r\n", ERR_UNKNOWN_OP),
    (b"PUB foo 2\r\nhi\n", ERR_UNKNOWN_OP),
    (b"PUB foo 1\r\nx\r\r\n", ERR_UNKNOWN_OP),
    (b"PUB foo 1\r\nxY", ERR_UNKNOWN_OP),
    (b"PUB foo 1\n\nx\r\n", ERR_UNKNOWN_OP),
    (b"PUB foo 1048577\r\n", ERR_MAX_PAYLOAD),
    (b"PUB foo 123456789\r\n", ERR_MAX_PAYLOAD),
    (HDR_CONNECT + b"HPUB foo 3 1048577\r\n", ERR_MAX_PAYLOAD),
    (b"SUB " + b"x" * 10000, ERR_MAX_CONTROL_LINE),
    (b"PUB foo " + b"x" * 10000, ERR_MAX_CONTROL_LINE),
    (b'CONNECT {"x":"' + b"1" * 10000, ERR_MAX_CONTROL_LINE),
    (b"INFO " + b"x" * 10000, ERR_MAX_CONTROL_LINE),
]

SILENT = [  # nats-server closes the connection without any -ERR
    b"PUB foo\r\n",
    b"PUB \r\n",
    b"PUB foo a b c\r\n",
    b"PUB foo x\r\n",
    b"PUB foo -1\r\n",
    b"PUB foo +1\r\n",
    b"PUB foo 1234567890\r\n",
    b"PUB foo 99999999999999999999999\r\n",
    b"PUB foo 1\r\r\nx\r\n",
    b"SUB foo\r\n",
    b"SUB foo q 1 x\r\n",
    b"UNSUB 1 2 3\r\n",
    b"HPUB foo 12 14\r\n",
    HDR_CONNECT + b"HPUB foo 14 12\r\n",
    HDR_CONNECT + b"HPUB foo 12\r\n",
    HDR_CONNECT + b"HPUB foo x 12\r\n",
    HDR_CONNECT + b"HPUB foo 2 x\r\n",
    HDR_CONNECT + b"HPUB foo -1 1\r\n",
    HDR_CONNECT + b"HPUB foo a b c d\r\n",
    HDR_CONNECT + b"HPUB foo 2000000 1048577\r\n",
    b"CONNECT {\r\n",
    b"CONNECT\r\n",
    b"CONNECT []\r\n",
    b'CONNECT "x"\r\n',
    b"CONNECT {} junk\r\n",
    b'CONNECT {"verbose":1}\r\n',
    b'CONNECT {"name":1}\r\n',
    b'CONNECT {"protocol":1.5}\r\n',
    b'CONNECT {"protocol":1e2}\r\n',
    b'CONNECT {"protocol":"1"}\r\n',
    b'CONNECT {"protocol":99999999999999999999}\r\n',
    b'CONNECT {"protocol":NaN}\r\n',
    b'CONNECT {"import":1}\r\n',
    b'CONNECT {"import":{"allow":"x"}}\r\n',
    b"INFO x\r\n",
    b"INFO\r\n",
    b"INFO []\r\n",
    b"-ERR 'x'\r\n",
]


@pytest.mark.parametrize("data,message", LOUD)
def test_errors_sent_to_client(data: bytes, message: str) -> None:
    err = parse_error(data)
    assert (err.message, err.send_err, err.fatal) == (message, True, True)
    assert err.detail.startswith(message) or "exceeded" in err.detail
    assert "offset=" in err.detail and "proto=" in err.detail


@pytest.mark.parametrize("data", SILENT)
def test_silent_errors(data: bytes) -> None:
    err = parse_error(data)
    assert (err.send_err, err.fatal) == (False, True)
    assert err.message  # the reason nats-server logs


@pytest.mark.parametrize("data", [d for d, _ in LOUD] + SILENT)
def test_errors_do_not_depend_on_chunking(data: bytes) -> None:
    whole = parse_error(data)
    events, err = feed_chunks(data, list(range(1, len(data))))
    assert err is not None and (err.message, err.send_err) == (whole.message, whole.send_err)
    assert events == whole.events


def test_events_before_an_error_are_returned_and_parser_refuses_more() -> None:
    parser = Parser()
    with pytest.raises(ProtocolError) as info:
        parser.feed(b"PING\r\nPUB a 1\r\nx\r\nBAD\r\nPING\r\n")
    assert info.value.events == [Ping(), Pub("a", None, b"x")]
    assert "offset=18" in info.value.detail
    with pytest.raises(ProtocolError):
        parser.feed(b"PING\r\n")


def test_error_offset_counts_earlier_feeds() -> None:
    parser = Parser()
    assert parser.feed(b"PING\r\nPUB a 3\r\nab") == [Ping()]
    with pytest.raises(ProtocolError) as info:
        parser.feed(b"cX\n")
    assert info.value.message == ERR_UNKNOWN_OP
    assert "offset=18" in info.value.detail  # the byte where CR was due


# ---------------------------------------------------------------- differential

ERR_LINE = re.compile(rb"-ERR '([^']*)'\r\n")
DIFF_VALID = [d for d, _ in VALID] + [
    b"PUB foo 1\r\nx\r\n" * 3,
    HDR_CONNECT + b"HPUB foo 5 5\r\nabcde\r\n",
    b"UNSUB 1 1234567890\r\n",
    b'CONNECT {"name":"\xff\xfe"}\r\n',
    b"PING " + b"x" * 10000 + b"\r\n",
    b"+OK " + b"x" * 10000 + b"\r\n",
]



async def _server_outcome(port: int, data: bytes, expect_open: bool) -> tuple[str, str]:
    """('open'|'closed', -ERR text or '') for data sent on a fresh connection.

    When we expect the server to accept the bytes, a PING follows and its PONG proves the
    connection survived; otherwise we wait for the server to close it.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await reader.readuntil(b"\r\n")  # INFO
    writer.write(data + (b"PING\r\n" if expect_open else b""))
    await writer.drain()
    out = b""
    try:
        async with asyncio.timeout(20):
            while not (expect_open and b"PONG\r\n" in out):
                chunk = await reader.read(65536)
                if not chunk:
                    break
                out += chunk
    except (TimeoutError, ConnectionError):
        pass
    writer.close()
    match = ERR_LINE.search(out)
    state = "open" if b"PONG\r\n" in out else "closed"
    return state, match.group(1).decode() if match else ""


def _our_outcome(data: bytes) -> tuple[str, str]:
    try:
        Parser().feed(data)
    except ProtocolError as err:
        return "closed", err.message if err.send_err else ""
    return "open", ""


async def test_differential_against_nats_server(nats_port: int) -> None:
    cases = DIFF_VALID + [d for d, _ in LOUD] + SILENT
    ours = [_our_outcome(d) for d in cases]
    sem = asyncio.Semaphore(16)

    async def one(data: bytes, expect_open: bool) -> tuple[str, str]:
        async with sem:
            return await _server_outcome(nats_port, data, expect_open)

    theirs = await asyncio.gather(*(one(d, o[0] == "open") for d, o in zip(cases, ours,
                                                                         strict=True)))
    mismatches = [(d[:60], o, t) for d, o, t in zip(cases, ours, theirs, strict=True) if o != t]
    assert mismatches == []
    assert sum(o[0] == "open" for o in ours) == len(DIFF_VALID)

"""Fuzzing the client-protocol parser.

1. A seeded mutation fuzzer: >= 100k inputs per run built from valid frames by bit flips,
   truncations, splices, random bytes, huge/odd sizes and case changes, fed in random
   chunks. Only ProtocolError may escape; the parser's buffer stays bounded; a fatal
   error is final; and chunking never changes the outcome.
2. A hypothesis property: random valid event sequences, encoded with random but legal
   formatting and chunked at random, parse back to the same events.
"""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from node.protocol.events import Connect, HPub, Ping, Pong, Pub, Sub, Unsub
from node.protocol.parser import Parser, ProtocolError

SEEDS = [
    b'CONNECT {"verbose":false,"headers":true,"name":"x","protocol":1}\r\n',
    b"PUB foo 5\r\nhello\r\n",
    b"PUB foo.bar _INBOX.1 0\r\n\r\n",
    b"PUB foo  3\r\nabc\r\n",
    b"pub\tfoo\t2\nhi\r\n",
    b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",
    b"HPUB foo reply 22 22\r\nNATS/1.0\r\nA: b\r\n\r\n\r\n",
    b"SUB foo 1\r\n",
    b"SUB foo.* q 22\r\n",
    b"UNSUB 1\r\n",
    b"UNSUB 22 10\r\n",
    b"PING\r\n",
    b"PONG\r\n",
    b"+OK\r\n",
    b'INFO {"server_id":"x"}\r\n',
]
TOKENS = [b"\r\n", b"\n", b"\r", b" ", b"\t", b"0", b"9", b"-1", b"999999999", b"1234567890",
          b"PUB ", b"HPUB ", b"SUB ", b"PING", b"{", b"}", b'"', b"\x00", b"\xff", b"-ERR 'x'\r\n"]
SLACK = 64
TYPES = {Pub: (str, (str, type(None)), bytes), HPub: (str, (str, type(None)), bytes, bytes),
         Sub: (str, (str, type(None)), str), Unsub: (str, (int, type(None))),
         Connect: (dict,), Ping: (), Pong: ()}


def _mutate(rng: random.Random, data: bytearray) -> None:
    kind = rng.randrange(9)
    if not data:
        data += rng.choice(SEEDS)
    i = rng.randrange(len(data))
    if kind == 0:  # bit flips
        for _ in range(rng.randint(1, 4)):
            j = rng.randrange(len(data))
            data[j] ^= 1 << rng.randrange(8)
    elif kind == 1:  # truncate
        del data[i:]
    elif kind == 2:  # delete a range
        del data[i : i + rng.randint(1, 16)]
    elif kind == 3:  # splice in part of another frame
        seed = rng.choice(SEEDS)
        a = rng.randrange(len(seed))
        data[i:i] = seed[a : a + rng.randint(1, len(seed))]
    elif kind == 4:  # random bytes
        data[i:i] = rng.randbytes(rng.randint(1, 8))
    elif kind == 5:  # interesting tokens
        data[i:i] = rng.choice(TOKENS)
    elif kind == 6:  # replace a digit run with a huge, negative or odd size
        j = next((k for k in range(i, len(data)) if 48 <= data[k] <= 57), None)
        if j is not None:
            data[j : j + 1] = rng.choice([b"99999999", b"-5", b"1e3", b"", b"4096", b"70"])
    elif kind == 7:  # case change
        data[i : i + 4] = bytes(data[i : i + 4]).swapcase()
    else:  # a very long line
        data[i:i] = b"x" * rng.choice([50, 300, 5000])


def _feed_all(data: bytes, cuts: list[int], mp: int, mcl: int) -> tuple[list, str | None]:
    parser = Parser(max_payload=mp, max_control_line=mcl)
    events: list = []
    bounds = [0, *cuts, len(data)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        try:
            events += parser.feed(data[a:b])
        except ProtocolError as err:
            events += err.events
            try:
                parser.feed(b"PING\r\n")
            except ProtocolError:
                pass
            else:
                raise AssertionError("parser accepted input after a fatal error") from err
            return events, err.message
        assert parser.buffered <= mcl + mp + SLACK, (parser.buffered, data[:80])
    return events, None


def _check_types(events: list) -> None:
    for event in events:
        fields = [getattr(event, f) for f in event.__slots__]
        assert all(isinstance(v, t) for v, t in zip(fields, TYPES[type(event)], strict=True))


def test_mutation_fuzz_100k() -> None:
    rng = random.Random(0xC0FFEE)
    errors = accepted = 0
    for n in range(100_000):
        # Mostly after a CONNECT with headers on, so HPUB frames get past that check.
        data = bytearray(SEEDS[0] if rng.random() < 0.8 else b"")
        for _ in range(rng.randint(1, 4)):
            data += rng.choice(SEEDS)
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            _mutate(rng, data)
        raw = bytes(data)
        mp, mcl = rng.choice(((1048576, 4096), (64, 64), (16, 24), (0, 4096)))
        whole = _feed_all(raw, [], mp, mcl)
        _check_types(whole[0])
        if n % 2 == 0 and len(raw) > 1:
            cuts = sorted(rng.sample(range(1, len(raw)), min(len(raw) - 1, rng.randint(1, 8))))
            assert _feed_all(raw, cuts, mp, mcl) == whole, raw
        errors += whole[1] is not None
        accepted += whole[1] is None
    # Both outcomes must be well represented, or the fuzzer is not exploring.
    assert errors > 10_000 and accepted > 10_000, (errors, accepted)


def test_byte_by_byte_fuzz() -> None:
    rng = random.Random(99)
    for _ in range(1500):
        data = bytearray(b"".join(rng.choice(SEEDS) for _ in range(3)))
        _mutate(rng, data)
        raw = bytes(data)
        whole = _feed_all(raw, [], 1024, 256)
        assert _feed_all(raw, list(range(1, len(raw))), 1024, 256) == whole, raw


def test_random_garbage_is_bounded() -> None:
    rng = random.Random(5)
    for _ in range(200):
        parser = Parser(max_payload=128, max_control_line=64)
        try:
            for _ in range(50):
                parser.feed(rng.randbytes(rng.randint(1, 300)))
                assert parser.buffered <= 64 + 128 + SLACK
        except ProtocolError:
            pass


# ---------------------------------------------------------------- hypothesis roundtrip

token = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters=" \t\r\n\x0b\x0c"),
    min_size=1, max_size=12,
)
sep = st.sampled_from([b" ", b"\t", b"  ", b" \t "])
eol = st.sampled_from([b"\r\n", b"\n"])
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6,
)

events_strategy = st.lists(
    st.one_of(
        st.builds(Pub, token, st.none() | token, st.binary(max_size=64)),
        st.builds(HPub, token, st.none() | token, st.binary(max_size=32),
                  st.binary(max_size=32)),
        st.builds(Sub, token, st.none() | token, token),
        st.builds(Unsub, token, st.none() | st.integers(1, 999_999_999)),
        st.just(Ping()),
        st.just(Pong()),
        st.builds(
            Connect,
            st.fixed_dictionaries(
                {"headers": st.just(True)},
                optional={"verbose": st.booleans(), "name": st.text(max_size=8),
                          "protocol": st.integers(0, 1), "x_extra": json_value},
            ),
        ),
    ),
    max_size=12,
)


def _op(draw, word: bytes) -> bytes:
    return draw(st.sampled_from([word, word.lower(), word.capitalize()]))


@st.composite
def encoded(draw):
    events = [Connect({"headers": True}), *draw(events_strategy)]
    out = bytearray()
    for ev in events:
        s, e = draw(sep), draw(eol)
        if isinstance(ev, Pub | HPub):
            word = b"PUB" if isinstance(ev, Pub) else b"HPUB"
            args = [ev.subject.encode()] + ([ev.reply.encode()] if ev.reply else [])
            if isinstance(ev, HPub):
                args.append(b"%d" % len(ev.headers))
                body = ev.headers + ev.payload
            else:
                body = ev.payload
            args.append(b"%d" % len(body))
            out += _op(draw, word) + s + s.join(args) + e + body + b"\r\n"
        elif isinstance(ev, Sub):
            args = [ev.subject, *([ev.queue] if ev.queue else []), ev.sid]
            out += _op(draw, b"SUB") + s + s.join(a.encode() for a in args) + e
        elif isinstance(ev, Unsub):
            tail = b"" if ev.max_msgs is None else s + b"%d" % ev.max_msgs
            out += _op(draw, b"UNSUB") + s + ev.sid.encode() + tail + e
        elif isinstance(ev, Ping | Pong):
            out += _op(draw, b"PING" if isinstance(ev, Ping) else b"PONG") + e
        else:
            out += _op(draw, b"CONNECT") + s + json.dumps(ev.options).encode() + e
    cuts = draw(st.lists(st.integers(1, max(1, len(out) - 1)), max_size=10, unique=True))
    return events, bytes(out), sorted(c for c in cuts if c < len(out))


@settings(max_examples=300, deadline=None)
@given(encoded())
def test_roundtrip_random_events(case) -> None:
    events, data, cuts = case
    parsed, error = _feed_all(data, cuts, 1048576, 4096)
    assert error is None
    assert parsed == events

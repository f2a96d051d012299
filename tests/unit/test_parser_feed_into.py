"""Parser.feed_into (the callback API of the hot path) against Parser.feed.

feed() itself is built on feed_into, so the differential and fuzz tests of
test_parser.py cover the shared code; these check what only the callback form has:
the order of PUB callbacks relative to other events, the reuse of a repeated PUB
control line (including its edge cases), and errors raised after earlier callbacks.
"""

from __future__ import annotations

import random

import pytest

from node.protocol.events import Ping, Pub, Sub
from node.protocol.parser import Parser, ProtocolError


def collect(parser: Parser, chunks: list[bytes]) -> list:
    out: list = []
    for chunk in chunks:
        parser.feed_into(chunk, lambda s, r, p: out.append(Pub(s, r, p)), out.append)
    return out


def split(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 12))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def test_pubs_and_other_events_keep_stream_order() -> None:
    data = (b"PUB a 1\r\nx\r\nSUB a 1\r\nPUB a 1\r\ny\r\nPING\r\n"
            b"PUB a r 2\r\nzz\r\nPUB a 1\r\nq\r\n")
    assert collect(Parser(), [data]) == [
        Pub("a", None, b"x"), Sub("a", None, "1"), Pub("a", None, b"y"), Ping(),
        Pub("a", "r", b"zz"), Pub("a", None, b"q")]


def test_repeated_line_matches_feed_under_any_chunking() -> None:
    rng = random.Random(7)
    frames = [b"PUB s 3\r\nabc\r\n", b"PUB s 3\r\nxyz\r\n", b"PUB s 4\r\nabcd\r\n",
              b"PUB s r 3\r\nabc\r\n", b"PUB s 3\r\n\r\n\r\r\n", b"PING\r\n",
              b"PUB  s 3\r\nabc\r\n", b"PUB s 3\nabc\r\n"]
    for _ in range(300):
        data = b"".join(rng.choice(frames) for _ in range(rng.randint(1, 30)))
        expected = Parser().feed(data)
        assert collect(Parser(), split(data, rng)) == expected


def test_repeated_line_still_checks_the_payload_end() -> None:
    parser = Parser()
    with pytest.raises(ProtocolError) as info:
        collect(parser, [b"PUB a 1\r\nx\r\nPUB a 1\r\nxy\r\n"])
    assert info.value.message == "Unknown Protocol Operation"


def test_nul_at_frame_start_is_an_unknown_op_not_a_cached_pub() -> None:
    with pytest.raises(ProtocolError) as info:
        collect(Parser(), [b"\x00\r\n"])
    assert info.value.message == "Unknown Protocol Operation"
    assert "state=OP_START offset=0" in info.value.detail


def test_cached_line_respects_a_lowered_max_payload_on_the_next_call() -> None:
    parser = Parser()
    assert collect(parser, [b"PUB a 4\r\nabcd\r\n"]) == [Pub("a", None, b"abcd")]
    parser.max_payload = 3
    with pytest.raises(ProtocolError) as info:
        collect(parser, [b"PUB a 4\r\nabcd\r\n"])
    assert info.value.message == "Maximum Payload Violation"


@pytest.mark.parametrize("form", ["interpreted", "compiled"])
def test_limits_a_connect_sets_apply_to_the_frames_after_it_in_the_same_read(form: str) -> None:
    """A client pipelines PUBs behind its CONNECT; the CONNECT's account has a
    smaller max_payload: those PUBs must obey it (they slipped through when the
    parser kept the limits it read at the start of the call)."""
    from node.protocol import native

    cls = Parser if form == "interpreted" else native.compiled_parser()
    if cls is None:
        pytest.skip("compiled parser not built")
    parser = cls()
    seen: list = []

    def on_event(event: object) -> None:
        seen.append(event)
        parser.max_payload = 3  # what Client does once the CONNECT is authenticated

    data = b'CONNECT {}\r\nPUB a 3\r\nabc\r\nPUB a 4\r\nabcd\r\n'
    with pytest.raises(ProtocolError) as info:
        parser.feed_into(data, lambda s, r, p: seen.append(Pub(s, r, p)), on_event)
    assert info.value.message == "Maximum Payload Violation"
    assert seen[1:] == [Pub("a", None, b"abc")]


def test_callbacks_before_an_error_have_run_and_the_parser_is_dead() -> None:
    parser = Parser()
    seen: list = []
    with pytest.raises(ProtocolError) as info:
        parser.feed_into(b"PUB a 1\r\nx\r\nPING\r\nBAD\r\n",
                         lambda s, r, p: seen.append(p), seen.append)
    assert seen == [b"x", Ping()]
    assert info.value.events == []
    with pytest.raises(ProtocolError):
        parser.feed_into(b"PING\r\n", seen.append, seen.append)


def test_error_offsets_do_not_depend_on_chunking() -> None:
    # Frames completed across feeds are parsed apart from the rest of the chunk; the
    # stream offset in an error's detail must not notice.
    rng = random.Random(1)
    good = b"PUB a 5\r\nhello\r\nPING pad\r\nPUB bb r 2\r\nhi\r\n+OK\r\n"
    for _ in range(1500):
        data = good * rng.randint(1, 4) + b"XBAD\r\n"
        with pytest.raises(ProtocolError) as whole:
            Parser().feed(data)
        parser = Parser()
        with pytest.raises(ProtocolError) as chunked:
            for chunk in split(data, rng):
                parser.feed(chunk)
        assert _offset(chunked.value) == _offset(whole.value)


def _offset(err: ProtocolError) -> str:
    # An unterminated bad line is refused early (state "op"): only the offset is common.
    return err.detail.split(" offset=")[1].split()[0]


def test_shared_line_cache_applies_each_parsers_own_limits() -> None:
    # The parsed-line cache is shared by every parser: a line another connection parsed
    # under looser limits must still be refused by a stricter one.
    line = b"PUB shared.limits.subject 64\r\n" + b"x" * 64 + b"\r\n"
    assert collect(Parser(), [line]) == [Pub("shared.limits.subject", None, b"x" * 64)]
    with pytest.raises(ProtocolError) as err:
        collect(Parser(max_payload=10), [line])
    assert err.value.message == "Maximum Payload Violation"
    with pytest.raises(ProtocolError) as err:
        collect(Parser(max_control_line=10), [line])
    assert err.value.message == "maximum control line exceeded"


def test_shared_line_cache_serves_many_alternating_lines() -> None:
    # Many subjects alternate frame by frame (the 1,000-subject publisher): every line
    # hits the cache after its first use, and each frame keeps its own subject.
    frames = [b"PUB alt.%d %d\r\n%s\r\n" % (i % 37, i % 5, b"y" * (i % 5)) for i in range(400)]
    data = b"".join(frames)
    want = [Pub(f"alt.{i % 37}", None, b"y" * (i % 5)) for i in range(400)]
    rng = random.Random(11)
    for _ in range(5):
        assert collect(Parser(), split(data, rng)) == want

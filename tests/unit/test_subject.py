"""Subject syntax and matching: unit cases, properties against brute-force
oracles, and differential tests that pin nats-server's observed behaviour."""

from __future__ import annotations

import itertools
import json
import re
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.subject import (
    compile_matcher,
    is_literal,
    subject_matches,
    subjects_collide,
    subset,
    valid_literal_subject,
    valid_queue_name,
    valid_subject,
)

# -- syntax -------------------------------------------------------------------

VALID = ["foo", "foo.bar", "*", ">", "foo.*", "foo.>", "*.*.>", "foo*", "*foo", ">foo",
         "foo.b>r", "ü.é", "$JS.API.>", "_INBOX.abc", "a-b_c.d"]
INVALID = ["", ".", "..", "foo..bar", ".foo", "foo.", "foo.>.bar", ">.foo", "> .a", "foo bar",
           "foo\tbar", "a.\n", "a.b\r", "a\fb", " "]


@pytest.mark.parametrize("subject", VALID)
def test_valid_subjects(subject: str) -> None:
    assert valid_subject(subject)


@pytest.mark.parametrize("subject", INVALID)
def test_invalid_subjects(subject: str) -> None:
    assert not valid_subject(subject)
    assert not valid_literal_subject(subject)


@pytest.mark.parametrize(("subject", "literal"), [
    ("foo", True), ("foo.bar", True), ("foo*", True), ("a.>b", True),
    ("*", False), (">", False), ("foo.*", False), ("foo.>", False), ("*.bar", False),
])
def test_literal_subjects(subject: str, literal: bool) -> None:
    assert is_literal(subject) is literal
    assert valid_literal_subject(subject) is literal


def test_check_runes_refuses_nul_and_replacement_char() -> None:
    assert valid_subject("a\x00b")
    assert not valid_subject("a\x00b", check_runes=True)
    assert not valid_subject("a.\ufffd", check_runes=True)
    assert valid_subject("ü.é", check_runes=True)


@pytest.mark.parametrize(("queue", "ok"), [
    ("workers", True), ("q.*", True), ("q>", True), ("a.b", True),
    ("", False), ("a b", False), ("a\tb", False), ("a\n", False),
])
def test_queue_names(queue: str, ok: bool) -> None:
    assert valid_queue_name(queue) is ok


# -- matching -----------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "subject", "expected"), [
    ("foo", "foo", True),
    ("foo", "bar", False),
    ("foo.*", "foo.bar", True),
    ("foo.*", "foo", False),
    ("foo.*", "foo.bar.baz", False),
    ("foo.>", "foo.bar.baz", True),
    ("foo.>", "foo", False),
    (">", "foo", True),
    (">", "a.b.c", True),
    ("*.bar", "foo.bar", True),
    ("*.*", "foo", False),
    ("foo*", "foox", False),
    ("foo*", "foo*", True),
    # Published wildcards are literal tokens (observed on nats-server).
    ("foo.*", "foo.*", True),
    ("foo.*", "foo.>", True),
    ("foo.bar", "foo.*", False),
    (">", ">", True),
    # Empty tokens in the published subject match nothing.
    (">", ".foo", False),
    (">", "foo.", False),
    ("foo.>", "foo..bar", False),
    ("*", "", False),
])
def test_subject_matches(pattern: str, subject: str, expected: bool) -> None:
    assert subject_matches(pattern, subject) is expected
    assert compile_matcher(pattern)(subject) is expected


def _oracle_regex(pattern: str) -> re.Pattern[str]:
    """An independent definition of matching, via regular expressions."""
    parts = []
    for tok in pattern.split("."):
        if tok == "*":
            parts.append(r"[^.]+")
        elif tok == ">":
            parts.append(r"[^.]+(?:\.[^.]+)*")
        else:
            parts.append(re.escape(tok))
    return re.compile(r"\.".join(parts))


# Valid by construction: ">" only last.
pattern_st = st.builds(
    lambda head, tail: ".".join(head + tail),
    st.lists(st.sampled_from(["a", "b", "*"]), min_size=0, max_size=3),
    st.sampled_from([[], [">"]]),
).filter(bool)
subject_st = st.lists(st.sampled_from(["a", "b", "c", "*", ">", ""]), min_size=1, max_size=5).map(
    ".".join)


@settings(max_examples=400, deadline=None)
@given(pattern_st, subject_st)
def test_matching_agrees_with_regex_oracle(pattern: str, subject: str) -> None:
    well_formed = "" not in subject.split(".")
    expected = well_formed and _oracle_regex(pattern).fullmatch(subject) is not None
    assert subject_matches(pattern, subject) is expected
    assert compile_matcher(pattern)(subject) is expected


# Every literal subject over {a, b, z} up to 5 tokens: enough to separate any
# two patterns of at most 4 tokens over {a, b, *, >} ("z" is a token neither uses).
UNIVERSE = [".".join(p) for n in range(1, 6) for p in itertools.product("abz", repeat=n)]


@settings(max_examples=300, deadline=None)
@given(pattern_st, pattern_st)
def test_subset_agrees_with_brute_force(a: str, b: str) -> None:
    expected = all(subject_matches(b, s) for s in UNIVERSE if subject_matches(a, s))
    assert subset(a, b) is expected


@settings(max_examples=300, deadline=None)
@given(pattern_st, pattern_st)
def test_collide_agrees_with_brute_force(a: str, b: str) -> None:
    expected = any(subject_matches(a, s) and subject_matches(b, s) for s in UNIVERSE)
    assert subjects_collide(a, b) is expected
    assert subjects_collide(b, a) is expected


@pytest.mark.parametrize(("a", "b", "expected"), [
    ("foo.bar", "foo.*", True), ("foo.*", "foo.>", True), ("foo.>", ">", True),
    ("foo.*", "foo.bar", False), (">", "foo.>", False), ("foo.>", "foo.*", False),
    ("foo", "foo", True), ("foo.*", "*.*", True), ("*.*", "foo.*", False),
])
def test_subset_cases(a: str, b: str, expected: bool) -> None:
    assert subset(a, b) is expected


# -- differential tests against a real nats-server ---------------------------


def _session(port: int, lines: list[str], pedantic: bool = False) -> bytes:
    """Send `lines` on a fresh connection, then PING; return everything
    received up to the PONG (the server answers in order)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.settimeout(10)
        f = s.makefile("rb")
        assert f.readline().startswith(b"INFO ")
        connect = json.dumps({"verbose": False, "pedantic": pedantic})
        payload = "".join(f"{line}\r\n" for line in [f"CONNECT {connect}", *lines, "PING"])
        s.sendall(payload.encode())
        out = b""
        while not out.endswith(b"PONG\r\n"):
            line = f.readline()
            assert line, f"connection closed; got {out!r}"
            out += line
        return out[: -len(b"PONG\r\n")]


SUB_SUBJECTS = ["foo", "foo.bar", "foo..bar", ".foo", "foo.", "foo.>.bar", "foo*", "*foo",
                ">foo", "foo.>", ">", "*", "*.*", "a.>.b", "ü.é"]


@pytest.mark.parametrize("subject", SUB_SUBJECTS)
def test_sub_validation_matches_nats_server(nats_port: int, subject: str) -> None:
    got = _session(nats_port, [f"SUB {subject} 1"])
    expected = b"" if valid_subject(subject) else b"-ERR 'Invalid Subject'\r\n"
    assert got == expected


@pytest.mark.parametrize("queue", ["q", "q.*", "q>", "a.b.>", "*"])
def test_queue_names_accepted_by_nats_server(nats_port: int, queue: str) -> None:
    assert valid_queue_name(queue)
    assert _session(nats_port, [f"SUB foo {queue} 1"]) == b""


PUB_SUBJECTS = ["foo", "foo.bar", "foo.*", "foo.>", ">", "*", "foo..bar", "foo*"]


@pytest.mark.parametrize("subject", PUB_SUBJECTS)
def test_pedantic_pub_validation_matches_nats_server(nats_port: int, subject: str) -> None:
    got = _session(nats_port, [f"PUB {subject} 0", ""], pedantic=True)
    expected = b"" if valid_literal_subject(subject) else b"-ERR 'Invalid Publish Subject'\r\n"
    assert got == expected


@pytest.mark.parametrize("subject", PUB_SUBJECTS)
def test_non_pedantic_pub_is_never_refused(nats_port: int, subject: str) -> None:
    assert _session(nats_port, [f"PUB {subject} 0", ""]) == b""


@pytest.mark.parametrize("reply", ["bar.*", "a..b", ">"])
def test_reply_subject_not_validated_even_when_pedantic(nats_port: int, reply: str) -> None:
    got = _session(nats_port, ["SUB foo 1", f"PUB foo {reply} 1", "x"], pedantic=True)
    assert got == f"MSG foo 1 {reply} 1\r\nx\r\n".encode()


DELIVERY_PATTERNS = ["foo", "foo.bar", "foo.*", "foo.>", "*.bar", "*.*", ">", "foo*", "*",
                     "foo.bar.baz", "*.>", "foo.*.baz"]
DELIVERY_SUBJECTS = ["foo", "foo.bar", "foo.*", "foo.>", "*", ">", "foo*", "x.bar",
                     "foo.bar.baz", "foo..bar", ".foo", "foo.", "foo.x.baz"]


@pytest.mark.parametrize("pedantic", [False, True])
@pytest.mark.parametrize("subject", DELIVERY_SUBJECTS)
def test_delivery_matches_nats_server(nats_port: int, subject: str, pedantic: bool) -> None:
    """Which subscriptions does the server deliver a publish to?  Pedantic mode
    complains about wildcard subjects but still delivers (observed)."""
    subs = [f"SUB {p} {sid}" for sid, p in enumerate(DELIVERY_PATTERNS)]
    got = _session(nats_port, [*subs, f"PUB {subject} 1", "x"], pedantic=pedantic)
    got = got.replace(b"-ERR 'Invalid Publish Subject'\r\n", b"")
    sids = set(re.findall(rb"MSG \S+ (\d+) 1\r\nx\r\n", got))
    delivered = {DELIVERY_PATTERNS[int(sid)] for sid in sids}
    assert got.count(b"MSG ") == len(sids)
    assert delivered == {p for p in DELIVERY_PATTERNS if subject_matches(p, subject)}

"""Mirrors and sources, the pure part (`node/jetstream/sourcing.py`): SOURCE_MSGS entries
applied to a target stream, the progress kept with them, headers and transforms."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from node.jetstream import config, ops, sourcing
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Stored, Stream

T0 = 1_700_000_000_000_000_000


def make(name: str, **extra: Any) -> Stream:
    origin = config.check_create("O", config.parse_request(
        json.dumps({"name": "O", "subjects": ["o.>"]}).encode())[0], False, {})[0]
    cfg, pedantic = config.parse_request(json.dumps({"name": name, **extra}).encode())
    return Stream(config.check_create(name, cfg, pedantic, {"O": origin})[0], MemStore(name))


def msgs(*seqs: int, subject: str = "o.a") -> tuple[ops.SourcedMsg, ...]:
    return tuple(ops.SourcedMsg(s, T0 + s, subject, b"", f"m{s}".encode()) for s in seqs)


def apply(stream: Stream, index: int, key: str, batch: tuple[ops.SourcedMsg, ...]) -> Any:
    op = ops.SourceMsgs(T0 + 10_000 + index, key, "IDENT", batch)
    assert ops.decode(ops.encode(op)) == op
    return stream.apply_batch([(index, ops.encode(op))])


def stored(stream: Stream) -> list[tuple[int, str, bytes, bytes, int]]:
    out = []
    for seq in stream.store.seqs():
        m = stream.store.load(seq)
        assert m is not None
        out.append((m.seq, m.subject, m.hdr, m.data, m.ts_ns))
    return out


def test_mirror_keeps_origin_seqs_times_and_gaps() -> None:
    m = make("M", mirror={"name": "O"})
    effects = apply(m, 1, sourcing.MIRROR_KEY, msgs(2, 3, 5))
    assert [e.seq for e in effects if isinstance(e, Stored)] == [2, 3, 5]
    assert [(s, ts) for s, _, _, _, ts in stored(m)] == [(2, T0 + 2), (3, T0 + 3), (5, T0 + 5)]
    state = m.state()
    assert (state["first_seq"], state["last_seq"], state["messages"]) == (2, 5, 3)
    assert sourcing.progress(m.store, sourcing.MIRROR_KEY) == 5


def test_redelivered_messages_are_stored_once() -> None:
    """Resume guard: an entry repeating what the progress covers stores nothing again."""
    for target in (make("M", mirror={"name": "O"}),
                   make("S", subjects=["s"], sources=[{"name": "O"}])):
        key = sourcing.MIRROR_KEY if target.cfg.get("mirror") else \
            sourcing.source_key(target.cfg["sources"][0])
        apply(target, 1, key, msgs(1, 2, 3))
        apply(target, 2, key, msgs(2, 3, 4))  # a reconnect re-sent 2 and 3
        assert [d for _, _, _, d, _ in stored(target)] == [b"m1", b"m2", b"m3", b"m4"]
        assert sourcing.progress(target.store, key) == 4


def test_source_header_transform_and_new_seqs() -> None:
    s = make("S", subjects=["s"], sources=[
        {"name": "O", "subject_transforms": [{"src": "o.*", "dest": "x.{{wildcard(1)}}"}]},
        {"name": "O", "filter_subject": "o.b"}])
    k1, k2 = (sourcing.source_key(src) for src in s.cfg["sources"])
    assert (k1, k2) == ("O o.* x.{{wildcard(1)}}", "O o.b >")
    apply(s, 1, k1, msgs(4, 7))
    apply(s, 2, k2, msgs(5, subject="o.b"))
    got = stored(s)
    assert [(seq, subj) for seq, subj, _, _, _ in got] == [(1, "x.a"), (2, "x.a"), (3, "o.b")]
    assert got[0][2] == b"NATS/1.0\r\nNats-Stream-Source: O 4 o.* x.{{wildcard(1)}} o.a " \
        b"IDENT\r\n\r\n"
    assert got[2][2] == b"NATS/1.0\r\nNats-Stream-Source: O 5 o.b > o.b IDENT\r\n\r\n"
    assert got[0][4] == T0 + 10_001  # a source stores at its own time, the entry's
    assert (sourcing.progress(s.store, k1), sourcing.progress(s.store, k2)) == (7, 5)


def test_expected_headers_are_not_copied() -> None:
    """nats-server stores a mirrored or sourced message without its `Nats-Expected-*` lines
    (case-sensitive; tests/integration/test_kv_obj_diff.py compares it with nats-server)."""
    hdrs = [b"NATS/1.0\r\nNats-Expected-Stream: O\r\nX-A: 1\r\n\r\n",
            b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: 2\r\n"
            b"Nats-Expected-Last-Subject-Sequence-Subject: o.a\r\n\r\n",
            b"NATS/1.0\r\nnats-expected-last-sequence: 6\r\nX-Nats-Expected-Stream: y\r\n\r\n"]
    batch = tuple(ops.SourcedMsg(i + 1, T0, "o.a", hdr, b"d") for i, hdr in enumerate(hdrs))
    m = make("M", mirror={"name": "O"})
    apply(m, 1, sourcing.MIRROR_KEY, batch)
    assert [hdr for _, _, hdr, _, _ in stored(m)] == [
        b"NATS/1.0\r\nX-A: 1\r\n\r\n", b"", hdrs[2]]
    s = make("S", subjects=["s"], sources=[{"name": "O"}])
    apply(s, 1, sourcing.source_key(s.cfg["sources"][0]), batch)
    tail = [f"Nats-Stream-Source: O {i} > > o.a IDENT\r\n\r\n".encode() for i in (1, 2, 3)]
    assert [hdr for _, _, hdr, _, _ in stored(s)] == [
        b"NATS/1.0\r\nX-A: 1\r\n" + tail[0], b"NATS/1.0\r\n" + tail[1],
        hdrs[2][:-2] + tail[2]]


def test_an_earlier_hops_source_header_is_replaced() -> None:
    s = make("S", subjects=["s"], sources=[{"name": "O"}])
    hdr = b"NATS/1.0\r\nA: 1\r\nNats-Stream-Source: X 9 > > x IDX\r\n\r\n"
    op = ops.SourceMsgs(T0, sourcing.source_key(s.cfg["sources"][0]), "ID",
                        (ops.SourcedMsg(1, T0, "o.a", hdr, b""),))
    s.apply_batch([(1, ops.encode(op))])
    assert stored(s)[0][2] == b"NATS/1.0\r\nA: 1\r\nNats-Stream-Source: O 1 > > o.a ID\r\n\r\n"


def test_a_promoted_mirror_ignores_late_entries() -> None:
    m = make("M", mirror={"name": "O"})
    apply(m, 1, sourcing.MIRROR_KEY, msgs(1))
    promoted = dict(m.cfg, mirror=None, subjects=["m.>"])
    m.apply_batch([(2, ops.encode(ops.UpdateConfig(T0, json.dumps(
        config.to_wire(promoted)).encode())))])
    apply(m, 3, sourcing.MIRROR_KEY, msgs(2))
    assert [s for s, *_ in stored(m)] == [1]


def test_consumer_request_starts_after_progress() -> None:
    src = {"name": "O", "opt_start_seq": 5, "filter_subject": "o.a"}
    first = sourcing.consumer_request(src, "N", "D", 0, False, 10)["config"]
    assert (first["deliver_policy"], first["opt_start_seq"], first["filter_subject"]) == \
        ("by_start_sequence", 5, "o.a")
    later = sourcing.consumer_request(src, "N", "D", 41, False, 10)["config"]
    assert (later["deliver_policy"], later["opt_start_seq"]) == ("by_start_sequence", 42)
    timed = sourcing.consumer_request({"name": "O", "opt_start_time": "2024-01-02T03:04:05Z"},
                                      "N", "D", 0, True, 10)["config"]
    assert (timed["deliver_policy"], timed["opt_start_time"]) == \
        ("by_start_time", "2024-01-02T03:04:05Z")


def test_parse_time_and_delivery() -> None:
    assert sourcing.parse_time("1970-01-01T00:00:01.5Z") == 1_500_000_000
    assert sourcing.parse_time("1970-01-01T01:00:00+01:00") == 0
    assert sourcing.parse_delivery("$JS.ACK.O.C.1.7.3.99.2") == (7, 3, 99, 2)
    assert sourcing.parse_delivery("$JS.ACK.O.C.1.7.3.99") is None


@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.integers(0, 29))
def test_any_split_into_entries_stores_each_origin_message_once(seqs: list[int],
                                                                cut: int) -> None:
    """However deliveries are cut into entries, and whatever is re-sent, a source holds
    each origin sequence once, in origin order."""
    origin = sorted(set(seqs))
    s = make("S", subjects=["s"], sources=[{"name": "O"}])
    key = sourcing.source_key(s.cfg["sources"][0])
    cut = min(cut, len(origin))
    first, rest = origin[:cut], origin[max(0, cut - 3):]  # the second repeats a few
    index = 0
    for part in (first, rest):
        if part:
            index += 1
            apply(s, index, key, msgs(*part))
    got = [int(hdr.split(b" ")[2]) for _, _, hdr, _, _ in stored(s)]
    assert got == origin


def test_a_full_discard_new_target_refuses_and_keeps_its_progress() -> None:
    s = make("S", subjects=["s"], sources=[{"name": "O"}], max_msgs=2, discard="new")
    key = sourcing.source_key(s.cfg["sources"][0])
    apply(s, 1, key, msgs(1, 2, 3, 4))
    assert [d for _, _, _, d, _ in stored(s)] == [b"m1", b"m2"]
    assert sourcing.progress(s.store, key) == 2  # 3 is retried once there is room
    m = make("M", mirror={"name": "O"}, max_msgs=1, discard="new")
    apply(m, 1, sourcing.MIRROR_KEY, msgs(5, 6))
    assert [seq for seq, *_ in stored(m)] == [5]
    assert sourcing.progress(m.store, sourcing.MIRROR_KEY) == 5


def test_a_sealed_target_takes_nothing_in() -> None:
    s = make("S", subjects=["s"], sources=[{"name": "O"}])
    key = sourcing.source_key(s.cfg["sources"][0])
    apply(s, 1, key, msgs(1))
    sealed = dict(s.cfg, sealed=True)
    s.apply_batch([(2, ops.encode(ops.UpdateConfig(T0, json.dumps(
        config.to_wire(sealed)).encode())))])
    apply(s, 3, key, msgs(2, 3))
    assert [d for _, _, _, d, _ in stored(s)] == [b"m1"]
    assert sourcing.progress(s.store, key) == 1

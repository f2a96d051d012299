"""node/msgtrace.py: which headers start a trace, and the documents it builds."""

from __future__ import annotations

from node import msgtrace

HDR = b"NATS/1.0\r\nNats-Trace-Dest: trace.a\r\nX: 1\r\nX: 2\r\n\r\n"


def test_header_map_keeps_keys_and_repeated_values() -> None:
    assert msgtrace.parse_headers(HDR) == {"Nats-Trace-Dest": ["trace.a"], "X": ["1", "2"]}


def test_start_reads_destination_and_size() -> None:
    mt = msgtrace.start(HDR, 5)
    assert mt is not None and mt.dest == "trace.a" and not mt.only
    assert mt.msgsize == len(HDR) + 5


def test_no_trace_without_an_exact_literal_destination() -> None:
    assert msgtrace.start(b"NATS/1.0\r\nnats-trace-dest: t\r\n\r\n", 0) is None
    assert msgtrace.start(b"NATS/1.0\r\nNats-Trace-Dest: t.*\r\n\r\n", 0) is None
    assert msgtrace.start(b"NATS/1.0\r\nNats-Trace-Dest: a b\r\n\r\n", 0) is None
    assert msgtrace.start(b"NATS/1.0\r\nX-Nats-Trace-Dest: t\r\n\r\n", 0) is None


def test_trace_only_values() -> None:
    for value, only in [("1", True), ("true", True), ("TRUE", True), ("on", True),
                        ("t", False), ("yes", False), ("0", False), ("false", False)]:
        hdr = f"NATS/1.0\r\nNats-Trace-Dest: t\r\nNats-Trace-Only: {value}\r\n\r\n".encode()
        mt = msgtrace.start(hdr, 0)
        assert mt is not None and mt.only is only, value


def test_disabled_headers_replace_only_the_destination() -> None:
    out = msgtrace.disabled_headers(HDR)
    assert msgtrace.parse_headers(out) == {"Nats-Trace-Dest": ["trace disabled"],
                                           "X": ["1", "2"]}
    assert out.endswith(b"\r\n\r\n")


def test_document_shape() -> None:
    mt = msgtrace.start(HDR, 0)
    assert mt is not None
    mt.ingress("Client", 7, "", "A", "s")
    mt.mapping("m")
    mt.service_import("B", "m", "n")
    mt.stream_export("C", "p.s")
    mt.egress("JetStream", 3, "x", "s.>", "q", msgtrace.NO_ECHO)
    mt.jetstream("S", "s")
    doc = mt.document({"id": "N"})
    events = [{k: v for k, v in e.items() if k != "ts"} for e in doc["events"]]
    assert events == [
        {"type": "in", "kind": 0, "cid": 7, "acc": "A", "subj": "s"},
        {"type": "sm", "to": "m"},
        {"type": "si", "acc": "B", "from": "m", "to": "n"},
        {"type": "se", "acc": "C", "to": "p.s"},
        {"type": "eg", "kind": 5, "cid": 3, "name": "x", "sub": "s.>", "queue": "q",
         "error": msgtrace.NO_ECHO},
        {"type": "js", "stream": "S", "subject": "s"},
    ]
    assert doc["request"] == {"header": {"Nats-Trace-Dest": ["trace.a"], "X": ["1", "2"]},
                              "msgsize": len(HDR)}
    assert all(e["ts"].endswith("Z") for e in doc["events"])


def test_account_trace_needs_a_sampled_traceparent() -> None:
    from node.accountconf import MsgTraceConfig

    conf = MsgTraceConfig("acc.t", 100)
    parent = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-"
    for flags, traced in [(b"01", True), (b"03", True), (b"00", False), (b"zz", False)]:
        hdr = b"NATS/1.0\r\nTRACEPARENT: " + parent + flags + b"\r\n\r\n"
        mt = msgtrace.start(hdr, 0, conf)
        assert (mt is not None) is traced, flags
        assert mt is None or (mt.dest == "acc.t" and not mt.only)
    assert msgtrace.start(b"NATS/1.0\r\ntraceparent: " + parent + b"01\r\n\r\n", 0) is None


def test_account_trace_sampling() -> None:
    import random

    from node.accountconf import MsgTraceConfig

    hdr = (b"NATS/1.0\r\ntraceparent: "
           b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\r\n")
    rng = random.Random(7)
    hits = sum(msgtrace.start(hdr, 0, MsgTraceConfig("t", 25), rng) is not None
               for _ in range(2000))
    assert 400 < hits < 600  # 25% of 2,000, well inside 5 sigma


def test_jwt_allow_trace_claims() -> None:
    """nats-jwt's `allow_trace` on a service export and on a stream import."""
    from node.accountconf import ServiceExport, StreamImport
    from node.resolver import _jwt_export, _jwt_import

    export = _jwt_export({"type": "service", "subject": "svc.>", "allow_trace": True})
    assert isinstance(export, ServiceExport) and export.allow_trace
    plain = _jwt_export({"type": "service", "subject": "svc.>"})
    assert isinstance(plain, ServiceExport) and not plain.allow_trace
    imp = _jwt_import({"type": "stream", "subject": "n.>", "account": "A" * 56,
                       "allow_trace": True})
    assert isinstance(imp, StreamImport) and imp.allow_trace


def test_jwt_account_trace_claim() -> None:
    from node.accountconf import MsgTraceConfig
    from node.resolver import _jwt_trace

    assert _jwt_trace({"dest": "t.acc", "sampling": 30}) == MsgTraceConfig("t.acc", 30)
    assert _jwt_trace({"dest": "t.acc"}) == MsgTraceConfig("t.acc", 100)
    for bad in [None, "t", {"dest": "t.*"}, {"dest": "t", "sampling": 101}, {"sampling": 5}]:
        assert _jwt_trace(bad) is None


def test_route_copy_carries_its_hop_last() -> None:
    out = msgtrace.with_hop(HDR, "1")
    assert out == HDR[:-2] + b"Nats-Trace-Hop: 1\r\n\r\n"  # where nats-server appends it
    # A hop the publisher set itself is replaced, never doubled.
    assert msgtrace.with_hop(out, "2").count(b"Nats-Trace-Hop") == 1
    assert msgtrace.parse_headers(msgtrace.with_hop(out, "2"))["Nats-Trace-Hop"] == ["2"]
    assert msgtrace.without_hop(out) == HDR
    mt = msgtrace.start(out, 3)
    # The origin ignores a publisher's hop (a route's copy sets it: node/cluster/service.py).
    assert mt is not None and mt.hop == "" and mt.msgsize == len(out) + 3
    # A publisher's hop is replaced where it stands.
    own = b"NATS/1.0\r\nNats-Trace-Hop: 7\r\nX: 1\r\n\r\n"
    assert msgtrace.with_hop(own, "1") == b"NATS/1.0\r\nNats-Trace-Hop: 1\r\nX: 1\r\n\r\n"


def test_route_egress_numbers_hops_and_counts_them() -> None:
    mt = msgtrace.start(HDR, 0)
    assert mt is not None
    assert "hops" not in mt.document({})  # no route egress: no `hops`
    assert mt.route_egress(7, "n2") == "1"
    assert mt.route_egress(8, "n3") == "2"
    doc = mt.document({})
    assert list(doc) == ["server", "request", "hops", "events"] and doc["hops"] == 2
    assert [{k: v for k, v in e.items() if k != "ts"} for e in doc["events"]] == [
        {"type": "eg", "kind": 1, "cid": 7, "name": "n2", "hop": "1"},
        {"type": "eg", "kind": 1, "cid": 8, "name": "n3", "hop": "2"}]
    # A copy of a copy numbers below the hop it came with.
    again = msgtrace.start(msgtrace.with_hop(HDR, "1"), 0)
    assert again is not None
    again.hop = "1"
    assert again.route_egress(1, "n3") == "1.1"


def test_origin_named_by_a_publisher_disables_the_trace() -> None:
    out = msgtrace.origin_disabled(HDR)
    assert out == b"NATS/1.0\r\nX: 1\r\nX: 2\r\nNats-Trace-Dest: trace disabled\r\n\r\n"
    bare = b"NATS/1.0\r\ntraceparent: x\r\n\r\n"
    assert msgtrace.origin_disabled(bare).endswith(b"Nats-Trace-Dest: trace disabled\r\n\r\n")


def test_routed_account_trace_is_not_sampled_again() -> None:
    from node.accountconf import MsgTraceConfig

    hdr = (b"NATS/1.0\r\ntraceparent: "
           b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nNats-Trace-Hop: 1\r\n\r\n")
    conf = MsgTraceConfig("t", 1)
    assert all(msgtrace.start(hdr, 0, conf, resample=False) is not None for _ in range(50))


def test_route_copy_names_the_trace_account_only_when_it_travels_in_another() -> None:
    mt = msgtrace.start(HDR, 0)
    assert mt is not None
    mt.ingress("Client", 1, "", "A", "news.1")
    same = msgtrace.parse_headers(msgtrace.route_copy(mt, "A", HDR, "1"))
    assert msgtrace.TRACE_ORIGIN not in same and same["Nats-Trace-Hop"] == ["1"]
    other = msgtrace.parse_headers(msgtrace.route_copy(mt, "B", HDR, "1"))
    assert other[msgtrace.TRACE_ORIGIN] == ["A"]
    # A service import's copy names its own `_R_.` destination: its peer answers there.
    rewritten = msgtrace.with_dest(HDR, "_R_.tok")
    assert msgtrace.TRACE_ORIGIN not in msgtrace.parse_headers(
        msgtrace.route_copy(mt, "B", rewritten, "1"))
    tight = b"NATS/1.0\r\nNats-Trace-Dest:trace.a\r\n\r\n"  # no space after the colon
    assert msgtrace.parse_headers(msgtrace.route_copy(mt, "B", tight, "1"))[
        msgtrace.TRACE_ORIGIN] == ["A"]
    # A publisher cannot choose the account a peer sends its document in.
    forged = HDR[:-2] + b"Nats-Trace-Origin-Account: C\r\n\r\n"
    assert msgtrace.TRACE_ORIGIN not in msgtrace.parse_headers(
        msgtrace.route_copy(mt, "A", forged, "1"))
    assert msgtrace.parse_headers(msgtrace.route_copy(mt, "B", forged, "1"))[
        msgtrace.TRACE_ORIGIN] == ["A"]

"""The pure parts of `jetstream { domain }` (node/jetstream/domain.py): nats-server's name
checks and mapping table, and the reply/advisory shapes (checked against nats-server 2.15.1
over the wire in tests/integration/test_jetstream_domain.py)."""

from __future__ import annotations

import json

import pytest

from node.jetstream.domain import (
    append_to_event,
    domain_error,
    mapping_table,
    merged,
    with_domain,
)
from node.mapping import MappingTable, build_mapping


@pytest.mark.parametrize("name,err", [
    ("hub", None), ("", None), ("$JS", None), ("ÄÖ", None), ("_", None),
    ("a.b", "may not contain"), ("a*", "may not contain"), ("b>", "may not contain"),
    ("a b", 'derived "$JS.a b.API.>" is not a valid subject'),
    ("x\ty", 'derived "$JS.x\\ty.API.>" is not a valid subject'),
    ("a..b", "is not a valid subject"),  # the subject check comes first
])
def test_domain_names(name: str, err: str | None) -> None:
    got = domain_error(name)
    assert (got is None) if err is None else (got is not None and err in got)


def test_mapping_table_as_nats_server_lists_it() -> None:
    t = mapping_table("hub")
    assert {m.src for m in t.mappings} == {
        "$JS.hub.API.INFO", "$JS.hub.API.STREAM.>", "$JS.hub.API.CONSUMER.>",
        "$JS.hub.API.DIRECT.>", "$JS.hub.API.ACCOUNT.>", "$JS.hub.API.META.>",
        "$JS.hub.API.SERVER.>", "$JS.hub.API.$KV.>", "$JS.hub.API.$OBJ.>"}
    assert t.apply("$JS.hub.API.INFO") == "$JS.API.INFO"
    assert t.apply("$JS.hub.API.STREAM.INFO.S") == "$JS.API.STREAM.INFO.S"
    assert t.apply("$JS.hub.API.$KV.B.k") == "$KV.B.k"
    # nats-py's filtered CONSUMER.CREATE publishes wildcard tokens: still mapped
    assert t.apply("$JS.hub.API.CONSUMER.CREATE.S.D.s.>") == "$JS.API.CONSUMER.CREATE.S.D.s.>"
    assert t.apply("$JS.hub.API.NOPE") is None
    assert t.apply("$JS.other.API.INFO") is None
    assert not mapping_table("")


def test_own_mapping_wins() -> None:
    own = MappingTable([build_mapping("$JS.hub.API.INFO", [("mine", 100, None)], single=True)])
    table = merged(own, mapping_table("hub"))
    assert table is not None and table.apply("$JS.hub.API.INFO") == "mine"
    assert table.apply("$JS.hub.API.STREAM.NAMES") == "$JS.API.STREAM.NAMES"
    assert merged(own, MappingTable()) is own
    assert merged(None, MappingTable()) is None


def test_reply_and_event_shapes() -> None:
    info = {"type": "t", "config": {}, "created": "c", "state": {}, "cluster": {}, "ts": "x"}
    assert list(with_domain(info, "hub")) == ["type", "config", "created", "state", "domain",
                                              "cluster", "ts"]
    assert with_domain(info, "") is info
    body = append_to_event(b'{"type":"a","stream":"S"}', "hub")
    assert list(json.loads(body).items())[-1] == ("domain", "hub")
    assert append_to_event(b"{}", "") == b"{}"
    assert json.loads(append_to_event(b"{}", "hub")) == {"domain": "hub"}

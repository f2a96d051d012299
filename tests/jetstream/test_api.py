"""The `$JS.API` subject table (node/jetstream/api.py)."""

from __future__ import annotations

import pytest

from node.jetstream.api import Call, route


@pytest.mark.parametrize(("subject", "call"), [
    ("$JS.API.INFO", Call("INFO")),
    ("$JS.API.STREAM.CREATE.S", Call("STREAM.CREATE", "S")),
    ("$JS.API.STREAM.NAMES", Call("STREAM.NAMES")),
    ("$JS.API.STREAM.MSG.GET.S", Call("STREAM.MSG.GET", "S")),
    ("$JS.API.STREAM.MSG.DELETE.S", Call("STREAM.MSG.DELETE", "S")),
    ("$JS.API.DIRECT.GET.S", Call("DIRECT.GET", "S")),
    ("$JS.API.DIRECT.GET.KV_b.$KV.b.key", Call("DIRECT.GET", "KV_b", rest="$KV.b.key")),
    ("$JS.API.CONSUMER.CREATE.S", Call("CONSUMER.CREATE", "S")),
    ("$JS.API.CONSUMER.CREATE.S.c", Call("CONSUMER.CREATE", "S", "c")),
    ("$JS.API.CONSUMER.CREATE.S.c.a.b.>", Call("CONSUMER.CREATE", "S", "c", "a.b.>")),
    ("$JS.API.CONSUMER.DURABLE.CREATE.S.d", Call("CONSUMER.DURABLE.CREATE", "S", "d")),
    ("$JS.API.CONSUMER.MSG.NEXT.S.c", Call("CONSUMER.MSG.NEXT", "S", "c")),
    ("$JS.API.CONSUMER.NAMES.S", Call("CONSUMER.NAMES", "S")),
    ("$JS.API.STREAM.LEADER.STEPDOWN.S", Call("STREAM.LEADER.STEPDOWN", "S")),
    ("$JS.API.CONSUMER.LEADER.STEPDOWN.S.c", Call("CONSUMER.LEADER.STEPDOWN", "S", "c")),
])
def test_known_subjects(subject: str, call: Call) -> None:
    assert route(subject) == call


@pytest.mark.parametrize("subject", [
    "$JS.API.NOPE", "$JS.API.STREAM.CREATE", "$JS.API.STREAM.INFO.S.extra",
    "$JS.API.CONSUMER.INFO.S", "$JS.API.CONSUMER.CREATE", "$JS.API.STREAM.NAMES.x",
    "$JS.ACK.S.c.1.1.1.1.0", "foo",
])
def test_unknown_or_malformed_subjects_have_no_handler(subject: str) -> None:
    assert route(subject) is None

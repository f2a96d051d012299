"""The chaos run's acknowledged-writes file for the audit (chaos/audit.py): pure."""

from __future__ import annotations

from audit.acked import StreamAck, digest_of, parse_any
from chaos.audit import acked_lines


def test_confirmed_publishes_become_ack_lines():
    events = [
        {"proc": "pub0", "type": "invoke", "f": "publish", "stream": "S", "payload": "p0-0"},
        {"proc": "pub0", "type": "ok", "f": "publish", "stream": "S", "payload": "p0-0",
         "seq": 1, "dup": False},
        {"proc": "pub0", "type": "info", "f": "publish", "stream": "S", "payload": "p0-1"},
        {"proc": "pub0", "type": "ok", "f": "publish", "stream": "S", "payload": "p0-1",
         "seq": 2, "dup": True},
        {"proc": "pub1", "type": "fail", "f": "publish", "stream": "S", "payload": "p1-0"},
        {"proc": "con0", "type": "ok", "f": "ack", "stream": "S", "seq": 1},
        {"proc": "run", "type": "ok", "f": "create", "stream": "CR0_0"},
        {"proc": "kv0", "type": "ok", "f": "kv-cas", "key": "k0", "value": "k0|kv0-1|0",
         "last": 0, "rev": 3},
        {"proc": "kv0", "type": "fail", "f": "kv-cas", "key": "k0", "value": "k0|kv0-2|0",
         "last": 0},
    ]
    lines = acked_lines(events)
    assert lines == [{"stream": "S", "seq": 1, "data": "p0-0", "retried": False},
                     {"stream": "S", "seq": 2, "data": "p0-1", "retried": True},
                     {"stream": "KV_CHAOSKV", "seq": 3, "data": "k0|kv0-1|0",
                      "retried": False}]
    import json

    assert parse_any(json.dumps(lines[1]), 2) == StreamAck(2, "S", digest_of(b"p0-1"), 2, True)

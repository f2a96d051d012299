"""Differential tests of the PUB fast path: clients with verbose and pedantic off.

Such clients (nats-py, nats.js, nats.go all connect this way) take jetraft's shortest
route: the parser's repeated-line reuse, no per-message checks, and direct delivery to
a single subscriber. The same raw scripts run against nats-server and jetraft and the
bytes answered (INFO lines aside) must be equal.
"""

from __future__ import annotations

import re

import pytest

_INFO = re.compile(rb"INFO \{.*?\} ?\r\n")
_QUIET = b'CONNECT {"verbose":false,"pedantic":false'


def _connect(extra: bytes = b"") -> bytes:
    return _QUIET + extra + b"}\r\n"


def _burst() -> bytes:
    # Same control line many times (the reused parse), then sizes and replies change.
    frames = [b"PUB b.x 3\r\n%03d\r\n" % i for i in range(300)]
    frames += [b"PUB b.x 4\r\nabcd\r\n", b"PUB b.x r.1 2\r\nhi\r\n", b"PUB b.x r.1 2\r\nho\r\n",
               b"PUB b.x 0\r\n\r\n", b"PUB b.y 3\r\nyyy\r\n", b"PUB b.x 3\r\nend\r\n"]
    return _connect() + b"SUB b.* 5\r\n" + b"".join(frames)


SCRIPTS = {
    "burst_single_sub": _burst(),
    "no_subscriber": _connect() + b"PUB none 2\r\nhi\r\n" * 50 + b"SUB none 1\r\n"
                     + b"PUB none 2\r\nok\r\n",
    "unsub_max": _connect() + b"SUB a 1\r\nUNSUB 1 2\r\n" + b"PUB a 1\r\nx\r\n" * 4
                 + b"SUB a 2\r\nPUB a 1\r\ny\r\n",
    "echo_false_self_only": _connect(b',"echo":false') + b"SUB e 1\r\nPUB e 1\r\nx\r\n",
    "echo_false_no_responders": _connect(b',"echo":false,"headers":true,"no_responders":true')
                                + b"SUB _INBOX.y.* 3\r\nSUB svc 4\r\n"
                                + b"PUB svc _INBOX.y.1 2\r\nhi\r\n",
    "no_responders": _connect(b',"headers":true,"no_responders":true')
                     + b"SUB _INBOX.x.* 7\r\nPUB nope _INBOX.x.1 2\r\nhi\r\n"
                     + b"SUB svc 8\r\nPUB svc _INBOX.x.2 2\r\nhi\r\n",
    "two_subs_and_queue": _connect() + b"SUB s 1\r\nSUB s 2\r\nSUB s q 3\r\n"
                          + b"PUB s 1\r\nx\r\nPUB s 1\r\ny\r\nUNSUB 1\r\nUNSUB 3\r\n"
                          + b"PUB s 1\r\nz\r\n",
    "headers_client_gets_plain_msg": _connect(b',"headers":true') + b"SUB h 9\r\n"
                                     + b"PUB h 2\r\nhi\r\n",
    "ping_inside_burst": _connect() + b"SUB p 1\r\n"
                         + b"PUB p 1\r\nx\r\nPING\r\n" * 20,
}

# Neither server promises an order between the subscriptions of one message: compare
# these outputs as multisets of lines.
_ANY_ORDER = {"two_subs_and_queue"}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_same_bytes_as_nats_server(pair, raw, name):
    script = SCRIPTS[name]
    got = {}
    for label, srv in pair.items():
        got[label] = _INFO.sub(b"", raw(srv.port).exchange(script))
    if name in _ANY_ORDER:
        got = {k: sorted(v.split(b"\r\n")) for k, v in got.items()}
    labels = sorted(got)
    assert got[labels[0]] == got[labels[1]], name
    assert got[labels[0]] or name in ("echo_false_self_only",)


def test_burst_delivers_every_frame_in_order(pair, raw):
    out = _INFO.sub(b"", raw(pair["jetraft"].port).exchange(_burst()))
    bodies = re.findall(rb"MSG b\.x 5 3\r\n(\d{3})\r\n", out)
    assert [int(b) for b in bodies] == list(range(300))


_PERMS_CONF = """
authorization {
  users = [
    {user: free, password: pw}
    {user: lim, password: pw, permissions: {subscribe: {allow: ["a.>"], deny: ["a.secret"]}}}
  ]
}
"""


@pytest.fixture(scope="module")
def perms_pair(module_servers):
    return module_servers.both(_PERMS_CONF)


def test_subscriber_permissions_filter_fast_path_deliveries(perms_pair, raw):
    # The publisher takes the fast path; the single subscriber's permissions still decide.
    got = {}
    for label, srv in perms_pair.items():
        sub = raw(srv.port)
        sub.exchange(_connect(b',"user":"lim","pass":"pw"') + b"SUB a.> 1\r\n")
        pub = raw(srv.port)
        pub.exchange(_connect(b',"user":"free","pass":"pw"')
                     + b"PUB a.x 1\r\n1\r\nPUB a.secret 1\r\n2\r\nPUB a.y 1\r\n3\r\n")
        got[label] = _INFO.sub(b"", sub.exchange(b""))
    assert got["jetraft"] == got["nats-server"]
    assert got["jetraft"] == b"MSG a.x 1 1\r\n1\r\nMSG a.y 1 1\r\n3\r\n"

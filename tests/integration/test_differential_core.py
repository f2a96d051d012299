"""Differential tests: the same raw-protocol scripts against the Go
nats-server and jetraft; the bytes each server answers must be equal.

Only INFO lines differ legitimately (ids, versions), so they are dropped
before comparing.  Everything else (+OK, -ERR texts, MSG/HMSG framing, the
no-responders status, whether the server closes) must match.
"""

from __future__ import annotations

import re

import pytest

_INFO = re.compile(rb"INFO \{.*?\} ?\r\n")


def norm(data: bytes) -> bytes:
    return _INFO.sub(b"", data)


def run_until_pong(raw, port: int, script: bytes) -> bytes:
    c = raw(port)
    return norm(c.exchange(script))


def run_until_close(raw, port: int, script: bytes) -> bytes:
    c = raw(port)
    c.send(script)
    return norm(c.read_to_close()) + b"<closed>"


PONG_SCRIPTS = {
    "verbose_pedantic": b'CONNECT {"verbose":true,"pedantic":true}\r\n'
                        b"PUB foo.* 1\r\nx\r\nSUB foo 1\r\nPUB foo r 2\r\nhi\r\n"
                        b"PUB nope 2\r\nhi\r\n",
    "defaults_before_connect": b"UNSUB 99\r\nSUB a 1\r\nPUB a 1\r\nz\r\n",
    "quiet": b'CONNECT {"verbose":false}\r\nSUB q.> 1\r\nPUB q.a 2\r\nok\r\nPUB q 1\r\nn\r\n',
    "invalid_sub_subject": b'CONNECT {"verbose":false}\r\nSUB foo. 1\r\nSUB .foo 2\r\n'
                           b"SUB a.>.b 3\r\n",
    "pedantic_pub_still_routed": b'CONNECT {"verbose":false,"pedantic":true}\r\n'
                                 b"SUB w.* 1\r\nPUB w.* 1\r\nx\r\n",
    "no_responders": b'CONNECT {"verbose":false,"headers":true,"no_responders":true}\r\n'
                     b"SUB _INBOX.x.* 7\r\nPUB nope _INBOX.x.1 2\r\nhi\r\n",
    "no_responders_without_own_sub": b'CONNECT {"verbose":false,"headers":true,'
                                     b'"no_responders":true}\r\nPUB nope _INBOX.z 2\r\nhi\r\n',
    "unsub_max": b'CONNECT {"verbose":false}\r\nSUB a 1\r\nUNSUB 1 2\r\n'
                 + b"PUB a 1\r\nx\r\n" * 4,
    "unsub_max_already_reached": b'CONNECT {"verbose":false}\r\nSUB a 1\r\nPUB a 1\r\nx\r\n'
                                 b"UNSUB 1 1\r\nPUB a 1\r\ny\r\n",
    "echo_false": b'CONNECT {"verbose":false,"echo":false}\r\nSUB e 1\r\nPUB e 1\r\nx\r\n',
    "hpub_hmsg": b'CONNECT {"verbose":false,"headers":true}\r\nSUB h 9\r\n'
                 b"HPUB h r.1 18 20\r\nNATS/1.0\r\nA: b\r\n\r\nhi\r\n",
    "queue_and_plain": b'CONNECT {"verbose":false}\r\nSUB s q 1\r\nSUB s 2\r\nPUB s 1\r\nx\r\n',
    "duplicate_sid": b'CONNECT {"verbose":false}\r\nSUB a 1\r\nSUB b 1\r\nPUB b 1\r\nx\r\n'
                     b"PUB a 1\r\ny\r\n",
}

CLOSE_SCRIPTS = {
    "garbage": b"garbage\r\n",
    "max_payload": b'CONNECT {"verbose":false}\r\nPUB foo 2000000\r\n',
    "no_responders_needs_headers": b'CONNECT {"verbose":false,"no_responders":true}\r\n',
}


@pytest.mark.parametrize("name", sorted(PONG_SCRIPTS))
def test_same_replies(pair, raw, name):
    script = PONG_SCRIPTS[name]
    want = run_until_pong(raw, pair["nats-server"].port, script)
    got = run_until_pong(raw, pair["jetraft"].port, script)
    assert got == want


@pytest.mark.parametrize("name", sorted(CLOSE_SCRIPTS))
def test_same_fatal_errors(pair, raw, name):
    script = CLOSE_SCRIPTS[name]
    want = run_until_close(raw, pair["nats-server"].port, script)
    got = run_until_close(raw, pair["jetraft"].port, script)
    assert got == want


def test_headers_stripped_for_clients_without_headers(pair, raw):
    def transcript(port: int) -> bytes:
        sub = raw(port)
        sub.exchange(b'CONNECT {"verbose":false,"headers":false}\r\nSUB h 1\r\n')
        pub = raw(port)
        pub.exchange(b'CONNECT {"verbose":false,"headers":true}\r\n'
                     b"HPUB h 16 18\r\nNATS/1.0\r\nA:\r\n\r\nhi\r\n")
        return norm(sub.exchange(b""))

    assert transcript(pair["jetraft"].port) == transcript(pair["nats-server"].port)


def test_queue_group_single_delivery_across_connections(pair, raw):
    def counts(port: int) -> int:
        members = [raw(port) for _ in range(3)]
        for m in members:
            m.exchange(b'CONNECT {"verbose":false}\r\nSUB jobs grp 1\r\n')
        pub = raw(port)
        pub.exchange(b'CONNECT {"verbose":false}\r\n' + b"PUB jobs 1\r\nx\r\n" * 30)
        return sum(norm(m.exchange(b"")).count(b"MSG jobs 1 1\r\n") for m in members)

    assert counts(pair["jetraft"].port) == counts(pair["nats-server"].port) == 30


AUTH_CONF = """
authorization {
  users = [
    {user: alice, password: secret, permissions: {publish: {allow: ["ok.>"]},
                                                  subscribe: {deny: ["secret.>"]}}}
  ]
}
"""


@pytest.fixture(scope="module")
def auth_pair(module_servers):
    return module_servers.both(AUTH_CONF)


def test_auth_violation(auth_pair, raw):
    script = b'CONNECT {"verbose":false,"user":"alice","pass":"wrong"}\r\n'
    want = run_until_close(raw, auth_pair["nats-server"].port, script)
    assert run_until_close(raw, auth_pair["jetraft"].port, script) == want


def test_op_before_connect_when_auth_required(auth_pair, raw):
    script = b"SUB a 1\r\n"
    want = run_until_close(raw, auth_pair["nats-server"].port, script)
    assert run_until_close(raw, auth_pair["jetraft"].port, script) == want


def test_auth_info_and_permission_errors(auth_pair, raw):
    script = (b'CONNECT {"verbose":true,"user":"alice","pass":"secret"}\r\n'
              b"PUB no.way 1\r\nx\r\nPUB ok.fine 1\r\nx\r\nSUB secret.x 1\r\n"
              b"SUB secret.y q 2\r\nSUB public 3\r\n")
    outs = {}
    for name, proc in auth_pair.items():
        c = raw(proc.port)
        assert c.info.get("auth_required") is True
        outs[name] = norm(c.exchange(script))
    assert outs["jetraft"] == outs["nats-server"]
    assert b"Permissions Violation for Publish to \"no.way\"" in outs["jetraft"]

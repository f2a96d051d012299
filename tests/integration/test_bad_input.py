"""Hostile and broken clients: each gets -ERR or a clean close, only that
client is affected, and the server keeps serving everyone else."""

from __future__ import annotations

import random
import socket
import time

import pytest


def assert_healthy(raw, proc, timeout: float = 10.0) -> None:
    """A fresh client can still subscribe and receive its own message."""
    c = raw(proc.port, timeout)
    out = c.exchange(b'CONNECT {"verbose":false}\r\nSUB ok.check 1\r\nPUB ok.check 2\r\nhi\r\n',
                     timeout)
    assert b"MSG ok.check 1 2\r\nhi\r\n" in out
    assert proc.alive()


@pytest.fixture(scope="module")
def bystander(jetraft):
    """A subscriber that must see every message despite the abuse around it."""
    s = socket.create_connection(("127.0.0.1", jetraft.port), timeout=10)
    s.sendall(b'CONNECT {"verbose":false}\r\nSUB by.stand 1\r\nPING\r\n')
    return s


def _check_bystander(jetraft, sock, raw, tag: bytes) -> None:
    pub = raw(jetraft.port)
    pub.exchange(b'CONNECT {"verbose":false}\r\nPUB by.stand %d\r\n%b\r\n' % (len(tag), tag))
    data = b""
    deadline = time.monotonic() + 10
    while tag not in data and time.monotonic() < deadline:
        data += sock.recv(65536)
    assert tag in data


@pytest.mark.parametrize("payload", [
    b"garbage\r\n",
    b"\x00\x01\x02\xff\xfe" * 100,
    b"PUB\r\n",
    b"PUB foo bar baz qux quux\r\n",
    b"PUB foo -5\r\n",
    b"SUB\r\n",
    b"HPUB foo 10 5\r\n",
    b"CONNECT {not json\r\n",
    b'CONNECT ["list"]\r\n',
    b"X" * 10000,
], ids=lambda p: repr(p[:16]))
def test_garbage_closes_only_that_client(jetraft, raw, bystander, payload):
    c = raw(jetraft.port)
    c.send(payload)
    out = c.read_close_or_wait(3)
    assert out == b"" or out.startswith(b"-ERR '"), out
    assert_healthy(raw, jetraft)
    _check_bystander(jetraft, bystander, raw, b"after-%d" % len(payload))


def test_random_bytes_fuzz(jetraft, raw):
    rng = random.Random(1234)
    for _ in range(20):
        c = raw(jetraft.port)
        try:
            c.send(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
        except OSError:
            pass
        c.close()
    assert_healthy(raw, jetraft)


def test_oversized_payload_rejected(jetraft, raw):
    c = raw(jetraft.port)
    c.send(b'CONNECT {"verbose":false}\r\nPUB big %d\r\n' % (c.info["max_payload"] + 1))
    assert c.read_to_close() == b"-ERR 'Maximum Payload Violation'\r\n"
    assert_healthy(raw, jetraft)


def test_invalid_subjects_are_not_fatal(jetraft, raw):
    c = raw(jetraft.port)
    out = c.exchange(b'CONNECT {"verbose":false}\r\nSUB a..b 1\r\nSUB > x 2\r\nSUB a 3\r\n'
                     b"PUB a 1\r\nz\r\n")
    assert out.count(b"-ERR 'Invalid Subject'") == 1
    assert b"MSG a 3 1\r\nz\r\n" in out


def test_half_frames_then_close(jetraft, raw):
    for frag in [b"PUB foo 10\r\nabc", b"HPUB foo 20 30\r\nNATS/1.0\r\n", b"SUB fo", b"CONN"]:
        c = raw(jetraft.port)
        c.send(frag)
        c.close()
    assert_healthy(raw, jetraft)


def test_control_line_too_long(jetraft, raw):
    c = raw(jetraft.port)
    c.send(b"SUB " + b"a" * 10000 + b" 1\r\n")
    out = c.read_close_or_wait(3)
    assert out.lower().startswith(b"-err 'maximum control line exceeded")
    assert_healthy(raw, jetraft)


def _many_subs(proc, raw, n: int) -> None:
    c = raw(proc.port)
    c.send(b'CONNECT {"verbose":false}\r\n')
    chunk = 10_000
    for start in range(0, n, chunk):
        c.send(b"".join(b"SUB many.%d %d\r\n" % (i, i) for i in range(start, start + chunk)))
    c.exchange(b"", timeout=120)
    probe = c.exchange(b"PUB many.%d 1\r\nx\r\n" % (n - 1), timeout=60)
    assert b"MSG many.%d %d 1\r\nx\r\n" % (n - 1, n - 1) in probe
    c.close()


# Its own waits add up to more than the default 120 s on a loaded machine.
@pytest.mark.timeout(600)
def test_million_subscriptions(servers, raw):
    # Its own server: the mass unsubscribe on close must not slow other tests.
    proc = servers.jetraft()
    _many_subs(proc, raw, 1_000_000)
    # The closed client's million subscriptions go first: on a loaded machine (CI runs 4 test
    # workers on 2 cores) that took more than 10 s before the new client's INFO.
    assert_healthy(raw, proc, timeout=60)

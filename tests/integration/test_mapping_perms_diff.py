"""Weighted subject mappings under publish permissions (issue 7 review): the
permission applies to the subject the mapping draws, drawn once, as in
nats-server (the mapping runs in its parser, before processInboundClientMsg
checks permissions). Same config and clients against both servers."""

from __future__ import annotations

import asyncio
import json
import re
import socket

import nats
import pytest

from tests.integration.test_security import HOST

pytestmark = pytest.mark.timeout(120)
N = 300

CONFIG = """
accounts {
  A {
    users: [
      {user: pub, password: p, permissions: {publish: {allow: ["ok.>"]}}}
      {user: sub, password: p}
    ]
    mappings: {
      foo: [{destination: ok.foo, weight: 40%}, {destination: no.foo, weight: 40%}]
    }
  }
}
"""
VIOLATION = re.compile(rb"-ERR 'Permissions Violation for Publish to \"([^\"]+)\"'")


def publish_all(port: int) -> list[str]:
    """N publishes to `foo` as `pub`; the subjects the server refused."""
    with socket.create_connection((HOST, port), timeout=20) as s:
        buf = b""
        while b"\r\n" not in buf:
            buf += s.recv(4096)
        connect = {"verbose": False, "pedantic": False, "user": "pub", "pass": "p"}
        s.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\n"
                  + b"PUB foo 2\r\nhi\r\n" * N + b"PING\r\n")
        got = b""
        while not got.endswith(b"PONG\r\n"):
            chunk = s.recv(65536)
            assert chunk, f"closed early: {got[-200:]!r}"
            got += chunk
    return [m.decode() for m in VIOLATION.findall(got)]


async def outcome(port: int) -> tuple[dict[str, int], dict[str, int]]:
    seen: dict[str, int] = {}

    async def on_msg(msg) -> None:
        seen[msg.subject] = seen.get(msg.subject, 0) + 1

    nc = await nats.connect(f"nats://{HOST}:{port}", user="sub", password="p",
                            allow_reconnect=False)
    await nc.subscribe(">", cb=on_msg)
    await nc.flush(timeout=10)
    refused: dict[str, int] = {}
    for subject in await asyncio.to_thread(publish_all, port):
        refused[subject] = refused.get(subject, 0) + 1
    deadline = asyncio.get_running_loop().time() + 30
    while sum(seen.values()) + sum(refused.values()) < N:
        assert asyncio.get_running_loop().time() < deadline, (seen, refused)
        await asyncio.sleep(0.05)
    await nc.flush(timeout=10)
    await nc.close()
    return seen, refused


@pytest.mark.parametrize("impl", ["nats-server", "jetraft"])
async def test_publish_permission_applies_to_the_drawn_destination(servers, impl):
    srv = servers.nats_server(CONFIG) if impl == "nats-server" else servers.jetraft(CONFIG)
    seen, refused = await outcome(srv.port)
    # Only the allowed destination is ever delivered; the denied one and the
    # unmapped remainder (`foo`, 20 %) are refused under their mapped names.
    assert set(seen) == {"ok.foo"}, seen
    assert set(refused) == {"no.foo", "foo"}, refused
    assert sum(seen.values()) + sum(refused.values()) == N

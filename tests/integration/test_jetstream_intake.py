"""A client's plain PUB to a stream is taken in the publisher's own turn (`Client.deliver_inline`:
no Message framed, no internal-inbox turn) only while the stream's internal client has
nothing queued; and the publish path's byte-limit check is skipped only while no limit
applies (`JetStreamService._no_byte_limit`).

1. HPUBs are queued in the internal client's inbox; the plain PUBs sent behind them in the
   same TCP write must still be stored after them, in arrival order (nats-server and
   jetraft). Mutation: `deliver_inline` without its `inbox` check -> the PUBs overtake the
   queued HPUBs and this test FAILS.
2. An account whose JetStream limits are lowered by a config reload refuses the next
   publish past them (10002) although earlier publishes skipped the check (jetraft: its
   remembered "no limit" is dropped with the replaced options and limits). Mutation:
   `_no_byte_limit` trusting its remembered answer (no identity check of the limits and the
   options) -> FAILS (the 5th publish is stored). A JWT update (operator mode) replaces the
   limits only; no test here changes them that way.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats
import pytest

from tests.integration.test_reload_diff import reload

IMPLS = ["nats-server", "jetraft"]
N = 60


def _frames() -> bytes:
    """N publishes to `in.x`, every third an HPUB, each with its own reply subject."""
    out = []
    hdr = b"NATS/1.0\r\nK: v\r\n\r\n"
    for k in range(N):
        body = str(k).encode()
        if k % 3 == 0:
            out.append(b"HPUB in.x _R.%d %d %d\r\n%b%b\r\n"
                       % (k, len(hdr), len(hdr) + len(body), hdr, body))
        else:
            out.append(b"PUB in.x _R.%d %d\r\n%b\r\n" % (k, len(body), body))
    return b"".join(out)


async def _stored_order(url: str, port: int, raw: Any) -> list[bytes]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="IN", subjects=["in.>"])
        conn = raw(port)
        conn.send(b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\nSUB _R.* 1\r\n')
        conn.exchange(b"")
        conn.send(_frames())  # one write: the HPUBs wait in the inbox as the PUBs arrive
        for _ in range(N):  # every PubAck
            head = conn.read_line()
            assert head.startswith(b"MSG _R."), head
            ack = json.loads(conn.read_line())
            assert "error" not in ack, ack
        return [(await js.get_msg("IN", seq)).data for seq in range(1, N + 1)]
    finally:
        await nc.close()


@pytest.mark.parametrize("impl", IMPLS)
def test_plain_pubs_behind_queued_hpubs_are_stored_in_arrival_order(
        servers: Any, raw: Any, impl: str) -> None:
    srv = servers.nats_server(args=["-js", "-sd", str(servers.workdir / "ns")]) \
        if impl == "nats-server" else servers.jetraft(
            args=["-js", "-sd", str(servers.workdir / "jr")])
    got = asyncio.run(_stored_order(srv.url, srv.port, raw))
    assert got == [str(k).encode() for k in range(N)]


def _config(store: str, limits: str) -> str:
    return (f'jetstream {{ store_dir: "{store}" }}\n'
            f"accounts {{ A: {{ jetstream: {limits}, users: [{{user: a, password: a}}] }} }}\n")


async def _publish(url: str, count: int) -> list[Any]:
    nc = await nats.connect(url, user="a", password="a")
    out: list[Any] = []
    try:
        js = nc.jetstream(timeout=10)
        for _ in range(count):
            try:
                out.append((await js.publish("lim.x", b"x" * 1000)).seq)
            except nats.js.errors.APIError as exc:
                out.append(exc.err_code)
    finally:
        await nc.close()
    return out


async def _create(url: str) -> None:
    nc = await nats.connect(url, user="a", password="a")
    try:
        await nc.jetstream(timeout=10).add_stream(name="LIM", subjects=["lim.>"])
    finally:
        await nc.close()


def test_a_reload_that_lowers_the_account_limits_refuses_the_next_publish(
        servers: Any) -> None:
    store = str(servers.workdir / "lim")
    srv = servers.jetraft(config=_config(store, "enabled"))
    asyncio.run(_create(srv.url))
    assert asyncio.run(_publish(srv.url, 3)) == [1, 2, 3]  # no limit: nothing to check
    outcome = reload(srv, _config(store, "{max_file: 4500, max_mem: 1000}"))
    assert "Reloaded server configuration" in outcome, outcome
    # 3 records of ~1,040 bytes stored: the 4th still fits, the 5th does not
    assert asyncio.run(_publish(srv.url, 2)) == [4, 10002]

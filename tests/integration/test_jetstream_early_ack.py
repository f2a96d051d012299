"""A lone publish's PubAck leaves before the store commit (single node, inline apply:
`JetStreamService._early_replies`); what a client sees must not change for it.

Both servers (nats-py over TCP, `jetraft serve -js` and nats-server -js): after each sync
publish returns, (1) the message is readable and counted, (2) with `republish` the
republished copy reached the client before the PubAck (nats-server sends it first; the
early path stands aside for such streams); (3) PubAcks keep the stream's order when runs
acked early and runs acked after their commit mix.
"""

from __future__ import annotations

from pathlib import Path

import nats
import pytest
from nats.js.api import RePublish

from tests.integration.conftest import Servers
from tests.puback_order import pubacks_keep_stream_order

COUNT = 40


def _start(servers: Servers, which: str, tmp_path: Path) -> str:
    args = ["-js", "-sd", str(tmp_path / which)]
    proc = servers.jetraft(args=args) if which == "jetraft" else servers.nats_server(args=args)
    return proc.url


@pytest.mark.timeout(90)
@pytest.mark.parametrize("which", ["nats-server", "jetraft"])
async def test_an_acked_message_is_readable_and_counted_at_once(
        servers: Servers, tmp_path: Path, which: str) -> None:
    nc = await nats.connect(_start(servers, which, tmp_path))
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="EA", subjects=["ea.>"])
        for k in range(1, COUNT + 1):
            ack = await js.publish(f"ea.{k % 3}", f"m{k}".encode())
            assert ack.seq == k
            got = await js.get_msg("EA", k)  # the next request sees the stored message
            assert got.data == f"m{k}".encode() and got.subject == f"ea.{k % 3}"
            if k % 10 == 0:
                info = await js.stream_info("EA")
                assert info.state.messages == info.state.last_seq == k
    finally:
        await nc.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("which", ["nats-server", "jetraft"])
async def test_a_republished_copy_arrives_before_the_puback(
        servers: Servers, tmp_path: Path, which: str) -> None:
    nc = await nats.connect(_start(servers, which, tmp_path))
    try:
        js = nc.jetstream(timeout=10)
        sub = await nc.subscribe("copy.>")  # no callback: parsed MSGs queue here at once
        await nc.flush()
        await js.add_stream(name="RP", subjects=["rp.>"],
                            republish=RePublish(src="rp.>", dest="copy.>"))
        for k in range(1, COUNT + 1):
            ack = await js.publish(f"rp.{k}", b"x")
            assert ack.seq == k
            # The copy came before the PubAck on the connection: already parsed.
            assert sub.pending_msgs == k, (k, sub.pending_msgs)
    finally:
        await nc.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("which", ["nats-server", "jetraft"])
async def test_pubacks_arrive_in_sequence_order_when_runs_of_any_size_mix(
        servers: Servers, tmp_path: Path, which: str) -> None:
    """Bursts of 20 publishes in flight (a run too long to ack early: its PubAcks wait for
    the loop) alternate with lone ones (acked early): no PubAck overtakes an earlier one."""
    nc = await nats.connect(_start(servers, which, tmp_path))
    try:
        js = nc.jetstream(timeout=10)
        await pubacks_keep_stream_order(nc, js, rounds=60, timeout=30)
    finally:
        await nc.close()

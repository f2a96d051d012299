"""The WebSocket listener end to end, with the real `websockets` client and
nats-py's ws:// transport, against nats-server (the oracle) and `jetraft serve`."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from tests.integration.test_security import HOST, IMPLS, server
from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)


def ws_conf(port: int, compression: bool) -> str:
    return (f'websocket {{ listen: "{HOST}:{port}", no_tls: true, '
            f"compression: {str(compression).lower()} }}\n")


async def recv_until(ws, needle: bytes, timeout: float = 10.0) -> bytes:
    """Read frames until the NATS byte stream contains `needle`."""
    got = b""
    async with asyncio.timeout(timeout):
        while needle not in got:
            frame = await ws.recv()
            got += frame if isinstance(frame, bytes) else frame.encode()
    return got


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("compression", [False, True], ids=["plain", "deflate"])
async def test_pub_sub_over_websocket(impl, compression, tmp_path):
    wport = free_port()
    with server(impl, tmp_path, ws_conf(wport, compression), also=(wport,)):
        async with websockets.connect(f"ws://{HOST}:{wport}", max_size=None) as ws:
            if compression:
                assert ws.protocol.extensions, "permessage-deflate was not negotiated"
            first = await recv_until(ws, b"\r\n")
            assert first.startswith(b"INFO ")
            info = json.loads(first[5:first.index(b"\r\n")])
            assert info["headers"] is True
            big = b"x" * 70_000  # a 64-bit length frame both ways
            await ws.send(b'CONNECT {"verbose":false,"headers":true}\r\nSUB foo 1\r\n')
            # A PUB split across two messages, one of them a text frame.
            await ws.send(b"PUB foo 5\r\nhel")
            await ws.send("lo\r\n")
            await ws.send(b"PUB foo %d\r\n" % len(big) + big + b"\r\nPING\r\n")
            got = await recv_until(ws, b"PONG\r\n")
            assert b"MSG foo 1 5\r\nhello\r\n" in got
            assert b"MSG foo 1 %d\r\n" % len(big) + big + b"\r\n" in got


@pytest.mark.parametrize("impl", IMPLS)
async def test_websocket_ping_and_close(impl, tmp_path):
    wport = free_port()
    with server(impl, tmp_path, ws_conf(wport, False), also=(wport,)):
        ws = await websockets.connect(f"ws://{HOST}:{wport}")
        await recv_until(ws, b"\r\n")
        pong = await ws.ping(b"hi")
        async with asyncio.timeout(10):
            await pong
        await ws.close(code=1000)
        assert ws.close_code == 1000


@pytest.mark.parametrize("impl", IMPLS)
async def test_websocket_rejects_plain_http(impl, tmp_path):
    wport = free_port()
    with server(impl, tmp_path, ws_conf(wport, False), also=(wport,)):
        reader, writer = await asyncio.open_connection(HOST, wport)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(10):
            status = await reader.readline()
        writer.close()
        assert status.startswith(b"HTTP/1.1 400")


@pytest.mark.parametrize("impl", IMPLS)
async def test_websocket_and_tcp_clients_see_each_other(impl, tmp_path):
    import nats

    wport = free_port()
    with server(impl, tmp_path, ws_conf(wport, True), also=(wport,)) as port:
        nc = await nats.connect(f"nats://{HOST}:{port}", allow_reconnect=False)
        async with websockets.connect(f"ws://{HOST}:{wport}") as ws:
            await recv_until(ws, b"\r\n")
            await ws.send(b'CONNECT {"verbose":false}\r\nSUB bar 7\r\nPING\r\n')
            await recv_until(ws, b"PONG\r\n")
            await nc.publish("bar", b"from-tcp")
            await nc.flush(timeout=10)
            got = await recv_until(ws, b"from-tcp\r\n")
            assert b"MSG bar 7 8\r\nfrom-tcp\r\n" in got
            sub = await nc.subscribe("baz")
            await nc.flush(timeout=10)
            # In two full CI runs nats-server 2.15 (only it, and never when run alone) did not
            # route the websocket client's first PUB to the TCP subscriber; not yet understood.
            # Jetraft must route the first one; the oracle gets two more tries.
            tries = 1 if impl == "jetraft" else 3
            for attempt in range(tries):
                await ws.send(b"PUB baz 6\r\nfrom-w\r\nPING\r\n")
                await recv_until(ws, b"PONG\r\n")  # the server has routed the PUB
                try:
                    msg = await sub.next_msg(timeout=10 if attempt == tries - 1 else 3)
                    break
                except nats.errors.TimeoutError:
                    if attempt == tries - 1:
                        raise
            assert msg.data == b"from-w"
        await nc.close()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("compression", [False, True], ids=["plain", "deflate"])
async def test_nats_py_over_websocket(impl, compression, tmp_path):
    import nats

    wport = free_port()
    with server(impl, tmp_path, ws_conf(wport, compression), also=(wport,)):
        nc = await nats.connect(f"ws://{HOST}:{wport}", allow_reconnect=False)
        try:
            sub = await nc.subscribe("ws.>")
            async def upper(m):
                await m.respond(m.data.upper())

            responder = await nc.subscribe("svc", cb=upper)
            big = bytes(range(256)) * 300  # spans several frames
            await nc.publish("ws.a", big, headers={"K": "v"})
            msg = await sub.next_msg(timeout=10)
            assert (msg.subject, msg.data, msg.headers) == ("ws.a", big, {"K": "v"})
            reply = await nc.request("svc", b"ping", timeout=10)
            assert reply.data == b"PING"
            await responder.unsubscribe()
        finally:
            await nc.close()

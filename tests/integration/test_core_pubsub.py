"""Core NATS through real nats-py clients against a real `jetraft serve`."""

from __future__ import annotations

import asyncio
from collections import Counter

import nats
import pytest
from nats.errors import MaxPayloadError, NoRespondersError

TIMEOUT = 10.0


async def connect(server, **kw):
    return await nats.connect(server.url, connect_timeout=TIMEOUT, allow_reconnect=False, **kw)


async def collect(sub, n: int) -> list:
    return [await sub.next_msg(timeout=TIMEOUT) for _ in range(n)]


async def test_pub_sub_roundtrip(jetraft):
    nc = await connect(jetraft)
    sub = await nc.subscribe("greet.joe")
    await nc.publish("greet.joe", b"hello")
    msg = await sub.next_msg(timeout=TIMEOUT)
    assert (msg.subject, msg.data) == ("greet.joe", b"hello")
    await nc.close()


async def test_many_clients_and_ordering(jetraft):
    pub = await connect(jetraft)
    subs = [await connect(jetraft) for _ in range(5)]
    handles = [await c.subscribe("fan.out") for c in subs]
    for c in subs:
        await c.flush()
    for i in range(200):
        await pub.publish("fan.out", str(i).encode())
    await pub.flush()
    for h in handles:
        got = [m.data for m in await collect(h, 200)]
        assert got == [str(i).encode() for i in range(200)]
    for c in [pub, *subs]:
        await c.close()


async def test_wildcards(jetraft):
    nc = await connect(jetraft)
    star = await nc.subscribe("w.*.end")
    full = await nc.subscribe("w.>")
    await nc.flush()
    for subject in ["w.a.end", "w.b.end", "w.a.b.end", "w.x"]:
        await nc.publish(subject, subject.encode())
    await nc.flush()
    assert sorted(m.subject for m in await collect(star, 2)) == ["w.a.end", "w.b.end"]
    got = sorted(m.subject for m in await collect(full, 4))
    assert got == ["w.a.b.end", "w.a.end", "w.b.end", "w.x"]
    with pytest.raises(asyncio.TimeoutError):
        await star.next_msg(timeout=0.3)  # w.a.b.end and w.x must not match w.*.end
    await nc.close()


async def test_queue_group_exactly_once_and_spread(jetraft):
    nc = await connect(jetraft)
    counts: Counter[int] = Counter()
    seen: list[bytes] = []
    members = []
    for i in range(3):
        async def cb(msg, i=i):
            counts[i] += 1
            seen.append(msg.data)
        members.append(await nc.subscribe("work", queue="workers", cb=cb))
    plain = await nc.subscribe("work")
    await nc.flush()
    n = 300
    for i in range(n):
        await nc.publish("work", str(i).encode())
    await nc.flush()
    assert len(await collect(plain, n)) == n  # plain subscribers still get everything
    for _ in range(200):
        if len(seen) >= n:
            break
        await asyncio.sleep(0.05)
    assert sorted(seen) == sorted(str(i).encode() for i in range(n))
    assert len(counts) == 3 and min(counts.values()) > n // 10
    await nc.close()


async def test_request_reply(jetraft):
    svc = await connect(jetraft)
    cli = await connect(jetraft)

    async def handler(msg):
        await msg.respond(b"echo:" + msg.data)

    await svc.subscribe("svc.echo", cb=handler)
    await svc.flush()
    for i in range(20):
        resp = await cli.request("svc.echo", str(i).encode(), timeout=TIMEOUT)
        assert resp.data == b"echo:" + str(i).encode()
    await svc.close()
    await cli.close()


async def test_headers(jetraft):
    nc = await connect(jetraft)
    sub = await nc.subscribe("hdr")
    await nc.flush()
    await nc.publish("hdr", b"body", headers={"X-Trace": "abc", "Multi": "1"})
    msg = await sub.next_msg(timeout=TIMEOUT)
    assert msg.data == b"body"
    assert msg.headers == {"X-Trace": "abc", "Multi": "1"}
    await nc.close()


async def test_no_responders(jetraft):
    nc = await connect(jetraft)
    with pytest.raises(NoRespondersError):
        await nc.request("nobody.home", b"?", timeout=TIMEOUT)
    await nc.close()


async def test_auto_unsubscribe(jetraft):
    nc = await connect(jetraft)
    sub = await nc.subscribe("auto", max_msgs=3)
    await nc.flush()
    for i in range(10):
        await nc.publish("auto", str(i).encode())
    await nc.flush()
    assert [m.data for m in await collect(sub, 3)] == [b"0", b"1", b"2"]
    with pytest.raises((asyncio.TimeoutError, nats.errors.TimeoutError)):
        await sub.next_msg(timeout=0.3)
    await nc.close()


async def test_echo_false(jetraft):
    quiet = await connect(jetraft, no_echo=True)
    other = await connect(jetraft)
    own = await quiet.subscribe("echo.t")
    theirs = await other.subscribe("echo.t")
    await quiet.flush()
    await other.flush()
    await quiet.publish("echo.t", b"from-quiet")
    await other.publish("echo.t", b"from-other")
    await quiet.flush()
    await other.flush()
    assert (await own.next_msg(timeout=TIMEOUT)).data == b"from-other"
    with pytest.raises(asyncio.TimeoutError):
        await own.next_msg(timeout=0.3)
    got = sorted(m.data for m in await collect(theirs, 2))
    assert got == [b"from-other", b"from-quiet"]
    await quiet.close()
    await other.close()


async def test_max_payload_is_advertised_and_enforced(jetraft):
    nc = await connect(jetraft)
    assert nc.max_payload == 1024 * 1024
    with pytest.raises(MaxPayloadError):
        await nc.publish("big", b"x" * (nc.max_payload + 1))
    sub = await nc.subscribe("big")
    await nc.flush()
    await nc.publish("big", b"y" * nc.max_payload)  # exactly the limit is fine
    assert len((await sub.next_msg(timeout=TIMEOUT)).data) == nc.max_payload
    await nc.close()


async def test_server_info_fields(jetraft):
    nc = await connect(jetraft)
    info = nc._server_info
    assert len(info["server_id"]) == 56 and info["server_id"].startswith("N")
    assert info["headers"] is True and info["proto"] == 1
    assert info["port"] == jetraft.port
    await nc.close()

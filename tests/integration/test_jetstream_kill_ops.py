"""kill -9 at random moments while publishers (with PubAcks), an acking consumer, purges,
consumer create/delete and message TTLs all run against one `jetraft serve -js` node.

After every restart a checker holds the store to what the clients were told:
- every acked message is at the sequence its PubAck named, or its absence is explained by a
  purge that may have applied after it was stored (acknowledged, or with its reply lost to
  the kill) or by its Nats-TTL having run out;
- an acknowledged purge (no `keep`) leaves none of the matching messages acked before it;
- nothing appears that no publisher sent, nothing twice, each publisher's messages in order;
- a consumer whose create was acknowledged exists, one whose delete was acknowledged does not;
- the surviving consumer's ack floor never goes backwards.

CI runs 3 cycles; by hand `JS_KILL_CYCLES=50 pytest --timeout 0 <this file>` (the default
120 s per-test timeout stops long runs; `JS_KILL_SEED` repeats one).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.js.errors

from tests.integration.conftest import ServerProc, Servers
from tests.integration.test_jetstream_serve import KILL_CYCLES, _js_server

PUBLISHERS = 3
TTL_S = 1.0
WORKER = nats.js.api.ConsumerConfig(ack_wait=1.0)


@dataclass
class Sent:
    payload: str
    subject: str
    ttl: bool
    sent: float  # monotonic time the publish went out: it cannot be stored earlier
    seq: int = 0  # from the PubAck; 0 while unacknowledged
    acked: float = 0.0


@dataclass
class Purge:
    req: dict[str, Any]
    sent: float
    end: float = float("inf")  # reply time; a lost reply could have applied until the kill
    replied: bool = False

    def matches(self, subject: str) -> bool:
        return self.req.get("filter") in (None, subject)


@dataclass
class History:
    sent: dict[str, Sent] = field(default_factory=dict)
    purges: list[Purge] = field(default_factory=list)
    created: set[str] = field(default_factory=set)  # create acknowledged
    delete_sent: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)  # delete acknowledged
    floor: int = 0  # highest ack floor of `worker` seen so far
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # clear: publishers wait
    inflight: int = 0


async def _publisher(js: Any, tag: str, h: History) -> None:
    i = 0
    while True:
        subject = "k.a" if i % 2 == 0 else "k.b"
        ttl = i % 3 == 0
        await h.gate.wait()
        s = Sent(f"{tag}:{i:06d}", subject, ttl, time.monotonic())
        h.sent[s.payload] = s
        h.inflight += 1
        try:
            ack = await js.publish(subject, s.payload.encode(), timeout=2,
                                   headers={"Nats-TTL": f"{int(TTL_S)}s"} if ttl else None)
        except Exception:  # noqa: BLE001 - the node was killed under us
            return
        finally:
            h.inflight -= 1
        s.seq, s.acked = ack.seq, time.monotonic()
        i += 1


async def _acker(js: Any) -> None:
    try:
        psub = await js.pull_subscribe("k.>", "worker", stream="K", config=WORKER)
        while True:
            for m in await psub.fetch(5, timeout=1):
                await m.ack_sync(timeout=2)
    except Exception:  # noqa: BLE001 - killed, or a fetch timed out at the very end
        return


PURGES = [{"filter": "k.b"}, {"filter": "k.a", "keep": 5}, {"keep": 20}, {}]


async def _quiet(js: Any, subject: str, payload: str, h: History) -> None:
    """Stop the publishers, then store a marker that the purge must take: with nothing
    after it, it is the stream's last message (a purge that spares the last one shows)."""
    h.gate.clear()
    while h.inflight:
        await asyncio.sleep(0.01)
    s = Sent(payload, subject, False, time.monotonic())
    h.sent[payload] = s
    ack = await js.publish(subject, payload.encode(), timeout=2)
    s.seq, s.acked = ack.seq, time.monotonic()


async def _side(nc: Any, js: Any, cycle: int, rng: random.Random, h: History) -> None:
    """Purges and consumer create/delete, one after another, until the node dies."""
    j = 0
    try:
        while True:
            await asyncio.sleep(rng.uniform(0.05, 0.25))
            req = dict(rng.choice(PURGES))
            if "keep" not in req and rng.random() < 0.5:
                await _quiet(js, req.get("filter", "k.a"), f"m:{cycle:03d}:{j:06d}", h)
            p = Purge(req, time.monotonic())
            h.purges.append(p)
            try:
                reply = json.loads((await nc.request("$JS.API.STREAM.PURGE.K",
                                                     json.dumps(req).encode(), timeout=2)).data)
            finally:
                h.gate.set()
            assert reply.get("success"), reply
            p.end, p.replied = time.monotonic(), True
            name = f"tmp{cycle}x{j}"
            j += 1
            await js.add_consumer("K", durable_name=name, ack_policy="explicit")
            h.created.add(name)
            if rng.random() < 0.7:
                h.delete_sent.add(name)
                await js.delete_consumer("K", name)
                h.deleted.add(name)
                if rng.random() < 0.4:  # the same name again: it must exist once acked
                    h.deleted.discard(name)
                    await js.add_consumer("K", durable_name=name, ack_policy="explicit")
                    h.delete_sent.discard(name)
            ci = await js.consumer_info("K", "worker")
            assert ci.ack_floor.stream_seq >= h.floor, "ack floor went backwards (live)"
            h.floor = ci.ack_floor.stream_seq
    except (TimeoutError, nats.errors.Error, OSError):
        return  # killed
    finally:
        h.gate.set()  # the publishers must see the kill too


async def _cycle(cycle: int, proc: ServerProc, rng: random.Random, h: History) -> None:
    nc = await nats.connect(proc.url, allow_reconnect=False)
    js = nc.jetstream()
    await js.add_stream(name="K", subjects=["k.*"], allow_msg_ttl=True)  # same config: no-op
    await js.add_consumer("K", config=WORKER, durable_name="worker", filter_subject="k.>",
                          ack_policy="explicit")
    h.gate.set()
    tasks = [asyncio.ensure_future(_publisher(js, f"{w}:{cycle:03d}", h))
             for w in range(PUBLISHERS)]
    tasks.append(asyncio.ensure_future(_acker(js)))
    side = asyncio.ensure_future(_side(nc, js, cycle, rng, h))
    await asyncio.sleep(rng.uniform(0.5, 1.5))
    proc.stop(signal.SIGKILL)
    await asyncio.wait([*tasks, side], timeout=15)
    if side.done() and side.exception() is not None:
        raise side.exception()  # type: ignore[misc]
    try:
        await nc.close()
    except Exception:  # noqa: BLE001 - the connection is already gone
        pass


async def _stored(nc: Any, js: Any) -> tuple[dict[int, str], dict[int, float]]:
    """seq -> payload of every stored message, and seq -> when it was found missing."""
    info = await js.stream_info("K")
    stored: dict[int, str] = {}
    now = time.monotonic()  # all below first_seq are gone (a full purge moves it up)
    missing_at: dict[int, float] = {seq: now for seq in range(1, info.state.first_seq)}
    for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1):
        try:
            stored[seq] = (await js.get_msg("K", seq)).data.decode()
        except nats.js.errors.NotFoundError:
            missing_at[seq] = time.monotonic()
    return stored, missing_at


async def _check(url: str, seed: int, h: History, final: bool = False) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        stored, missing_at = await _stored(nc, js)
        names = (json.loads((await nc.request("$JS.API.CONSUMER.NAMES.K", b"{}",
                                              timeout=5)).data)).get("consumers") or []
        floor = 0
        if "worker" in names:
            floor = (await js.consumer_info("K", "worker")).ack_floor.stream_seq
    finally:
        await nc.close()
    where = f"seed {seed}"
    for payload in stored.values():
        assert payload in h.sent, f"{where}: {payload} was never published"
    assert len(stored) == len(set(stored.values())), f"{where}: a message is stored twice"
    for w in range(PUBLISHERS):
        mine = [p for p in stored.values() if p.startswith(f"{w}:")]
        assert mine == sorted(mine), f"{where}: publisher {w} out of order"
    for s in h.sent.values():
        if not s.seq:
            continue
        if s.seq in stored:
            assert stored[s.seq] == s.payload, \
                f"{where}: acked {s.payload}@{s.seq} holds {stored[s.seq]}"
            continue
        gone_at = missing_at.get(s.seq, float("inf"))
        expired = s.ttl and gone_at >= s.sent + TTL_S
        purged = any(p.matches(s.subject) and s.sent < p.end for p in h.purges)
        assert expired or purged, f"{where}: acked {s.payload}@{s.seq} lost unexplained"
    for p in h.purges:  # an acknowledged full purge keeps nothing acked before it was sent
        if p.replied and "keep" not in p.req:
            back = [s.payload for s in h.sent.values()
                    if s.seq and s.acked < p.sent and p.matches(s.subject)
                    and stored.get(s.seq) == s.payload]
            assert not back, f"{where}: purge {p.req} undone: {back[:5]}"
    back_c = h.deleted & set(names)
    assert not back_c, f"{where}: deleted consumers back: {back_c}"
    lost = h.created - h.delete_sent - set(names)
    assert not lost, f"{where}: created consumers lost: {lost}"
    assert floor >= h.floor, f"{where}: ack floor {floor} < {h.floor} seen before"
    h.floor = floor
    if final:  # expiry survives restarts: every message with a TTL is gone by now
        left = [s.payload for s in h.sent.values() if s.ttl and s.payload in stored.values()]
        assert not left, f"{where}: TTL messages not expired: {left[:5]}"


async def test_kill_9_loop_with_purges_consumer_deletes_and_ttl(servers: Servers,
                                                               tmp_path: Path) -> None:
    store = tmp_path / "store"
    seed = int(os.environ.get("JS_KILL_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    h = History()
    for cycle in range(KILL_CYCLES):
        proc = _js_server(servers, store)
        if cycle:
            await _check(proc.url, seed, h)
        await _cycle(cycle, proc, rng, h)
    assert any(s.seq for s in h.sent.values()), f"seed {seed}: nothing was acknowledged"
    assert any(p.replied for p in h.purges), f"seed {seed}: no purge was acknowledged"
    assert h.deleted, f"seed {seed}: no consumer delete was acknowledged"
    final = _js_server(servers, store)
    await _check(final.url, seed, h)
    await asyncio.sleep(TTL_S + 1.5)
    await _check(final.url, seed, h, final=True)

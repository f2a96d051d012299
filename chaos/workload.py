"""Clients: publishers that record every PubAck, consumers that record every delivery and
every confirmed ack. Real nats-py connections to the nodes, with reconnects.

A publisher sends "p<i>-<k>" one at a time with Nats-Msg-Id = the payload. When the
outcome is unknown (timeout, connection lost, an API error), it retries the SAME payload
and id: JetStream's dedup must make the retries harmless, and the checker counts any
second copy as a duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass
from typing import Any

import nats
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from chaos.history import History

CONSUMER = "chaos"


@dataclass
class Spec:
    stream: str = "CHAOS"
    replicas: int = 1
    publishers: int = 3
    consumers: int = 2
    rate: float = 0.0  # per publisher per second; 0 = as fast as acks come back
    retries: int = 20  # attempts per payload with an unknown outcome
    op_timeout: float = 2.0
    ack_wait: float = 5.0
    creators: int = 1  # clients creating small streams CR<i>_<k> (no stream may be forgotten)
    create_rate: float = 1.0  # per creator per second
    kv_clients: int = 0  # clients doing per-key CAS and reads on a KV bucket (kv_workload)
    kv_keys: int = 4  # keys they share (few keys: CASes race)


async def connect(urls: list[str], name: str) -> Any:
    async def quiet(_e: Exception) -> None:
        return None

    return await nats.connect(servers=urls, name=name, max_reconnect_attempts=-1,
                              reconnect_time_wait=0.2, connect_timeout=2,
                              allow_reconnect=True, error_cb=quiet, dont_randomize=True)


async def api(nc: Any, subject: str, body: bytes = b"", timeout: float = 5.0) -> dict[str, Any]:
    import json

    msg = await nc.request("$JS.API." + subject, body, timeout=timeout)
    return json.loads(msg.data)


async def retry(what: str, fn: Any, deadline_s: float = 60.0) -> Any:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await fn()
        except Exception as e:  # noqa: BLE001 - the cluster may be electing
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: {e!r}") from e
            await asyncio.sleep(0.5)


class Workload:
    def __init__(self, history: History, urls: list[str], spec: Spec, seed: int = 0) -> None:
        self.h = history
        self.urls = urls
        self.spec = spec
        self.rng = random.Random(seed)
        self.stop_publishing = asyncio.Event()
        self.stop_consuming = asyncio.Event()
        self.conns: list[Any] = []

    def _urls_from(self, i: int) -> list[str]:
        # Spread clients over the nodes; each can fail over to all of them.
        k = i % len(self.urls)
        return self.urls[k:] + self.urls[:k]

    async def setup(self) -> None:
        s = self.spec
        nc = await connect(self.urls, "chaos-setup")
        try:
            js = nc.jetstream(timeout=10)

            async def create() -> None:
                from nats.js.api import StreamConfig

                await js.add_stream(StreamConfig(name=s.stream, subjects=[f"{s.stream}.>"],
                                                 num_replicas=s.replicas, allow_direct=True,
                                                 duplicate_window=600.0))

            await retry("create stream", create)

            async def consumer() -> None:
                from nats.js.api import AckPolicy, ConsumerConfig

                await js.add_consumer(s.stream, ConsumerConfig(
                    durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT,
                    ack_wait=s.ack_wait, max_deliver=-1))

            await retry("create consumer", consumer)
            self.h.add("run", "ok", "setup", stream=s.stream, replicas=s.replicas)
        finally:
            await nc.close()

    async def publisher(self, i: int) -> None:
        s = self.spec
        proc = f"pub{i}"
        nc = await connect(self._urls_from(i), proc)
        self.conns.append(nc)
        js = nc.jetstream(timeout=s.op_timeout)
        k = 0
        try:
            while not self.stop_publishing.is_set():
                payload = f"p{i}-{k}"
                k += 1
                for attempt in range(s.retries):
                    if attempt and self.stop_publishing.is_set():
                        break
                    self.h.add(proc, "invoke", "publish", stream=s.stream, payload=payload,
                               attempt=attempt)
                    try:
                        ack = await js.publish(f"{s.stream}.{i}", payload.encode(),
                                               headers={"Nats-Msg-Id": payload})
                    except NoRespondersError as e:
                        # Nobody received it: certainly not stored.
                        self.h.add(proc, "fail", "publish", stream=s.stream, payload=payload,
                                   err=type(e).__name__)
                        await asyncio.sleep(0.2)
                        continue
                    except Exception as e:  # noqa: BLE001 - any other outcome is unknown
                        self.h.add(proc, "info", "publish", stream=s.stream, payload=payload,
                                   err=f"{type(e).__name__}: {e}"[:200])
                        await asyncio.sleep(0.1)
                        continue
                    self.h.add(proc, "ok", "publish", stream=ack.stream, payload=payload,
                               seq=ack.seq, dup=bool(ack.duplicate))
                    break
                if s.rate:
                    await asyncio.sleep(self.rng.expovariate(s.rate))
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    async def creator(self, i: int) -> None:
        """Creates streams one after another while the faults run. Every create whose reply
        said so must exist at the end (the checker's `stream-forgotten`)."""
        from nats.js.api import StreamConfig

        s = self.spec
        proc = f"cre{i}"
        nc = await connect(self._urls_from(i + 2), proc)
        self.conns.append(nc)
        js = nc.jetstream(timeout=max(s.op_timeout, 5.0))
        k = 0
        try:
            while not self.stop_publishing.is_set():
                name = f"CR{i}_{k}"
                k += 1
                self.h.add(proc, "invoke", "create", stream=name)
                try:
                    await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.>"],
                                                     num_replicas=s.replicas))
                except Exception as e:  # noqa: BLE001 - unknown: it may exist or not
                    self.h.add(proc, "info", "create", stream=name,
                               err=f"{type(e).__name__}: {e}"[:200])
                else:
                    self.h.add(proc, "ok", "create", stream=name)
                await asyncio.sleep(1.0 / s.create_rate)
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    async def _ack(self, nc: Any, proc: str, m: Any) -> None:
        s = self.spec
        seq = m.metadata.sequence.stream
        self.h.add(proc, "invoke", "ack", stream=s.stream, consumer=CONSUMER, seq=seq)
        try:
            # What ack_sync does, keeping the reply: only an empty reply (nats-server's)
            # confirms the ack; anything else is recorded as unknown, with its text.
            reply = await nc.request(m.reply, b"+ACK", timeout=s.op_timeout)
        except Exception as e:  # noqa: BLE001 - unknown: it may be redelivered
            self.h.add(proc, "info", "ack", stream=s.stream, consumer=CONSUMER, seq=seq,
                       err=type(e).__name__)
            return
        if reply.data or reply.headers:
            self.h.add(proc, "info", "ack", stream=s.stream, consumer=CONSUMER, seq=seq,
                       err=f"reply {reply.data[:100]!r} {reply.headers}")
        else:
            self.h.add(proc, "ok", "ack", stream=s.stream, consumer=CONSUMER, seq=seq)

    async def consumer(self, i: int, quiet_rounds: int = 5) -> None:
        """Fetch and ack until told to stop; then drain: stop after `quiet_rounds` empty
        fetches in a row (the stream holds nothing this consumer has not seen)."""
        s = self.spec
        proc = f"con{i}"
        nc = await connect(self._urls_from(i + 1), proc)
        self.conns.append(nc)
        js = nc.jetstream(timeout=s.op_timeout)
        empty = 0
        psub = None
        try:
            while True:
                stopping = self.stop_consuming.is_set()
                if stopping and empty >= quiet_rounds:
                    self.h.add(proc, "ok", "drained", stream=s.stream, consumer=CONSUMER)
                    return
                try:
                    if psub is None:
                        psub = await js.pull_subscribe_bind(CONSUMER, s.stream)
                    fetch_t = round(time.monotonic() - self.h.start, 6)
                    msgs = await psub.fetch(50, timeout=1.0)
                except NatsTimeout:
                    empty += 1 if stopping else 0
                    continue
                except Exception as e:  # noqa: BLE001 - node down, leader moving: try again
                    # Counted while draining too: a fetch that keeps failing must end the
                    # drain, and the checker then reports what was never delivered.
                    self.h.add(proc, "info", "fetch", stream=s.stream, consumer=CONSUMER,
                               err=f"{type(e).__name__}: {e}"[:200])
                    empty += 1 if stopping else 0
                    await asyncio.sleep(0.2)
                    continue
                if not msgs:  # nats-py returns [] for some empty answers (a 408 after a wait)
                    empty += 1 if stopping else 0
                    continue
                empty = 0
                good = []
                for m in msgs:
                    try:
                        md = m.metadata
                    except Exception as e:  # noqa: BLE001 - not a stream message at all
                        self.h.add(proc, "info", "bad-delivery", stream=s.stream,
                                   consumer=CONSUMER, subject=m.subject, reply=m.reply,
                                   headers=str(m.headers), data=m.data[:100].decode(
                                       errors="replace"), err=type(e).__name__)
                        continue
                    good.append(m)
                    self.h.add(proc, "ok", "deliver", stream=s.stream, consumer=CONSUMER,
                               seq=md.sequence.stream, payload=m.data.decode(),
                               delivered=md.num_delivered, fetch_t=fetch_t)
                # The batch's acks go out together; each is confirmed (or not) on its own.
                await asyncio.gather(*(self._ack(nc, proc, m) for m in good))
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

"""KV clients: per-key compare-and-set and reads on an R-replica bucket, every outcome in
the history (f = "kv-cas" / "kv-get").

Each write is `update(key, value, last=revision)` (`create` when the client believes the
key is absent: `last=0`), with a value unique to the attempt that names its key and the
revision it was conditioned on: "<key>|<proc>-<n>|<last>". The final stream then says, for
every stored write, which revision it claimed to follow, and the checker (chaos/kv_checker)
can rebuild each key's chain from the final state alone. An attempt with an unknown
outcome is never retried with the same value: the next one reads the key again.

The bucket's stream is made by hand (as `create_key_value` would, but with no per-key
history limit), so the final state holds every revision ever written. Reads go through the
stream leader (allow_direct off): the checker holds them to real-time order.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

from nats.errors import NoRespondersError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from chaos.history import History
from chaos.workload import Spec, connect, retry

BUCKET = "CHAOSKV"
STREAM = f"KV_{BUCKET}"


def kv_value(key: str, proc: str, n: int, last: int) -> str:
    return f"{key}|{proc}-{n}|{last}"


def parse_value(value: str) -> tuple[str, int] | None:
    """(key, the revision the write was conditioned on), or None for a foreign value."""
    parts = value.split("|")
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return parts[0], int(parts[2])


async def setup_bucket(urls: list[str], spec: Spec, h: History) -> None:
    from nats.js.api import DiscardPolicy, StreamConfig

    nc = await connect(urls, "chaos-kv-setup")
    try:
        js = nc.jetstream(timeout=10)

        async def create() -> None:
            await js.add_stream(StreamConfig(
                name=STREAM, subjects=[f"$KV.{BUCKET}.>"], num_replicas=spec.replicas,
                allow_rollup_hdrs=True, deny_delete=True, discard=DiscardPolicy.NEW,
                duplicate_window=120.0, max_msgs=-1, max_msgs_per_subject=1_000_000,
                max_consumers=-1, allow_direct=False))

        await retry("create kv bucket", create)
        h.add("run", "ok", "kv-setup", stream=STREAM, replicas=spec.replicas)
    finally:
        await nc.close()


async def kv_client(h: History, urls: list[str], spec: Spec, i: int, keys: int,
                    stop: asyncio.Event, seed: int) -> None:
    """Pick a key, read it, CAS from what was read; now and then a blind CAS from a stale
    revision (must fail). Several clients share the keys, so CASes race."""
    rng = random.Random(seed * 1000 + i)
    proc = f"kv{i}"
    k = i % len(urls)
    nc = await connect(urls[k:] + urls[:k], proc)
    js = nc.jetstream(timeout=spec.op_timeout)
    kv: Any = None
    known: dict[str, int] = {}  # key -> last revision this client saw
    n = 0
    try:
        while not stop.is_set():
            try:
                if kv is None:
                    kv = await js.key_value(BUCKET)
            except Exception:  # noqa: BLE001 - no leader yet
                await asyncio.sleep(0.3)
                continue
            key = f"k{rng.randrange(keys)}"
            if rng.random() < 0.6:
                rev = await _get(h, proc, kv, key)
                if rev is not None:
                    known[key] = rev
            last = known.get(key, 0)
            n += 1
            rev = await _cas(h, proc, kv, key, kv_value(key, proc, n, last), last)
            if rev is not None:
                known[key] = rev
            if spec.rate:
                await asyncio.sleep(rng.expovariate(spec.rate))
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


async def _get(h: History, proc: str, kv: Any, key: str) -> int | None:
    h.add(proc, "invoke", "kv-get", key=key)
    try:
        e = await kv.get(key)
    except KeyNotFoundError:
        h.add(proc, "ok", "kv-get", key=key, rev=0, value=None)
        return 0
    except Exception as e:  # noqa: BLE001 - unknown: nothing learnt
        h.add(proc, "info", "kv-get", key=key, err=f"{type(e).__name__}: {e}"[:200])
        return None
    value = e.value.decode(errors="replace") if e.value is not None else None
    h.add(proc, "ok", "kv-get", key=key, rev=e.revision, value=value)
    return int(e.revision)


async def _cas(h: History, proc: str, kv: Any, key: str, value: str, last: int
               ) -> int | None:
    """The new revision when the CAS was acknowledged, else None."""
    h.add(proc, "invoke", "kv-cas", key=key, value=value, last=last)
    try:
        rev = await kv.update(key, value.encode(), last=last)
    except KeyWrongLastSequenceError as e:
        # The leader refused it: certainly not stored.
        h.add(proc, "fail", "kv-cas", key=key, value=value, last=last, err=str(e)[:120])
        return None
    except NoRespondersError as e:
        h.add(proc, "fail", "kv-cas", key=key, value=value, last=last, err=type(e).__name__)
        await asyncio.sleep(0.2)
        return None
    except Exception as e:  # noqa: BLE001 - unknown: it may or may not be stored
        h.add(proc, "info", "kv-cas", key=key, value=value, last=last,
              err=f"{type(e).__name__}: {e}"[:200])
        await asyncio.sleep(0.1)
        return None
    h.add(proc, "ok", "kv-cas", key=key, value=value, last=last, rev=rev)
    return int(rev)

"""Step-by-step comparison of a script's results on Jetraft and on nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from typing import Any


def masked(obj: Any, allowed: Collection[str]) -> Any:
    """`obj` with the value of every key in `allowed` (times, ids) replaced by "*"."""
    if isinstance(obj, dict):
        return {k: "*" if k in allowed else masked(v, allowed) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [masked(v, allowed) for v in obj]
    return obj


def assert_same_steps(ours: Sequence[Any], theirs: Sequence[Any],
                      allowed: Collection[str]) -> None:
    """Every step equal once the allowed keys are masked; the message lists each that is not."""
    diffs = [f"step {i}:\n  ours:   {masked(a, allowed)}\n  theirs: {masked(b, allowed)}"
             for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
             if masked(a, allowed) != masked(b, allowed)]
    assert not diffs, "\n".join(diffs)


async def kv_history(kv: Any, key: str) -> list[Any]:
    """`kv.history`, asked again when it found nothing: under load nats-py's history()
    raised NoKeysError against nats-server for a key just written (CI, session 7); a key
    really missing fails all three tries."""
    from nats.js.errors import NoKeysError

    for attempt in range(3):
        try:
            return list(await kv.history(key))
        except NoKeysError:
            if attempt == 2:
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("unreachable")


async def kv_keys(kv: Any) -> list[str]:
    """`kv.keys`, asked again when it found nothing: the same nats-py race as `kv_history`
    (its watcher puts the 'caught up' marker first when the server sent every key before the
    subscription's callback counted one; keys() then ends empty). Never partial: the marker
    is either first or after the last key. A bucket really empty fails all three tries."""
    from nats.js.errors import NoKeysError

    for attempt in range(3):
        try:
            return list(await kv.keys())
        except NoKeysError:
            if attempt == 2:
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("unreachable")


async def watch_initial(watcher: Any, timeout: float = 15.0) -> list[Any]:
    """The entries a nats-py KV watcher delivers for what the bucket held when it started.
    Reading until the first None is racy: nats-py puts its 'caught up' marker FIRST when the
    server's consumer info says nothing is pending and its callback has not counted an entry
    yet, though every entry was already sent. So the count comes from the server's own
    consumer info (delivered + pending, asked right after the watch started), and the
    entries are read until that many came (bounded; then whatever came is compared)."""
    info = await watcher._sub.consumer_info()
    want = info.delivered.consumer_seq + info.num_pending
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    got: list[Any] = []
    while len(got) < want and (left := deadline - loop.time()) > 0:
        try:
            entry = await watcher.updates(timeout=left)
        except Exception:  # noqa: BLE001 (nats.errors.TimeoutError: compare what came)
            break
        if entry is not None:
            got.append(entry)
    return got


async def watch_next(watcher: Any, timeout: float = 10.0) -> Any:
    """The next entry of a nats-py KV watcher, past the 'caught up' marker wherever it was
    queued (before or after the initial entries)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (entry := await watcher.updates(timeout=max(0.01, deadline - loop.time()))) is None:
        pass
    return entry

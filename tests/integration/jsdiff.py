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

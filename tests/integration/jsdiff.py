"""Step-by-step comparison of a script's results on Jetraft and on nats-server."""

from __future__ import annotations

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

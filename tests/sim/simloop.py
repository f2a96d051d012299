"""Simulated time for asyncio: a loop whose clock jumps to the next timer.

`SimLoop` is a normal selector event loop whose selector never waits: when
the loop would block for `t` seconds, virtual time advances by `t` instead.
Everything on the loop (the driver's tick loop, timeouts, the simulated
network's delays) therefore runs in a deterministic order and as fast as the
CPU allows. Nothing may use real threads: `SimExecutor` replaces the worker
threads (also as the loop's default executor, so `asyncio.to_thread` is
simulated too). It runs each job atomically on the loop, after a seeded
random delay, so the loop keeps serving meanwhile exactly as it does while a
real thread fsyncs -- which is where the driver's races live.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import selectors
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _NoWaitSelector(selectors.BaseSelector):
    def __init__(self) -> None:
        self._map: dict[Any, selectors.SelectorKey] = {}
        self.loop: SimLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, id(fileobj), events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list:
        assert self.loop is not None
        if timeout is None:
            raise RuntimeError("simulation deadlock: nothing scheduled")
        self.loop.advance(timeout)
        return []

    def get_map(self) -> dict:
        return self._map

    def close(self) -> None:
        self._map.clear()


class SimLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        sel = _NoWaitSelector()
        super().__init__(sel)
        sel.loop = self
        self._now = 1000.0  # not 0: some code treats 0.0 as "never"

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds

    def _write_to_self(self) -> None:
        pass  # one thread: nothing to wake


class SimExecutor(concurrent.futures.Executor):
    """Jobs run on the loop after a seeded delay, one at a time, whole."""

    def __init__(self, loop: SimLoop, rng: random.Random, max_delay_s: float = 0.004,
                 slow: float = 0.1) -> None:
        self.loop = loop
        self.rng = rng
        self.max_delay_s = max_delay_s
        self.slow = slow  # share of jobs that take 10x longer (a slow disk)

    def delay(self) -> float:
        d = self.rng.random() * self.max_delay_s
        return d * 10 if self.rng.random() < self.slow else d

    def submit(self, fn: Callable[..., T], /, *args: Any, **kw: Any) -> concurrent.futures.Future:
        cf: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if not cf.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kw)
            except BaseException as exc:  # noqa: BLE001 (SimCrash too: the awaiting task sees it)
                cf.set_exception(exc)
            else:
                cf.set_result(result)

        self.loop.call_later(self.delay(), run)
        return cf

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """The driver's `Executor` protocol."""
        return await asyncio.wrap_future(self.submit(fn, *args), loop=self.loop)

    def close(self) -> None:
        pass


class SimClock:
    """The driver's `Clock` protocol on the loop's virtual time."""

    def __init__(self, loop: SimLoop) -> None:
        self.loop = loop

    def now(self) -> float:
        return self.loop.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float) -> contextlib.AbstractAsyncContextManager[Any]:
        return asyncio.timeout(seconds)

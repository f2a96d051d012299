"""What the multi-group driver needs from the world: a clock, a transport and
executors for blocking work. `MultiRaft` receives them, so the real driver
(`raft/multigroup.py`) can run inside a deterministic simulation (tests/sim)
with a simulated clock, network and worker, and in production with the ones
below.

* `Clock`: `now()` (seconds, monotonic), `sleep(s)` and `timeout(s)` (an
  async context manager raising TimeoutError). Every timer of the driver
  (ticks, deadlines of `read_index`, `transfer_leader`, ...) goes through it.
* `Transport`: `send(msgs)` never blocks; `beat()` queues a node-level
  liveness beat; `last_seen(peer)` is the `Clock.now()` of the last batch
  from `peer` (0.0 = never, KeyError = unknown peer); `add_peer(node, addr)`
  and `remove_peer(node)` change the peer set at runtime; `start`/`stop`.
  The driver hands its callbacks over with `MultiRaft.transport_callbacks()`.
* `Executor`: `await run(fn, *args)` runs blocking `fn` off the event loop
  and returns its result. The driver uses two: `apply_executor`, ONE worker
  thread that applies committed batches in log order, and `io_executor`
  for other blocking work (snapshot images, restores, file commits).
  A simulation passes an inline executor (`InlineExecutor`) for both. In
  production the apply worker and the drain loop's WAL write+fsync each run on
  a `DedicatedThread` (a thread and a queue of its own: about a third of the
  CPU and latency of a thread-pool round trip, which a one-in-flight publish
  pays on every commit). A small drain pass fsyncs on the loop instead
  (`MultiRaft(inline_sync_bytes=...)`); the simulation turns that off so
  every fsync takes simulated time a crash can land in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

from raft.types import Message

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    def timeout(self, seconds: float) -> contextlib.AbstractAsyncContextManager[Any]: ...


class Executor(Protocol):
    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...


class Transport(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def send(self, msgs: list[Message]) -> None: ...

    def beat(self) -> None: ...

    def last_seen(self, peer: int) -> float: ...

    def add_peer(self, node: int, addr: str) -> None: ...

    def remove_peer(self, node: int) -> None: ...


class LoopClock:
    """The running asyncio loop's clock (production)."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float) -> contextlib.AbstractAsyncContextManager[Any]:
        return asyncio.timeout(seconds)


class ThreadExecutor:
    """Blocking work in a thread pool (`workers` threads). With one worker,
    calls run one at a time in submission order: the apply executor."""

    def __init__(self, workers: int = 1, name: str = "raft-worker") -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class DedicatedThread:
    """One thread of its own fed by a queue: calls run one at a time, in
    submission order (what the apply worker needs); the result comes back to
    the caller's loop with one `call_soon_threadsafe`. Cheaper per call than
    `run_in_executor`/`asyncio.to_thread` (no pool bookkeeping, no context
    copy, no chained futures)."""

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._q.put((loop, fut, fn, args))
        return await fut

    def _work(self) -> None:
        while (item := self._q.get()) is not None:
            loop, fut, fn, args = item
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                _resolve(loop, fut, None, exc)
            else:
                _resolve(loop, fut, result, None)

    def close(self) -> None:
        self._q.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()


def _resolve(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any], result: Any,
             exc: BaseException | None) -> None:
    def settle() -> None:
        if fut.done():
            return  # the caller was cancelled meanwhile
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass  # the loop is closed: nobody waits any more


class DefaultThreads:
    """asyncio's default thread pool (`asyncio.to_thread`): concurrent blocking I/O."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    def close(self) -> None:
        pass


class InlineExecutor:
    """Runs `fn` on the calling thread at once: deterministic (simulation)."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    def close(self) -> None:
        pass


async def iterate_in(executor: Executor, it: Any) -> AsyncIterator[Any]:
    """Yield from a blocking iterator, each `next` run by `executor`."""
    while (item := await executor.run(next, it, None)) is not None:
        yield item

"""Which bcrypt checks run, in what order, and which are refused (pure, no I/O).

bcrypt is deliberately slow, so wrong guesses are a cheap way to burn our CPU
and, worse, to crowd out clients that know their password. nats-server hashes
in every connection's goroutine, so a storm shares the CPU with a correct login.
Here a few workers hash; everything else waits in this queue, which decides:

- how much waits at all: at most `SLOW_CHECKS_MAX` checks run or wait, and at
  most `SLOW_CHECKS_PER_HOST_MAX` per source address; an address with
  `FAILURES_PER_HOST_MAX` recent failures is refused without hashing;
- who goes first: the address with the fewest recent failures, then the one
  with the fewest checks running (round robin among equals), then the oldest.
  An address that has been guessing wrong falls behind one that has not;
- who gives way when the queue is full: the waiting check of the address with
  the worst record, if the newcomer's record is better. A storm from many
  addresses therefore cannot keep a clean address's login out; it only ever
  competes with the storm's first guesses from addresses it has not used yet.

The caller passes `now` and runs what `ready()` hands out."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Generic, TypeVar

SLOW_CHECKS_MAX = 32
SLOW_CHECKS_PER_HOST_MAX = 4
FAILURES_PER_HOST_MAX = 10
FAILURE_WINDOW = 60.0
_HOSTS_TRACKED_MAX = 4096

Job = TypeVar("Job")


def source_of(host: str) -> str:
    """The source a client's address counts as: the address itself for IPv4, its /64
    for IPv6 (one host is usually given a whole /64, so rotating inside it gains
    nothing); an IPv4-mapped IPv6 address is its IPv4 address."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass
class _Waiting(Generic[Job]):
    host: str
    seq: int
    job: Job


@dataclass
class Admission(Generic[Job]):
    """`admitted`: the job waits for `ready()`; `evicted`: jobs dropped to make
    room (refuse their clients without hashing)."""

    admitted: bool
    evicted: list[Job] = field(default_factory=list)


class AuthThrottle(Generic[Job]):
    """The queue of slow checks; `workers` of them run at once."""

    def __init__(self, workers: int = 2) -> None:
        self.workers = workers
        self._waiting: list[_Waiting[Job]] = []
        self._running: dict[str, int] = {}
        self._active: dict[str, int] = {}  # running + waiting, per host
        self._failures: dict[str, list[float]] = {}
        self._seq = 0

    @property
    def in_flight(self) -> int:
        return len(self._waiting) + sum(self._running.values())

    def submit(self, host: str, job: Job, now: float) -> Admission[Job]:
        """Queue `job` for a client at `host`, or refuse it."""
        if self._active.get(host, 0) >= SLOW_CHECKS_PER_HOST_MAX:
            return Admission(False)
        if self._count_failures(host, now) >= FAILURES_PER_HOST_MAX:
            return Admission(False)
        evicted: list[Job] = []
        if self.in_flight >= SLOW_CHECKS_MAX:
            worst = self._worst_waiting(now)
            failures, active = self._record(host, now)
            # Compared as if admitted: a clean address queueing its first check
            # cannot push out another clean address's only one.
            if worst is None or self._record(worst.host, now) <= (failures, active + 1):
                return Admission(False)
            self._waiting.remove(worst)
            self._leave(self._active, worst.host)
            evicted.append(worst.job)
        self._seq += 1
        self._waiting.append(_Waiting(host, self._seq, job))
        self._active[host] = self._active.get(host, 0) + 1
        return Admission(True, evicted)

    def ready(self, now: float) -> list[tuple[str, Job]]:
        """Jobs to start now, best record first; each must end with `done`."""
        started: list[tuple[str, Job]] = []
        while self._waiting and sum(self._running.values()) < self.workers:
            best = min(self._waiting, key=lambda w: (self._count_failures(w.host, now),
                                                     self._running.get(w.host, 0), w.seq))
            self._waiting.remove(best)
            self._running[best.host] = self._running.get(best.host, 0) + 1
            started.append((best.host, best.job))
        return started

    def done(self, host: str, ok: bool | None, now: float) -> None:
        """A job `ready()` started for `host` ended with `ok` (None: it was not
        run after all, its client having gone: neither a match nor a miss)."""
        assert self._running.get(host), "done() for a job that was not started"
        self._leave(self._running, host)
        self._leave(self._active, host)
        if ok is False:
            if host not in self._failures and len(self._failures) >= _HOSTS_TRACKED_MAX:
                self._forget_oldest(now)
            self._failures.setdefault(host, []).append(now)

    def _record(self, host: str, now: float) -> tuple[int, int]:
        """Lower is better: recent failures, then checks queued or running."""
        return self._count_failures(host, now), self._active.get(host, 0)

    def _worst_waiting(self, now: float) -> _Waiting[Job] | None:
        if not self._waiting:
            return None
        return max(self._waiting, key=lambda w: (self._record(w.host, now), w.seq))

    @staticmethod
    def _leave(counts: dict[str, int], host: str) -> None:
        left = counts.get(host, 1) - 1
        if left:
            counts[host] = left
        else:
            counts.pop(host, None)

    def _count_failures(self, host: str, now: float) -> int:
        times = self._failures.get(host)
        if times is None:
            return 0
        while times and now - times[0] > FAILURE_WINDOW:
            times.pop(0)
        if not times:
            del self._failures[host]
        return len(times)

    def _forget_oldest(self, now: float) -> None:
        for host in [h for h, t in self._failures.items() if not t or now - t[-1] > FAILURE_WINDOW]:
            del self._failures[host]
        while len(self._failures) >= _HOSTS_TRACKED_MAX:
            del self._failures[next(iter(self._failures))]

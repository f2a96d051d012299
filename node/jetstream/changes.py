"""A node-wide change mark for periodic passes over every stream (pure, thread-safe).

Passes that run several times a second over all the streams a node hosts (the usage report
of the bytes of the streams it leads, the scan for streams whose messages can expire) cost
O(streams) per round even when nothing happens: with 1,000 streams that alone kept idle
nodes above 5 % of a core. Every event that can change what such a pass finds moves this
mark (an applied entry or a restored image of any stream, a reservation taken or released,
a leader change, a stream opened or closed); the pass keeps the value it read BEFORE its
last full round and skips the work while the mark still shows that value.

Moving it too often only costs a full round; missing a move would leave a pass stale, so
the callers move it after every change of that kind (`StreamMachine`, `Inflight`,
`JetStreamService`). Threads: the apply worker and the event loop both move it. Each move
stores a value `itertools.count` never hands out twice (one C call under the GIL), so once
a pass has read a value, any later move leaves the mark at a different one, even when two
moves race and the older value lands last.
"""

from __future__ import annotations

import itertools


class ChangeMark:
    __slots__ = ("_next", "value")

    def __init__(self) -> None:
        self._next = itertools.count(1)
        self.value = 0

    def move(self) -> None:
        self.value = next(self._next)

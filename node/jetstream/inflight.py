"""Publishes a stream's leader has proposed and not yet applied (pure, thread-safe).

The account limits (`max_file` / `max_mem`), the server's and `max_buffered_*` are checked
on the leader BEFORE a publish is proposed, but its bytes reach the store only when the
entry is applied, after the drain pass, the fsync and the commit; batching merges hundreds
of publishes into one entry. Counting the stored bytes alone let a burst pass the check
as a whole (400 x 1 KB acked against a 100 KB `max_file`). So the leader reserves each
publish it proposes here and releases it when the entry carrying it is applied (in the
same critical section that makes the stored bytes visible, `StreamMachine.apply_batch`),
when its proposal fails, and all at once when the group's leader changes: a deposed
leader keeps no reservation and a new one starts from the applied state.

A publish is known by its entry's clock (`now_ns`), which the leader makes unique among
the publishes it holds (`reserve`); applying an entry releases the clocks it carries
(`ops.msg_clocks`). A committed atomic batch and a mirror/source entry are held the same
way, as ONE reservation of several messages under their entry's clock. Releasing a clock
that is not held (an entry of an earlier term, a failure after the apply) does nothing, so
each publish is released at most once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from node.jetstream import ops
from node.jetstream.changes import ChangeMark

# nats-server's bounds of a stream's ingest queue when `max_buffered_msgs` /
# `max_buffered_size` are not set (stream.go, 2.11+): past either, a publish is dropped.
DEFAULT_MAX_MSGS = 100_000
DEFAULT_MAX_SIZE = 128 * 1024 * 1024


class Inflight:
    """One stream's reservations: clock -> (stored bytes, buffered bytes, messages, the
    publish's encoded STREAM_MSG entry, its op): the apply takes the op instead of decoding
    a part that is byte for byte that entry (`own`)."""

    __slots__ = ("_lock", "_held", "msgs", "bytes", "buffered", "changes")

    def __init__(self, changes: ChangeMark | None = None) -> None:
        self._lock = threading.Lock()  # the loop reserves, the apply worker releases
        # Moved after every change of what `bound` answers (node/jetstream/changes.py).
        self.changes = changes if changes is not None else ChangeMark()
        self._held: dict[int, tuple[int, int, int, bytes, Any]] = {}
        self.msgs = 0       # messages held
        self.bytes = 0      # their size as the store will count it (limits)
        self.buffered = 0   # their subject + reply + headers + data (max_buffered_size)

    def reserve(self, now_ns: int, stored: int, buffered: int, count: int = 1,
                entry: bytes = b"", op: Any = None) -> int:
        """Hold a new publish (or an entry of `count` messages); its key: `now_ns`, or the
        next clock not held after it (the caller then proposes the entry with that clock:
        `entry`, encoded with `now_ns`, is then not kept, and the apply decodes that one)."""
        with self._lock:
            held = self._held
            if now_ns in held:
                entry, op = b"", None
                while now_ns in held:
                    now_ns += 1
            held[now_ns] = (stored, buffered, count, entry, op)
            self.msgs += count
            self.bytes += stored
            self.buffered += buffered
        self.changes.move()
        return now_ns

    def own(self, clock: int, entry: bytes, at: int, size: int) -> Any:
        """The op of the publish held with `clock` if `entry[at:at + size]` is exactly
        the STREAM_MSG entry it was proposed as (so decoding it would give that op);
        None otherwise (another proposer's entry, a replay, a clock bumped by `reserve`).
        One dict read: safe from the apply worker while the loop reserves."""
        held = self._held.get(clock)
        if held is None:
            return None
        mine = held[3]
        if len(mine) == size and entry.startswith(mine, at):
            return held[4]
        return None

    def release(self, key: int) -> None:
        self._release_all([key])

    def release_entries(self, run: Iterable[tuple[int, bytes]]) -> None:
        """The publishes the applied entries carry (called under the stream's lock)."""
        if self._held:
            self._release_all([c for _, data in run for c in ops.msg_clocks(data)])

    def _release_all(self, clocks: list[int]) -> None:
        n = stored = buffered = 0
        with self._lock:
            pop = self._held.pop
            for clock in clocks:
                got = pop(clock, None)
                if got is not None:
                    n += got[2]
                    stored += got[0]
                    buffered += got[1]
            self.msgs -= n
            self.bytes -= stored
            self.buffered -= buffered
        self.changes.move()

    def bound(self, stored: int, stored_msgs: int, cfg: dict[str, Any]) -> int:
        """The most bytes the stream can hold once what is held here is applied: a
        publish its own limits will refuse (max_bytes; max_msgs with discard new) does not
        count against the account, as nats-server, which checks one publish at a time,
        answers it with the stream's error (10077), not the account's (10002)."""
        with self._lock:
            held, msgs = self.bytes, self.msgs
            if msgs and cfg.get("discard") == "new" and cfg.get("max_msgs", -1) > 0:
                room = max(cfg["max_msgs"] - stored_msgs, 0)
                if room < msgs:  # the first `room` in proposal order are the ones stored
                    held = _first_bytes(self._held.values(), room)
        total = stored + held
        max_bytes = cfg.get("max_bytes", -1)
        if 0 < max_bytes < total:
            total = max(stored, max_bytes)
        return total

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self.msgs = self.bytes = self.buffered = 0
        self.changes.move()


def _first_bytes(held: Iterable[tuple[int, int, int, bytes, Any]], room: int) -> int:
    """The bytes of the reservations, in order, while their messages fit in `room` (an
    entry of several messages that does not fit whole is refused whole by its apply)."""
    total = 0
    for stored, _, count, _, _ in held:
        if count > room:
            break
        room -= count
        total += stored
    return total

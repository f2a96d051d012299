"""The consumer state machine: deliveries, acks and redelivery, pure and deterministic.

A consumer's durable state changes only through two kinds of replicated events, each carrying
the proposer's `now_ns`:

- `apply_delivered(now, sseq)`: the leader delivered stream message `sseq` (new or again);
- `apply_ack(now, kind, sseq, delay_ns)`: an `+ACK`, `-NAK` (optional delay), `+WPI`,
  `+TERM`, or the leader's decision to stop redelivering (`MAX_DELIVER`) or to forget a
  message that left the stream (`GONE`).

What to deliver next is a read-only question, `plan(now, view)`: the leader asks it, proposes
the answer as one of the events above, and every replica applies the same event. Redelivery is
derived from the pending deadlines, so no timer state needs replicating.

Ack deadlines: the n-th delivery of a message waits `backoff[n-1]` (the last value repeats) or
`ack_wait` without backoff; `+WPI` restarts the wait; `-NAK` with a delay makes the message due
after the delay (immediately without one).
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NamedTuple

from node.jetstream.headers import parse_go_duration
from node.jetstream.store import CorruptRecordError, StreamStore
from node.subject import compile_matcher, is_literal

DEFAULT_ACK_WAIT_NS = 30_000_000_000
ACK_PREFIX = "$JS.ACK."


class AckKind(IntEnum):
    ACK = 1
    NAK = 2
    WPI = 3
    TERM = 4
    MAX_DELIVER = 5  # leader: delivered max_deliver times, stop redelivering
    GONE = 6         # leader: the message left the stream before it was acked


class Pending(NamedTuple):
    """Immutable: a change is a new object, so an encoded record cached for the old one
    (`ConsumerState._records`) is recognised as stale by identity. (A tuple: made once per
    delivered message, and a frozen dataclass's __init__ costs several times more.)"""
    cseq: int
    delivered_ns: int
    deadline_ns: int
    naked: bool = False  # waits in the redelivery queue for a pull, not for the ack timer


STATE_V2 = 2  # first byte of the binary state record (a JSON record starts with "{")
_STATE_HEAD = struct.Struct("<BQQQQQI")  # version, delivered s/c, floor s/c, lps_until, count
_PENDING_REC = struct.Struct("<QQqqQB")  # sseq, cseq, delivered_ns, deadline_ns, count, naked


@dataclass
class ConsumerState:
    delivered_sseq: int = 0   # highest stream sequence delivered
    delivered_cseq: int = 0   # consumer sequence of the latest delivery (redeliveries count)
    floor_sseq: int = 0       # every stream message <= this is acked (or never due)
    floor_cseq: int = 0
    # in stream sequence order (Consumer.apply_delivered keeps it so, __post_init__ and
    # decode make it so): the ack floor is its first key, the record lists it in order
    pending: dict[int, Pending] = field(default_factory=dict)
    deliveries: dict[int, int] = field(default_factory=dict)  # sseq -> times delivered
    lps_until: int = 0        # deliver last per subject: see StreamView.next_matching
    # sseq -> (the Pending it was made from, its delivery count, its packed record): a
    # batch re-encodes only the messages whose pending entry changed since the last one
    _records: dict[int, tuple[Pending, int, bytes]] = field(
        default_factory=dict, compare=False, repr=False)
    # the pending sequences in the order they were added (ascending) from `_head` on, acked
    # ones skipped lazily: the lowest pending one in amortised O(1). (A dict's first key
    # is not O(1): iteration walks over the slots its deleted keys leave at the front.)
    _order: list[int] = field(default_factory=list, compare=False, repr=False)
    _head: int = field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.resort()

    def resort(self) -> None:
        """Put `pending` (and `_order`) back in stream sequence order."""
        keys = list(self.pending)
        if keys != sorted(keys):
            self.pending = dict(sorted(self.pending.items()))
            keys = list(self.pending)
        self._order, self._head = keys, 0

    def first_pending(self) -> int:
        """The lowest pending stream sequence; 0 when nothing pends."""
        order, pending, head = self._order, self.pending, self._head
        while head < len(order) and order[head] not in pending:
            head += 1
        if head >= len(order):
            if pending:  # filled without `_order` (never by this module): rebuild it
                self.resort()
                return self._order[0]
            order.clear()
            head = 0
        elif head > 256 and 2 * head > len(order):  # drop the skipped prefix now and then
            del order[:head]
            head = 0
        self._head = head
        return order[head] if order else 0

    def encode(self) -> bytes:
        """The consumer state record kept in the store: binary (version 2), one fixed-size
        record per pending message, bounded by max_ack_pending. Written once per applied
        batch for every consumer the batch touched, so only changed entries are packed
        again. Records written before version 2 are JSON (`to_json`), and so is a state
        holding a value beyond 64 bits; `decode` reads both."""
        try:
            return self._encode_v2()
        except struct.error:  # a NAK delay near the maximum: its deadline overflows
            self._records = {}
            return self.to_json()

    def _encode_v2(self) -> bytes:
        cache, deliveries = self._records, self.deliveries
        parts = [_STATE_HEAD.pack(STATE_V2, self.delivered_sseq, self.delivered_cseq,
                                  self.floor_sseq, self.floor_cseq, self.lps_until,
                                  len(self.pending))]
        for sseq, p in self.pending.items():
            count = deliveries.get(sseq, 1)
            hit = cache.get(sseq)
            if hit is None or hit[0] is not p or hit[1] != count:
                hit = cache[sseq] = (p, count, _PENDING_REC.pack(
                    sseq, p.cseq, p.delivered_ns, p.deadline_ns, count, p.naked))
            parts.append(hit[2])
        if len(cache) > 2 * len(self.pending) + 64:  # forget the acked ones, now and then
            self._records = {s: cache[s] for s in self.pending if s in cache}
        return b"".join(parts)

    def to_json(self) -> bytes:
        """The version-1 record (JSON): what STREAM.SNAPSHOT puts in a backup."""
        return json.dumps({
            "d": [self.delivered_sseq, self.delivered_cseq],
            "f": [self.floor_sseq, self.floor_cseq],
            "l": self.lps_until,
            "p": [[s, p.cseq, p.delivered_ns, p.deadline_ns, self.deliveries.get(s, 1),
                   int(p.naked)] for s, p in sorted(self.pending.items())],
        }, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> ConsumerState:
        """A version-2 record, or a JSON (version 1) one: stores and backups written
        before version 2 stay readable."""
        if raw[:1] != bytes([STATE_V2]):
            return cls._from_json(raw)
        _v, d_s, d_c, f_s, f_c, lps, count = _STATE_HEAD.unpack_from(raw)
        if len(raw) != _STATE_HEAD.size + count * _PENDING_REC.size:
            raise ValueError(f"consumer state record of {len(raw)} bytes, {count} pending")
        state = cls(d_s, d_c, f_s, f_c, lps_until=lps)
        recs = sorted(_PENDING_REC.iter_unpack(memoryview(raw)[_STATE_HEAD.size:]))
        for sseq, cseq, delivered, deadline, n, naked in recs:
            state.pending[sseq] = Pending(cseq, delivered, deadline, bool(naked))
            state.deliveries[sseq] = n
        state.resort()
        return state

    @classmethod
    def _from_json(cls, raw: bytes) -> ConsumerState:
        data = json.loads(raw)
        state = cls(*data["d"], *data["f"], lps_until=data.get("l", 0))
        for sseq, cseq, delivered, deadline, count, naked in sorted(data["p"]):
            state.pending[sseq] = Pending(cseq, delivered, deadline, bool(naked))
            state.deliveries[sseq] = count
        state.resort()
        return state


class Delivery(NamedTuple):
    """The leader's plan: deliver `sseq` (its `deliveries`-th time)."""
    sseq: int
    deliveries: int


@dataclass(frozen=True, slots=True)
class Drop:  # a dataclass: a Drop never equals a Delivery of the same numbers
    """The leader's plan: stop tracking `sseq` (`kind` MAX_DELIVER or GONE)."""
    sseq: int
    kind: AckKind


@dataclass(frozen=True, slots=True)
class Advisory:
    """An event the node publishes as `$JS.EVENT.ADVISORY.CONSUMER.*`."""
    kind: str  # "MAX_DELIVERIES", "MSG_TERMINATED", "MSG_NAKED"
    sseq: int
    deliveries: int


class StreamView:
    """The questions a consumer asks its stream, answered from the stream's store."""

    def __init__(self, store: StreamStore, filters: list[str]) -> None:
        self.store = store
        self.filters = [f for f in filters if f]
        self._matchers: list[Callable[[str], bool]] = [compile_matcher(f) for f in self.filters]

    def matches(self, subject: str) -> bool:
        return not self._matchers or any(m(subject) for m in self._matchers)

    def subject_of(self, sseq: int) -> str | None:
        """None for a message that is gone, and for one whose record failed its CRC: a
        consumer passes over it as over a deleted one (its subject cannot be trusted)."""
        try:
            msg = self.store.load(sseq)
        except CorruptRecordError:
            return None
        return None if msg is None else msg.subject

    def next_matching(self, start: int, lps_until: int = 0) -> int:
        """Lowest stored sequence >= start whose subject passes the filters; 0 if none.
        Up to `lps_until` (deliver last per subject) only the last message of each subject
        as of that sequence counts."""
        if len(self.filters) == 1 and is_literal(self.filters[0]) and not lps_until:
            return self.store.first_for_subject(self.filters[0], start)
        if not self._matchers and not lps_until:
            return next(iter(self.store.seqs(start)), 0)  # every subject passes: no load
        return next((s for s in self.store.seqs(start) if self._passes(s, lps_until)), 0)

    def next_matching_many(self, start: int, n: int, lps_until: int = 0) -> list[int]:
        """Up to `n` sequences `next_matching` would give one after the other from `start`,
        in one walk (a delivery round asks for hundreds: one store read each was most of
        the round's planning)."""
        if len(self.filters) == 1 and is_literal(self.filters[0]) and not lps_until:
            out, at = [], start
            while len(out) < n and (at := self.store.first_for_subject(self.filters[0], at)):
                out.append(at)
                at += 1
            return out
        if not self._matchers and not lps_until:
            return list(itertools.islice(self.store.seqs(start), n))  # no load needed
        out = []
        for sseq in self.store.seqs(start):
            if len(out) >= n:
                break
            if self._passes(sseq, lps_until):
                out.append(sseq)
        return out

    def _passes(self, sseq: int, lps_until: int) -> bool:
        subject = self.subject_of(sseq)
        if subject is None or not self.matches(subject):
            return False
        # up to lps_until, a later message of the subject is the one to deliver
        return not (sseq <= lps_until
                    and 0 < self.store.first_for_subject(subject, sseq + 1) <= lps_until)

    def last_matching(self) -> int:
        best = 0
        for subject, _count in self.store.subjects():
            if self.matches(subject):
                best = max(best, self.store.last_for_subject(subject))
        return best

    def first_at_or_after_time(self, ts_ns: int) -> int:
        for sseq in self.store.seqs():
            msg = self.store.load(sseq)
            if msg is not None and msg.ts_ns >= ts_ns:
                return sseq
        return 0

    def lasts_per_subject(self) -> list[int]:
        return sorted(self.store.last_for_subject(subject)
                      for subject, _count in self.store.subjects() if self.matches(subject))

    def count_matching(self, after: int) -> int:
        """Messages after `after` that pass the filters (a consumer's num_pending)."""
        if len(self.filters) == 1 and is_literal(self.filters[0]):
            n, at = 0, self.store.first_for_subject(self.filters[0], after + 1)
            while at:
                n += 1
                at = self.store.first_for_subject(self.filters[0], at + 1)
            return n
        if not self._matchers:  # every subject passes: count keys, load no message
            if after < self.store.first_seq():
                return self.store.msgs()
            return sum(1 for _ in self.store.seqs(after + 1))
        return sum(1 for s in self.store.seqs(after + 1)
                   if self.matches(self.subject_of(s) or ""))


class Consumer:
    """One consumer's state machine. `cfg` uses the wire names of a consumer config
    (`ack_policy`, `ack_wait`, `backoff`, `max_deliver`, `max_ack_pending`, `filter_subject(s)`,
    `deliver_policy`, `opt_start_seq`)."""

    def __init__(self, cfg: dict[str, Any], state: ConsumerState | None = None,
                 start_sseq: int = 1, lps_until: int = 0) -> None:
        self.state = state or ConsumerState(delivered_sseq=start_sseq - 1,
                                            floor_sseq=start_sseq - 1, lps_until=lps_until)
        self.reconfigure(cfg)

    def reconfigure(self, cfg: dict[str, Any]) -> None:
        """A new config (CONSUMER.CREATE on an existing consumer); the state carries on."""
        self.cfg = cfg
        filters = self.filters()
        matchers = [compile_matcher(f) for f in filters]
        self.matches: Callable[[str], bool] = (
            (lambda subject: any(m(subject) for m in matchers)) if matchers else (lambda _s: True))
        # num_pending, kept up to date by the stream's Stored/Removed hooks once computed
        # (derived state: recomputed after a restart, never replicated)
        self.pending_cache: int | None = None
        self.ack_policy = cfg.get("ack_policy", "explicit")
        self.ack_wait = cfg.get("ack_wait") or DEFAULT_ACK_WAIT_NS
        self.backoff: list[int] = list(cfg.get("backoff") or [])
        self.max_deliver = cfg.get("max_deliver", -1)
        self.max_ack_pending = cfg.get("max_ack_pending", -1)

    def filters(self) -> list[str]:
        filters = list(self.cfg.get("filter_subjects") or [])
        if self.cfg.get("filter_subject"):
            filters.append(self.cfg["filter_subject"])
        return filters

    # -- the leader's question -------------------------------------------------------------

    def plan(self, now_ns: int, view: StreamView) -> Delivery | Drop | None:
        """What the leader should propose next, or None (nothing to do now). Read-only."""
        plans = self.plan_batch(now_ns, view, 1)
        return plans[0] if plans else None

    def plan_batch(self, now_ns: int, view: StreamView, limit: int) -> list[Delivery | Drop]:
        """Up to `limit` deliveries the leader may propose together (read-only): what
        `plan` would answer one after the other if each delivery were applied before the
        next question. Drops come first and do not count toward `limit`; one pull request
        is then served by one group commit instead of one per message."""
        st = self.state
        out: list[Delivery | Drop] = []
        wanted = 0
        due = sorted((p.deadline_ns, s) for s, p in st.pending.items() if p.deadline_ns <= now_ns)
        for _deadline, sseq in due:
            if wanted >= limit:
                return out
            count = st.deliveries.get(sseq, 1)
            if 0 < self.max_deliver <= count:
                out.append(Drop(sseq, AckKind.MAX_DELIVER))
            elif view.subject_of(sseq) is None:
                out.append(Drop(sseq, AckKind.GONE))
            else:
                out.append(Delivery(sseq, count + 1))
                wanted += 1
        room = limit - wanted
        if self.max_ack_pending > 0:  # each new delivery pends, unless acks are off
            left = self.max_ack_pending - len(st.pending)
            room = min(room, left) if self.ack_policy != "none" or left <= 0 else room
        if room > 0:
            out += [Delivery(s, 1) for s in
                    view.next_matching_many(st.delivered_sseq + 1, room, st.lps_until)]
        return out

    def timer_drops(self, now_ns: int) -> list[Drop]:
        """What the leader's ack timer decides on its own, without a pull request: messages
        whose ack wait ran out after their last allowed delivery (nats-server's
        checkPending). Nak'd messages wait for the next pull instead."""
        if self.max_deliver <= 0:
            return []
        st = self.state
        return [Drop(s, AckKind.MAX_DELIVER) for s, p in sorted(st.pending.items())
                if not p.naked and p.deadline_ns <= now_ns
                and st.deliveries.get(s, 1) >= self.max_deliver]

    def next_deadline(self) -> int | None:
        """When the leader should next call plan() for redeliveries (None: no pending)."""
        return min((p.deadline_ns for p in self.state.pending.values()), default=None)

    # -- replicated events -----------------------------------------------------------------

    def _wait(self, deliveries: int) -> int:
        if self.backoff:
            return self.backoff[min(deliveries, len(self.backoff)) - 1]
        return self.ack_wait

    def apply_delivered(self, now_ns: int, sseq: int) -> int:
        """Record a delivery of `sseq`; returns its consumer sequence."""
        st = self.state
        assert sseq > 0, sseq
        st.delivered_cseq += 1
        cseq = st.delivered_cseq
        fresh = sseq > st.delivered_sseq  # never delivered: above every pending one
        if fresh and self.pending_cache is not None:
            self.pending_cache -= 1  # a new delivery: the first pending message
        st.delivered_sseq = max(st.delivered_sseq, sseq)
        if self.ack_policy == "none":
            st.floor_sseq, st.floor_cseq = st.delivered_sseq, cseq
            return cseq
        count = st.deliveries.get(sseq, 0) + 1
        st.deliveries[sseq] = count
        first = st.pending.get(sseq)
        # A redelivery keeps the first delivery's consumer sequence in `pending`, as
        # nats-server does: the ack floor's consumer sequence is derived from it.
        st.pending[sseq] = Pending(first.cseq if first else cseq, now_ns,
                                   now_ns + self._wait(count))  # not naked any more
        if fresh:
            st._order.append(sseq)
        elif first is None:  # rare: a stale plan delivering an acked message again
            st.resort()
        return cseq

    def apply_ack(self, now_ns: int, kind: AckKind, sseq: int,
                  delay_ns: int = 0) -> list[Advisory]:
        """Apply one ack event. Acks for messages no longer pending (double acks, acks after a
        redelivery was acked) change nothing."""
        st = self.state
        pending = st.pending.get(sseq)
        if self.ack_policy == "all" and kind == AckKind.ACK:
            return self._ack_all(sseq)
        if pending is None:
            return []
        count = st.deliveries.get(sseq, 1)
        if kind == AckKind.NAK:
            st.pending[sseq] = Pending(pending.cseq, pending.delivered_ns,
                                       now_ns + max(delay_ns, 0), True)
            return [Advisory("MSG_NAKED", sseq, count)]
        if kind == AckKind.WPI:
            st.pending[sseq] = Pending(pending.cseq, pending.delivered_ns,
                                       now_ns + self._wait(count), pending.naked)
            return []
        self._forget(sseq)
        if kind == AckKind.TERM:
            return [Advisory("MSG_TERMINATED", sseq, count)]
        if kind == AckKind.MAX_DELIVER:
            return [Advisory("MAX_DELIVERIES", sseq, count)]
        return []

    def _ack_all(self, sseq: int) -> list[Advisory]:
        for s in [s for s in self.state.pending if s <= sseq]:
            self._forget(s)
        return []

    def _forget(self, sseq: int) -> None:
        st = self.state
        del st.pending[sseq]
        st.deliveries.pop(sseq, None)
        if st.pending:
            # amortised O(1), instead of a min() over every pending message per ack
            first = st.first_pending()
            st.floor_sseq = first - 1
            st.floor_cseq = st.pending[first].cseq - 1
        else:
            st.floor_sseq, st.floor_cseq = st.delivered_sseq, st.delivered_cseq

    # -- what clients see ------------------------------------------------------------------

    def num_ack_pending(self) -> int:
        return len(self.state.pending)

    def num_pending(self, view: StreamView) -> int:
        """Messages the consumer has not delivered yet (its filters and start position).
        Computed once by a scan, then maintained in O(1) per stored/removed/delivered
        message (`on_stored`, `on_removed`, `apply_delivered`)."""
        st = self.state
        if not st.lps_until:
            if self.pending_cache is None:
                self.pending_cache = view.count_matching(st.delivered_sseq)
            return self.pending_cache
        n, at = 0, st.delivered_sseq + 1
        while (at := view.next_matching(at, st.lps_until)) != 0:
            n += 1
            at += 1
        return n

    def on_stored(self, sseq: int, subject: str) -> None:
        if self.pending_cache is not None and sseq > self.state.delivered_sseq and \
                self.matches(subject):
            self.pending_cache += 1

    def on_removed(self, sseq: int, subject: str) -> None:
        if self.pending_cache is not None and sseq > self.state.delivered_sseq and \
                self.matches(subject):
            self.pending_cache -= 1

    def num_redelivered(self) -> int:
        return sum(1 for s in self.state.pending if self.state.deliveries.get(s, 1) > 1)


def initial_position(cfg: dict[str, Any], view: StreamView, last_seq: int,
                     start_time_ns: int = 0) -> tuple[int, int]:
    """Where a new consumer starts: (first stream sequence to consider, lps_until). The
    leader computes it once, at creation, and the creation entry carries it."""
    policy = cfg.get("deliver_policy", "all")
    after_last = last_seq + 1
    if policy == "new":
        return after_last, 0
    first = view.store.first_seq() or after_last
    if policy == "by_start_sequence":
        return max(cfg["opt_start_seq"], first), 0  # nats-server starts no earlier than first
    if policy == "last":
        return view.last_matching() or after_last, 0
    if policy == "by_start_time":
        return view.first_at_or_after_time(start_time_ns) or after_last, 0
    if policy == "last_per_subject":
        lasts = view.lasts_per_subject()
        return (lasts[0], last_seq) if lasts else (after_last, 0)
    return first, 0


# ---------------------------------------------------------------------------------------------
# Ack reply subjects and bodies


def ack_subject(stream: str, consumer: str, deliveries: int, sseq: int, cseq: int, ts_ns: int,
                pending: int) -> str:
    """The reply subject of a delivered message, the layout nats-server 2.x sends and every
    client parses: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>."""
    return f"{ACK_PREFIX}{stream}.{consumer}.{deliveries}.{sseq}.{cseq}.{ts_ns}.{pending}"


class AckInfo(NamedTuple):
    """What an ack subject names (a tuple: one is parsed per ack)."""
    stream: str
    consumer: str
    deliveries: int
    sseq: int
    cseq: int
    ts_ns: int
    pending: int
    domain: str = ""


def parse_ack_subject(subject: str) -> AckInfo | None:
    """Both layouts: v1 (9 tokens) and v2 ($JS.ACK.<domain>.<account hash>.<stream>...,
    12 tokens with the trailing random token, 11 without). None when not an ack subject."""
    tokens = subject.split(".")
    if tokens[0] != "$JS" or len(tokens) < 9 or tokens[1] != "ACK":
        return None
    try:
        if len(tokens) == 9:
            d, s, c, t, p = _ack_nums(tokens[4:9])
            return AckInfo(tokens[2], tokens[3], d, s, c, t, p)
        if len(tokens) in (11, 12):
            domain = "" if tokens[2] == "_" else tokens[2]
            d, s, c, t, p = _ack_nums(tokens[6:11])
            return AckInfo(tokens[4], tokens[5], d, s, c, t, p, domain)
    except ValueError:
        return None
    return None


def _ack_nums(tokens: list[str]) -> list[int]:
    """The number tokens of an ack subject: digits only, as nats-server's parser takes them
    (an empty token fails `int`), and within int64 (a bigger one failed when its ack entry
    was encoded). Checked together: one is parsed per ack."""
    joined = "".join(tokens)
    if not joined.isascii() or not joined.isdigit():
        raise ValueError(tokens)
    nums = [int(t) for t in tokens]
    if max(nums) >= 1 << 63:
        raise ValueError(tokens)
    return nums


def parse_ack_body(body: bytes) -> tuple[AckKind | None, int, bool]:
    """An ack message body -> (kind, nak delay ns, wants next). An empty body, `+ACK` and
    `+OK` ack; `+NXT` acks and asks for the next messages (`next_request`); `-NAK`, `+TERM`
    and `+NXT` may carry more after the word, `+ACK` / `+WPI` must be exact. A body
    nats-server does not know changes nothing (kind None), though a double ack is still
    answered."""
    if not body or body in (b"+ACK", b"+OK"):
        return AckKind.ACK, 0, False
    if body.startswith(b"+NXT"):
        return AckKind.ACK, 0, True
    if body.startswith(b"-NAK"):
        return AckKind.NAK, _nak_delay(body[4:].strip()), False
    if body == b"+WPI":
        return AckKind.WPI, 0, False
    if body.startswith(b"+TERM"):
        return AckKind.TERM, 0, False
    return None, 0, False


def next_request(body: bytes) -> bytes:
    """The pull request a `+NXT` ack carries after the word (empty: one message)."""
    return body[len(b"+NXT"):] if body.startswith(b"+NXT") else b""


def _nak_delay(arg: bytes) -> int:
    """`-NAK {"delay": ns}` or `-NAK <go duration>`; anything else means no delay."""
    if not arg:
        return 0
    if arg.startswith(b"{"):
        try:
            delay = json.loads(arg).get("delay", 0)
        except (ValueError, AttributeError, RecursionError):
            return 0
        return delay if isinstance(delay, int) and 0 < delay < 1 << 63 else 0
    parsed = parse_go_duration(arg.decode(errors="replace"))
    return parsed if parsed and 0 < parsed < 1 << 63 else 0

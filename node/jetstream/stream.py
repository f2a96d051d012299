"""The stream state machine: committed entries in, store writes and effects out.

    stream = Stream(cfg, store)
    effects = stream.apply_batch([(raft_index, entry_bytes), ...])

`apply` is deterministic: everything it depends on is in the entry (the proposer's `now_ns`,
the subject, headers and data) or in the store, so every replica and the audit job compute the
same sequences, removals and replies. It never reads a clock.

Effects tell the node what to do next; the state machine does no I/O itself:
- `Reply(subject, payload)`: a PubAck (or its error) for the publisher's reply subject;
- `Result(payload)`: the body of a STREAM.MSG.DELETE / STREAM.PURGE reply (without `type`);
- `Stored(seq, subject)` and `Removed(seqs)`: for consumers and interest/workqueue bookkeeping;
- `Republish(subject, hdr, data)`: a message the stream's `republish` config sends on.

Durable progress (`applied` Raft index, last sequence, last msg id, ...) is written with the
messages in the same store batch, so a re-applied entry (after a restart) is skipped exactly.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from node.jetstream import headers as h
from node.jetstream import ops, sourcing
from node.jetstream import schedule as sch
from node.jetstream.config import Config
from node.jetstream.config import from_wire as config_from_wire
from node.jetstream.consumer import AckKind, Advisory, Consumer, ConsumerState, Pending
from node.jetstream.consumer_config import from_wire as consumer_from_wire
from node.jetstream.errors import ApiError
from node.jetstream.store import StoredMsg, StreamStore
from node.jetstream.transform import apply_mapping
from node.subject import compile_matcher, is_literal, subject_matches

MAX_HEADER_BYTES = 64 * 1024
MIN_TTL_NS = 1_000_000_000
EXPIRE_BATCH = 10_000  # TTL expiries handled per entry: bounds one apply's work
# A schedule's next fire shares the TTL index with expiries: its key's seq has this bit set.
# Sequences never reach 2**63, and the index then needs no store format of its own.
SCHED_FLAG = 1 << 63
_U64 = struct.Struct("<Q")
_CONSUMER_CFG = "consumer:"  # store meta key prefix of a consumer's config JSON
_MAX_KEY = 511  # LMDB's key size limit (the default build)
_CONSUMER_CREATED = "consumer-created:"  # ... of its creation time (the creating entry's clock)
_EMPTY = (0, 1 << 64)  # Stream._head of a stream without messages: nothing ever too old


# Reply and Stored are made once per applied publish (on every replica): not frozen (a
# frozen dataclass's __init__ sets each field through object.__setattr__); nothing assigns
# to an effect, and unsafe_hash keeps them hashable as frozen ones are.
@dataclass(slots=True, unsafe_hash=True)
class Reply:
    subject: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Result:
    payload: dict[str, Any]


@dataclass(slots=True, unsafe_hash=True)
class Stored:
    seq: int
    subject: str


@dataclass(frozen=True, slots=True)
class Removed:
    seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Republish:
    subject: str
    hdr: bytes
    data: bytes


@dataclass(frozen=True, slots=True)
class Delivered:
    """A consumer delivery was recorded: the leader now sends the message."""
    consumer: str
    sseq: int
    cseq: int
    deliveries: int
    now_ns: int


@dataclass(frozen=True, slots=True)
class ConsumerEvent:
    consumer: str
    advisory: Advisory


Effect = Reply | Result | Stored | Removed | Republish | Delivered | ConsumerEvent


def rfc3339(ts_ns: int) -> str:
    """Go's RFC 3339 with nanoseconds, as nats-server prints times (trailing zeros dropped)."""
    if ts_ns <= 0:
        return "0001-01-01T00:00:00Z"
    seconds, nanos = divmod(ts_ns, 1_000_000_000)
    base = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{nanos:09d}".rstrip("0")
    return f"{base}.{frac}Z" if frac else f"{base}Z"


class Stream:
    """One stream's state machine over its store."""

    def __init__(self, cfg: Config, store: StreamStore, domain: str = "") -> None:
        stored_cfg = store.get_meta("config")  # an applied UPDATE_CONFIG wins over `cfg`
        self.cfg = config_from_wire(json.loads(stored_cfg)) if stored_cfg else cfg
        self.store = store
        self.domain = domain
        self.applied = self._meta_int("applied")
        self.last_seq = self._meta_int("last_seq")
        self.last_ts = self._meta_int("last_ts")
        self.last_msg_id = (store.get_meta("last_msg_id") or b"").decode()
        self.consumers: dict[str, Consumer] = {}
        # ns since the epoch, from the creating CONSUMER_UPSERT entry (CONSUMER.INFO's
        # `created`, the same after a restart); absent for consumers older than the record
        self.consumer_created: dict[str, int] = {}
        self._dirty: set[str] = set()
        # (last_seq, last_ts, last_msg_id) as the last committed batch of THIS object wrote
        # them (None: not yet): a batch that leaves them unchanged (acks, deliveries) does
        # not put them again. Written in full by the first batch, as before.
        self._saved: tuple[int, int, str] | None = None
        # (seq, ts_ns) of the first stored message, or _EMPTY, or None (unknown): max_age
        # expiry looks at it on every entry, and it changes only when that message goes.
        self._head: tuple[int, int] | None = None
        self._ack_prefix: tuple[str, str, str] = ("", "", "")  # name, domain -> PubAck head
        self._ack_head: bytes | None = None  # `_ack_prefix`'s head as bytes (reset with it)
        # False: PubAcks are not built (a cluster follower's apply: nobody sends them).
        # Errors and every other effect are the same either way.
        self.acks = True
        for name in store.consumers():  # consumers created by CONSUMER_UPSERT entries
            raw = store.get_meta(_CONSUMER_CFG + name)
            if raw:
                self.attach_consumer(name, consumer_from_wire(json.loads(raw)))
                created = store.get_meta(_CONSUMER_CREATED + name)
                if created:
                    self.consumer_created[name] = int(created)

    def attach_consumer(self, name: str, cfg: dict[str, Any], start_sseq: int = 1,
                        lps_until: int = 0) -> Consumer:
        """Register a consumer, resuming its stored state if it has one."""
        raw = self.store.get_consumer(name)
        state = ConsumerState.decode(raw) if raw else None
        consumer = Consumer(cfg, state, start_sseq=start_sseq, lps_until=lps_until)
        self.consumers[name] = consumer
        return consumer

    # -- durable progress ------------------------------------------------------------------

    def _meta_int(self, key: str) -> int:
        raw = self.store.get_meta(key)
        return _U64.unpack(raw)[0] if raw else 0

    def _save_progress(self, saved: tuple[int, int, str] | None) -> tuple[int, int, str]:
        """Put the progress in the open batch; `saved`: what the store already holds."""
        progress = (self.last_seq, max(self.last_ts, 0), self.last_msg_id)
        if progress == saved:
            self.store.put_meta("applied", _U64.pack(self.applied))
        else:  # one store call, not four: every applied run of a publish gets here
            self.store.put_metas([("applied", _U64.pack(self.applied)),
                                  ("last_seq", _U64.pack(progress[0])),
                                  ("last_ts", _U64.pack(progress[1])),
                                  ("last_msg_id", progress[2].encode())])
        return progress

    # -- applying --------------------------------------------------------------------------

    def apply_batch(self, entries: Iterable[tuple[int, bytes]],
                    on_entry: Callable[[int, list[Effect]], None] | None = None,
                    before_commit: Callable[[list[Effect]], list[Effect]] | None = None,
                    own: ops.Own | None = None) -> list[Effect]:
        """Apply committed entries in log order in ONE store batch; indexes at or below
        `applied` were applied before a restart and are skipped. `on_entry(index, effects)`
        sees each entry's own effects (the node matches results to their proposals).
        `before_commit(effects)` gets them once every entry is applied, before the store
        commits, and returns those left for the caller (a PubAck may leave that early: the
        entries are committed Raft entries, fsynced in the WAL, which replays them into
        the store after a crash). `own`: the leader's publishes still held as ops
        (ops.decode skips their decode)."""
        effects: list[Effect] = []
        saved, self._saved = self._saved, None  # known again only once the batch commits
        with self.store.batch():
            for index, data in entries:
                if index <= self.applied:
                    continue
                produced = self.apply(ops.decode(data, own))
                if on_entry is not None:
                    on_entry(index, produced)
                effects.extend(produced)
                self.applied = index
            if before_commit is not None and effects:
                effects = before_commit(effects)
            progress = self._save_progress(saved)
            for name in sorted(self._dirty):
                if name in self.consumers:
                    self.store.put_consumer(name, self.consumers[name].state.encode())
            self._dirty.clear()
        self._saved = progress
        return effects

    def apply(self, op: ops.Op) -> list[Effect]:
        if isinstance(op, ops.StreamMsg):
            return self._apply_msg(op)
        if isinstance(op, ops.StreamMsgs):
            return self._apply_msgs(op)
        if isinstance(op, ops.DeleteMsg):
            return self._apply_delete(op)
        if isinstance(op, ops.Purge):
            return self._apply_purge(op)
        if isinstance(op, ops.StreamBatch):
            return self._apply_stream_batch(op)
        if isinstance(op, ops.UpdateConfig):
            return self._apply_update(op)
        if isinstance(op, ops.ConsumerUpsert):
            return self._apply_consumer_upsert(op)
        if isinstance(op, ops.ConsumerDelete):
            return self.detach_consumer(op.consumer)
        if isinstance(op, ops.ConsumerGroupState):
            return self._apply_group_state(op)
        if isinstance(op, ops.ConsumerForget):
            self.detach_consumer(op.consumer, retire=False)
            return []
        if isinstance(op, ops.ConsumerDelivered):
            return self._apply_delivered(op)
        if isinstance(op, ops.ConsumerAck):
            return self._apply_consumer_ack(op)
        if isinstance(op, ops.ConsumerAcks):
            return self._apply_consumer_acks(op)
        if isinstance(op, ops.ConsumerDeliveredMany):
            return self._apply_delivered_many(op)
        if isinstance(op, ops.RestoreMsgs):
            return self._apply_restore(op)
        if isinstance(op, ops.ConsumerState):
            return self._apply_consumer_state(op)
        if isinstance(op, ops.SourceMsgs):
            return sourcing.apply_sourced(self, op)  # mirrors and sources (sourcing.py)
        return self._expire(op.now_ns)

    # -- STREAM.RESTORE --------------------------------------------------------------------

    def _apply_restore(self, op: ops.RestoreMsgs) -> list[Effect]:
        """A snapshot's messages, as they were: their sequences and times, no limits."""
        effects: list[Effect] = []
        for m in op.msgs:
            if m.seq <= self.last_seq:
                continue  # already here (sequences only grow)
            self._put(StoredMsg(m.seq, m.subject, m.hdr, m.data, m.ts_ns))
            self.last_seq, self.last_ts = m.seq, m.ts_ns
            effects.append(Stored(m.seq, m.subject))
        if op.last_seq > self.last_seq:
            self.last_seq, self.last_ts = op.last_seq, op.last_ts
        return effects

    def _apply_consumer_state(self, op: ops.ConsumerState) -> list[Effect]:
        consumer = self.consumers.get(op.consumer)
        if consumer is not None:
            consumer.state = ConsumerState.decode(op.state)
            consumer.pending_cache = None  # derived: computed again on first use
            self._dirty.add(op.consumer)
        return []

    # -- configuration entries -------------------------------------------------------------

    def _apply_update(self, op: ops.UpdateConfig) -> list[Effect]:
        """A STREAM.UPDATE the leader checked: new limits apply at once to what is stored."""
        self.cfg = config_from_wire(json.loads(op.config))
        self.store.put_meta("config", op.config)
        removed: list[int] = []
        for subject, _count in list(self.store.subjects()):
            removed += self._enforce_limits(subject)
        effects: list[Effect] = [Removed(tuple(removed))] if removed else []
        return self._expire(op.now_ns) + effects

    def _apply_consumer_upsert(self, op: ops.ConsumerUpsert) -> list[Effect]:
        cfg = consumer_from_wire(json.loads(op.config))
        existing = self.consumers.get(op.consumer)
        if existing is not None:
            existing.reconfigure(cfg)  # an update: the state (deliveries, acks) carries on
        else:
            consumer = Consumer(cfg, None, start_sseq=op.start_sseq, lps_until=op.lps_until)
            self.consumers[op.consumer] = consumer
            self.consumer_created[op.consumer] = op.now_ns
            self.store.put_meta(_CONSUMER_CREATED + op.consumer, str(op.now_ns).encode())
        self.store.put_meta(_CONSUMER_CFG + op.consumer, op.config)
        self._dirty.add(op.consumer)  # the state record lists the consumer in the store
        return []

    # -- atomic batches --------------------------------------------------------------------

    def _apply_stream_batch(self, op: ops.StreamBatch) -> list[Effect]:
        """All or nothing: every message is checked against the state the earlier messages
        of the batch would leave, then all are stored, or none and the commit gets the
        error. One PubAck for the batch: its last sequence and size."""
        effects: list[Effect] = list(self._expire(op.now_ns))
        reply = op.msgs[-1].reply
        try:
            checked = self._check_batch(op)
        except ApiError as err:
            return effects + self._pub_error(reply, err)
        for msg, (rollup, ttl) in zip(op.msgs, checked, strict=True):
            stored = self._store_msg(ops.StreamMsg(op.now_ns, msg.subject, "", msg.hdr,
                                                   msg.data), rollup, ttl)
            effects.extend(e for e in stored if not isinstance(e, Reply))
        if reply and not self.cfg["no_ack"]:
            name = json.dumps(self.cfg["name"])
            body = f'{{"stream":{name},"seq":{self.last_seq},"batch":{json.dumps(op.batch_id)},' \
                f'"count":{len(op.msgs)}}}'
            effects.append(Reply(reply, body.encode()))
        return effects

    def _check_batch(self, op: ops.StreamBatch) -> list[tuple[str, int]]:
        cfg = self.cfg
        if not cfg.get("allow_atomic"):
            raise ApiError.of("JSAtomicPublishDisabledErr")
        last_seq, written, ids = self.last_seq, set(), set()
        out = []
        for msg in op.msgs:
            if cfg["sealed"]:
                raise ApiError.of("JSStreamSealedErr")
            if 0 <= cfg["max_msg_size"] < len(msg.hdr) + len(msg.data):
                raise ApiError.of("JSStreamMessageExceedsMaximumErr")
            self._check_key_sizes(msg.subject, msg.hdr)
            expected_stream = h.get(msg.hdr, h.EXPECTED_STREAM)
            if expected_stream is not None and expected_stream != cfg["name"]:
                raise ApiError.of("JSStreamNotMatchErr")
            expected_last = h.get(msg.hdr, h.EXPECTED_LAST_SEQ)
            if expected_last is not None and _as_seq(expected_last) != last_seq:
                raise ApiError.of("JSStreamWrongLastSequenceErrF", seq=last_seq)
            subject = self._stored_subject(msg.subject)
            self._check_batch_subject_seq(msg, subject, written)
            msg_id = h.get(msg.hdr, h.MSG_ID) or ""
            if msg_id and (msg_id in ids or self._is_duplicate(msg_id, op.now_ns)):
                raise ApiError.of("JSAtomicPublishContainsDuplicateMessageErr")
            out.append((self._check_rollup(msg.hdr), self._check_ttl(msg.hdr)))
            last_seq = last_seq + 1 if last_seq or not cfg.get("first_seq") else cfg["first_seq"]
            written.add(subject)
            ids.add(msg_id)
        return out

    def _check_batch_subject_seq(self, msg: ops.StreamMsg, subject: str,
                                 written: set[str]) -> None:
        expected = h.get(msg.hdr, h.EXPECTED_LAST_SUBJECT_SEQ)
        if expected is None:
            return
        target = h.get(msg.hdr, h.EXPECTED_LAST_SUBJECT_SEQ_SUBJECT) or subject
        if target in written:
            raise ApiError.of("JSStreamWrongLastSequenceConstantErr")  # changed in the batch
        found = self._last_seq_matching(target)
        if _as_seq(expected) != found:
            raise ApiError.of("JSStreamWrongLastSequenceErrF", seq=found)

    def _is_duplicate(self, msg_id: str, now_ns: int) -> bool:
        seen = self.store.get_dedup(msg_id)
        return seen is not None and now_ns - seen[1] <= self.cfg["duplicate_window"]

    # -- consumers -------------------------------------------------------------------------

    def _apply_delivered(self, op: ops.ConsumerDelivered) -> list[Effect]:
        return self._apply_delivered_many(ops.ConsumerDeliveredMany(op.now_ns, op.consumer,
                                                                    (op.sseq,)))

    def _apply_delivered_many(self, op: ops.ConsumerDeliveredMany) -> list[Effect]:
        """A delivery round: each sequence as its own CONSUMER_DELIVERED would be."""
        consumer = self.consumers.get(op.consumer)
        if consumer is None:
            return []  # deleted before this entry applied
        self._dirty.add(op.consumer)
        effects: list[Effect] = []
        deliveries = consumer.state.deliveries
        for sseq in op.sseqs:
            cseq = consumer.apply_delivered(op.now_ns, sseq)
            effects.append(Delivered(op.consumer, sseq, cseq, deliveries.get(sseq, 1),
                                     op.now_ns))
            if consumer.ack_policy == "none":
                effects += self._retire_acked([sseq])
        return effects

    def _apply_consumer_ack(self, op: ops.ConsumerAck) -> list[Effect]:
        return self._apply_consumer_acks(ops.ConsumerAcks(
            op.now_ns, op.consumer, ((op.kind, op.sseq, op.delay_ns),)))

    def _apply_consumer_acks(self, op: ops.ConsumerAcks) -> list[Effect]:
        """Acks that arrived together: each as its own CONSUMER_ACK would be, in order."""
        consumer = self.consumers.get(op.consumer)
        if consumer is None:
            return []
        self._dirty.add(op.consumer)
        retains = self.cfg["retention"] != "limits"  # only then may an ack remove messages
        effects: list[Effect] = []
        for kind, sseq, delay_ns in op.acks:
            before = set(consumer.state.pending) if retains else None
            advisories = consumer.apply_ack(op.now_ns, AckKind(kind), sseq, delay_ns)
            effects += [ConsumerEvent(op.consumer, a) for a in advisories]
            if before is not None and kind in (AckKind.ACK, AckKind.TERM):
                effects += self._retire_acked(sorted(before - set(consumer.state.pending)))
        return effects

    def _apply_group_state(self, op: ops.ConsumerGroupState) -> list[Effect]:
        """A consumer whose deliveries and acks live in a group of its own reports its state
        (docs/jetstream.md, "Consumer groups"). The stream keeps it as that consumer's state
        record, so retention reads it as it reads an in-stream consumer's: a message goes once
        every interested consumer acked it. Each report is the consumer group's applied state
        at some index, and a message once acked there stays acked, so even a report that
        arrives after a newer one removes nothing that was not acked."""
        consumer = self.consumers.get(op.consumer)
        if consumer is None:
            return []  # deleted before this entry applied
        st, pending = consumer.state, set(op.pending)
        newly = [s for s in st.pending if s not in pending and s <= op.delivered_sseq]
        for s in self.store.seqs(st.delivered_sseq + 1):  # stored ones only
            if s > op.delivered_sseq:
                break
            if s not in pending:
                newly.append(s)
        st.delivered_sseq, st.floor_sseq = op.delivered_sseq, op.floor_sseq
        st.pending = {s: Pending(0, op.now_ns, 0) for s in op.pending}
        st.deliveries = {}
        consumer.pending_cache = None  # derived: computed again on first use
        self._dirty.add(op.consumer)
        return self._retire_acked(sorted(newly))

    def detach_consumer(self, name: str, retire: bool = True) -> list[Effect]:
        """Forget a deleted consumer (the wiring proposes the delete as an entry). Under
        interest retention, messages nobody else wants any more go with it (unless `retire`
        is False: a forgotten mem_storage consumer leaves the messages, as nats-server)."""
        if self.consumers.pop(name, None) is None:
            return []
        self.store.delete_consumer(name)
        self.store.put_meta(_CONSUMER_CFG + name, b"")
        self.store.put_meta(_CONSUMER_CREATED + name, b"")
        self.consumer_created.pop(name, None)
        self._dirty.discard(name)
        if self.cfg["retention"] != "interest" or not retire:
            return []
        return self._retire_acked(list(self.store.seqs()))

    # -- retention: interest and workqueue -------------------------------------------------

    def _interested(self, subject: str) -> list[Consumer]:
        return [c for c in self.consumers.values() if _consumer_matches(c, subject)]

    def _retire_acked(self, seqs: list[int]) -> list[Effect]:
        """Under interest / workqueue retention, remove messages every interested consumer
        has acknowledged."""
        if self.cfg["retention"] == "limits":
            return []
        removed = []
        for sseq in seqs:
            msg = self.store.load(sseq)
            if msg is None:
                continue
            if all(_acked(c, sseq) for c in self._interested(msg.subject)) and self._remove(sseq):
                removed.append(sseq)
        return [Removed(tuple(removed))] if removed else []

    # -- publish ---------------------------------------------------------------------------

    def _pub_error(self, reply: str, err: ApiError) -> list[Effect]:
        if not reply:
            return []
        body = {**err.to_dict(), "stream": self.cfg["name"], "seq": 0}
        return [Reply(reply, json.dumps(body, separators=(",", ":")).encode())]

    def _pub_ack(self, reply: str, seq: int, duplicate: bool = False,
                 total: int | None = None) -> list[Effect]:
        if not reply or not self.acks or self.cfg["no_ack"]:
            return []
        name, domain, head = self._ack_prefix
        if name != self.cfg["name"] or domain != self.domain:
            name, domain = self.cfg["name"], self.domain
            in_domain = f',"domain":{json.dumps(domain)}' if domain else ""
            head = f'{{"stream":{json.dumps(name)}{in_domain},"seq":'
            self._ack_prefix = (name, domain, head)
            self._ack_head = None
        dup = ',"duplicate": true' if duplicate else ""
        val = f',"val":"{total}"' if total is not None else ""
        return [Reply(reply, f'{head}{seq}{dup}{val}}}'.encode())]

    def _apply_msg(self, op: ops.StreamMsg) -> list[Effect]:
        effects: list[Effect] = list(self._expire(op.now_ns))
        try:
            checked = self._check_msg(op)
        except ApiError as err:
            return effects + self._pub_error(op.reply, err)
        if isinstance(checked, int):  # a duplicate: acknowledge the original
            return effects + self._pub_ack(op.reply, checked, duplicate=True)
        return effects + self._store_msg(op, *checked)

    def _apply_msgs(self, op: ops.StreamMsgs) -> list[Effect]:
        """Publishes merged into one entry: each exactly as its own STREAM_MSG entry, in
        order (its checks see the messages before it; its own PubAck or error). A part
        without headers on a stream with none of the features that look at a message
        (`_plain_room`) takes `_apply_plain`: the same outcome with the checks that cannot
        refuse it left out (tests/jetstream/test_apply_plain.py compares both paths)."""
        effects: list[Effect] = []
        apply_msg = self._apply_msg
        room = self._plain_room()  # constant within the entry: only other ops change cfg
        if room < 0:
            for msg in op.msgs:
                effects += apply_msg(msg)
            return effects
        plain = self._apply_plain
        max_size = self.cfg["max_msg_size"]
        for msg in op.msgs:
            if msg.hdr or len(msg.subject) > room or 0 <= max_size < len(msg.data):
                effects += apply_msg(msg)  # headers, or a refusal: the full path says which
            else:
                plain(msg, effects)
        return effects

    def _plain_room(self) -> int:
        """-1 unless this stream's config lets a headerless publish be stored with no check
        that can refuse it besides its size and subject length (sealed, counters, discard
        new, transforms, republish, interest/workqueue retention take the full path;
        schedules, TTLs and rollups need a header; expiry and delete markers happen in
        `_expire`, which both paths run); else a subject length in characters (a
        character is at most 4 UTF-8 bytes) under which `_check_key_sizes` cannot refuse."""
        cfg = self.cfg
        if (cfg["sealed"] or cfg["discard"] == "new" or cfg["retention"] != "limits"
                or cfg.get("allow_msg_counter") or cfg.get("subject_transform")
                or cfg.get("republish")):
            return -1
        return max(_MAX_KEY - 2 - len(cfg["name"].encode()) - 9, -1) // 4

    def _apply_plain(self, op: ops.StreamMsg, effects: list[Effect]) -> None:
        """`_apply_msg` of a headerless publish that `_apply_msgs` found cannot be refused:
        expiry, then store, limits, PubAck, in `_store_msg`'s order, appended to `effects`.
        With no header there is no msg id, rollup, TTL or schedule; the subject is stored
        as published."""
        now_ns = op.now_ns
        expired = self._expire(now_ns)
        if expired:
            effects += expired
        seq = self._next_seq()
        subject = op.subject
        self._put(StoredMsg(seq, subject, b"", op.data, now_ns))
        self.last_seq, self.last_ts, self.last_msg_id = seq, now_ns, ""
        effects.append(Stored(seq, subject))
        removed = self._enforce_limits(subject)
        if removed:
            effects.append(Removed(tuple(removed)))
        reply = op.reply
        if reply and self.acks and not self.cfg["no_ack"]:
            effects.append(Reply(reply, b"%b%d}" % (self._ack_bytes(), seq)))

    def _ack_bytes(self) -> bytes:
        """`_pub_ack`'s head (`{"stream":...,"seq":`) as bytes, made again when it is."""
        name, domain, _ = self._ack_prefix
        if self._ack_head is None or name != self.cfg["name"] or domain != self.domain:
            self._pub_ack("-", 0)  # (re)makes `_ack_prefix`
            self._ack_head = self._ack_prefix[2].encode()
        return self._ack_head

    def _check_key_sizes(self, subject: str, hdr: bytes) -> None:
        """The subject as stored (after the stream's transform) and the Nats-Msg-Id become
        parts of LMDB keys (511 bytes at most, after the stream's 2+name prefix and up to 9
        more bytes). nats-server stores any
        subject its control line lets through; here a longer one is refused instead of
        stopping the node when the put fails. Checked in the apply, so a WAL entry written
        before this check is refused again on replay rather than failing every restart."""
        room = _MAX_KEY - 2 - len(self.cfg["name"].encode()) - 9
        if len(subject.encode()) > room:
            raise ApiError.of("JSStreamStoreFailedF",
                              err=f"subject longer than {room} bytes for this stream")
        msg_id = h.get(hdr, h.MSG_ID) or ""
        if len(msg_id.encode()) > room:
            raise ApiError.of("JSStreamStoreFailedF",
                              err=f"Nats-Msg-Id longer than {room} bytes for this stream")

    def _check_msg(self, op: ops.StreamMsg) -> int | tuple[str, int, sch.Schedule | None]:
        """Every refusal, in nats-server's order. -> the original seq of a duplicate, or
        (rollup, ttl_ns, the schedule it holds) for a message to store."""
        cfg = self.cfg
        if cfg["sealed"]:
            raise ApiError.of("JSStreamSealedErr")
        if 0 <= cfg["max_msg_size"] < len(op.hdr) + len(op.data):
            raise ApiError.of("JSStreamMessageExceedsMaximumErr")
        if len(op.hdr) > MAX_HEADER_BYTES:
            raise ApiError.of("JSStreamHeaderExceedsMaximumErr")
        if not op.hdr:  # most publishes: no header check below can refuse them
            return self._check_headerless(op)
        self._check_key_sizes(self._stored_subject(op.subject), op.hdr)
        self._check_counter(op)
        expected_stream = h.get(op.hdr, h.EXPECTED_STREAM)
        if expected_stream is not None and expected_stream != cfg["name"]:
            raise ApiError.of("JSStreamNotMatchErr")
        self._check_expected_seqs(op)
        msg_id = h.get(op.hdr, h.MSG_ID) or ""
        if msg_id:
            seen = self.store.get_dedup(msg_id)
            if seen is not None and op.now_ns - seen[1] <= cfg["duplicate_window"]:
                return seen[0]
        expected_id = h.get(op.hdr, h.EXPECTED_LAST_MSG_ID)
        if expected_id is not None and expected_id != self.last_msg_id:
            raise ApiError.of("JSStreamWrongLastMsgIDErrF", id=self.last_msg_id)
        rollup = self._check_rollup(op.hdr)
        ttl = self._check_ttl(op.hdr)
        schedule = self._check_schedule(op.hdr, op.subject)
        self._check_discard_new(op)
        return rollup, ttl, schedule

    def _check_headerless(self, op: ops.StreamMsg) -> tuple[str, int, None]:
        """`_check_msg`'s remaining checks for a message without headers, in the same order:
        no expected-* header, msg id, rollup or TTL to look at."""
        self._check_key_sizes(self._stored_subject(op.subject), b"")
        if self.cfg.get("allow_msg_counter"):
            raise ApiError.of("JSMessageIncrMissingErr")  # a counter needs its Nats-Incr
        self._check_discard_new(op)
        return "", 0, None

    def _check_counter(self, op: ops.StreamMsg) -> None:
        """Counter streams (`allow_msg_counter`): every message is an empty-payload
        `Nats-Incr: <integer>`; headers that would make the total depend on more than the
        subject's last value are refused."""
        incr = h.get(op.hdr, h.INCR)
        if not self.cfg.get("allow_msg_counter"):
            if incr is not None:
                raise ApiError.of("JSMessageIncrDisabledErr")
            return
        if incr is None:
            raise ApiError.of("JSMessageIncrMissingErr")
        if op.data:
            raise ApiError.of("JSMessageIncrPayloadErr")
        unsupported = (h.EXPECTED_STREAM, h.EXPECTED_LAST_SEQ, h.EXPECTED_LAST_SUBJECT_SEQ,
                       h.EXPECTED_LAST_SUBJECT_SEQ_SUBJECT, h.EXPECTED_LAST_MSG_ID, h.ROLLUP)
        if _as_int(incr) is None or any(h.get(op.hdr, k) is not None for k in unsupported):
            raise ApiError.of("JSMessageIncrInvalidErr")

    def _counter_total(self, subject: str, hdr: bytes) -> int:
        """The subject's new total: its last stored total plus this increment."""
        incr = _as_int(h.get(hdr, h.INCR) or "")
        assert incr is not None  # checked before
        last = self.store.last_for_subject(subject)
        if not last:
            return incr
        msg = self.store.load(last)
        try:
            return int(json.loads(msg.data)["val"]) + incr if msg else incr
        except (ValueError, KeyError, TypeError) as exc:
            raise ApiError.of("JSMessageCounterBrokenErr") from exc

    def _check_expected_seqs(self, op: ops.StreamMsg) -> None:
        expected_last = h.get(op.hdr, h.EXPECTED_LAST_SEQ)
        if expected_last is not None and _as_seq(expected_last) != self.last_seq:
            raise ApiError.of("JSStreamWrongLastSequenceErrF", seq=self.last_seq)
        expected_subject_seq = h.get(op.hdr, h.EXPECTED_LAST_SUBJECT_SEQ)
        if expected_subject_seq is not None:
            subject = h.get(op.hdr, h.EXPECTED_LAST_SUBJECT_SEQ_SUBJECT) or \
                self._stored_subject(op.subject)
            found = self._last_seq_matching(subject)
            if _as_seq(expected_subject_seq) != found:
                raise ApiError.of("JSStreamWrongLastSequenceErrF", seq=found)

    def _last_seq_matching(self, subject: str) -> int:
        if is_literal(subject):
            return self.store.last_for_subject(subject)
        match = compile_matcher(subject)
        best = 0
        for name, _count in self.store.subjects():
            if match(name):
                best = max(best, self.store.last_for_subject(name))
        return best

    def _check_rollup(self, hdr: bytes) -> str:
        rollup = h.get(hdr, h.ROLLUP)
        if rollup is None:
            return ""
        if not self.cfg["allow_rollup_hdrs"]:
            raise ApiError.of("JSStreamRollupFailedF", err="rollup not permitted")
        if rollup not in ("sub", "all"):
            raise ApiError.of("JSStreamRollupFailedF",
                              err=f"rollup value invalid: {json.dumps(rollup)}")
        return rollup

    def _check_ttl(self, hdr: bytes) -> int:
        value = h.get(hdr, h.TTL)
        if value is None:
            return 0
        if not self.cfg["allow_msg_ttl"]:
            raise ApiError.of("JSMessageTTLDisabledErr")
        ttl = h.parse_ttl(value)
        if ttl is None or (ttl != -1 and ttl < MIN_TTL_NS):
            raise ApiError.of("JSMessageTTLInvalidErr")
        return ttl

    def _check_schedule(self, hdr: bytes, subject: str) -> sch.Schedule | None:
        """-> the schedule the message holds (parsed once: `_store_msg` takes it)."""
        if not (h.get(hdr, sch.SCHEDULE) or h.get(hdr, sch.NEXT) is not None
                or h.get(hdr, sch.SCHEDULER) is not None):
            return None
        if not self.cfg.get("allow_msg_schedules"):
            raise ApiError.of("JSMessageSchedulesDisabledErr")
        checked = sch.check(hdr, subject, self._captures, self.cfg["allow_msg_ttl"])
        sch.check_cancel(hdr, subject)
        return checked.schedule if checked is not None else None

    def _captures(self, subject: str) -> bool:
        return any(subject_matches(p, subject) for p in self.cfg["subjects"] or [self.cfg["name"]])

    def _check_discard_new(self, op: ops.StreamMsg) -> None:
        cfg = self.cfg
        if cfg["discard"] != "new":
            return
        if 0 < cfg["max_msgs"] <= self.store.msgs():
            raise ApiError.of("JSStreamStoreFailedF", err="maximum messages exceeded")
        size = self.store.sizer(self._stored_subject(op.subject), op.hdr, op.data)
        if 0 < cfg["max_bytes"] < self.store.bytes() + size:
            raise ApiError.of("JSStreamStoreFailedF", err="maximum bytes exceeded")
        per_subject = cfg["max_msgs_per_subject"]
        if cfg["discard_new_per_subject"] and per_subject > 0 and \
                self.store.subject_count(self._stored_subject(op.subject)) >= per_subject:
            raise ApiError.of("JSStreamStoreFailedF",
                              err="maximum messages per subject exceeded")

    def _stored_subject(self, subject: str) -> str:
        tr = self.cfg.get("subject_transform")
        if not tr:
            return subject
        mapped = apply_mapping(tr.get("src", ""), tr.get("dest", ""), subject)
        return subject if mapped is None else mapped

    def _next_seq(self) -> int:
        if self.last_seq == 0 and self.cfg.get("first_seq"):
            return self.cfg["first_seq"]
        return self.last_seq + 1

    def _store_msg(self, op: ops.StreamMsg, rollup: str, ttl: int,
                   schedule: sch.Schedule | None | bool = False) -> list[Effect]:
        """`schedule`: what `_check_msg` parsed (False: not checked there, parsed here)."""
        subject = self._stored_subject(op.subject)
        data, total, hdr = op.data, None, op.hdr
        if schedule is False:
            schedule = self._schedule_of(hdr, subject)
        if schedule is not None:
            # one schedule per subject: nats-server stores it with a subject rollup
            hdr, rollup = _merge_headers(hdr, [(h.ROLLUP, "sub")]), "sub"
        marker_ttl = self.cfg.get("subject_delete_marker_ttl", 0)
        if 0 < ttl < marker_ttl:
            # nats-server raises a message TTL to the marker TTL, so a marker never outlives
            # what it marks, and rewrites the header (in whole seconds).
            ttl = marker_ttl
            hdr = _replace_header(hdr, h.TTL, str(marker_ttl // 1_000_000_000))
        if self.cfg.get("allow_msg_counter"):
            try:
                total = self._counter_total(subject, op.hdr)
            except ApiError as err:
                return self._pub_error(op.reply, err)
            data = json.dumps({"val": str(total)}, separators=(",", ":")).encode()
        seq = self._next_seq()
        # the subject's previous seq: only a republish header names it (a cursor read)
        previous_of_subject = (self.store.last_for_subject(subject)
                               if self.cfg.get("republish") else 0)
        self._put(StoredMsg(seq, subject, hdr, data, op.now_ns))
        self.last_seq, self.last_ts = seq, op.now_ns
        msg_id = h.get(op.hdr, h.MSG_ID) or ""
        self.last_msg_id = msg_id
        if msg_id:
            self.store.put_dedup(msg_id, seq, op.now_ns)
        if ttl > 0:
            self.store.add_ttl(op.now_ns + ttl, seq)
        if schedule is not None:
            self.store.add_ttl(schedule.first(op.now_ns), seq | SCHED_FLAG)
        effects: list[Effect] = [Stored(seq, subject)]
        removed = self._rollup(rollup, subject, seq) + self._enforce_limits(subject)
        removed += self._cancel_schedule(hdr, subject)
        if self.cfg["retention"] == "interest" and not self._interested(subject):
            self._remove(seq)  # nobody will ever want it: nats-server drops it at once
            removed.append(seq)
        if removed:
            effects.append(Removed(tuple(removed)))
        effects.extend(self._republish(seq, subject, op, previous_of_subject))
        return effects + self._pub_ack(op.reply, seq, total=total)

    def _schedule_of(self, hdr: bytes, subject: str) -> sch.Schedule | None:
        """The schedule a message being stored holds (checked already), or None."""
        if not self.cfg.get("allow_msg_schedules") or not hdr:
            return None
        value = h.get(hdr, sch.SCHEDULE)
        return sch.parse(value, h.get(hdr, sch.TIME_ZONE)) if value else None

    def _cancel_schedule(self, hdr: bytes, subject: str) -> list[int]:
        """`Nats-Schedule-Next: purge` with `Nats-Scheduler` (a client's cancel, or what a
        one-shot schedule published) removes the schedule held on that subject."""
        if not self.cfg.get("allow_msg_schedules") or not hdr:
            return []
        scheduler = h.get(hdr, sch.SCHEDULER)
        if not scheduler or scheduler == subject or h.get(hdr, sch.NEXT) != sch.NEXT_PURGE:
            return []
        removed = []
        at = self.store.first_for_subject(scheduler)
        while at:
            msg = self.store.load(at)
            if msg is not None and h.get(msg.hdr, sch.SCHEDULE) and self._remove(at):
                removed.append(at)
            at = self.store.first_for_subject(scheduler, at + 1)
        return removed

    def _fire(self, due_ns: int, seq: int, now_ns: int) -> list[Effect]:
        """Publish what the schedule stored at `seq` holds (it may be gone: a stale key)."""
        msg = self.store.load(seq)
        value = h.get(msg.hdr, sch.SCHEDULE) if msg is not None else None
        if msg is None or not value:
            return []
        schedule = sch.parse(value, h.get(msg.hdr, sch.TIME_ZONE))
        nxt = sch.NEXT_PURGE
        if schedule.repeats:
            next_ns = schedule.next_after(due_ns, now_ns)
            self.store.add_ttl(next_ns, seq | SCHED_FLAG)
            nxt = sch.format_next(next_ns)
        body_hdr, data = msg.hdr, msg.data
        source = h.get(msg.hdr, sch.SOURCE)
        if source:
            last = self.store.last_for_subject(source)
            held = self.store.load(last) if last else None
            if held is not None:
                body_hdr, data = held.hdr, held.data
        ttl_text = h.get(msg.hdr, sch.TTL) or ""
        rollup = h.get(msg.hdr, sch.ROLLUP) or ""
        hdr = sch.generated_headers(body_hdr, msg.subject, nxt, ttl_text, rollup)
        ttl = h.parse_ttl(ttl_text) if ttl_text else 0
        target = h.get(msg.hdr, sch.TARGET) or ""
        return self._store_msg(ops.StreamMsg(now_ns, target, "", hdr, data), rollup, ttl or 0)

    def _put(self, msg: StoredMsg) -> None:
        self.store.store(msg)
        if self._head is _EMPTY:  # sequences only grow: a stored message is first only here
            self._head = (msg.seq, msg.ts_ns)
        for consumer in self.consumers.values():
            consumer.on_stored(msg.seq, msg.subject)

    def _rollup(self, rollup: str, subject: str, seq: int) -> list[int]:
        if rollup == "sub":
            return self._remove_subject_below(subject, seq)
        if rollup == "all":
            return [s for s in list(self.store.seqs()) if s < seq and self._remove(s)]
        return []

    def _remove_subject_below(self, subject: str, below: int, keep: int = 0) -> list[int]:
        removed = []
        count = self.store.subject_count(subject)
        at = self.store.first_for_subject(subject)
        while at and at < below and count > keep:
            if self._remove(at):
                removed.append(at)
                count -= 1
                if count <= keep:
                    break  # no need to look for the next one
            at = self.store.first_for_subject(subject, at + 1)
        return removed

    def _remove(self, seq: int) -> bool:
        msg = self.store.remove(seq)
        if msg is None:
            return False
        if self._head is not None and seq <= self._head[0]:
            self._head = None  # the first message went: look again when needed
        for consumer in self.consumers.values():
            consumer.on_removed(seq, msg.subject)
        ttl = h.get(msg.hdr, h.TTL)
        parsed = h.parse_ttl(ttl) if ttl is not None else None
        if parsed and parsed > 0:
            self.store.remove_ttl(msg.ts_ns + parsed, seq)
        return True

    def _enforce_limits(self, subject: str) -> list[int]:
        cfg, removed = self.cfg, []
        per_subject = cfg["max_msgs_per_subject"]
        if per_subject > 0 and self.store.subject_count(subject) > per_subject:
            removed += self._remove_subject_below(subject, self.last_seq + 1, keep=per_subject)
        while 0 < cfg["max_msgs"] < self.store.msgs() or 0 < cfg["max_bytes"] < self.store.bytes():
            first = self.store.first_seq()
            if not first or first == self.last_seq:
                break  # never remove the message just stored to meet a byte limit
            self._remove(first)
            removed.append(first)
        return removed

    def _republish(self, seq: int, subject: str, op: ops.StreamMsg,
                   previous: int) -> list[Effect]:
        rp = self.cfg.get("republish")
        if not rp:
            return []
        dest = apply_mapping(rp.get("src", ">"), rp.get("dest", ""), subject)
        if dest is None:
            return []
        pairs = [("Nats-Stream", self.cfg["name"]), ("Nats-Subject", subject),
                 ("Nats-Sequence", str(seq)), ("Nats-Time-Stamp", rfc3339(op.now_ns)),
                 ("Nats-Last-Sequence", str(previous))]
        if rp.get("headers_only"):
            pairs.append(("Nats-Msg-Size", str(len(op.data))))
            return [Republish(dest, _merge_headers(op.hdr, pairs), b"")]
        return [Republish(dest, _merge_headers(op.hdr, pairs), op.data)]

    # -- time ------------------------------------------------------------------------------

    def _expire(self, now_ns: int) -> list[Effect]:
        """Remove what per-message TTLs, then max_age, expired by `now_ns`; both leave
        subject delete markers (reason `MaxAge` for both, as nats-server writes them)."""
        aged: list[StoredMsg] = []
        fired: list[Effect] = []
        for _expires, seq in self.store.due_ttls(now_ns, EXPIRE_BATCH):
            self.store.remove_ttl(_expires, seq)
            if seq & SCHED_FLAG:
                fired += self._fire(_expires, seq & ~SCHED_FLAG, now_ns)
                continue
            msg = self.store.load(seq)
            if msg is not None and self._remove(seq):
                aged.append(msg)
        max_age = self.cfg["max_age"]
        if max_age > 0 and (self._head is None or self._head[1] <= now_ns - max_age):
            self._head = _EMPTY
            for seq in self.store.seqs():
                msg = self.store.load(seq)
                if msg is None or msg.ts_ns > now_ns - max_age:
                    self._head = None if msg is None else (seq, msg.ts_ns)
                    break
                self._remove(seq)
                aged.append(msg)
        self.store.prune_dedup(now_ns - self.cfg["duplicate_window"], EXPIRE_BATCH)
        if not aged and not fired:
            return []  # the common case, on every applied message: nothing was due
        effects: list[Effect] = [Removed(tuple(m.seq for m in aged))] if aged else []
        return fired + effects + self._delete_markers(aged, now_ns)

    def _delete_markers(self, aged: list[StoredMsg], now_ns: int) -> list[Effect]:
        """`subject_delete_marker_ttl`: when expiry removed the last message of a subject,
        store a marker there (itself expiring after that TTL) so watchers see the delete.
        Markers go in the order the subjects became empty."""
        ttl = self.cfg.get("subject_delete_marker_ttl", 0)
        if ttl <= 0:
            return []
        emptied: dict[str, int] = {}
        for i, msg in enumerate(aged):
            if not h.is_delete_marker(msg.hdr):  # an expiring marker leaves none
                emptied[msg.subject] = i
            else:
                emptied.pop(msg.subject, None)
        effects: list[Effect] = []
        for subject in sorted(emptied, key=emptied.__getitem__):
            if self.store.last_for_subject(subject):
                continue
            hdr = h.build([(h.MARKER_REASON, "MaxAge"), (h.TTL, h.format_go_duration(ttl)),
                           (h.ROLLUP, "sub")])
            seq = self._next_seq()
            self._put(StoredMsg(seq, subject, hdr, b"", now_ns))
            self.store.add_ttl(now_ns + ttl, seq)
            self.last_seq, self.last_ts, self.last_msg_id = seq, now_ns, ""
            effects.append(Stored(seq, subject))
        return effects

    # -- delete and purge ------------------------------------------------------------------

    def _apply_delete(self, op: ops.DeleteMsg) -> list[Effect]:
        effects = self._expire(op.now_ns)
        try:
            if self.cfg["sealed"]:
                raise ApiError.of("JSStreamSealedErr")
            if self.cfg["deny_delete"]:
                raise ApiError.of("JSStreamMsgDeleteFailedF", err="message delete not permitted")
            first = self.store.first_seq() or self.last_seq + 1
            if op.seq == 0 or op.seq < first:
                raise ApiError.of("JSStreamMsgDeleteFailedF", err="no message found")
            if op.seq > self.last_seq:
                raise ApiError.of("JSStreamMsgDeleteFailedF", err="stream store EOF")
            if not self._remove(op.seq):
                raise ApiError.of("JSSequenceNotFoundErrF", seq=op.seq)
        except ApiError as err:
            return effects + [Result(err.to_dict())]
        return effects + [Removed((op.seq,)), Result({"success": True})]

    def _apply_purge(self, op: ops.Purge) -> list[Effect]:
        effects = self._expire(op.now_ns)
        if self.cfg["sealed"]:
            return effects + [Result({**ApiError.of("JSStreamSealedErr").to_dict(),
                                      "purged": 0})]
        if self.cfg["deny_purge"]:
            err = ApiError.of("JSStreamPurgeFailedF", err="stream purge not permitted")
            return effects + [Result({**err.to_dict(), "purged": 0})]
        removed = self._purge(op)
        if removed:
            effects.append(Removed(tuple(removed)))
        return effects + [Result({"success": True, "purged": len(removed)})]

    def _purge(self, op: ops.Purge) -> list[int]:
        below = op.seq if op.seq else self.last_seq + 1
        if op.filter and is_literal(op.filter):
            return self._remove_subject_below(op.filter, below, keep=op.keep)
        match = compile_matcher(op.filter) if op.filter else None
        total = sum(1 for s in self.store.seqs() if s < below and self._matches(s, match))
        budget = total - op.keep if op.keep else total
        removed: list[int] = []
        for seq in self.store.seqs():
            if len(removed) >= budget or seq >= below:
                break
            if self._matches(seq, match) and self._remove(seq):
                removed.append(seq)
        return removed

    def _matches(self, seq: int, match: Any) -> bool:
        if match is None:
            return True
        msg = self.store.load(seq)
        return msg is not None and match(msg.subject)

    # -- state -----------------------------------------------------------------------------

    def state(self, consumers: int = 0) -> dict[str, Any]:
        """STREAM.INFO's `state`, times as nats-server prints them."""
        msgs = self.store.msgs()
        if msgs:
            first = self.store.first_seq()
            first_msg = self.store.load(first)
            first_ts = rfc3339(first_msg.ts_ns if first_msg else 0)
        else:
            first = self._next_seq() if self.last_seq or self.cfg.get("first_seq") else 0
            first_ts = rfc3339(0)
        out: dict[str, Any] = {
            "messages": msgs, "bytes": self.store.bytes(), "first_seq": first,
            "first_ts": first_ts, "last_seq": self.last_seq or max(first - 1, 0),
            "last_ts": rfc3339(self.last_ts),
        }
        subjects = sum(1 for _ in self.store.subjects())
        if subjects:
            out["num_subjects"] = subjects
        deleted = (self.last_seq - first + 1 - msgs) if msgs else 0
        if deleted > 0:
            out["num_deleted"] = deleted
        out["consumer_count"] = consumers
        return out


def _consumer_matches(consumer: Consumer, subject: str) -> bool:
    filters = consumer.filters()
    return not filters or any(compile_matcher(f)(subject) for f in filters)


def _acked(consumer: Consumer, sseq: int) -> bool:
    st = consumer.state
    return sseq <= st.delivered_sseq and sseq not in st.pending


def _replace_header(hdr: bytes, key: str, value: str) -> bytes:
    needle = key.encode() + b":"
    lines = hdr.split(b"\r\n")
    for i, line in enumerate(lines):
        if i and line.startswith(needle):
            lines[i] = needle + b" " + value.encode()
            break
    return b"\r\n".join(lines)


def _as_int(value: str) -> int | None:
    """A counter increment: an optionally signed decimal integer of any size."""
    text = value.strip()
    digits = text[1:] if text[:1] in "+-" else text
    return int(text) if digits.isdigit() and digits.isascii() else None


def _as_seq(value: str) -> int:
    """nats-server reads an unparsable expected sequence as 0."""
    try:
        return int(value.strip())
    except ValueError:
        return 0


def _merge_headers(hdr: bytes, pairs: list[tuple[str, str]]) -> bytes:
    if not hdr:
        return h.build(pairs)
    lines = [line for line in hdr.split(b"\r\n")[1:] if line]
    return b"NATS/1.0\r\n" + b"".join(line + b"\r\n" for line in lines) + b"".join(
        f"{k}: {v}\r\n".encode() for k, v in pairs) + b"\r\n"

"""Raft entry formats of a stream's group: what is proposed, replicated, logged and applied.

Every entry starts with an `EntryOp` byte and the proposer's clock reading `now_ns`; applying an
entry never reads a clock or a random source, so every member (and the audit job replaying the
WAL) computes the same state. Encoding is explicit little-endian `struct`; a decoder refuses
unknown op codes, short entries and trailing bytes. docs/jetstream.md lists the layouts.

EntryOp values are append-only: a value, once released, keeps its meaning forever, because old
WAL segments and snapshots are replayed by newer code.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum


class EntryOp(IntEnum):
    STREAM_MSG = 1   # a publish captured by the stream
    DELETE_MSG = 2   # STREAM.MSG.DELETE
    PURGE = 3        # STREAM.PURGE, with optional subject filter, seq and keep
    EXPIRE = 4       # a leader tick: remove what max_age and per-message TTLs expired by now_ns
    UPDATE_CONFIG = 5        # STREAM.UPDATE: the checked config, as JSON
    # 6..15 reserved for stream ops
    SOURCE_MSGS = 12         # messages a mirror / source read from its origin, with origin seqs
    RESTORE_MSGS = 13        # STREAM.RESTORE: messages at their own sequences and times
    CONSUMER_DELIVERED = 16  # the leader delivered a stream message to a consumer
    CONSUMER_ACK = 17        # +ACK / -NAK / +WPI / +TERM, or a leader's MAX_DELIVER / GONE
    STREAM_BATCH = 18        # a committed atomic batch, applied all-or-nothing
    CONSUMER_UPSERT = 19     # create or update a consumer: config JSON + start position
    CONSUMER_DELETE = 20     # delete a consumer
    CONSUMER_STATE = 21      # STREAM.RESTORE: a consumer's whole state record
    CONSUMER_DELIVERED_MANY = 22  # one delivery round: several CONSUMER_DELIVERED in order
    CONSUMER_ACKS = 23       # acks that arrived together: several CONSUMER_ACK in order
    STREAM_MSGS = 24         # publishes proposed together: applied as consecutive STREAM_MSGs
    CONSUMER_FORGET = 30     # a single node restarted: a mem_storage consumer is gone
    CONSUMER_GROUP_STATE = 31  # a consumer with a group of its own tells its stream its acks


class EntryFormatError(ValueError):
    """An entry that no version of this code wrote: refuse it, never guess."""


_HEAD = struct.Struct("<Bq")                # op, now_ns
_MSG = struct.Struct("<HHII")               # subject_len, reply_len, hdr_len, data_len
_DELETE = struct.Struct("<QB")              # seq, flags
_PURGE = struct.Struct("<QQH")              # seq (0 = none), keep (0 = none), filter_len
_DELIVERED = struct.Struct("<HQ")           # consumer_len, stream seq
_ACK = struct.Struct("<HBQq")               # consumer_len, kind, stream seq, delay_ns
_BATCH = struct.Struct("<HI")               # batch_id_len, message count
_CONFIG = struct.Struct("<I")               # config_len
_UPSERT = struct.Struct("<HQQI")            # name_len, start seq, lps_until, config_len
_NAME = struct.Struct("<H")                 # name_len
_RESTORE = struct.Struct("<QqI")            # last_seq, last_ts, message count
_RMSG = struct.Struct("<QqHII")             # seq, ts, subject_len, hdr_len, data_len
_STATE = struct.Struct("<HI")               # name_len, state_len
_SOURCE = struct.Struct("<HHI")             # source key_len, origin ident_len, message count
_GSTATE = struct.Struct("<HQQI")            # name_len, delivered sseq, floor sseq, count
_SEQ = struct.Struct("<Q")
_SOURCED = struct.Struct("<QqHII")          # origin seq, origin ts, subject_len, hdr_len, data_len
_COUNT = struct.Struct("<I")                # STREAM_MSGS: message count; then each part's length
_MANY = struct.Struct("<HI")                # consumer_len, count
_ONE_ACK = struct.Struct("<BQq")            # kind, stream seq, delay_ns
DELETE_NO_ERASE = 0x01


# Not frozen (nothing assigns to an op after it is built; unsafe_hash keeps it hashable
# as a frozen one is): a frozen dataclass's __init__ sets each field through
# object.__setattr__, and every replica builds one StreamMsg per applied publish.
@dataclass(slots=True, unsafe_hash=True)
class StreamMsg:
    now_ns: int
    subject: str
    reply: str
    hdr: bytes
    data: bytes


@dataclass(frozen=True, slots=True)
class StreamMsgs:
    """Several publishes in one entry (the leader merged the STREAM_MSG proposals that
    queued between two drain passes): applied exactly as the STREAM_MSG entries one after
    the other, each with its own clock reading, checks, sequence and PubAck."""
    now_ns: int  # the first message's
    msgs: tuple[StreamMsg, ...]


@dataclass(frozen=True, slots=True)
class DeleteMsg:
    now_ns: int
    seq: int
    no_erase: bool = False


@dataclass(frozen=True, slots=True)
class Purge:
    now_ns: int
    filter: str = ""
    seq: int = 0   # remove messages below this sequence (0: no bound)
    keep: int = 0  # keep this many newest messages (0: keep none)


@dataclass(frozen=True, slots=True)
class Expire:
    now_ns: int


@dataclass(frozen=True, slots=True)
class ConsumerDelivered:
    now_ns: int
    consumer: str
    sseq: int


@dataclass(frozen=True, slots=True)
class ConsumerAck:
    now_ns: int
    consumer: str
    kind: int  # consumer.AckKind
    sseq: int
    delay_ns: int = 0


@dataclass(frozen=True, slots=True)
class ConsumerDeliveredMany:
    """A delivery round: what `count` CONSUMER_DELIVERED entries with the same clock would
    do, in order, as ONE entry (one WAL record, one proposal, one apply dispatch)."""
    now_ns: int
    consumer: str
    sseqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ConsumerAcks:
    """Acks of one consumer that arrived together, as ONE entry: what the CONSUMER_ACK
    entries `(kind, sseq, delay_ns)` with the same clock would do, in order."""
    now_ns: int
    consumer: str
    acks: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, slots=True)
class StreamBatch:
    now_ns: int
    batch_id: str
    msgs: tuple[StreamMsg, ...]  # their own now_ns is the batch's


@dataclass(frozen=True, slots=True)
class UpdateConfig:
    now_ns: int
    config: bytes  # the stream config JSON (wire form), already checked by the leader


@dataclass(frozen=True, slots=True)
class ConsumerUpsert:
    now_ns: int
    consumer: str
    config: bytes  # the consumer config JSON, already checked by the leader
    start_sseq: int = 1
    lps_until: int = 0


@dataclass(frozen=True, slots=True)
class ConsumerDelete:
    now_ns: int
    consumer: str


@dataclass(frozen=True, slots=True)
class ConsumerForget:
    """A standalone node's restart forgets a `mem_storage` consumer (nats-server keeps such a
    consumer in memory only). Unlike ConsumerDelete it removes no message under interest
    retention: nats-server's restarted stream keeps what that consumer had not acked."""
    now_ns: int
    consumer: str


@dataclass(frozen=True, slots=True)
class ConsumerGroupState:
    """An entry of the STREAM's group: the state of a consumer that keeps its deliveries and
    acks in a Raft group of its own, as that group applied it at some index (its leader
    proposes it). Every stream seq <= `delivered_sseq` not in `pending` is acked (or was
    never due); the stream removes such messages under interest / workqueue retention."""
    now_ns: int
    consumer: str
    delivered_sseq: int
    floor_sseq: int
    pending: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RestoredMsg:
    seq: int
    ts_ns: int
    subject: str
    hdr: bytes
    data: bytes


@dataclass(frozen=True, slots=True)
class SourcedMsg:
    origin_seq: int
    origin_ts: int
    subject: str  # the origin's subject (a source's transform is applied by the target)
    hdr: bytes
    data: bytes


@dataclass(frozen=True, slots=True)
class RestoreMsgs:
    """Messages of a snapshot, stored at their own sequences and times (no limits, no
    dedup); then the stream's last sequence / time become at least `last_seq` / `last_ts`
    (a snapshot may end with deleted messages)."""
    now_ns: int
    msgs: tuple[RestoredMsg, ...]
    last_seq: int = 0
    last_ts: int = 0


@dataclass(frozen=True, slots=True)
class ConsumerState:
    now_ns: int
    consumer: str
    state: bytes  # consumer.ConsumerState.encode()


@dataclass(frozen=True, slots=True)
class SourceMsgs:
    """Messages read from one origin, in origin order. `key` names the source ("" for the
    mirror); applying records the last origin seq under it with the messages."""
    now_ns: int
    key: str
    ident: str  # the origin's identity, for the source header
    msgs: tuple[SourcedMsg, ...]


Op = (StreamMsg | StreamMsgs | DeleteMsg | Purge | Expire | ConsumerDelivered | ConsumerAck
      | StreamBatch | ConsumerDeliveredMany | ConsumerAcks | UpdateConfig | ConsumerUpsert
      | ConsumerDelete | RestoreMsgs | ConsumerState | SourceMsgs | ConsumerForget
      | ConsumerGroupState)


_HEAD_MSG = struct.Struct("<BqHHII")      # _HEAD then _MSG: a whole STREAM_MSG head


def encode_msg(now_ns: int, subject: str, reply: str, hdr: bytes, data: bytes) -> bytes:
    """`encode(StreamMsg(...))` without building the op (the leader's publish path)."""
    subj, rep = subject.encode(), reply.encode()
    return b"".join((_HEAD_MSG.pack(EntryOp.STREAM_MSG, now_ns, len(subj), len(rep), len(hdr),
                                    len(data)), subj, rep, hdr, data))


def _msg_body(msg: StreamMsg) -> bytes:
    subject, reply = msg.subject.encode(), msg.reply.encode()
    return (_MSG.pack(len(subject), len(reply), len(msg.hdr), len(msg.data))
            + subject + reply + msg.hdr + msg.data)


def encode(op: Op) -> bytes:
    if isinstance(op, StreamMsg):
        return encode_msg(op.now_ns, op.subject, op.reply, op.hdr, op.data)
    if isinstance(op, StreamMsgs):
        return merge_msgs([encode(m) for m in op.msgs])
    if isinstance(op, StreamBatch):
        batch_id = op.batch_id.encode()
        return (_HEAD.pack(EntryOp.STREAM_BATCH, op.now_ns)
                + _BATCH.pack(len(batch_id), len(op.msgs)) + batch_id
                + b"".join(_msg_body(m) for m in op.msgs))
    if isinstance(op, DeleteMsg):
        flags = DELETE_NO_ERASE if op.no_erase else 0
        return _HEAD.pack(EntryOp.DELETE_MSG, op.now_ns) + _DELETE.pack(op.seq, flags)
    if isinstance(op, Purge):
        filt = op.filter.encode()
        return (_HEAD.pack(EntryOp.PURGE, op.now_ns) + _PURGE.pack(op.seq, op.keep, len(filt))
                + filt)
    if isinstance(op, Expire):
        return _HEAD.pack(EntryOp.EXPIRE, op.now_ns)
    if isinstance(op, ConsumerDelivered):
        name = op.consumer.encode()
        return (_HEAD.pack(EntryOp.CONSUMER_DELIVERED, op.now_ns)
                + _DELIVERED.pack(len(name), op.sseq) + name)
    if isinstance(op, ConsumerAck):
        name = op.consumer.encode()
        return (_HEAD.pack(EntryOp.CONSUMER_ACK, op.now_ns)
                + _ACK.pack(len(name), op.kind, op.sseq, op.delay_ns) + name)
    if isinstance(op, ConsumerDeliveredMany):
        name = op.consumer.encode()
        return (_HEAD.pack(EntryOp.CONSUMER_DELIVERED_MANY, op.now_ns)
                + _MANY.pack(len(name), len(op.sseqs)) + name
                + struct.pack(f"<{len(op.sseqs)}Q", *op.sseqs))
    if isinstance(op, ConsumerAcks):
        name = op.consumer.encode()
        return (_HEAD.pack(EntryOp.CONSUMER_ACKS, op.now_ns)
                + _MANY.pack(len(name), len(op.acks)) + name
                + b"".join(_ONE_ACK.pack(*a) for a in op.acks))
    return _encode_admin(op)


def _encode_admin(op: Op) -> bytes:
    if isinstance(op, UpdateConfig):
        return _HEAD.pack(EntryOp.UPDATE_CONFIG, op.now_ns) + _CONFIG.pack(len(op.config)) + \
            op.config
    if isinstance(op, ConsumerUpsert):
        name = op.consumer.encode()
        return (_HEAD.pack(EntryOp.CONSUMER_UPSERT, op.now_ns)
                + _UPSERT.pack(len(name), op.start_sseq, op.lps_until, len(op.config))
                + name + op.config)
    if isinstance(op, ConsumerDelete):
        name = op.consumer.encode()
        return _HEAD.pack(EntryOp.CONSUMER_DELETE, op.now_ns) + _NAME.pack(len(name)) + name
    if isinstance(op, ConsumerGroupState):
        name = op.consumer.encode()
        return (_HEAD.pack(EntryOp.CONSUMER_GROUP_STATE, op.now_ns)
                + _GSTATE.pack(len(name), op.delivered_sseq, op.floor_sseq, len(op.pending))
                + name + b"".join(_SEQ.pack(s) for s in op.pending))
    if isinstance(op, ConsumerForget):
        name = op.consumer.encode()
        return _HEAD.pack(EntryOp.CONSUMER_FORGET, op.now_ns) + _NAME.pack(len(name)) + name
    if isinstance(op, RestoreMsgs):
        parts = [_HEAD.pack(EntryOp.RESTORE_MSGS, op.now_ns),
                 _RESTORE.pack(op.last_seq, op.last_ts, len(op.msgs))]
        for m in op.msgs:
            subject = m.subject.encode()
            parts += [_RMSG.pack(m.seq, m.ts_ns, len(subject), len(m.hdr), len(m.data)),
                      subject, m.hdr, m.data]
        return b"".join(parts)
    if isinstance(op, ConsumerState):
        name = op.consumer.encode()
        return (_HEAD.pack(EntryOp.CONSUMER_STATE, op.now_ns)
                + _STATE.pack(len(name), len(op.state)) + name + op.state)
    if isinstance(op, SourceMsgs):
        return _encode_sourced(op)
    raise TypeError(f"not an entry op: {op!r}")


def merge_msgs(entries: list[bytes]) -> bytes:
    """One STREAM_MSGS entry from encoded STREAM_MSG entries (`MultiRaft.propose_quiet`'s
    `merge`): the first one's clock, the count, then each entry whole behind its length."""
    if not entries or any(e[:1] != b"\x01" for e in entries):
        raise ValueError("STREAM_MSGS merges one or more STREAM_MSG entries")
    _, now_ns = _HEAD.unpack_from(entries[0])
    parts = [_HEAD.pack(EntryOp.STREAM_MSGS, now_ns), _COUNT.pack(len(entries))]
    pack = _COUNT.pack
    for e in entries:
        parts.append(pack(len(e)))
        parts.append(e)
    return b"".join(parts)


_HELD_WHOLE = (EntryOp.STREAM_MSG, EntryOp.STREAM_BATCH, EntryOp.SOURCE_MSGS)


def msg_clocks(entry: bytes) -> list[int]:
    """The clock of each publish a STREAM_MSG or STREAM_MSGS entry carries, and the one
    clock of a STREAM_BATCH or SOURCE_MSGS entry (the leader's in-flight reservations are
    keyed by it, inflight.py); none for any other entry. Reads
    only the heads: a malformed entry yields what it can (its apply refuses it anyway)."""
    if len(entry) < _HEAD.size:
        return []
    code, now_ns = _HEAD.unpack_from(entry)
    if code in _HELD_WHOLE:
        return [now_ns]
    if code != EntryOp.STREAM_MSGS or len(entry) < _HEAD.size + _COUNT.size:
        return []
    (count,) = _COUNT.unpack_from(entry, _HEAD.size)
    at = _HEAD.size + _COUNT.size
    clocks = []
    head, size_of = _HEAD.unpack_from, _COUNT.unpack_from
    for _ in range(count):
        if at + _COUNT.size + _HEAD.size > len(entry):
            break
        (size,) = size_of(entry, at)
        clocks.append(head(entry, at + _COUNT.size)[1])
        at += _COUNT.size + size
    return clocks


# `own(clock, entry, at, size)`: the op of a publish this node proposed if `entry[at:at +
# size]` is exactly its encoding, else None (inflight.Inflight.own): decoding it is skipped.
Own = Callable[[int, bytes, int, int], "StreamMsg | None"]


def decode(entry: bytes, own: Own | None = None) -> Op:
    if len(entry) < _HEAD.size:
        raise EntryFormatError(f"entry of {len(entry)} bytes is shorter than its header")
    code, now_ns = _HEAD.unpack_from(entry)
    if code == 1 and type(entry) is bytes:  # EntryOp.STREAM_MSG, the most frequent entry
        if own is not None:
            msg = own(now_ns, entry, 0, len(entry))
            if msg is not None:
                return msg
        return _decode_msg_bytes(now_ns, entry)
    if code == EntryOp.STREAM_MSGS:
        return _decode_msgs(now_ns, bytes(entry), own)
    body = memoryview(entry)[_HEAD.size:]
    # A plain int lookup (EntryOp is an IntEnum): constructing the enum member cost as much
    # as decoding a small message.
    decoder = _DECODERS.get(code)
    if decoder is None:
        raise EntryFormatError(f"unknown entry op {code}")
    try:
        return decoder(now_ns, body)
    except UnicodeDecodeError as exc:
        raise EntryFormatError(
            f"{EntryOp(code).name} entry has a subject that is not UTF-8") from exc


def _fixed(body: memoryview, layout: struct.Struct, what: str) -> tuple[int, ...]:
    if len(body) < layout.size:
        raise EntryFormatError(f"{what} entry truncated")
    return layout.unpack_from(body)


def _decode_msg(now_ns: int, body: memoryview) -> StreamMsg:
    msg, used = _read_msg(now_ns, body)
    if used != len(body):
        raise EntryFormatError(f"stream msg entry is {len(body)} bytes, lengths say {used}")
    return msg


def _decode_msg_bytes(now_ns: int, entry: bytes, base: int = 0, stop: int = -1
                      ) -> StreamMsg:
    """`_decode_msg` for a publish held in `bytes` (the entry, or its part
    entry[base:stop]): each field sliced from the entry once (no memoryview slice, then
    copy, per field); the same checks and errors."""
    if stop < 0:
        stop = len(entry)
    start = base + _HEAD.size
    if stop < start + _MSG.size:
        raise EntryFormatError("stream msg entry truncated")
    subject_len, reply_len, hdr_len, data_len = _MSG.unpack_from(entry, start)
    at = start + _MSG.size
    reply_at = at + subject_len
    hdr_at = reply_at + reply_len
    data_at = hdr_at + hdr_len
    end = data_at + data_len
    if end != stop:
        raise EntryFormatError(f"stream msg entry is {stop - start} bytes, lengths say "
                               f"{end - start}")
    try:
        subject, reply = entry[at:reply_at].decode(), entry[reply_at:hdr_at].decode()
    except UnicodeDecodeError as exc:
        raise EntryFormatError("STREAM_MSG entry has a subject that is not UTF-8") from exc
    return StreamMsg(now_ns, subject, reply, entry[hdr_at:data_at], entry[data_at:end])


def _decode_msgs(now_ns: int, entry: bytes, own: Own | None = None) -> StreamMsgs:
    """STREAM_MSGS: count, then each part (a whole STREAM_MSG entry) behind its length.
    The first part's clock must be the entry's; nothing may be left over. A part `own`
    knows is not decoded (its bytes are the op's encoding)."""
    at = _HEAD.size + _COUNT.size
    if len(entry) < at:
        raise EntryFormatError("stream msgs entry truncated")
    (count,) = _COUNT.unpack_from(entry, _HEAD.size)
    if count == 0:
        raise EntryFormatError("stream msgs entry is empty")
    msgs = []
    for _ in range(count):
        if len(entry) < at + _COUNT.size:
            raise EntryFormatError("stream msgs entry truncated")
        (size,) = _COUNT.unpack_from(entry, at)
        at += _COUNT.size
        end = at + size
        if end > len(entry) or size < _HEAD.size:
            raise EntryFormatError("stream msgs entry truncated")
        code, ns = _HEAD.unpack_from(entry, at)
        if code != EntryOp.STREAM_MSG:
            raise EntryFormatError(f"stream msgs entry holds an entry of op {code}")
        msg = own(ns, entry, at, size) if own is not None else None
        msgs.append(msg if msg is not None else _decode_msg_bytes(ns, entry, at, end))
        at = end
    if at != len(entry):
        raise EntryFormatError("stream msgs entry has trailing bytes")
    if msgs[0].now_ns != now_ns:
        raise EntryFormatError("stream msgs entry's clock is not its first message's")
    return StreamMsgs(now_ns, tuple(msgs))


def _read_msg(now_ns: int, body: memoryview) -> tuple[StreamMsg, int]:
    subject_len, reply_len, hdr_len, data_len = _fixed(body, _MSG, "stream msg")
    total = _MSG.size + subject_len + reply_len + hdr_len + data_len
    if len(body) < total:
        raise EntryFormatError(f"stream msg entry is {len(body)} bytes, lengths say {total}")
    at = _MSG.size
    subject = bytes(body[at:at + subject_len]).decode()
    at += subject_len
    reply = bytes(body[at:at + reply_len]).decode()
    at += reply_len
    hdr = bytes(body[at:at + hdr_len])
    at += hdr_len
    return StreamMsg(now_ns, subject, reply, hdr, bytes(body[at:total])), total


def _decode_batch(now_ns: int, body: memoryview) -> StreamBatch:
    id_len, count = _fixed(body, _BATCH, "stream batch")
    at = _BATCH.size + id_len
    if len(body) < at or count == 0:
        raise EntryFormatError("stream batch entry truncated or empty")
    batch_id = bytes(body[_BATCH.size:at]).decode()
    msgs = []
    for _ in range(count):
        msg, used = _read_msg(now_ns, body[at:])
        msgs.append(msg)
        at += used
    if at != len(body):
        raise EntryFormatError("stream batch entry has trailing bytes")
    return StreamBatch(now_ns, batch_id, tuple(msgs))


def _decode_delete(now_ns: int, body: memoryview) -> DeleteMsg:
    if len(body) != _DELETE.size:
        raise EntryFormatError("delete msg entry has the wrong size")
    seq, flags = _DELETE.unpack_from(body)
    if flags & ~DELETE_NO_ERASE:
        raise EntryFormatError(f"delete msg entry has unknown flags {flags:#x}")
    return DeleteMsg(now_ns, seq, bool(flags & DELETE_NO_ERASE))


def _decode_purge(now_ns: int, body: memoryview) -> Purge:
    seq, keep, filter_len = _fixed(body, _PURGE, "purge")
    if len(body) != _PURGE.size + filter_len:
        raise EntryFormatError("purge entry has the wrong size")
    return Purge(now_ns, bytes(body[_PURGE.size:]).decode(), seq, keep)


def _decode_expire(now_ns: int, body: memoryview) -> Expire:
    if len(body):
        raise EntryFormatError("expire entry has trailing bytes")
    return Expire(now_ns)


def _decode_delivered(now_ns: int, body: memoryview) -> ConsumerDelivered:
    name_len, sseq = _fixed(body, _DELIVERED, "consumer delivered")
    if len(body) != _DELIVERED.size + name_len:
        raise EntryFormatError("consumer delivered entry has the wrong size")
    return ConsumerDelivered(now_ns, bytes(body[_DELIVERED.size:]).decode(), sseq)


def _decode_ack(now_ns: int, body: memoryview) -> ConsumerAck:
    name_len, kind, sseq, delay_ns = _fixed(body, _ACK, "consumer ack")
    if len(body) != _ACK.size + name_len:
        raise EntryFormatError("consumer ack entry has the wrong size")
    if not 1 <= kind <= 6:
        raise EntryFormatError(f"consumer ack entry has unknown kind {kind}")
    return ConsumerAck(now_ns, bytes(body[_ACK.size:]).decode(), kind, sseq, delay_ns)


def _many(body: memoryview, item: int, what: str) -> tuple[str, int, int]:
    """(consumer, count, offset of the first item) of a *_MANY entry, sizes checked."""
    name_len, count = _fixed(body, _MANY, what)
    at = _MANY.size + name_len
    if count == 0 or len(body) != at + count * item:
        raise EntryFormatError(f"{what} entry is empty or has the wrong size")
    return bytes(body[_MANY.size:at]).decode(), count, at


def _decode_delivered_many(now_ns: int, body: memoryview) -> ConsumerDeliveredMany:
    name, count, at = _many(body, 8, "consumer delivered many")
    return ConsumerDeliveredMany(now_ns, name, struct.unpack_from(f"<{count}Q", body, at))


def _decode_acks(now_ns: int, body: memoryview) -> ConsumerAcks:
    name, count, at = _many(body, _ONE_ACK.size, "consumer acks")
    acks = tuple(_ONE_ACK.iter_unpack(body[at:]))
    if any(not 1 <= kind <= 6 for kind, _s, _d in acks):
        raise EntryFormatError("consumer acks entry has an unknown kind")
    return ConsumerAcks(now_ns, name, acks)


def _decode_update(now_ns: int, body: memoryview) -> UpdateConfig:
    (size,) = _fixed(body, _CONFIG, "update config")
    if len(body) != _CONFIG.size + size:
        raise EntryFormatError("update config entry has the wrong size")
    return UpdateConfig(now_ns, bytes(body[_CONFIG.size:]))


def _decode_upsert(now_ns: int, body: memoryview) -> ConsumerUpsert:
    name_len, start, lps, size = _fixed(body, _UPSERT, "consumer upsert")
    if len(body) != _UPSERT.size + name_len + size:
        raise EntryFormatError("consumer upsert entry has the wrong size")
    at = _UPSERT.size + name_len
    return ConsumerUpsert(now_ns, bytes(body[_UPSERT.size:at]).decode(), bytes(body[at:]),
                          start, lps)


def _decode_consumer_delete(now_ns: int, body: memoryview) -> ConsumerDelete:
    (name_len,) = _fixed(body, _NAME, "consumer delete")
    if len(body) != _NAME.size + name_len:
        raise EntryFormatError("consumer delete entry has the wrong size")
    return ConsumerDelete(now_ns, bytes(body[_NAME.size:]).decode())


def _decode_consumer_forget(now_ns: int, body: memoryview) -> ConsumerForget:
    return ConsumerForget(now_ns, _decode_consumer_delete(now_ns, body).consumer)


def _decode_group_state(now_ns: int, body: memoryview) -> ConsumerGroupState:
    name_len, delivered, floor, count = _fixed(body, _GSTATE, "consumer group state")
    at = _GSTATE.size + name_len
    if len(body) != at + count * _SEQ.size:
        raise EntryFormatError("consumer group state entry has the wrong size")
    pending = tuple(s for (s,) in _SEQ.iter_unpack(body[at:]))
    return ConsumerGroupState(now_ns, bytes(body[_GSTATE.size:at]).decode(), delivered, floor,
                              pending)


def _decode_restore(now_ns: int, body: memoryview) -> RestoreMsgs:
    last_seq, last_ts, count = _fixed(body, _RESTORE, "restore msgs")
    at, msgs = _RESTORE.size, []
    for _ in range(count):
        seq, ts, subject_len, hdr_len, data_len = _fixed(body[at:], _RMSG, "restore msgs")
        at += _RMSG.size
        end = at + subject_len + hdr_len + data_len
        if len(body) < end:
            raise EntryFormatError("restore msgs entry truncated")
        subject = bytes(body[at:at + subject_len]).decode()
        hdr = bytes(body[at + subject_len:at + subject_len + hdr_len])
        msgs.append(RestoredMsg(seq, ts, subject, hdr, bytes(body[end - data_len:end])))
        at = end
    if at != len(body):
        raise EntryFormatError("restore msgs entry has trailing bytes")
    return RestoreMsgs(now_ns, tuple(msgs), last_seq, last_ts)


def _decode_consumer_state(now_ns: int, body: memoryview) -> ConsumerState:
    name_len, size = _fixed(body, _STATE, "consumer state")
    if len(body) != _STATE.size + name_len + size:
        raise EntryFormatError("consumer state entry has the wrong size")
    at = _STATE.size + name_len
    return ConsumerState(now_ns, bytes(body[_STATE.size:at]).decode(), bytes(body[at:]))


def _encode_sourced(op: SourceMsgs) -> bytes:
    key, ident = op.key.encode(), op.ident.encode()
    parts = [_HEAD.pack(EntryOp.SOURCE_MSGS, op.now_ns),
             _SOURCE.pack(len(key), len(ident), len(op.msgs)), key, ident]
    for m in op.msgs:
        subject = m.subject.encode()
        parts += [_SOURCED.pack(m.origin_seq, m.origin_ts, len(subject), len(m.hdr),
                                len(m.data)), subject, m.hdr, m.data]
    return b"".join(parts)


def _decode_sourced(now_ns: int, body: memoryview) -> SourceMsgs:
    key_len, ident_len, count = _fixed(body, _SOURCE, "source msgs")
    at = _SOURCE.size + key_len + ident_len
    if len(body) < at or count == 0:
        raise EntryFormatError("source msgs entry truncated or empty")
    key = bytes(body[_SOURCE.size:_SOURCE.size + key_len]).decode()
    ident = bytes(body[_SOURCE.size + key_len:at]).decode()
    msgs = []
    for _ in range(count):
        seq, ts, subject_len, hdr_len, data_len = _fixed(body[at:], _SOURCED, "source msgs")
        start = at + _SOURCED.size
        end = start + subject_len + hdr_len + data_len
        if len(body) < end:
            raise EntryFormatError("source msgs entry truncated")
        subject = bytes(body[start:start + subject_len]).decode()
        hdr = bytes(body[start + subject_len:start + subject_len + hdr_len])
        msgs.append(SourcedMsg(seq, ts, subject, hdr, bytes(body[end - data_len:end])))
        at = end
    if at != len(body):
        raise EntryFormatError("source msgs entry has trailing bytes")
    return SourceMsgs(now_ns, key, ident, tuple(msgs))


_DECODERS = {
    EntryOp.STREAM_MSG: _decode_msg,
    EntryOp.DELETE_MSG: _decode_delete,
    EntryOp.PURGE: _decode_purge,
    EntryOp.EXPIRE: _decode_expire,
    EntryOp.CONSUMER_DELIVERED: _decode_delivered,
    EntryOp.CONSUMER_ACK: _decode_ack,
    EntryOp.STREAM_BATCH: _decode_batch,
    EntryOp.UPDATE_CONFIG: _decode_update,
    EntryOp.CONSUMER_UPSERT: _decode_upsert,
    EntryOp.CONSUMER_DELETE: _decode_consumer_delete,
    EntryOp.RESTORE_MSGS: _decode_restore,
    EntryOp.CONSUMER_STATE: _decode_consumer_state,
    EntryOp.SOURCE_MSGS: _decode_sourced,
    EntryOp.CONSUMER_FORGET: _decode_consumer_forget,
    EntryOp.CONSUMER_GROUP_STATE: _decode_group_state,
    EntryOp.CONSUMER_DELIVERED_MANY: _decode_delivered_many,
    EntryOp.CONSUMER_ACKS: _decode_acks,
}

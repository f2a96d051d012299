"""raft.types.Message <-> protobuf (proto/cluster.proto). Pure conversions.

Plain HEARTBEAT / HEARTBEAT_RESP messages are coalesced into the compact
`Batch.heartbeats` / `heartbeat_resps` lists; anything else (or a heartbeat
with unusual fields set) travels as a full Message. Within a Batch the full
messages keep their order; decoded heartbeats come after them (Raft tolerates
reordering; heartbeats only carry term/commit, which are monotonic checks).
"""

from __future__ import annotations

from typing import Any

from proto import cluster_pb2 as pb
from raft.types import (
    LOCAL_MSG_TYPES,
    ConfState,
    Entry,
    EntryType,
    Message,
    MsgType,
    Snapshot,
    SnapshotMeta,
)


def entry_to_pb(e: Entry, out: pb.Entry) -> None:
    out.term, out.index, out.type, out.data = e.term, e.index, e.type, e.data


# EntryType by wire value without an Enum call per entry (decode_wire has checked it).
_ETYPE = {t.value: t for t in EntryType}


def entry_from_pb(p: pb.Entry) -> Entry:
    return Entry(p.term, p.index, _ETYPE[p.type], p.data)


def meta_to_pb(meta: SnapshotMeta, out: pb.SnapshotMeta) -> None:
    out.index, out.term = meta.index, meta.term
    out.conf_state.voters.extend(meta.conf_state.voters)
    out.conf_state.learners.extend(meta.conf_state.learners)


def meta_from_pb(p: pb.SnapshotMeta) -> SnapshotMeta:
    cs = ConfState(tuple(p.conf_state.voters), tuple(p.conf_state.learners))
    return SnapshotMeta(p.index, p.term, cs)


def message_to_pb(m: Message, out: pb.Message | None = None) -> pb.Message:
    """Snapshot data is not encoded: it streams on the Snapshot RPC. `out`: an
    empty message (proto3: a field left at its default is not encoded, so the
    ones most messages leave at zero are set only when they are not)."""
    p = pb.Message() if out is None else out
    p.type, p.group, p.frm, p.to, p.term = m.type, m.group, m.frm, m.to, m.term
    if m.log_term:
        p.log_term = m.log_term
    if m.index:
        p.index = m.index
    if m.commit:
        p.commit = m.commit
    if m.reject:
        p.reject = True
    if m.reject_hint:
        p.reject_hint = m.reject_hint
    if m.context:
        p.context = m.context
    add = p.entries.add  # fields as keywords: one call per entry, not four setattrs
    for e in m.entries:
        add(term=e.term, index=e.index, type=e.type, data=e.data)
    if m.snapshot is not None:
        meta_to_pb(m.snapshot.meta, p.snapshot)
    return p


# MsgType by wire value: a dict lookup, not an Enum call per message.
_MTYPE = {t.value: t for t in MsgType}


def message_from_pb(p: pb.Message, entries: Any = None) -> Message:
    """`entries`: `p.entries` when the caller has read it already (each read of a
    repeated field builds a wrapper)."""
    snap = Snapshot(meta=meta_from_pb(p.snapshot)) if p.HasField("snapshot") else None
    t = _MTYPE.get(p.type)
    if entries is None:
        entries = p.entries
    return Message(
        type=t if t is not None else MsgType(p.type),  # unknown: ValueError, as before
        group=p.group,
        frm=p.frm,
        to=p.to,
        term=p.term,
        log_term=p.log_term,
        index=p.index,
        # (no comprehension for the answers and commit-only appends that carry none)
        entries=[Entry(e.term, e.index, _ETYPE[e.type], e.data) for e in entries]
        if entries else [],
        commit=p.commit,
        reject=p.reject,
        reject_hint=p.reject_hint,
        snapshot=snap,
        context=p.context,
    )


def _plain_heartbeat(m: Message) -> bool:
    # Only the fields a Heartbeat record carries may be set.
    return (
        m.type in (MsgType.HEARTBEAT, MsgType.HEARTBEAT_RESP)
        and not m.entries
        and m.snapshot is None
        and not (m.log_term or m.index or m.reject or m.reject_hint)
    )


def message_size(m: Message) -> int:
    """Rough encoded size, used to split very large batches."""
    return 48 + len(m.group) + len(m.context) + sum(len(e.data) + 24 for e in m.entries)


def encode_batch(
    frm: int, to: int, msgs: list[Message], *, liveness: bool = False, coalesce: bool = True
) -> pb.Batch:
    b = pb.Batch(from_node=frm, to_node=to, liveness=liveness)
    for m in msgs:
        if coalesce and _plain_heartbeat(m):
            hb = b.heartbeats.add() if m.type == MsgType.HEARTBEAT else b.heartbeat_resps.add()
            hb.group, hb.term, hb.commit = m.group, m.term, m.commit
            hb.frm, hb.to, hb.context = m.frm, m.to, m.context
        else:
            message_to_pb(m, b.messages.add())
    return b


# Message types a peer may send us. Anything else in a Batch is dropped: local
# types (a forged STORAGE_APPEND_RESP would count unsynced entries toward
# commit) and types this version does not know (a newer peer during a rolling
# upgrade: dropping one message keeps the stream, Raft retries or ignores).
WIRE_TYPES = frozenset(t.value for t in MsgType if t not in LOCAL_MSG_TYPES)
_ENTRY_TYPES = frozenset(t.value for t in EntryType)


def _known_entry_types(entries: Any) -> bool:
    for e in entries:
        if e.type not in _ENTRY_TYPES:
            return False
    return True


def decode_wire(b: pb.Batch) -> tuple[list[Message], int]:
    """The acceptable messages of a Batch from the network, and how many were dropped."""
    msgs = b.messages  # each attribute read of a repeated field builds a wrapper: once
    out: list[Message] = []
    for p in msgs:
        if p.type in WIRE_TYPES:
            ents = p.entries
            if not ents or _known_entry_types(ents):
                out.append(message_from_pb(p, ents))
    dropped = len(msgs) - len(out)
    for kind, hbs in ((MsgType.HEARTBEAT, b.heartbeats),
                      (MsgType.HEARTBEAT_RESP, b.heartbeat_resps)):
        if hbs:
            for h in hbs:
                out.append(
                    Message(kind, h.group, h.frm, h.to, h.term, commit=h.commit, context=h.context)
                )
    return out, dropped


def decode_batch(b: pb.Batch) -> list[Message]:
    return decode_wire(b)[0]

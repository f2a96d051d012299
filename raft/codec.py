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
    """Snapshot data is not encoded: it streams on the Snapshot RPC."""
    p = pb.Message() if out is None else out
    p.type, p.group, p.frm, p.to = m.type, m.group, m.frm, m.to
    p.term, p.log_term, p.index, p.commit = m.term, m.log_term, m.index, m.commit
    p.reject, p.reject_hint, p.context = m.reject, m.reject_hint, m.context
    add = p.entries.add  # fields as keywords: one call per entry, not four setattrs
    for e in m.entries:
        add(term=e.term, index=e.index, type=e.type, data=e.data)
    if m.snapshot is not None:
        meta_to_pb(m.snapshot.meta, p.snapshot)
    return p


def message_from_pb(p: pb.Message) -> Message:
    snap = Snapshot(meta=meta_from_pb(p.snapshot)) if p.HasField("snapshot") else None
    return Message(
        type=MsgType(p.type),
        group=p.group,
        frm=p.frm,
        to=p.to,
        term=p.term,
        log_term=p.log_term,
        index=p.index,
        entries=[Entry(e.term, e.index, _ETYPE[e.type], e.data) for e in p.entries],
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
    out = []
    for p in b.messages:
        if p.type in WIRE_TYPES and _known_entry_types(p.entries):
            out.append(message_from_pb(p))
    dropped = len(b.messages) - len(out)
    coalesced = ((MsgType.HEARTBEAT, b.heartbeats), (MsgType.HEARTBEAT_RESP, b.heartbeat_resps))
    for kind, hbs in coalesced:
        for h in hbs:
            out.append(
                Message(kind, h.group, h.frm, h.to, h.term, commit=h.commit, context=h.context)
            )
    return out, dropped


def decode_batch(b: pb.Batch) -> list[Message]:
    return decode_wire(b)[0]

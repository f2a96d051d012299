"""Differential guards for the r3lead fast paths (review rev-r3lead, session 12).

Each fast path is run against the code it replaced (kept here verbatim) over many
random states: the leader's answer handling (`Raft._on_app_resp`, the follow-up
send loop's early exit) and the wire decode (`codec.decode_wire`)."""

from __future__ import annotations

import copy
import random
from typing import Any

from proto import cluster_pb2 as pb
from raft import codec
from raft.core import Raft
from raft.progress import Inflights, ProgressState
from raft.types import Entry, EntryType, Message, MsgType, Snapshot, SnapshotMeta
from tests.raft.network import Network


class _OldRaft(Raft):
    """`_on_app_resp` as int12 had it (the follow-up loop without the index test)."""

    def _on_app_resp(self, m: Message) -> None:
        pr = self.prs[m.frm]
        pr.recent_active = True
        if m.reject:
            hint = m.reject_hint
            if m.log_term > 0:
                hint, _ = self.log.find_conflict_by_term(m.reject_hint, m.log_term)
            if pr.maybe_decr_to(m.index, hint):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_append(m.frm)
            return
        was_paused = pr.is_paused()
        if not pr.maybe_update(m.index):
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
            pr.become_probe()
            pr.become_replicate()
        elif pr.state is ProgressState.REPLICATE:
            pr.inflights.free_le(m.index)
        if self._maybe_commit():
            self._bcast_append()
        elif was_paused:
            self._send_append(m.frm)
        while self._send_append(m.frm, send_empty=False):
            pass
        if m.frm == self.lead_transferee and pr.match == self.log.last_index():
            self.send(Message(MsgType.TIMEOUT_NOW, to=m.frm))


def _progress_view(r: Raft) -> list[tuple[Any, ...]]:
    return [(nid, p.match, p.next, p.state, p.probe_sent, p.pending_snapshot,
             p.app_sent, list(p.inflights._q)) for nid, p in sorted(r.prs.items())]


def _random_leader(rng: random.Random) -> Raft:
    """A leader of 3 or 5 with a random log (partly persisted, maybe compacted) and
    random follower progress: probing (sent or not), replicating (window empty,
    partial or full), in a snapshot, ahead or behind."""
    ids = [1, 2, 3] if rng.random() < 0.6 else [1, 2, 3, 4, 5]
    net = Network(ids, seed=rng.randrange(1 << 30))
    net.elect(1)
    net.stabilize()
    r = net.raft(1)
    for k in range(rng.randint(0, 12)):
        r.step(Message(MsgType.PROP, frm=1, entries=[Entry(0, 0, EntryType.NORMAL, b"p%d" % k)]))
    if rng.random() < 0.7:  # the leader's own fsync of part or all of it
        net.persist(1)
    for k in range(rng.randint(0, 4)):  # and maybe more, not yet persisted
        r.step(Message(MsgType.PROP, frm=1, entries=[Entry(0, 0, EntryType.NORMAL, b"q%d" % k)]))
    r.msgs = []
    if rng.random() < 0.3:
        net.compact(1, keep=rng.randint(0, 3))
    r.cfg.max_size_per_msg = rng.choice([1, 40, 1 << 20])
    last = r.log.last_index()
    first = r.log.first_index()
    for nid in ids[1:]:
        pr = r.prs[nid]
        pr.inflights = Inflights(rng.choice([1, 2, 4, 256]))
        pr.match = rng.randint(0, last)
        pr.recent_active = rng.random() < 0.8
        kind = rng.random()
        if kind < 0.35:
            pr.become_probe()
            pr.next = rng.randint(pr.match + 1, last + 1)
            pr.probe_sent = rng.random() < 0.5
        elif kind < 0.8:
            pr.become_replicate()
            pr.next = rng.randint(pr.match + 1, last + 1)
            for idx in range(pr.match + 1, pr.next):
                if pr.inflights.full() or rng.random() < 0.3:
                    break
                pr.inflights.add(idx)
        else:
            pr.become_snapshot(rng.randint(max(first - 1, 1), last))
    if rng.random() < 0.2:
        r.lead_transferee = rng.choice(ids[1:])
    return r


def _random_answer(rng: random.Random, r: Raft) -> Message:
    frm = rng.choice([n for n in r.prs if n != r.id])
    last = r.log.last_index()
    pr = r.prs[frm]
    if rng.random() < 0.3:
        idx = rng.randint(max(pr.match, 0), max(pr.next - 1, pr.match))
        hint = rng.randint(0, idx)
        return Message(MsgType.APP_RESP, frm=frm, to=r.id, term=r.term, index=idx,
                       reject=True, reject_hint=hint,
                       log_term=rng.choice([0, 0, r.term, max(r.term - 1, 0)]))
    idx = rng.choice([pr.match, pr.next - 1, last, rng.randint(0, last)])
    return Message(MsgType.APP_RESP, frm=frm, to=r.id, term=r.term, index=max(idx, 0))


def test_on_app_resp_sends_exactly_what_the_old_loop_sent() -> None:
    rng = random.Random(2026_11_28)
    sent_follow_ups = 0
    for _ in range(600):
        new = _random_leader(rng)
        old = copy.deepcopy(new)
        old.__class__ = _OldRaft
        for _ in range(rng.randint(1, 4)):  # a few answers in a row
            m = _random_answer(rng, new)
            new.step(copy.deepcopy(m))
            old.step(copy.deepcopy(m))
            assert new.msgs == old.msgs, m
            assert _progress_view(new) == _progress_view(old), m
            assert new.log.committed == old.log.committed
            sent_follow_ups += sum(1 for x in new.msgs if x.type in (MsgType.APP, MsgType.SNAP))
            new.msgs, old.msgs = [], []
    assert sent_follow_ups > 500  # the states do reach the send paths


# -- codec --------------------------------------------------------------------------------
def _old_message_from_pb(p: pb.Message) -> Message:
    snap = (Snapshot(meta=codec.meta_from_pb(p.snapshot)) if p.HasField("snapshot") else None)
    t = codec._MTYPE.get(p.type)
    return Message(
        type=t if t is not None else MsgType(p.type),
        group=p.group, frm=p.frm, to=p.to, term=p.term, log_term=p.log_term, index=p.index,
        entries=[Entry(e.term, e.index, codec._ETYPE[e.type], e.data) for e in p.entries],
        commit=p.commit, reject=p.reject, reject_hint=p.reject_hint, snapshot=snap,
        context=p.context)


def _old_decode_wire(b: pb.Batch) -> tuple[list[Message], int]:
    msgs = b.messages
    out = [_old_message_from_pb(p) for p in msgs
           if p.type in codec.WIRE_TYPES and codec._known_entry_types(p.entries)]
    dropped = len(msgs) - len(out)
    for kind, hbs in ((MsgType.HEARTBEAT, b.heartbeats),
                      (MsgType.HEARTBEAT_RESP, b.heartbeat_resps)):
        if hbs:
            for h in hbs:
                out.append(Message(kind, h.group, h.frm, h.to, h.term, commit=h.commit,
                                   context=h.context))
    return out, dropped


def _random_message(rng: random.Random) -> Message:
    t = rng.choice(list(MsgType))
    ents = [Entry(rng.randint(0, 9), rng.randint(0, 99), rng.choice(list(EntryType)),
                  rng.randbytes(rng.randint(0, 5))) for _ in range(rng.choice([0, 0, 1, 3]))]
    snap = (Snapshot(SnapshotMeta(index=rng.randint(1, 50), term=rng.randint(1, 5)),
                     data=b"s") if rng.random() < 0.1 else None)
    return Message(t, group=rng.choice(["", "g", "S-1"]), frm=rng.randint(0, 5),
                   to=rng.randint(0, 5), term=rng.randint(0, 9), log_term=rng.randint(0, 9),
                   index=rng.randint(0, 99), entries=ents, commit=rng.randint(0, 99),
                   reject=rng.random() < 0.2, reject_hint=rng.randint(0, 9), snapshot=snap,
                   context=rng.choice([b"", b"ctx"]))


def test_decode_wire_decodes_as_before_for_every_message_type() -> None:
    rng = random.Random(7)
    seen: set[MsgType] = set()
    for _ in range(400):
        b = pb.Batch()
        for _ in range(rng.randint(0, 6)):
            m = _random_message(rng)
            seen.add(m.type)
            p = codec.message_to_pb(m, b.messages.add())
            if rng.random() < 0.05:
                p.type = 250  # a type this version does not know
            if p.entries and rng.random() < 0.1:
                p.entries[rng.randrange(len(p.entries))].type = 77  # unknown entry type
        b = pb.Batch.FromString(b.SerializeToString())
        assert codec.decode_wire(b) == _old_decode_wire(b)
    assert seen == set(MsgType)

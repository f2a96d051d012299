"""The pure Raft state machine of one group (etcd-raft style).

No I/O, no clock, no threads: the driver feeds `tick()` and `step(msg)` and
drains `ready()`. The only randomness is the seeded `Config.rng` used for the
election timeout.

Driver contract, per group, strictly in this order:
  1. `rd = core.ready()` (only when `has_ready()`; at most one Ready out).
  2. Persist `rd.hard_state`, `rd.snapshot`, `rd.entries` and fsync (one
     fsync may cover many groups).
  3. Step `storage_append_resp(rd)` into the core if it is not None.
  4. Send `rd.messages`. They may depend on step 2 (a vote, a term, an
     APP_RESP acknowledging entries), so they must not leave earlier. One
     exception: a leader's APP, HEARTBEAT and SNAP depend only on its term,
     durable since its election, so they may leave before the fsync
     (thesis §10.2.1); the leader still counts itself only at step 3.
  Input may keep arriving (`step`, `tick`) while the fsync runs; it lands
  in the next Ready. Never call `ready()` again before `advance()`.
  5. Apply `rd.committed_entries`, hand out `rd.read_states`.
  6. `core.advance(rd)`.

Durability rule: an entry counts toward commit on a member only once fsynced
there. Followers acknowledge APP with an APP_RESP placed in `Ready.messages`
(sent after that Ready is persisted, step 4). The leader counts itself only
when the driver steps STORAGE_APPEND_RESP (step 3).

Membership changes are single-server, one in flight, and take effect when the
entry is *applied* (in `advance`), as in etcd. A new leader may propose a
change only after applying everything up to its election no-op, and a member
with committed-but-unapplied changes does not campaign.

Quiescence: `can_quiesce()`/`quiesce()` on an idle, fully replicated leader
send one last heartbeat flagged `context=QUIESCE`; quiesced members stop
counting ticks. Any other message, proposal or `wake()` wakes the group.
Safety never depends on it: a quiesced group still runs the same elections.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from enum import Enum

from raft.log import RaftLog, invariant
from raft.progress import Inflights, Progress, ProgressState
from raft.quorum import VoteResult, has_quorum, majority_match, vote_result
from raft.types import (
    LOCAL_MSG_TYPES,
    NONE,
    CompactedError,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MsgType,
    ReadState,
    Ready,
    Snapshot,
    Storage,
    UnavailableError,
)

QUIESCE = b"q"  # HEARTBEAT(_RESP) context marking the quiesce round
TRANSFER = b"transfer"  # VOTE context: a leader transfer, ignore the lease
MAX_PENDING_READS = 4096  # ReadIndex requests held by one leader
_CC = struct.Struct(">BQ")


class StateType(Enum):
    FOLLOWER = 0
    CANDIDATE = 1
    PRE_CANDIDATE = 2
    LEADER = 3


def encode_conf_change(cc: ConfChange) -> bytes:
    return _CC.pack(int(cc.type), cc.node_id)


def decode_conf_change(data: bytes) -> ConfChange:
    t, node = _CC.unpack(data)
    return ConfChange(ConfChangeType(t), node)


def bootstrap_log(cs: ConfState) -> tuple[list[Entry], HardState]:
    """The first log of a new group's founding members (etcd style).

    The initial membership is written as committed CONF_CHANGE entries at
    term 1, so a member that joins later with an empty log rebuilds every
    configuration by applying the log (or receives it in a snapshot). The
    driver stores these entries and the hard state before creating the core.
    """
    changes = [ConfChange(ConfChangeType.ADD_VOTER, v) for v in cs.voters]
    changes += [ConfChange(ConfChangeType.ADD_LEARNER, v) for v in cs.learners]
    ents = [Entry(1, i + 1, EntryType.CONF_CHANGE, encode_conf_change(cc))
            for i, cc in enumerate(changes)]
    return ents, HardState(term=1, vote=NONE, commit=len(ents))


def storage_append_resp(rd: Ready) -> Message | None:
    """The local message the driver steps in after persisting `rd`."""
    if rd.entries:
        last = rd.entries[-1]
        return Message(MsgType.STORAGE_APPEND_RESP, index=last.index, log_term=last.term)
    if rd.snapshot is not None:
        m = rd.snapshot.meta
        return Message(MsgType.STORAGE_APPEND_RESP, index=m.index, log_term=m.term)
    return None


@dataclass
class Config:
    id: int
    group: str = ""
    election_tick: int = 10
    heartbeat_tick: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    max_inflight_msgs: int = 256
    max_size_per_msg: int = 1 << 20
    max_committed_size_per_ready: int = 8 << 20
    max_uncommitted_entries: int = 8192  # proposals beyond this are dropped
    applied: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(0))


@dataclass(slots=True)
class _ReadRequest:
    index: int
    frm: int  # NONE for a local request
    acks: set[int]


class Raft:
    def __init__(self, cfg: Config, storage: Storage) -> None:
        invariant(cfg.id != NONE, "raft: id must be nonzero", id=cfg.id)
        invariant(0 < cfg.heartbeat_tick < cfg.election_tick, "raft: need 0 < heartbeat < election",
                  heartbeat=cfg.heartbeat_tick, election=cfg.election_tick)
        invariant(cfg.max_inflight_msgs > 0, "raft: max_inflight_msgs must be positive",
                  max_inflight_msgs=cfg.max_inflight_msgs)
        self.cfg = cfg
        self.id = cfg.id
        self.group = cfg.group
        self.log = RaftLog(storage)
        hs, cs = storage.initial_state()
        self.term = 0
        self.vote = NONE
        self.lead = NONE
        self.state = StateType.FOLLOWER
        self.prs: dict[int, Progress] = {}
        self._set_conf(cs)
        self.votes: dict[int, bool] = {}
        self.msgs: list[Message] = []
        self.read_states: list[ReadState] = []
        self.reads: dict[bytes, _ReadRequest] = {}  # insertion order = request order
        self.reads_waiting_commit: list[Message] = []
        self.lead_transferee = NONE
        self.pending_conf_index = 0
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = cfg.election_tick
        self.quiesced = False
        if hs != HardState():
            self._load_hard_state(hs)
        if cfg.applied:
            self.log.applied_to(cfg.applied)
        self.prev_hs = self.hard_state()
        self.become_follower(self.term, NONE)

    # -- properties ------------------------------------------------------------
    @property
    def commit(self) -> int:
        return self.log.committed

    @property
    def applied(self) -> int:
        return self.log.applied

    @property
    def conf_state(self) -> ConfState:
        voters = tuple(sorted(i for i, p in self.prs.items() if not p.is_learner))
        learners = tuple(sorted(i for i, p in self.prs.items() if p.is_learner))
        return ConfState(voters, learners)

    def voters(self) -> list[int]:
        return [i for i, p in self.prs.items() if not p.is_learner]

    def promotable(self) -> bool:
        pr = self.prs.get(self.id)
        return pr is not None and not pr.is_learner and not self.log.has_pending_snapshot()

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def _load_hard_state(self, hs: HardState) -> None:
        invariant(self.log.committed <= hs.commit <= self.log.last_index(),
                  "raft: hard state commit out of range", commit=hs.commit,
                  first=self.log.committed, last=self.log.last_index())
        self.log.committed = hs.commit
        self.term = hs.term
        self.vote = hs.vote

    def _set_conf(self, cs: ConfState) -> None:
        old = self.prs
        self.prs = {}
        last = self.log.last_index()
        for nid in cs.voters:
            self.prs[nid] = old.get(nid) or self._new_progress(last)
            self.prs[nid].is_learner = False
        for nid in cs.learners:
            self.prs[nid] = old.get(nid) or self._new_progress(last)
            self.prs[nid].is_learner = True

    def _new_progress(self, last: int) -> Progress:
        return Progress(match=0, next=last + 1,
                        inflights=Inflights(self.cfg.max_inflight_msgs))

    # -- outbound ------------------------------------------------------------------
    def send(self, m: Message) -> None:
        m.frm = self.id
        m.group = self.group
        if m.type in (MsgType.VOTE, MsgType.VOTE_RESP, MsgType.PRE_VOTE, MsgType.PRE_VOTE_RESP):
            invariant(m.term != 0, "raft: vote message without term", type=int(m.type))
        elif m.type not in (MsgType.PROP, MsgType.READ_INDEX):
            m.term = self.term
        elif m.type is MsgType.READ_INDEX:
            m.term = 0  # forwarded local request: no term, accepted by any term
        self.msgs.append(m)

    # -- state transitions ---------------------------------------------------------
    def _reset(self, term: int) -> None:
        if self.term != term:
            self.term = term
            self.vote = NONE
        self.lead = NONE
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = (
            self.cfg.election_tick + self.cfg.rng.randrange(self.cfg.election_tick))
        self.votes = {}
        self.lead_transferee = NONE
        self.quiesced = False
        self._drop_reads()
        last = self.log.last_index()
        for nid, pr in self.prs.items():
            learner = pr.is_learner
            self.prs[nid] = self._new_progress(last)
            self.prs[nid].is_learner = learner
            if nid == self.id:
                self.prs[nid].match = self.log.stable_last_index()

    def _drop_reads(self) -> None:
        self.reads = {}
        self.reads_waiting_commit = []

    def become_follower(self, term: int, lead: int) -> None:
        self._reset(term)
        self.lead = lead
        self.state = StateType.FOLLOWER

    def become_pre_candidate(self) -> None:
        invariant(self.state is not StateType.LEADER, "raft: leader -> pre-candidate",
                  term=self.term)
        # Pre-vote changes neither term nor vote: a partitioned node that keeps
        # failing pre-votes never inflates its term.
        self.votes = {}
        self.lead = NONE
        self.state = StateType.PRE_CANDIDATE

    def become_candidate(self) -> None:
        invariant(self.state is not StateType.LEADER, "raft: leader -> candidate",
                  term=self.term)
        self._reset(self.term + 1)
        self.vote = self.id
        self.state = StateType.CANDIDATE

    def become_leader(self) -> None:
        invariant(self.state is not StateType.FOLLOWER, "raft: follower -> leader",
                  term=self.term)
        self._reset(self.term)
        self.lead = self.id
        self.state = StateType.LEADER
        self.prs[self.id].become_replicate()
        self.prs[self.id].match = self.log.stable_last_index()
        # No conf change until everything in the log at election time is
        # applied: a change proposed by an earlier leader may still be in
        # flight (etcd's pendingConfIndex; with changes taking effect on
        # apply this is the single-server-change safety condition).
        self.pending_conf_index = self.log.last_index()
        self._append_entries([Entry(term=0, index=0)], force=True)

    # -- ticks -----------------------------------------------------------------------
    def tick(self) -> None:
        if self.quiesced:
            return
        if self.state is StateType.LEADER:
            self._tick_heartbeat()
        else:
            self._tick_election()

    def _tick_election(self) -> None:
        self.election_elapsed += 1
        if self.promotable() and self.election_elapsed >= self.randomized_election_timeout:
            self.election_elapsed = 0
            self.step(Message(MsgType.HUP, frm=self.id))

    def _tick_heartbeat(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.cfg.election_tick:
            self.election_elapsed = 0
            if self.cfg.check_quorum and not self._quorum_active():
                self.become_follower(self.term, NONE)
                return
            self.lead_transferee = NONE  # a transfer gets one election timeout
        if self.heartbeat_elapsed >= self.cfg.heartbeat_tick:
            self.heartbeat_elapsed = 0
            self.step(Message(MsgType.BEAT, frm=self.id))

    def _quorum_active(self) -> bool:
        active = [i for i, p in self.prs.items() if i == self.id or p.recent_active]
        for nid, pr in self.prs.items():
            if nid != self.id:
                pr.recent_active = False
        return has_quorum(self.voters(), active)

    def past_lease(self) -> bool:
        return self.election_elapsed >= self.cfg.election_tick

    # -- step ------------------------------------------------------------------------
    def step(self, m: Message) -> None:
        """Feed one message (wire or local) into the state machine."""
        self._maybe_wake_for(m)
        if m.term == 0 or m.type in _LOCAL:
            pass
        elif m.term > self.term:
            if not self._accept_higher_term(m):
                return
        elif m.term < self.term:
            self._on_lower_term(m)
            return
        handler = _HANDLERS.get(m.type)
        if handler is not None:
            handler(self, m)
            return
        if self.state is StateType.LEADER:
            self._step_leader(m)
        elif self.state is StateType.FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    def _in_lease(self, m: Message) -> bool:
        """Raft §6 / thesis §4.2.3: ignore (pre)votes while a leader is alive."""
        if m.type not in (MsgType.VOTE, MsgType.PRE_VOTE) or m.context == TRANSFER:
            return False
        return self.cfg.check_quorum and self.lead != NONE and not self.past_lease()

    def _accept_higher_term(self, m: Message) -> bool:
        if self._in_lease(m):
            return False
        if m.type is MsgType.PRE_VOTE:
            return True  # a pre-vote never changes our term
        if m.type is MsgType.PRE_VOTE_RESP and not m.reject:
            return True  # granted: our term rises only if we win the pre-vote
        if m.type in (MsgType.APP, MsgType.HEARTBEAT, MsgType.SNAP):
            self.become_follower(m.term, m.frm)
        else:
            self.become_follower(m.term, NONE)
        return True

    def _on_lower_term(self, m: Message) -> None:
        if (self.cfg.check_quorum or self.cfg.pre_vote) and m.type in (
            MsgType.HEARTBEAT, MsgType.APP):
            # A stale leader: tell it our term so it steps down (a node that
            # lease-ignores votes would otherwise never reach it).
            self.send(Message(MsgType.APP_RESP, to=m.frm))
        elif m.type is MsgType.PRE_VOTE:
            self.send(Message(MsgType.PRE_VOTE_RESP, to=m.frm, term=self.term, reject=True))

    # -- elections ---------------------------------------------------------------------
    def _has_unapplied_conf_changes(self) -> bool:
        lo, hi = self.log.applied + 1, self.log.committed + 1
        if lo >= hi:
            return False
        try:
            ents = self.log.slice(lo, hi)
        except CompactedError:
            return True  # a snapshot is pending: it must be applied first
        return any(e.type is EntryType.CONF_CHANGE for e in ents)

    def _on_hup(self, m: Message) -> None:
        if self.state is StateType.LEADER or not self.promotable():
            return
        if self._has_unapplied_conf_changes():
            return  # our configuration may be stale
        transfer = m.context == TRANSFER
        if self.cfg.pre_vote and not transfer:
            self._campaign(pre=True, transfer=False)
        else:
            self._campaign(pre=False, transfer=transfer)

    def _campaign(self, pre: bool, transfer: bool) -> None:
        if pre:
            self.become_pre_candidate()
            term, mtype = self.term + 1, MsgType.PRE_VOTE
        else:
            self.become_candidate()
            term, mtype = self.term, MsgType.VOTE
        if self._poll(self.id, True) is VoteResult.WON:
            self._won(pre)
            return
        ctx = TRANSFER if transfer else b""
        for nid in sorted(self.voters()):
            if nid != self.id:
                self.send(Message(mtype, to=nid, term=term, index=self.log.last_index(),
                                  log_term=self.log.last_term(), context=ctx))

    def _poll(self, nid: int, granted: bool) -> VoteResult:
        self.votes.setdefault(nid, granted)
        return vote_result(self.voters(), self.votes)

    def _won(self, pre: bool) -> None:
        if pre:
            self._campaign(pre=False, transfer=False)
        else:
            self.become_leader()
            self._bcast_append()

    def _on_vote(self, m: Message) -> None:
        pre = m.type is MsgType.PRE_VOTE
        can_vote = (
            self.vote == m.frm
            or (self.vote == NONE and self.lead == NONE)
            or (pre and m.term > self.term)
        )
        resp = MsgType.PRE_VOTE_RESP if pre else MsgType.VOTE_RESP
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            # Answer with the request's term: for a pre-vote ours is lower
            # and would be ignored by the pre-candidate.
            self.send(Message(resp, to=m.frm, term=m.term))
            if not pre:
                self.election_elapsed = 0
                self.vote = m.frm
        else:
            self.send(Message(resp, to=m.frm, term=self.term, reject=True))

    def _step_candidate(self, m: Message) -> None:
        my_resp = (MsgType.PRE_VOTE_RESP if self.state is StateType.PRE_CANDIDATE
                   else MsgType.VOTE_RESP)
        if m.type in (MsgType.APP, MsgType.HEARTBEAT, MsgType.SNAP):
            self.become_follower(m.term, m.frm)  # a leader of our term exists
            self._step_follower(m)
        elif m.type is my_resp:
            res = self._poll(m.frm, not m.reject)
            if res is VoteResult.WON:
                self._won(self.state is StateType.PRE_CANDIDATE)
            elif res is VoteResult.LOST:
                self.become_follower(self.term, NONE)
        elif m.type is MsgType.TIMEOUT_NOW:
            pass  # already campaigning

    # -- leader --------------------------------------------------------------------------
    def _step_leader(self, m: Message) -> None:
        t = m.type
        if t is MsgType.BEAT:
            self._heartbeat_round()
        elif t is MsgType.READ_INDEX:
            self._leader_read_index(m)
        elif t is MsgType.TRANSFER_LEADER:
            self._leader_transfer(m.index)
        elif m.frm not in self.prs:
            return
        elif t is MsgType.APP_RESP:
            self._on_app_resp(m)
        elif t is MsgType.HEARTBEAT_RESP:
            self._on_heartbeat_resp(m)
        elif t is MsgType.SNAP_STATUS:
            pr = self.prs[m.frm]
            if pr.state is ProgressState.SNAPSHOT:
                if m.reject:
                    pr.pending_snapshot = 0
                pr.become_probe()
                # Done: wait for the follower's APP_RESP. Failed: wait for its next
                # heartbeat response, not for the next append broadcast (a transfer
                # that keeps failing would be retried on every proposal).
                pr.probe_sent = True
        elif t is MsgType.UNREACHABLE:
            if self.prs[m.frm].state is ProgressState.REPLICATE:
                self.prs[m.frm].become_probe()

    def _on_persisted(self, m: Message) -> None:
        if m.frm not in (NONE, self.id):
            return  # only this node's driver reports this node's fsyncs
        self.log.unstable.stable_to(m.index, m.log_term)
        if self.state is not StateType.LEADER:
            return
        if self.log.match_term(m.index, m.log_term) and self.prs[self.id].maybe_update(m.index):
            if self._maybe_commit():
                self._bcast_append()

    def _maybe_commit(self) -> bool:
        # committed_index(voters, match) without the dict and the voter list (a
        # leader runs this on every APP_RESP and fsync of its own).
        acked = [p.match for p in self.prs.values() if not p.is_learner]
        if not self._maybe_commit_to(majority_match(acked)):
            return False
        self._release_reads_waiting_commit()
        return True

    def _maybe_commit_to(self, idx: int) -> bool:
        return self.log.maybe_commit(idx, self.term)

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
        # (The index test first: after the commit's broadcast, or at window 1,
        # nothing is left to send and `_send_append` would say so the long way.)
        while pr.next <= self.log.last_index() and self._send_append(m.frm, send_empty=False):
            pass
        if m.frm == self.lead_transferee and pr.match == self.log.last_index():
            self.send(Message(MsgType.TIMEOUT_NOW, to=m.frm))

    def _on_heartbeat_resp(self, m: Message) -> None:
        pr = self.prs[m.frm]
        pr.recent_active = True
        pr.probe_sent = False
        if pr.state is ProgressState.REPLICATE and pr.inflights.full():
            # The window may be full of appends that were lost: let one more
            # through so a rejection can move this peer back to probing.
            pr.inflights.free_first_one()
        if pr.match < self.log.last_index():
            self._send_append(m.frm)
        if m.context and m.context != QUIESCE:
            self._ack_read(m.frm, m.context)

    def _send_append(self, to: int, send_empty: bool = True) -> bool:
        """Send entries from pr.next; a snapshot if they are compacted."""
        pr = self.prs[to]
        if pr.is_paused():
            return False
        last = self.log.last_index()
        if not send_empty and pr.next > last:
            return False
        try:
            prev_term = self.log.term(pr.next - 1)
            ents = self.log.slice(pr.next, last + 1, self.cfg.max_size_per_msg)
        except CompactedError:
            return self._send_snapshot(to)
        if not ents and not send_empty:
            return False
        self.send(Message(MsgType.APP, to=to, index=pr.next - 1, log_term=prev_term,
                          entries=ents, commit=self.log.committed))
        pr.app_sent = True
        if ents:
            pr.sent_entries(ents[-1].index)
        elif pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        return True

    def _send_snapshot(self, to: int) -> bool:
        pr = self.prs[to]
        if not pr.recent_active:
            return False  # don't ship a snapshot to a peer we can't hear from
        try:
            snap = self.log.storage.snapshot()
        except UnavailableError:
            return False  # the application is still producing one
        invariant(snap.meta.index > 0, "raft: need snapshot but it is empty", to=to)
        pr.become_snapshot(snap.meta.index)
        self.send(Message(MsgType.SNAP, to=to, snapshot=snap))
        return True

    def _bcast_append(self) -> None:
        for nid in self.prs:
            if nid != self.id:
                self._send_append(nid)

    def _heartbeat_round(self) -> None:
        """The periodic heartbeat, only to followers that got no append for
        `_quiet_rounds_per_beat()` rounds: an append resets a follower's
        election timer and carries the commit index just as well, so a busy
        group costs no heartbeats, not even while a slow commit (longer than a
        tick) keeps it from appending (its node's liveness beat and its
        appends keep it alive); a follower whose appends stopped (paused,
        probing, idle) still gets one several times per election timeout."""
        every = self._quiet_rounds_per_beat()
        for nid, pr in self.prs.items():
            if nid == self.id:
                continue
            if pr.app_sent:
                pr.app_sent = False
                pr.quiet_rounds = 0
                continue
            pr.quiet_rounds += 1
            if pr.quiet_rounds >= every:
                pr.quiet_rounds = 0
                commit = min(pr.match, self.log.committed)
                self.send(Message(MsgType.HEARTBEAT, to=nid, commit=commit))

    def _quiet_rounds_per_beat(self) -> int:
        """Rounds without an append before a heartbeat: three beats per election
        timeout (the shortest a follower waits) leave room for two lost ones."""
        return max(1, self.cfg.election_tick // (3 * self.cfg.heartbeat_tick))

    def _bcast_heartbeat(self, ctx: bytes) -> None:
        for nid, pr in self.prs.items():
            if nid == self.id:
                continue
            # Never tell a follower to commit past what it is known to hold.
            commit = min(pr.match, self.log.committed)
            self.send(Message(MsgType.HEARTBEAT, to=nid, commit=commit, context=ctx))

    def _append_entries(self, ents: list[Entry], force: bool = False) -> bool:
        last = self.log.last_index()
        if not force and last - self.log.committed + len(ents) > self.cfg.max_uncommitted_entries:
            return False  # bounded uncommitted tail; the election no-op is forced
        for i, e in enumerate(ents):
            e.term = self.term
            e.index = last + 1 + i
        self.log.append(ents)
        return True

    def _step_prop(self, m: Message) -> None:
        self._on_prop(m)

    def _on_prop(self, m: Message) -> int | None:
        if self.state is not StateType.LEADER or self.id not in self.prs:
            return None  # ProposalDropped: the driver forwards or retries
        if self.lead_transferee != NONE:
            return None
        ents = m.entries
        for e in ents:
            if e.type is EntryType.CONF_CHANGE:
                if self.pending_conf_index > self.log.applied:
                    return None  # one membership change at a time
        if not self._append_entries(ents):
            return None
        for e in ents:
            if e.type is EntryType.CONF_CHANGE:
                self.pending_conf_index = e.index
        self._bcast_append()
        return ents[-1].index

    # -- follower ------------------------------------------------------------------------
    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t is MsgType.APP:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_append(m)
        elif t is MsgType.HEARTBEAT:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_heartbeat(m)
        elif t is MsgType.SNAP:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_snapshot(m)
        elif t is MsgType.TRANSFER_LEADER:
            if self.lead != NONE:
                self.send(Message(MsgType.TRANSFER_LEADER, to=self.lead, index=m.index))
        elif t is MsgType.TIMEOUT_NOW:
            # Leader transfer: campaign now, skipping pre-vote and the lease.
            self._on_hup(Message(MsgType.HUP, context=TRANSFER))
        elif t is MsgType.READ_INDEX:
            if self.lead != NONE:
                self.send(Message(MsgType.READ_INDEX, to=self.lead, context=m.context))
        elif t is MsgType.READ_INDEX_RESP:
            self._push_read_state(ReadState(m.index, m.context))

    def _handle_append(self, m: Message) -> None:
        if m.index < self.log.committed:
            self.send(Message(MsgType.APP_RESP, to=m.frm, index=self.log.committed))
            return
        last_new = self.log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            self.send(Message(MsgType.APP_RESP, to=m.frm, index=last_new))
            return
        # Reject with a hint: the last index whose term is <= the leader's
        # prev term, so the leader skips a whole divergent term per round trip.
        hint_i, hint_t = self.log.find_conflict_by_term(
            min(m.index, self.log.last_index()), m.log_term)
        self.send(Message(MsgType.APP_RESP, to=m.frm, index=m.index, reject=True,
                          reject_hint=hint_i, log_term=hint_t))

    def _handle_heartbeat(self, m: Message) -> None:
        self.log.commit_to(min(m.commit, self.log.last_index()))
        self.send(Message(MsgType.HEARTBEAT_RESP, to=m.frm, context=m.context))
        if m.context == QUIESCE:
            self.quiesced = True

    def _handle_snapshot(self, m: Message) -> None:
        snap = m.snapshot
        invariant(snap is not None, "raft: SNAP without snapshot", frm=m.frm)
        assert snap is not None
        if self._restore(snap):
            self.send(Message(MsgType.APP_RESP, to=m.frm, index=self.log.last_index()))
        else:
            self.send(Message(MsgType.APP_RESP, to=m.frm, index=self.log.committed))

    def _restore(self, snap: Snapshot) -> bool:
        meta = snap.meta
        if meta.index <= self.log.committed:
            return False
        if self.log.match_term(meta.index, meta.term):
            # We already hold the snapshot's last entry: just fast-forward.
            self.log.commit_to(meta.index)
            return False
        self.log.restore(snap)
        self._set_conf(meta.conf_state)
        last = self.log.last_index()
        for pr in self.prs.values():
            pr.match, pr.next = 0, last + 1
        return True

    # -- read index ------------------------------------------------------------------------
    def _push_read_state(self, rs: ReadState) -> None:
        if len(self.read_states) < MAX_PENDING_READS:
            self.read_states.append(rs)

    def _committed_in_term(self) -> bool:
        return self.log.term_or_zero(self.log.committed) == self.term

    def _leader_read_index(self, m: Message) -> None:
        invariant(m.context != QUIESCE, "raft: read context collides with QUIESCE")
        if not self._committed_in_term():
            # Raft §6.4: the commit index is only known once an entry of our
            # term commits; hold the request until then (bounded).
            if len(self.reads_waiting_commit) < MAX_PENDING_READS:
                self.reads_waiting_commit.append(m)
            return
        frm = NONE if m.frm in (NONE, self.id) else m.frm
        if len(self.voters()) == 1:
            self._answer_read(_ReadRequest(self.log.committed, frm, set()), m.context)
            return
        if m.context in self.reads or len(self.reads) >= MAX_PENDING_READS:
            return
        self.reads[m.context] = _ReadRequest(self.log.committed, frm, {self.id})
        self._bcast_heartbeat(m.context)

    def _release_reads_waiting_commit(self) -> None:
        if self.reads_waiting_commit and self._committed_in_term():
            waiting, self.reads_waiting_commit = self.reads_waiting_commit, []
            for m in waiting:
                self._leader_read_index(m)

    def _ack_read(self, frm: int, ctx: bytes) -> None:
        req = self.reads.get(ctx)
        if req is None:
            return
        req.acks.add(frm)
        if not has_quorum(self.voters(), req.acks):
            return
        # A heartbeat round confirms every request queued before this one.
        done = []
        for c in self.reads:
            done.append(c)
            if c == ctx:
                break
        for c in done:
            self._answer_read(self.reads.pop(c), c)

    def _answer_read(self, req: _ReadRequest, ctx: bytes) -> None:
        if req.frm == NONE:
            self._push_read_state(ReadState(req.index, ctx))
        else:
            self.send(Message(MsgType.READ_INDEX_RESP, to=req.frm, index=req.index, context=ctx))

    # -- leader transfer -------------------------------------------------------------------
    def _leader_transfer(self, target: int) -> None:
        pr = self.prs.get(target)
        if pr is None or pr.is_learner or target == self.id:
            return
        if self.lead_transferee == target:
            return
        self.lead_transferee = target
        self.election_elapsed = 0  # the transfer must finish within one election timeout
        if pr.match == self.log.last_index():
            self.send(Message(MsgType.TIMEOUT_NOW, to=target))
        else:
            self._send_append(target)

    # -- membership ----------------------------------------------------------------------
    def apply_conf_change(self, cc: ConfChange) -> ConfState:
        """Apply a committed change (called from `advance`, in log order)."""
        voters = set(self.voters())
        learners = {i for i, p in self.prs.items() if p.is_learner}
        if cc.type is ConfChangeType.ADD_VOTER:
            learners.discard(cc.node_id)
            voters.add(cc.node_id)
        elif cc.type is ConfChangeType.ADD_LEARNER:
            if cc.node_id not in voters:  # demotion is not supported
                learners.add(cc.node_id)
        else:
            voters.discard(cc.node_id)
            learners.discard(cc.node_id)
        self._set_conf(ConfState(tuple(sorted(voters)), tuple(sorted(learners))))
        if self.state is StateType.LEADER:
            self._after_leader_conf_change()
        return self.conf_state

    def _after_leader_conf_change(self) -> None:
        if self.id not in self.prs or self.prs[self.id].is_learner:
            # We removed ourselves: step down; the rest elect a new leader.
            self.become_follower(self.term, NONE)
            return
        if self.lead_transferee not in self.prs:
            self.lead_transferee = NONE
        # The quorum may have shrunk (commit now) or grown (new peer to feed).
        self._maybe_commit()
        self._bcast_append()

    # -- quiescence ----------------------------------------------------------------------
    def can_quiesce(self) -> bool:
        """An idle leader whose log is fully replicated, committed and applied."""
        if self.state is not StateType.LEADER or self.quiesced:
            return False
        last = self.log.last_index()
        return (
            self.log.committed == last
            and self.log.applied == last
            and all(p.match == last for p in self.prs.values())
            and not self.reads and not self.reads_waiting_commit
            and self.lead_transferee == NONE
            and not self.log.unstable.entries
        )

    def quiesce(self) -> bool:
        if not self.can_quiesce():
            return False
        self._bcast_heartbeat(QUIESCE)
        self.quiesced = True
        return True

    def wake(self) -> None:
        """Leave quiescence because the leader may be gone (the driver's
        node-level liveness lost its node): a follower treats its lease as
        expired, so it grants votes and campaigns after a randomized timeout."""
        self._wake(expire_lease=True)

    def _wake(self, expire_lease: bool) -> None:
        if not self.quiesced:
            return
        self.quiesced = False
        if self.state is StateType.LEADER:
            self.election_elapsed = 0
            self.heartbeat_elapsed = 0
            for pr in self.prs.values():
                pr.recent_active = True
            self._bcast_heartbeat(b"")
        else:
            self.election_elapsed = self.cfg.election_tick if expire_lease else 0

    def _maybe_wake_for(self, m: Message) -> None:
        if not self.quiesced or m.type is MsgType.STORAGE_APPEND_RESP:
            return
        if m.context == QUIESCE and m.type in (MsgType.HEARTBEAT, MsgType.HEARTBEAT_RESP):
            return
        if self.state is not StateType.LEADER and m.frm == self.lead and m.term == self.term:
            self.quiesced = False  # the leader speaks: its message resets the timer
            return
        if self._is_late_heartbeat_resp(m):
            return
        # A (pre)vote means a peer believes the leader is gone: let it be
        # judged on its log, not on a lease that stopped being renewed. Any
        # other input (a local read, a stray message) just restarts the timer.
        self._wake(expire_lease=m.type in (MsgType.VOTE, MsgType.PRE_VOTE, MsgType.HUP))

    def _is_late_heartbeat_resp(self, m: Message) -> bool:
        """An answer to a heartbeat sent before quiescing, from a caught-up follower:
        handling it sends nothing, so it must not wake the leader."""
        if self.state is not StateType.LEADER or m.type is not MsgType.HEARTBEAT_RESP:
            return False
        pr = self.prs.get(m.frm)
        return (m.term == self.term and not m.context and pr is not None
                and pr.match == self.log.last_index())

    # -- public API ------------------------------------------------------------------------
    def propose(self, data: bytes) -> int | None:
        """Index the entry will commit at, or None if dropped (not leader, busy)."""
        self._maybe_wake_for(Message(MsgType.PROP))
        return self._on_prop(Message(MsgType.PROP, entries=[Entry(0, 0, EntryType.NORMAL, data)]))

    def propose_conf_change(self, cc: ConfChange) -> int | None:
        self._maybe_wake_for(Message(MsgType.PROP))
        e = Entry(0, 0, EntryType.CONF_CHANGE, encode_conf_change(cc))
        return self._on_prop(Message(MsgType.PROP, entries=[e]))

    def campaign(self) -> None:
        self.step(Message(MsgType.HUP, frm=self.id))

    def transfer_leader(self, to: int) -> None:
        self.step(Message(MsgType.TRANSFER_LEADER, frm=self.id, index=to))

    def read_index(self, context: bytes) -> None:
        self.step(Message(MsgType.READ_INDEX, frm=self.id, context=context))

    def has_ready(self) -> bool:
        return bool(
            self.msgs or self.read_states or self.log.unstable.entries
            or self.log.has_pending_snapshot() or self.log.has_next_committed_ents()
            or self._hs_changed())

    def _hs_changed(self) -> bool:
        """hard_state() != prev_hs without building a HardState (several times a pass)."""
        hs = self.prev_hs
        return (self.term != hs.term or self.vote != hs.vote
                or self.log.committed != hs.commit)

    def ready(self) -> Ready:
        hs = self.hard_state()
        rd = Ready(
            entries=list(self.log.unstable.entries),
            snapshot=self.log.unstable.snapshot,
            committed_entries=self.log.next_committed_ents(self.cfg.max_committed_size_per_ready),
            messages=self.msgs,
            read_states=self.read_states,
        )
        if hs != self.prev_hs:
            rd.hard_state = hs
        rd.must_sync = bool(rd.entries) or (
            hs.term != self.prev_hs.term or hs.vote != self.prev_hs.vote)
        self.prev_hs = hs
        self.msgs = []
        self.read_states = []
        return rd

    def advance(self, rd: Ready) -> None:
        if rd.snapshot is not None:
            self.log.unstable.stable_snap_to(rd.snapshot.meta.index)
            self.log.applied = max(self.log.applied, rd.snapshot.meta.index)
        if rd.entries:
            last = rd.entries[-1]
            self.log.unstable.stable_to(last.index, last.term)
        if rd.committed_entries:
            if rd.committed_entries[0].index != self.log.applied + 1:
                invariant(False, "raft: committed entries not contiguous with applied",
                          first=rd.committed_entries[0].index, applied=self.log.applied)
            # A snapshot restored since this Ready was taken covers entries at
            # or below its index: its configuration is newer than any change
            # among them, so such a change must not be applied on top of it.
            floor = self.log.first_index() - 1
            # Only a membership change needs `applied` at its own index when it takes
            # effect; a run of plain entries moves it once (the checks hold for the run:
            # contiguous from applied + 1, and applied_to bounds the last by the commit).
            for e in rd.committed_entries:
                if e.type is EntryType.CONF_CHANGE:
                    self.log.applied_to(e.index)
                    if e.index > floor:
                        self.apply_conf_change(decode_conf_change(e.data))
            self.log.applied_to(rd.committed_entries[-1].index)
        self.check_invariants()

    def check_invariants(self) -> None:
        """Cheap always-on checks, run at every advance: the conditions first (one
        `last_index` and plain comparisons, the hot path of every Ready), the reports
        with their numbers only when one fails."""
        log = self.log
        last = log.last_index()
        if (log.applied <= log.committed <= last and (self.vote == NONE or self.term > 0)
                and (self.state is not StateType.LEADER
                     or (self.lead == self.id and self.prs[self.id].match <= last))):
            return
        self._report_invariants()

    def _report_invariants(self) -> None:
        """Raises InvariantError naming the first failed check and its numbers."""
        log = self.log
        invariant(log.applied <= log.committed <= log.last_index(),
                  "raft: applied <= commit <= last violated", applied=log.applied,
                  commit=log.committed, last=log.last_index())
        invariant(self.vote == NONE or self.term > 0, "raft: vote without term",
                  vote=self.vote, term=self.term)
        if self.state is StateType.LEADER:
            invariant(self.lead == self.id, "raft: leader does not lead itself",
                      lead=self.lead, id=self.id)
            invariant(self.prs[self.id].match <= log.last_index(),
                      "raft: leader self match past its log", match=self.prs[self.id].match,
                      last=log.last_index())


_LOCAL = LOCAL_MSG_TYPES
_HANDLERS = {
    MsgType.HUP: Raft._on_hup,
    MsgType.VOTE: Raft._on_vote,
    MsgType.PRE_VOTE: Raft._on_vote,
    MsgType.PROP: Raft._step_prop,
    MsgType.STORAGE_APPEND_RESP: Raft._on_persisted,
}

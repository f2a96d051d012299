"""An in-memory cluster of Raft cores with a faulty network and fake disks.

Each member has a `MemoryStorage` that plays the disk: a Ready's hard state,
snapshot and entries reach it only in `persist()` (the simulated fsync). A
Ready can be taken (`take_ready`) and left pending; `crash()` then loses it
unless asked to keep the fsynced tail. Messages of a Ready enter the network
only after that Ready is persisted, which is how the driver contract enforces
the durability rule. The network can cut links, drop, duplicate and reorder.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from raft.core import Config, Raft, StateType, storage_append_resp
from raft.memstorage import MemoryStorage
from raft.types import ConfState, Entry, Message, MsgType, ReadState, Ready

# Leader messages that do not depend on the leader's own pending fsync.
_EARLY = frozenset({MsgType.APP, MsgType.HEARTBEAT, MsgType.SNAP})

EntryKey = tuple[int, int, bytes]  # (term, type, data): identity of an entry


def key(e: Entry) -> EntryKey:
    return (e.term, int(e.type), e.data)


def encode_sm(sm: dict[int, EntryKey]) -> bytes:
    return json.dumps({str(i): [t, ty, d.hex()] for i, (t, ty, d) in sm.items()}).encode()


def decode_sm(data: bytes) -> dict[int, EntryKey]:
    if not data:
        return {}
    raw = json.loads(data)
    return {int(i): (t, ty, bytes.fromhex(d)) for i, (t, ty, d) in raw.items()}


@dataclass
class SimNode:
    id: int
    storage: MemoryStorage
    raft: Raft | None = None
    pending: Ready | None = None
    sm: dict[int, EntryKey] = field(default_factory=dict)  # the applied state machine
    read_states: list[ReadState] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.raft is not None


class Violation(AssertionError):
    pass


class Checker:
    """Raft's safety properties, checked against the whole cluster."""

    def __init__(self) -> None:
        self.leaders: dict[int, int] = {}  # term -> leader id
        self.applied: dict[int, EntryKey] = {}  # index -> entry, across all members
        self.acked: dict[int, tuple[EntryKey, int]] = {}  # index -> (entry, leader term at ack)

    def on_apply(self, node: SimNode, index: int, k: EntryKey) -> None:
        prev = self.applied.setdefault(index, k)
        if prev != k:
            raise Violation(f"state machine safety: node {node.id} applied {k} at {index}, "
                            f"another member applied {prev}")
        r = node.raft
        if r is not None and r.state is StateType.LEADER and index not in self.acked:
            self.acked[index] = (k, r.term)

    def check(self, net: Network) -> None:
        live = [n for n in net.nodes.values() if n.raft is not None]
        for n in live:
            r = n.raft
            assert r is not None
            if r.state is StateType.LEADER:
                owner = self.leaders.setdefault(r.term, n.id)
                if owner != n.id:
                    raise Violation(f"election safety: {owner} and {n.id} lead term {r.term}")
                self._check_completeness(n, r)
        self._check_log_matching(net)

    def _check_completeness(self, n: SimNode, r: Raft) -> None:
        first = r.log.first_index()
        for index, (k, ack_term) in self.acked.items():
            if r.term < ack_term:
                continue
            if index < first:
                if n.sm.get(index, k) != k:
                    raise Violation(f"leader {n.id} compacted {index} but applied otherwise")
                continue
            if index > r.log.last_index() or r.log.slice(index, index + 1)[0].term != k[0]:
                raise Violation(f"leader completeness: leader {n.id} term {r.term} lacks "
                                f"acked entry {index} {k}")

    def _check_log_matching(self, net: Network) -> None:
        logs = [net.log_view(n) for n in net.nodes.values()]
        for i, a in enumerate(logs):
            for b in logs[i + 1:]:
                common = sorted(set(a) & set(b), reverse=True)
                top = next((x for x in common if a[x][0] == b[x][0]), None)
                if top is None:
                    continue
                for x in common:
                    if x <= top and a[x] != b[x]:
                        raise Violation(f"log matching: entries at {x} differ below {top}")


class Network:
    def __init__(
        self,
        voters: tuple[int, ...] | list[int],
        learners: tuple[int, ...] | list[int] = (),
        *,
        seed: int = 0,
        election_tick: int = 10,
        pre_vote: bool = True,
        check_quorum: bool = True,
        max_inflight: int = 256,
        max_size_per_msg: int = 1 << 20,
        extra: tuple[int, ...] | list[int] = (),
        leader_sends_early: bool = False,
        hold_while_pending: bool = True,
    ) -> None:
        self.rng = random.Random(seed)
        self.leader_sends_early = leader_sends_early
        self.hold_while_pending = hold_while_pending
        self.cfg_kw = dict(election_tick=election_tick, pre_vote=pre_vote,
                           check_quorum=check_quorum, max_inflight_msgs=max_inflight,
                           max_size_per_msg=max_size_per_msg)
        cs = ConfState(tuple(voters), tuple(learners))
        self.nodes: dict[int, SimNode] = {}
        for nid in [*voters, *learners]:
            self.nodes[nid] = SimNode(nid, MemoryStorage.bootstrap(cs))
            self.restart(nid)
        for nid in extra:  # joins later through a conf change: empty config
            self.nodes[nid] = SimNode(nid, MemoryStorage(ConfState()))
            self.restart(nid)
        self.queue: list[Message] = []
        # Snapshot reports for a member that takes no input now (its Ready is
        # pending and the network holds it): stepped once that Ready is done.
        self.held_reports: dict[int, list[Message]] = {}
        self.cut: set[tuple[int, int]] = set()
        self.checker = Checker()
        self.sent: list[Message] = []  # every message that entered the network
        for nid in self.nodes:
            self.process(nid)  # apply the bootstrap configuration

    # -- members ---------------------------------------------------------------------
    def raft(self, nid: int) -> Raft:
        r = self.nodes[nid].raft
        assert r is not None, f"node {nid} is down"
        return r

    def leader(self) -> int | None:
        best = None
        for n in self.nodes.values():
            if n.raft is not None and n.raft.state is StateType.LEADER:
                if best is None or n.raft.term > self.raft(best).term:
                    best = n.id
        return best

    def log_view(self, n: SimNode) -> dict[int, EntryKey]:
        if n.raft is not None:
            log = n.raft.log
            lo, hi = log.first_index(), log.last_index()
            ents = log.slice(lo, hi + 1) if lo <= hi else []
        else:
            s = n.storage
            ents = s.entries(s.first_index(), s.last_index() + 1) if s.last_index() >= \
                s.first_index() else []
        return {e.index: key(e) for e in ents}

    # -- the driver ----------------------------------------------------------------------
    def take_ready(self, nid: int) -> bool:
        n = self.nodes[nid]
        if n.raft is None or n.pending is not None or not n.raft.has_ready():
            return False
        n.pending = rd = n.raft.ready()
        if self.leader_sends_early and n.raft.state is StateType.LEADER:
            # Thesis §10.2.1: a leader may replicate in parallel with its own
            # fsync; its entries still count for it only on STORAGE_APPEND_RESP.
            early = [m for m in rd.messages if m.type in _EARLY]
            rd.messages = [m for m in rd.messages if m.type not in _EARLY]
            self.sent.extend(early)
            self.queue.extend(early)
        return True

    def _fsync(self, n: SimNode, rd: Ready) -> None:
        if rd.snapshot is not None:
            n.storage.apply_snapshot(rd.snapshot)
        n.storage.append(rd.entries)
        if rd.hard_state is not None:
            n.storage.set_hard_state(rd.hard_state)

    def persist(self, nid: int) -> None:
        """fsync the pending Ready, then send, apply and advance."""
        n = self.nodes[nid]
        rd, r = n.pending, n.raft
        if rd is None or r is None:
            return
        self._fsync(n, rd)
        resp = storage_append_resp(rd)
        if resp is not None:
            r.step(resp)
        for m in rd.messages:
            self.sent.append(m)
            self.queue.append(m)
        if rd.snapshot is not None:
            n.sm = decode_sm(rd.snapshot.data)
        for e in rd.committed_entries:
            self._apply(n, e)
        n.read_states.extend(rd.read_states)
        n.pending = None
        r.advance(rd)
        for report in self.held_reports.pop(nid, []):
            r.step(report)

    def _apply(self, n: SimNode, e: Entry) -> None:
        expect = max(n.sm, default=n.storage.snapshot().meta.index) + 1
        if e.index != expect:
            raise Violation(f"node {n.id} applied {e.index}, expected {expect}")
        n.sm[e.index] = key(e)
        self.checker.on_apply(n, e.index, key(e))

    def process(self, nid: int) -> bool:
        if not self.take_ready(nid):
            return False
        self.persist(nid)
        return True

    # -- faults ----------------------------------------------------------------------------
    def crash(self, nid: int, lose_tail: bool = True) -> None:
        n = self.nodes[nid]
        if n.pending is not None and not lose_tail:
            self._fsync(n, n.pending)  # fsynced, but nothing sent or applied
        n.pending = None
        n.raft = None
        n.read_states = []
        self.held_reports.pop(nid, None)  # its transport died with it

    def restart(self, nid: int) -> None:
        n = self.nodes[nid]
        snap = n.storage.snapshot()
        cfg = Config(id=nid, rng=random.Random(self.rng.random() if hasattr(self, "rng")
                                               else nid), applied=snap.meta.index,
                     **self.cfg_kw)
        n.raft = Raft(cfg, n.storage)
        n.sm = decode_sm(snap.data)

    def compact(self, nid: int, keep: int = 0) -> bool:
        """Snapshot the state machine at `applied` and drop the log up to it."""
        n = self.nodes[nid]
        r = n.raft
        if r is None or n.pending is not None:
            return False
        idx = r.applied
        if idx <= n.storage.snapshot().meta.index:
            return False
        n.storage.create_snapshot(idx, r.conf_state, encode_sm(n.sm))
        if idx - keep > n.storage.first_index() - 1:
            n.storage.compact(idx - keep)
        return True

    def partition(self, *groups: tuple[int, ...] | list[int]) -> None:
        self.cut = set()
        for i, a in enumerate(groups):
            for b in groups[i + 1:]:
                for x in a:
                    for y in b:
                        self.cut.add((x, y))
                        self.cut.add((y, x))

    def isolate(self, nid: int) -> None:
        others = [i for i in self.nodes if i != nid]
        self.partition([nid], others)

    def heal(self) -> None:
        self.cut = set()

    # -- delivery -----------------------------------------------------------------------------
    def deliverable(self, i: int) -> bool:
        m = self.queue[i]
        n = self.nodes.get(m.to)
        # A member whose Ready is being fsynced keeps stepping input (as the
        # multigroup driver does) unless the network is told to hold it.
        return n is None or n.pending is None or not self.hold_while_pending

    def deliver(self, i: int = 0, duplicate: bool = False) -> Message | None:
        m = self.queue[i] if duplicate else self.queue.pop(i)
        return self._step_into(m)

    def _step_into(self, m: Message) -> Message | None:
        n = self.nodes.get(m.to)
        if n is None or n.raft is None or (m.frm, m.to) in self.cut:
            self._report_snapshot(m, failed=True)
            return None
        n.raft.step(m)
        self._report_snapshot(m, failed=False)
        return m

    def _report_snapshot(self, m: Message, failed: bool) -> None:
        """What a snapshot-streaming transport tells the sender (SNAP_STATUS).

        The real transport reports every SNAP it was handed, success or failure
        (GrpcTransport._snapshot_task), and the driver steps the report whenever
        it comes. A member held while its Ready is pending gets it afterwards:
        discarding it would leave the leader's progress paused in SNAPSHOT
        state for good (core seed 5073), a loss the real system cannot have."""
        sender = self.nodes.get(m.frm)
        if m.type is not MsgType.SNAP or sender is None or sender.raft is None:
            return  # a crashed sender's transport is gone, and its progress with it
        report = Message(MsgType.SNAP_STATUS, frm=m.to, reject=failed)
        if sender.pending is None or not self.hold_while_pending:
            sender.raft.step(report)
        else:
            self.held_reports.setdefault(m.frm, []).append(report)

    def drop(self, i: int = 0) -> None:
        self._report_snapshot(self.queue.pop(i), failed=True)

    def deliver_all(self, types: set[MsgType] | None = None) -> int:
        done = 0
        keep: list[Message] = []
        batch, self.queue = self.queue, []
        for m in batch:
            if types is not None and m.type not in types:
                keep.append(m)
                continue
            self._step_into(m)
            done += 1
        self.queue = keep + self.queue
        return done

    def stabilize(self, limit: int = 10_000) -> None:
        for _ in range(limit):
            busy = False
            for nid in self.nodes:
                busy |= self.process(nid)
            if self.queue:
                self.deliver_all()
                busy = True
            if not busy:
                return
        raise AssertionError("network did not stabilize")

    def tick(self, nid: int | None = None, n: int = 1) -> None:
        for _ in range(n):
            for x in [nid] if nid is not None else list(self.nodes):
                node = self.nodes[x]
                if node.raft is not None and (node.pending is None or not self.hold_while_pending):
                    node.raft.tick()

    def elect(self, nid: int) -> None:
        self.raft(nid).campaign()
        self.stabilize()
        assert self.raft(nid).state is StateType.LEADER, self.raft(nid).state

    def propose(self, nid: int, data: bytes) -> int | None:
        n = self.nodes[nid]
        if n.raft is None or (n.pending is not None and self.hold_while_pending):
            return None
        return n.raft.propose(data)

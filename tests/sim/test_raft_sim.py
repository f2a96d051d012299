"""Randomized schedules over an in-memory cluster, checked after every step.

Hypothesis draws a list of actions (ticks, deliveries, drops, duplicates,
reorders, partitions, crashes with or without the un-fsynced tail, restarts,
proposals, membership changes, leader transfers, compaction, quiescence).
After each action the checker verifies election safety, log matching, leader
completeness, state machine safety and that no acknowledged entry vanished.
At the end everything heals and the cluster must converge (liveness).

Set RAFT_SIM_EXAMPLES to run more schedules locally.
"""

from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raft.core import StateType
from raft.types import ConfChange, ConfChangeType
from tests.raft.network import Network

EXAMPLES = int(os.environ.get("RAFT_SIM_EXAMPLES", "1000"))
STRUCTURED_EXAMPLES = max(EXAMPLES // 10, 50)
ALL = (1, 2, 3, 4, 5)

# Weighted action table: common things appear several times.
KINDS = (
    ["tick"] * 6 + ["process"] * 3 + ["deliver"] * 4 + ["take_ready"] * 2 + ["persist"] * 2
    + ["round"] * 8
    + ["drop", "duplicate", "partition", "heal", "crash", "restart", "compact",
       "conf", "transfer", "read", "campaign", "quiesce", "wake"]
    + ["propose"] * 6
)

FAULTS = ("drop", "duplicate", "partition", "crash", "take_ready", "campaign", "transfer",
          "conf", "quiesce", "compact", "read", "wake")


def schedule(seed: int) -> list[tuple[str, int]]:
    """A seeded schedule whose fault mix itself varies from seed to seed."""
    rng = random.Random(seed)
    weights = {k: KINDS.count(k) for k in set(KINDS)}
    for k in FAULTS:
        weights[k] *= rng.choice((0, 0.3, 1, 2))
    kinds = sorted(weights)
    w = [weights[k] for k in kinds]
    n = rng.randrange(100, 300)
    return [(k, rng.randrange(1 << 16)) for k in rng.choices(kinds, w, k=n)]


actions = st.lists(
    st.tuples(st.integers(0, len(KINDS) - 1), st.integers(0, 1 << 16)),
    min_size=80, max_size=250,
)


class Sim:
    def __init__(self, seed: int) -> None:
        # Three founding voters (4 and 5 may join) or five founding voters.
        voters = ALL if seed % 3 == 0 else ALL[:3]
        extra = [n for n in ALL if n not in voters]
        # Safety must not depend on pre-vote or check-quorum: vary them too.
        variant = (seed >> 3) % 4
        self.net = Network(voters, seed=seed, election_tick=4, max_inflight=1 + seed % 4,
                           pre_vote=variant != 1, check_quorum=variant != 2,
                           max_size_per_msg=64, extra=extra, leader_sends_early=seed % 2 == 1,
                           hold_while_pending=seed % 4 < 2)
        self.removed: set[int] = set()
        self.nprop = 0

    def usable(self, nid: int) -> bool:
        """Alive, and free to take input (see Network.hold_while_pending)."""
        n = self.net.nodes[nid]
        return n.alive and (n.pending is None or not self.net.hold_while_pending)

    def pick_node(self, arg: int) -> int:
        return ALL[arg % len(ALL)]

    def run(self, kind: str, arg: int) -> None:
        getattr(self, "do_" + kind)(arg)
        self.net.checker.check(self.net)

    # -- actions --------------------------------------------------------------------
    def do_tick(self, arg: int) -> None:
        if arg % 3 == 0:
            self.net.tick()
        else:
            self.net.tick(self.pick_node(arg))

    def do_process(self, arg: int) -> None:
        nid = self.pick_node(arg)
        self.net.persist(nid)
        self.net.process(nid)

    def do_round(self, arg: int) -> None:
        """Every member handles its Ready, then a few messages move (maybe reordered)."""
        for nid in ALL:
            if arg >> nid & 1 or self.net.nodes[nid].pending is None:
                self.net.persist(nid)
                self.net.process(nid)
        for k in range(arg % 16 + 4):
            self.do_deliver(arg >> k)

    def do_take_ready(self, arg: int) -> None:
        self.net.take_ready(self.pick_node(arg))

    def do_persist(self, arg: int) -> None:
        self.net.persist(self.pick_node(arg))

    def _queue_index(self, arg: int) -> int | None:
        q = self.net.queue
        if not q:
            return None
        # Mostly FIFO, sometimes any message (reordering).
        i = 0 if arg % 4 else (arg >> 2) % len(q)
        return i if self.net.deliverable(i) else None

    def do_deliver(self, arg: int) -> None:
        i = self._queue_index(arg)
        if i is not None:
            self.net.deliver(i)

    def do_drop(self, arg: int) -> None:
        if self.net.queue:
            self.net.drop(arg % len(self.net.queue))

    def do_duplicate(self, arg: int) -> None:
        i = self._queue_index(arg)
        if i is not None:
            self.net.deliver(i, duplicate=True)

    def do_partition(self, arg: int) -> None:
        side = [n for i, n in enumerate(ALL) if arg >> i & 1]
        rest = [n for n in ALL if n not in side]
        self.net.partition(side, rest)

    def do_heal(self, arg: int) -> None:
        self.net.heal()

    def do_crash(self, arg: int) -> None:
        nid = self.pick_node(arg)
        if self.net.nodes[nid].alive:
            self.net.crash(nid, lose_tail=bool(arg >> 4 & 1))

    def do_restart(self, arg: int) -> None:
        nid = self.pick_node(arg)
        if not self.net.nodes[nid].alive:
            self.net.restart(nid)

    def do_compact(self, arg: int) -> None:
        self.net.compact(self.pick_node(arg), keep=(arg >> 4) % 3)

    def _leader(self) -> int | None:
        return self.net.leader()

    def do_propose(self, arg: int) -> None:
        # Mostly at the leader (the cluster layer forwards), sometimes anywhere.
        lead = self._leader()
        nid = lead if lead is not None and arg % 4 else self.pick_node(arg >> 2)
        self.nprop += 1
        self.net.propose(nid, b"p%d" % self.nprop)

    def do_conf(self, arg: int) -> None:
        lead = self._leader()
        if lead is None or not self.usable(lead):
            return
        r = self.net.raft(lead)
        target = self.pick_node(arg >> 3)
        cs = r.conf_state
        kind = arg % 3
        if target in self.removed:
            return
        if kind == 0 and target not in cs.voters:
            cc = ConfChange(ConfChangeType.ADD_VOTER, target)
        elif kind == 1 and target not in cs.voters and target not in cs.learners:
            cc = ConfChange(ConfChangeType.ADD_LEARNER, target)
        elif kind == 2 and len(cs.voters) > 3 and target in cs.voters:
            cc = ConfChange(ConfChangeType.REMOVE, target)
        else:
            return
        if r.propose_conf_change(cc) is not None and cc.type is ConfChangeType.REMOVE:
            self.removed.add(target)  # never re-add a removed id

    def do_transfer(self, arg: int) -> None:
        nid = self.pick_node(arg)
        if self.usable(nid):
            self.net.raft(nid).transfer_leader(self.pick_node(arg >> 3))

    def do_read(self, arg: int) -> None:
        nid = self.pick_node(arg)
        if self.usable(nid):
            self.net.raft(nid).read_index(b"r%d" % arg)

    def do_campaign(self, arg: int) -> None:
        nid = self.pick_node(arg)
        if self.usable(nid):
            self.net.raft(nid).campaign()

    def do_quiesce(self, arg: int) -> None:
        lead = self._leader()
        if lead is not None and self.usable(lead):
            self.net.raft(lead).quiesce()

    def do_wake(self, arg: int) -> None:
        nid = self.pick_node(arg)
        if self.usable(nid):
            self.net.raft(nid).wake()

    # -- liveness ------------------------------------------------------------------------
    def heal_all(self) -> None:
        net = self.net
        net.heal()
        for nid, n in net.nodes.items():
            if n.alive:
                net.persist(nid)
            else:
                net.restart(nid)
            net.raft(nid).wake()  # the node-level liveness heartbeat would do this

    def converge(self, rounds: int = 400) -> None:
        net = self.net
        self.heal_all()
        final = None
        final_term = 0
        for _ in range(rounds):
            net.tick()
            net.stabilize()
            net.checker.check(net)
            lead = net.leader()
            if lead is None or not self._leader_settled(lead):
                continue
            if final is not None and self._final_lost(lead, final, final_term):
                final = None  # Raft may drop an uncommitted entry: the client retries
            if final is None:
                final = net.raft(lead).propose(b"final")
                final_term = net.raft(lead).term
                continue
            if self._all_applied(lead, final):
                return
        raise AssertionError(f"no convergence: leader={net.leader()} final={final} "
                             + self._describe())

    def _final_lost(self, lead: int, final: int, term: int) -> bool:
        """The final proposal is gone when the settled leader's log does not
        hold it at its index and term (e.g. its leader removed itself before
        committing it, and the next leader overwrote or never had it)."""
        r = self.net.raft(lead)
        if final > r.log.last_index():
            return True
        # 0: compacted away, hence committed and applied before: not lost.
        return r.log.term_or_zero(final) not in (term, 0)

    def _leader_settled(self, lead: int) -> bool:
        r = self.net.raft(lead)
        return r.state is StateType.LEADER and r.log.term_or_zero(r.commit) == r.term

    def _all_applied(self, lead: int, final: int | None) -> bool:
        r = self.net.raft(lead)
        if final is None or r.applied < final:
            return False
        cs = r.conf_state
        members = set(cs.voters) | set(cs.learners)
        acked = self.net.checker.acked
        for nid in members:
            n = self.net.nodes[nid]
            if n.raft is None or n.raft.applied < r.applied:
                return False
            for idx in acked:
                if idx not in n.sm and idx > n.storage.snapshot().meta.index:
                    return False
        return True

    def _describe(self) -> str:
        out = []
        for nid, n in self.net.nodes.items():
            r = n.raft
            if r is None:
                out.append(f"{nid}:down")
                continue
            out.append(f"{nid}:{r.state.name} t={r.term} lead={r.lead} c={r.commit} "
                       f"a={r.applied} last={r.log.last_index()} cs={r.conf_state} q={r.quiesced}")
        return "; ".join(out)


def _run(sim: Sim, steps: list[tuple[str, int]]) -> None:
    for kind, arg in steps:
        sim.run(kind, arg)
    checker = sim.net.checker
    event(f"terms with a leader: {min(len(checker.leaders), 4)}+")
    event(f"acked before healing: {min(len(checker.acked) // 10 * 10, 30)}+")
    event(f"snapshot sent: {any(m.snapshot is not None for m in sim.net.sent)}")
    sim.converge()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_seeded_schedules_keep_raft_safe_and_live(seed: int) -> None:
    _run(Sim(seed), schedule(seed))


@settings(max_examples=STRUCTURED_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 1000), steps=actions)
def test_shrinkable_schedules_keep_raft_safe_and_live(
    seed: int, steps: list[tuple[int, int]]
) -> None:
    _run(Sim(seed), [(KINDS[k], a) for k, a in steps])


def test_final_proposal_lost_with_its_removed_leader_is_proposed_again() -> None:
    # Seed 605: the final proposal went to a leader that then applied its own
    # removal and stepped down; the next leader never had the entry. Raft may
    # drop an uncommitted entry, so convergence must retry, not wait forever.
    sim = Sim(605)
    for kind, arg in schedule(605):
        sim.run(kind, arg)
    sim.converge()


def test_snapshot_report_for_a_leader_busy_fsyncing_is_stepped_later() -> None:
    # Seed 5073: leader 4's SNAP to 2 was undeliverable while 4 held a pending
    # Ready (hold_while_pending). The network threw the failure report away,
    # so 4's progress for 2 stayed paused in SNAPSHOT state and 2 never caught
    # up. The real transport reports every SNAP and the driver steps the
    # report whenever it comes; the simulated network now holds it until the
    # Ready is done.
    sim = Sim(5073)
    assert sim.net.hold_while_pending
    for kind, arg in schedule(5073):
        sim.run(kind, arg)
    sim.converge()

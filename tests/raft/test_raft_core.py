"""Scenario tests of the Raft core over the in-memory network.

Each test names the rule it checks, quoting the Raft paper (Ongaro &
Ousterhout, 2014) or the thesis where it applies.
"""

from __future__ import annotations

import random

import pytest

from raft.core import (
    QUIESCE,
    Config,
    Raft,
    StateType,
    decode_conf_change,
    encode_conf_change,
    storage_append_resp,
)
from raft.log import InvariantError
from raft.memstorage import MemoryStorage
from raft.progress import ProgressState
from raft.types import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    Message,
    MsgType,
    Snapshot,
    SnapshotMeta,
)
from tests.raft.network import Network, key


def settle(net: Network, ticks: int = 1) -> None:
    for _ in range(ticks):
        net.tick()
        net.stabilize()
        net.checker.check(net)


def types_sent(net: Network, since: int) -> list[MsgType]:
    return [m.type for m in net.sent[since:]]


# -- elections ---------------------------------------------------------------------------
def test_single_leader_elected_and_no_op_appended() -> None:
    """§5.2 elections; §8: 'each leader commit a blank no-op entry at the start of its term'."""
    net = Network([1, 2, 3], seed=1)
    settle(net, 40)
    lead = net.leader()
    assert lead is not None
    r = net.raft(lead)
    noop = r.log.slice(r.log.last_index(), r.log.last_index() + 1)[0]
    assert noop.term == r.term and noop.data == b"" and noop.type is EntryType.NORMAL
    assert all(net.raft(i).commit == r.log.last_index() for i in (1, 2, 3))
    assert sum(net.raft(i).state is StateType.LEADER for i in (1, 2, 3)) == 1


def test_election_timeout_is_randomized_in_range() -> None:
    """§5.2: 'election timeouts are chosen randomly from a fixed interval'."""
    seen = set()
    for seed in range(60):
        r = Raft(Config(id=1, election_tick=10, rng=random.Random(seed)),
                 MemoryStorage.bootstrap(ConfState((1, 2, 3))))
        seen.add(r.randomized_election_timeout)
    assert min(seen) >= 10 and max(seen) < 20 and len(seen) > 5


def test_ready_persists_term_and_vote_before_vote_requests_leave() -> None:
    """Figure 2: currentTerm and votedFor are persistent, updated before responding."""
    net = Network([1, 2, 3])
    r = net.raft(1)
    r.step(Message(MsgType.HUP, frm=1))
    rd = r.ready()
    # Pre-vote first: term unchanged, nothing to sync, requests carry term+1.
    assert rd.hard_state is None and [m.type for m in rd.messages] == [MsgType.PRE_VOTE] * 2
    assert {m.term for m in rd.messages} == {2}
    r.advance(rd)
    for m in rd.messages:
        net.raft(m.to).step(m)
    for nid in (2, 3):
        resp = net.raft(nid).ready().messages
        assert resp[0].type is MsgType.PRE_VOTE_RESP and not resp[0].reject
        r.step(resp[0])
    rd = r.ready()
    assert rd.hard_state is not None and (rd.hard_state.term, rd.hard_state.vote) == (2, 1)
    assert rd.must_sync and {m.type for m in rd.messages} == {MsgType.VOTE}


def test_partitioned_node_does_not_inflate_term_with_prevote() -> None:
    """Thesis §9.6: pre-vote keeps a partitioned server from disrupting the cluster."""
    net = Network([1, 2, 3], seed=2)
    net.elect(1)
    net.isolate(3)
    settle(net, 60)
    assert net.raft(3).term == net.raft(1).term  # pre-votes failed, term untouched
    net.heal()
    settle(net, 30)
    assert net.leader() == 1 and net.raft(1).term == net.raft(3).term


def test_check_quorum_leader_steps_down_when_isolated() -> None:
    """Thesis §6.2: a leader steps down if an election timeout passes without
    hearing from a majority."""
    net = Network([1, 2, 3], seed=3)
    net.elect(1)
    net.isolate(1)
    settle(net, 25)
    assert net.raft(1).state is StateType.FOLLOWER
    assert net.leader() in (2, 3)


def test_follower_in_lease_ignores_votes() -> None:
    """Thesis §4.2.3: servers ignore RequestVote while they believe a leader exists."""
    net = Network([1, 2, 3], seed=4)
    net.elect(1)
    before = net.raft(2).term
    net.raft(2).step(Message(MsgType.VOTE, frm=3, to=2, term=before + 5, index=99, log_term=99))
    assert net.raft(2).term == before and not net.raft(2).ready().messages


def test_vote_refused_to_candidate_with_stale_log() -> None:
    """§5.4.1: 'the voter denies its vote if its own log is more up-to-date'."""
    net = Network([1, 2, 3], pre_vote=False, check_quorum=False)
    net.elect(1)
    net.propose(1, b"a")
    net.stabilize()
    r2 = net.raft(2)
    t = r2.term
    r2.step(Message(MsgType.VOTE, frm=3, to=2, term=t + 1, index=1, log_term=1))
    out = r2.ready().messages
    assert out[0].type is MsgType.VOTE_RESP and out[0].reject
    # ...but one vote per term, first come first served (§5.2).
    r2.step(Message(MsgType.VOTE, frm=3, to=2, term=t + 2, index=99, log_term=t))
    r2.step(Message(MsgType.VOTE, frm=1, to=2, term=t + 2, index=99, log_term=t))
    grants = [m for m in r2.ready().messages if not m.reject]
    assert [m.to for m in grants] == [3] and r2.vote == 3


# -- replication and commit ---------------------------------------------------------------------
def test_replication_and_apply_everywhere() -> None:
    net = Network([1, 2, 3])
    net.elect(1)
    idx = [net.propose(1, b"v%d" % i) for i in range(5)]
    net.stabilize()
    for nid in (1, 2, 3):
        assert [net.nodes[nid].sm[i][2] for i in idx] == [b"v%d" % i for i in range(5)]


def test_follower_ack_travels_in_the_ready_with_its_entries() -> None:
    """Durability: a follower's APP_RESP is in the same Ready as the entries it
    acknowledges, so the driver sends it only after the fsync."""
    net = Network([1, 2, 3])
    net.elect(1)
    net.propose(1, b"x")
    net.process(1)
    app = next(m for m in net.queue if m.to == 2 and m.type is MsgType.APP and m.entries)
    r2 = net.raft(2)
    r2.step(app)
    rd = r2.ready()
    assert rd.entries and rd.entries[-1].index == app.entries[-1].index
    assert [m.type for m in rd.messages] == [MsgType.APP_RESP]
    assert rd.messages[0].index == rd.entries[-1].index


def test_leader_counts_itself_only_after_storage_append_resp() -> None:
    """Durability: the leader's own entry counts toward commit only once fsynced."""
    net = Network([1])
    net.elect(1)
    r = net.raft(1)
    idx = r.propose(b"x")
    rd = r.ready()
    assert r.commit < idx
    net.nodes[1].storage.append(rd.entries)
    assert r.commit < idx  # persisted, but the core has not been told yet
    r.step(storage_append_resp(rd))
    assert r.commit == idx


def test_old_term_entries_commit_only_via_current_term_entry() -> None:
    """§5.4.2 / Figure 8: an entry of an earlier term is not committed by
    counting replicas; it commits once an entry of the current term does."""
    st = MemoryStorage.bootstrap(ConfState((1, 2, 3)))
    st.append([st.entries(1, 4)[-1].__class__(2, 4, EntryType.NORMAL, b"old")])
    hs = st.hard_state()
    hs.term = 2
    st.set_hard_state(hs)
    r = Raft(Config(id=1, election_tick=5), st)
    rd = r.ready()
    st.append(rd.entries)
    r.advance(rd)  # applies the bootstrap membership
    r.step(Message(MsgType.HUP, frm=1, context=b"transfer"))  # straight to a vote
    r.step(Message(MsgType.VOTE_RESP, frm=2, to=1, term=3))
    assert r.state is StateType.LEADER and r.log.last_index() == 5
    rd = r.ready()
    st.append(rd.entries)
    r.step(storage_append_resp(rd))
    r.advance(rd)
    r.step(Message(MsgType.APP_RESP, frm=2, to=1, term=3, index=4))
    assert r.commit == 3  # index 4 (term 2) is on a majority but not committed
    r.step(Message(MsgType.APP_RESP, frm=2, to=1, term=3, index=5))
    assert r.commit == 5


def test_divergent_follower_log_is_repaired_with_few_round_trips() -> None:
    """§5.3 optimisation: the rejection hint skips a whole conflicting term."""
    net = Network([1, 2, 3], seed=5)
    net.elect(1)
    net.isolate(1)
    for i in range(30):  # stranded, uncommitted entries of term 2 on node 1
        net.propose(1, b"lost%d" % i)
    net.process(1)
    net.queue.clear()
    settle(net, 30)  # 1 loses its lease and steps down; 2 or 3 takes over
    lead = net.leader()
    assert lead in (2, 3)
    net.propose(lead, b"kept")
    net.stabilize()
    net.heal()
    start = len(net.sent)
    settle(net, 3)
    rejects = [m for m in net.sent[start:] if m.type is MsgType.APP_RESP and m.reject]
    assert len(rejects) <= 2
    assert net.log_view(net.nodes[1]) == net.log_view(net.nodes[lead])
    assert not any(d.startswith(b"lost") for _, _, d in net.nodes[1].sm.values())


def test_duplicated_and_reordered_appends_keep_logs_intact() -> None:
    """§5.3 conflict rule under a hostile network: stale APPs never truncate."""
    net = Network([1, 2, 3], seed=6)
    net.elect(1)
    for i in range(6):
        net.propose(1, b"d%d" % i)
        net.process(1)
    apps = [m for m in net.queue if m.to == 2]
    for m in reversed(apps):  # reversed, then each again
        net.raft(2).step(m)
    for m in apps:
        net.raft(2).step(m)
    net.queue = [m for m in net.queue if m.to != 2]
    net.stabilize()
    settle(net, 3)
    assert net.log_view(net.nodes[1]) == net.log_view(net.nodes[2])
    assert net.raft(2).applied == net.raft(1).applied


# -- crash and restart --------------------------------------------------------------------------
def test_crash_loses_only_the_unfsynced_tail() -> None:
    net = Network([1, 2, 3], seed=7)
    net.elect(1)
    acked = net.propose(1, b"acked")
    net.stabilize()
    net.propose(1, b"unsynced")
    net.take_ready(1)  # taken, never fsynced
    net.crash(1, lose_tail=True)
    net.queue.clear()
    net.restart(1)
    r = net.raft(1)
    assert r.log.last_index() == acked  # the unsynced proposal is gone
    settle(net, 40)
    for nid in (1, 2, 3):
        assert net.nodes[nid].sm[acked][2] == b"acked"


def test_crash_after_fsync_keeps_the_tail() -> None:
    net = Network([1, 2, 3], seed=8)
    net.elect(1)
    net.stabilize()
    idx = net.propose(1, b"synced")
    net.take_ready(1)
    net.crash(1, lose_tail=False)
    net.restart(1)
    assert net.raft(1).log.last_index() == idx


# -- leader transfer ---------------------------------------------------------------------------
def test_leader_transfer_to_caught_up_follower() -> None:
    """Thesis §3.10: catch the target up, then TIMEOUT_NOW."""
    net = Network([1, 2, 3], seed=9)
    net.elect(1)
    start = len(net.sent)
    net.raft(1).transfer_leader(2)
    net.stabilize()
    assert MsgType.TIMEOUT_NOW in types_sent(net, start)
    assert net.leader() == 2 and net.raft(1).state is StateType.FOLLOWER


def test_leader_transfer_waits_for_lagging_target_and_drops_proposals() -> None:
    net = Network([1, 2, 3], seed=10)
    net.elect(1)
    net.isolate(3)
    for i in range(3):
        net.propose(1, b"t%d" % i)
    net.stabilize()
    net.heal()
    net.raft(1).transfer_leader(3)
    assert net.propose(1, b"during") is None  # no new entries while handing over
    net.stabilize()
    assert net.leader() == 3
    assert net.raft(3).log.last_index() >= net.raft(1).commit


def test_leader_transfer_aborts_after_an_election_timeout() -> None:
    net = Network([1, 2, 3], seed=11)
    net.elect(1)
    net.crash(3)
    net.raft(1).transfer_leader(3)
    assert net.propose(1, b"x") is None
    settle(net, 12)
    assert net.leader() == 1 and net.propose(1, b"y") is not None


def test_follower_forwards_transfer_request_to_leader() -> None:
    net = Network([1, 2, 3], seed=12)
    net.elect(1)
    net.raft(3).transfer_leader(3)
    net.stabilize()
    assert net.leader() == 3


# -- membership ---------------------------------------------------------------------------------
def add(net: Network, lead: int, t: ConfChangeType, nid: int) -> int:
    idx = net.raft(lead).propose_conf_change(ConfChange(t, nid))
    assert idx is not None
    net.stabilize()
    return idx


def test_add_voter_takes_effect_on_apply_and_new_member_catches_up() -> None:
    net = Network([1, 2, 3], extra=[4], seed=13)
    net.elect(1)
    net.propose(1, b"before")
    net.stabilize()
    idx = net.raft(1).propose_conf_change(ConfChange(ConfChangeType.ADD_VOTER, 4))
    assert 4 not in net.raft(1).conf_state.voters  # appended, not yet applied
    net.stabilize()
    assert net.raft(1).conf_state.voters == (1, 2, 3, 4)
    assert net.nodes[4].sm[idx][1] == EntryType.CONF_CHANGE
    assert net.raft(4).conf_state.voters == (1, 2, 3, 4)
    assert net.raft(4).applied == net.raft(1).applied


def test_one_membership_change_at_a_time() -> None:
    net = Network([1, 2, 3], extra=[4, 5], seed=14)
    net.elect(1)
    r = net.raft(1)
    assert r.propose_conf_change(ConfChange(ConfChangeType.ADD_VOTER, 4)) is not None
    assert r.propose_conf_change(ConfChange(ConfChangeType.ADD_VOTER, 5)) is None
    net.stabilize()
    assert r.propose_conf_change(ConfChange(ConfChangeType.ADD_VOTER, 5)) is not None


def test_new_leader_applies_earlier_entries_before_conf_change() -> None:
    """A change of an earlier leader may be in flight: the new leader proposes
    one only after applying everything its log held when it was elected."""
    net = Network([1, 2, 3], extra=[4], seed=15, check_quorum=False)
    net.elect(1)
    net.raft(1).propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, 4))
    net.process(1)
    for m in [m for m in net.queue if m.to == 2]:
        net.raft(2).step(m)  # 2 holds the change; nobody has committed it
    net.queue.clear()
    net.process(2)
    net.queue.clear()
    net.crash(1)
    net.raft(2).campaign()
    for _ in range(6):  # elect 2 but keep its no-op uncommitted
        for nid in (2, 3):
            net.process(nid)
        net.deliver_all({MsgType.PRE_VOTE, MsgType.PRE_VOTE_RESP, MsgType.VOTE,
                         MsgType.VOTE_RESP})
    r = net.raft(2)
    assert r.state is StateType.LEADER and r.applied < r.pending_conf_index
    assert r.propose_conf_change(ConfChange(ConfChangeType.ADD_VOTER, 4)) is None
    net.stabilize()
    assert r.conf_state.learners == (4,)
    assert r.propose_conf_change(ConfChange(ConfChangeType.ADD_VOTER, 4)) is not None


def test_learner_receives_log_but_does_not_vote_or_count() -> None:
    net = Network([1], learners=[2], seed=16)
    net.elect(1)
    idx = net.propose(1, b"l")
    net.crash(2)
    net.stabilize()
    assert net.raft(1).commit == idx  # the learner is not needed for commit
    net.restart(2)
    settle(net, 30)
    assert net.nodes[2].sm[idx][2] == b"l"
    assert net.raft(2).state is StateType.FOLLOWER  # never campaigns
    add(net, 1, ConfChangeType.ADD_VOTER, 2)  # promote
    assert net.raft(2).conf_state == ConfState((1, 2), ())
    net.crash(2)
    idx = net.propose(1, b"needs 2 now")
    net.stabilize()
    assert net.raft(1).commit < idx


def test_remove_voter_shrinks_quorum_and_removed_leader_steps_down() -> None:
    net = Network([1, 2, 3, 4], seed=17)
    net.elect(1)
    add(net, 1, ConfChangeType.REMOVE, 4)
    net.crash(4)
    net.crash(3)
    idx = net.propose(1, b"2 of 3")
    net.stabilize()
    assert net.raft(1).commit == idx  # {1, 2} is a majority of {1, 2, 3}
    net.restart(3)
    settle(net, 5)
    add(net, 1, ConfChangeType.REMOVE, 1)
    assert net.raft(1).state is StateType.FOLLOWER and not net.raft(1).promotable()
    settle(net, 40)
    assert net.leader() in (2, 3)
    assert net.raft(2).conf_state.voters == (2, 3)


# -- ReadIndex ----------------------------------------------------------------------------------
def test_read_index_needs_a_heartbeat_quorum() -> None:
    """§6.4: the leader records its commit index, then confirms leadership."""
    net = Network([1, 2, 3], seed=18)
    net.elect(1)
    net.isolate(1)
    net.raft(1).read_index(b"r1")
    net.stabilize()
    assert net.nodes[1].read_states == []
    net.heal()
    net.raft(1).read_index(b"r2")
    net.stabilize()
    got = {rs.context: rs.index for rs in net.nodes[1].read_states}
    assert got.get(b"r2") == net.raft(1).commit


def test_read_index_waits_for_commit_in_term_and_follower_forwards() -> None:
    net = Network([1, 2, 3], seed=19)
    net.raft(1).campaign()
    for _ in range(6):
        for nid in (1, 2, 3):
            net.process(nid)
        net.deliver_all({MsgType.PRE_VOTE, MsgType.PRE_VOTE_RESP, MsgType.VOTE,
                         MsgType.VOTE_RESP})
    assert net.raft(1).state is StateType.LEADER
    net.raft(1).read_index(b"early")
    net.process(1)
    assert not net.nodes[1].read_states and net.raft(1).reads_waiting_commit
    net.queue = [m for m in net.queue if m.type is MsgType.APP]
    net.stabilize()
    net.raft(3).read_index(b"via3")
    net.stabilize()
    assert [rs.context for rs in net.nodes[1].read_states] == [b"early"]
    assert [rs.context for rs in net.nodes[3].read_states] == [b"via3"]
    assert net.nodes[3].read_states[0].index == net.raft(1).commit


def test_single_voter_reads_immediately() -> None:
    net = Network([1])
    net.elect(1)
    net.raft(1).read_index(b"solo")
    assert net.raft(1).ready().read_states[0].context == b"solo"


# -- snapshots ----------------------------------------------------------------------------------
def test_lagging_follower_gets_a_snapshot() -> None:
    net = Network([1, 2, 3], seed=20)
    net.elect(1)
    net.crash(3)
    for i in range(10):
        net.propose(1, b"s%d" % i)
    net.stabilize()
    assert net.compact(1)
    net.restart(3)
    start = len(net.sent)
    settle(net, 20)
    assert MsgType.SNAP in types_sent(net, start)
    r3 = net.raft(3)
    assert r3.applied == net.raft(1).applied and r3.conf_state == ConfState((1, 2, 3))
    assert net.nodes[3].sm == net.nodes[1].sm  # restored from snapshot data
    assert net.nodes[3].storage.snapshot().meta.index > 0


def _peer_behind_a_compaction() -> Network:
    """Leader 1 compacted past what node 3 (restarted) holds: 3 needs a snapshot."""
    net = Network([1, 2, 3], seed=21)
    net.elect(1)
    net.crash(3)
    net.propose(1, b"x")
    net.stabilize()
    net.compact(1)
    net.restart(3)
    return net


def test_failed_snapshot_moves_peer_back_to_probe() -> None:
    net = _peer_behind_a_compaction()
    snaps: list[int] = []
    for _ in range(10):
        net.tick()
        for nid in (1, 2, 3):
            net.process(nid)
        snaps = [i for i, m in enumerate(net.queue) if m.type is MsgType.SNAP]
        if snaps:
            break
        net.deliver_all()
    assert snaps and net.raft(1).prs[3].state is ProgressState.SNAPSHOT
    net.drop(snaps[0])  # the transport reports SNAP_STATUS(reject)
    assert net.raft(1).prs[3].state is ProgressState.PROBE
    settle(net, 20)
    assert net.raft(3).applied == net.raft(1).applied


def test_failed_snapshot_waits_for_a_heartbeat_before_the_next_try() -> None:
    # A transfer that keeps failing (receiver refuses, source fails, no link)
    # must not be retried on every append broadcast: after a failed report the
    # leader waits for the follower's next heartbeat response (etcd does too).
    net = _peer_behind_a_compaction()

    def round_dropping_snapshots() -> None:
        for _ in range(1000):
            busy = False
            for nid in net.nodes:
                busy |= net.process(nid)
            while net.queue:
                busy = True
                if net.queue[0].type is MsgType.SNAP:
                    net.drop(0)  # the transport reports SNAP_STATUS(reject)
                else:
                    net.deliver(0)
            if not busy:
                return

    for _ in range(30):  # until a snapshot was tried (and failed)
        net.tick()
        round_dropping_snapshots()
        if MsgType.SNAP in types_sent(net, 0):
            break
    start = len(net.sent)
    for i in range(20):  # proposals, no ticks: no heartbeat response comes
        net.propose(1, b"p%d" % i)
        round_dropping_snapshots()
    assert types_sent(net, start).count(MsgType.SNAP) == 0
    assert net.raft(1).prs[3].is_paused()
    settle(net, 20)  # heartbeats resume the transfer, which now succeeds
    assert net.raft(3).applied == net.raft(1).applied


# -- bounds -------------------------------------------------------------------------------------
def test_proposals_dropped_without_leader_and_when_uncommitted_tail_is_full() -> None:
    net = Network([1, 2, 3], seed=22)
    assert net.propose(1, b"x") is None
    net.elect(1)
    r = net.raft(1)
    r.cfg.max_uncommitted_entries = 5
    net.isolate(1)
    got = [r.propose(b"p") for _ in range(10)]
    assert got.count(None) >= 5


def test_unstable_entries_released_after_persist() -> None:
    net = Network([1, 2, 3])
    net.elect(1)
    for i in range(50):
        net.propose(1, b"%d" % i)
    net.stabilize()
    for nid in (1, 2, 3):
        assert net.raft(nid).log.unstable.entries == []


# -- quiescence ---------------------------------------------------------------------------------
def test_quiesce_stops_heartbeats_and_election_ticks() -> None:
    net = Network([1, 2, 3], seed=23)
    net.elect(1)
    net.propose(1, b"q")
    net.stabilize()
    r = net.raft(1)
    assert r.can_quiesce() and r.quiesce()
    net.stabilize()
    assert all(net.raft(i).quiesced for i in (1, 2, 3))
    start = len(net.sent)
    settle(net, 100)
    assert net.sent[start:] == [] and net.leader() == 1
    assert any(m.context == QUIESCE for m in net.sent)


def test_late_heartbeat_response_does_not_wake_a_quiesced_leader() -> None:
    # A response to a heartbeat sent before quiescing may arrive after it; from a
    # caught-up follower it carries nothing the leader must act on.
    net = Network([1, 2, 3], seed=26)
    net.elect(1)
    net.propose(1, b"q")
    net.stabilize()
    r = net.raft(1)
    assert r.quiesce()
    net.stabilize()
    r.step(Message(MsgType.HEARTBEAT_RESP, frm=2, to=1, term=r.term))
    assert r.quiesced
    r.step(Message(MsgType.HEARTBEAT_RESP, frm=2, to=1, term=r.term, context=b"read"))
    assert not r.quiesced  # one that answers a read does need the leader awake


def test_quiesce_refused_while_a_follower_lags() -> None:
    net = Network([1, 2, 3], seed=24)
    net.elect(1)
    net.isolate(3)
    net.propose(1, b"lag")
    net.stabilize()
    assert not net.raft(1).can_quiesce()


def test_proposal_wakes_a_quiesced_group() -> None:
    net = Network([1, 2, 3], seed=25)
    net.elect(1)
    net.raft(1).quiesce()
    net.stabilize()
    idx = net.propose(1, b"wake")
    assert not net.raft(1).quiesced
    net.stabilize()
    assert not net.raft(2).quiesced and net.nodes[2].sm[idx][2] == b"wake"


def test_quiesced_followers_elect_after_leader_death_when_woken() -> None:
    net = Network([1, 2, 3], seed=26)
    net.elect(1)
    net.raft(1).quiesce()
    net.stabilize()
    net.crash(1)
    settle(net, 50)
    assert net.leader() is None  # nothing counts while quiesced
    for nid in (2, 3):  # the node-level liveness check declares 1 dead
        net.raft(nid).wake()
    settle(net, 40)
    assert net.leader() in (2, 3)


def test_conf_change_entry_roundtrip() -> None:
    cc = ConfChange(ConfChangeType.ADD_LEARNER, 77)
    net = Network([1])
    net.elect(1)
    idx = net.raft(1).propose_conf_change(cc)
    net.stabilize()
    t, ty, data = net.nodes[1].sm[idx]
    assert ty == EntryType.CONF_CHANGE and decode_conf_change(data) == cc
    assert key(net.raft(1).log.slice(idx, idx + 1)[0]) == (t, ty, data)


def test_follower_read_on_quiesced_group_does_not_disturb_the_leader() -> None:
    net = Network([1, 2, 3], seed=27)
    net.elect(1)
    net.raft(1).quiesce()
    net.stabilize()
    term = net.raft(1).term
    net.raft(2).read_index(b"idle-read")
    assert not net.raft(2).quiesced and not net.raft(2).past_lease()  # timer restarted
    settle(net, 30)
    assert net.leader() == 1 and net.raft(2).term == term
    assert [rs.context for rs in net.nodes[2].read_states] == [b"idle-read"]


def test_quiesced_follower_grants_prevote_to_a_peer_that_lost_the_leader() -> None:
    net = Network([1, 2, 3], seed=28)
    net.elect(1)
    net.raft(1).quiesce()
    net.stabilize()
    net.crash(1)
    net.raft(2).campaign()  # 2's driver saw node 1 die; 3 has not noticed yet
    net.stabilize()
    assert net.leader() == 2


def test_unreachable_peer_drops_back_to_probe() -> None:
    net = Network([1, 2, 3], seed=29)
    net.elect(1)
    net.propose(1, b"x")
    net.stabilize()
    pr = net.raft(1).prs[2]
    assert pr.state is ProgressState.REPLICATE
    net.raft(1).step(Message(MsgType.UNREACHABLE, frm=2))
    assert pr.state is ProgressState.PROBE and pr.next == pr.match + 1


def test_pending_reads_are_bounded() -> None:
    from raft.core import MAX_PENDING_READS

    net = Network([1, 2, 3], seed=30)
    net.elect(1)
    net.isolate(1)
    r = net.raft(1)
    for i in range(MAX_PENDING_READS + 50):
        r.read_index(b"r%d" % i)
    assert len(r.reads) == MAX_PENDING_READS


def test_conf_change_in_flight_is_not_applied_over_a_newer_snapshot() -> None:
    """Issue 6, defect 1. A Ready commits a membership change (add 4); while
    the driver fsyncs it, a snapshot at a later index arrives whose
    configuration no longer has 4. Advancing the old Ready must not put 4
    back: the snapshot's configuration is newer."""
    st = MemoryStorage.bootstrap(ConfState((1, 2, 3)))
    f = Raft(Config(id=2), st)
    rd = f.ready()
    st.append(rd.entries)
    f.advance(rd)
    add4 = Entry(2, 4, EntryType.CONF_CHANGE,
                 encode_conf_change(ConfChange(ConfChangeType.ADD_VOTER, 4)))
    f.step(Message(MsgType.APP, frm=1, to=2, term=2, index=3, log_term=1, entries=[add4],
                   commit=4))
    r1 = f.ready()
    assert [e.index for e in r1.committed_entries] == [4]
    newer = Snapshot(SnapshotMeta(10, 2, ConfState((1, 2, 3))))
    f.step(Message(MsgType.SNAP, frm=1, to=2, term=2, snapshot=newer))
    st.append(r1.entries)
    st.set_hard_state(r1.hard_state)
    f.step(storage_append_resp(r1))
    f.advance(r1)
    assert f.conf_state.voters == (1, 2, 3)
    r2 = f.ready()
    assert r2.snapshot is not None
    st.apply_snapshot(r2.snapshot)
    f.step(storage_append_resp(r2))
    f.advance(r2)
    assert f.conf_state.voters == (1, 2, 3)
    assert f.applied == 10


def test_storage_append_resp_from_another_node_is_ignored() -> None:
    """Issue 6, defect 8: only this node's driver reports this node's fsyncs. A
    STORAGE_APPEND_RESP naming another sender (forged, from the wire) must
    neither mark the leader's tail stable nor count it toward commit."""
    net = Network((1, 2, 3), seed=1)
    net.elect(1)
    r = net.raft(1)
    idx = r.propose(b"not yet fsynced")
    match, unstable = r.prs[1].match, list(r.log.unstable.entries)
    r.step(Message(MsgType.STORAGE_APPEND_RESP, "", frm=2, to=1, index=idx, log_term=r.term))
    assert r.prs[1].match == match < idx
    assert r.log.unstable.entries == unstable


def test_busy_group_sends_no_heartbeats_an_idle_follower_still_gets_them() -> None:
    """Issue 6 (priority): heartbeats per busy group are redundant: an append
    resets the follower's election timer and carries the commit index. A
    round skips followers that got an append since the last one; a follower
    that got none (idle group, or paused) still gets its heartbeat."""
    net = Network((1, 2, 3), seed=3)
    net.elect(1)
    settle(net)
    r = net.raft(1)
    for k in range(5):  # busy: an append to every follower between two rounds
        since = len(net.sent)
        r.propose(b"x%d" % k)
        net.stabilize()
        net.tick()
        net.stabilize()
        assert MsgType.HEARTBEAT not in types_sent(net, since)
        assert MsgType.APP in types_sent(net, since)
    since = len(net.sent)
    settle(net, 6)  # idle: a heartbeat every third round, and nobody campaigns
    assert types_sent(net, since).count(MsgType.HEARTBEAT) == 4
    assert r.state is StateType.LEADER and net.raft(2).lead == 1 and net.raft(3).lead == 1


def test_a_commit_slower_than_a_tick_costs_no_heartbeats() -> None:
    """Issue 6 (busy groups): a group waiting on a commit that takes longer than
    a tick sent no append since the last round, yet its followers hold fresh
    appends: heartbeats resume only after three quiet rounds (election_tick 10
    // 3), still three per election timeout for an idle or paused follower."""
    net = Network((1, 2, 3), seed=3)
    net.elect(1)
    settle(net, 4)
    r = net.raft(1)
    r.propose(b"slow")
    net.process(1)  # the APPs leave; the answers are late (nothing delivered)
    since = len(net.sent)
    for _ in range(3):  # the round that sees the append, then two quiet ones
        net.tick(1)
        net.process(1)
    assert MsgType.HEARTBEAT not in types_sent(net, since)
    net.tick(1)
    net.process(1)
    assert sorted(m.to for m in net.sent[since:] if m.type is MsgType.HEARTBEAT) == [2, 3]
    net.stabilize()
    assert r.log.committed == r.log.last_index()


# -- always-on invariants (their hot-path form tests the conditions first) -----------------
@pytest.mark.parametrize("breaks, report", [
    (lambda r: setattr(r.log, "applied", r.log.committed + 1), "applied <= commit <= last"),
    (lambda r: setattr(r.log, "committed", r.log.last_index() + 1), "applied <= commit <= last"),
    (lambda r: (setattr(r, "vote", 2), setattr(r, "term", 0)), "vote without term"),
    (lambda r: setattr(r, "lead", 3), "leader does not lead itself"),
    (lambda r: setattr(r.prs[r.id], "match", r.log.last_index() + 1), "self match past its log"),
])
def test_each_broken_invariant_is_reported_at_advance_with_its_numbers(breaks, report) -> None:
    net = Network([1, 2, 3], seed=1)
    settle(net, 40)
    r = net.raft(net.leader())
    r.check_invariants()  # a sound leader passes
    breaks(r)
    with pytest.raises(InvariantError, match=report):
        r.check_invariants()


def test_one_answer_moves_a_probed_follower_to_replicate_and_sends_all_it_lacks() -> None:
    """The leader's follow-up after an accepted append (etcd's maybeSendAppend loop):
    once a probed follower's answer puts it in REPLICATE, every entry it still lacks
    leaves at once, in size-limited appends, not one append per round trip."""
    net = Network([1, 2, 3])
    settle(net, 40)
    lead = net.leader()
    assert lead is not None
    r = net.raft(lead)
    f = next(i for i in (1, 2, 3) if i != lead)
    base = r.log.last_index()
    assert r.prs[f].match == base
    r.cfg.max_size_per_msg = 1  # one entry per append
    for k in range(4):
        r.step(Message(MsgType.PROP, frm=lead,
                       entries=[Entry(0, 0, EntryType.NORMAL, b"e%d" % k)]))
    r.msgs = []  # those appends are lost
    pr = r.prs[f]
    pr.become_probe()
    pr.probe_sent = True
    r.step(Message(MsgType.APP_RESP, frm=f, to=lead, term=r.term, index=base + 1))
    sent = [e.index for m in r.msgs if m.type is MsgType.APP and m.to == f for e in m.entries]
    assert pr.state is ProgressState.REPLICATE
    assert sent == [base + 2, base + 3, base + 4]

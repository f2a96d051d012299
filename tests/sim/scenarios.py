"""Adversarial schedules for the pure core, written out step by step.

Random schedules rarely line up the five or six events some bugs need
(Raft's Figure 8 needs two crashed leaders and a one-entry append in
between). These schedules do, over the in-memory network of
`tests/raft/network.py` and its checker. On correct code each one ends
quietly; on a mutant that breaks the rule it exercises, the checker raises a
named `Violation`. `tests/sim/mutants.py` runs them before the random seeds.
"""

from __future__ import annotations

from collections.abc import Callable

from raft.core import StateType
from raft.types import ConfChange, ConfChangeType, MsgType
from tests.raft.network import Network


def _net(**kw: object) -> Network:
    opts: dict[str, object] = dict(pre_vote=False, check_quorum=False, election_tick=10)
    opts.update(kw)
    return Network((1, 2, 3, 4, 5), seed=1, **opts)


def _pump(net: Network, rounds: int = 4) -> None:
    """A few rounds of persist-and-deliver among connected members (partition holds)."""
    for _ in range(rounds):
        for nid in net.nodes:
            if net.nodes[nid].raft is not None:
                net.process(nid)
        net.deliver_all()
        net.checker.check(net)


def _win(net: Network, nid: int) -> None:
    """`nid` campaigns (again, if refused) until it leads, inside its partition."""
    for _ in range(4):
        net.raft(nid).campaign()
        _pump(net, 2)
        if net.raft(nid).state is StateType.LEADER:
            return
    raise AssertionError(f"node {nid} did not win: {net.raft(nid).state}")


def figure8() -> None:
    """Raft §5.4.2 / Figure 8: an entry of an earlier term, once on a majority,
    must not count as committed before an entry of the leader's own term.

    S1 (term 2) puts X on S1, S2 only and dies. S5 wins term 3 with S3, S4 and
    writes Y at the same index, alone, and dies. S1 returns, wins term 4 and
    copies X (one entry per message) to S3: X is now on a majority. Counting
    it committed is the bug. S1 dies; S5 wins term 5 (its last term 3 beats
    X's 2) and overwrites X with Y everywhere."""
    net = _net(max_size_per_msg=1, max_inflight=1)
    _win(net, 1)
    _pump(net)
    net.partition([1, 2], [3, 4, 5])
    x = net.propose(1, b"X")
    _pump(net)
    net.crash(1, lose_tail=False)
    net.partition([1], [2], [3, 4, 5])
    net.raft(5).campaign()
    net.process(5)
    net.deliver_all({MsgType.VOTE})
    for nid in (3, 4):
        net.process(nid)
    net.deliver_all({MsgType.VOTE_RESP})
    assert net.raft(5).state is StateType.LEADER
    net.process(5)  # Y persisted on S5 only
    net.queue.clear()
    net.crash(5, lose_tail=False)
    net.restart(1)
    net.partition([1, 2, 3], [4, 5])
    _win_without_appends(net, 1)
    # Feed S3 one append at a time until it holds X (and not yet S1's no-op).
    for _ in range(12):
        net.process(1)
        net.deliver_all({MsgType.APP})
        net.process(3)
        net.process(2)
        net.deliver_all({MsgType.APP_RESP})
        net.process(1)
        net.checker.check(net)
        if net.raft(3).log.last_index() >= x:
            break
    net.queue.clear()
    net.crash(1, lose_tail=False)
    net.restart(5)
    net.partition([1], [2, 3, 4, 5])
    _win(net, 5)
    _pump(net, 6)


def _win_without_appends(net: Network, nid: int) -> None:
    """Win an election exchanging only votes (appends stay queued)."""
    for _ in range(4):
        net.raft(nid).campaign()
        for _ in range(2):
            for x in net.nodes:
                if net.nodes[x].raft is not None:
                    net.process(x)
            net.deliver_all({MsgType.VOTE, MsgType.VOTE_RESP})
        if net.raft(nid).state is StateType.LEADER:
            net.queue = [m for m in net.queue if m.type is MsgType.APP]
            return
    raise AssertionError(f"node {nid} did not win")


def _three(**kw: object) -> Network:
    """Founders 1-3; 4 and 5 exist, empty, and may be added."""
    opts: dict[str, object] = dict(pre_vote=False, check_quorum=False, election_tick=10,
                                   max_size_per_msg=1, max_inflight=1, extra=(4, 5))
    opts.update(kw)
    return Network((1, 2, 3), seed=1, **opts)


def _feed(net: Network, leader: int, to: int, upto: int, rounds: int = 40,
          apply: bool = True) -> None:
    """Appends from `leader` to `to` one entry at a time until `to` holds
    `upto` (and has applied it, unless `apply` is False)."""
    for _ in range(rounds):
        if net.raft(to).log.last_index() >= upto:
            return
        net.tick(leader)  # a heartbeat un-pauses a probing follower
        net.process(leader)
        for m in [m for m in net.queue if m.type in (MsgType.APP, MsgType.SNAP,
                                                      MsgType.HEARTBEAT)]:
            net.queue.remove(m)
            net._step_into(m)
            if net.raft(to).log.last_index() >= upto:
                if apply:
                    net.process(to)
                net.queue.clear()
                return
            net.process(to)
        net.deliver_all({MsgType.APP_RESP, MsgType.HEARTBEAT_RESP})
        net.queue = [m for m in net.queue if m.to == to and m.type is MsgType.APP]


def _add(r: object, node: int) -> int | None:
    return r.propose_conf_change(ConfChange(ConfChangeType.ADD_VOTER, node))  # type: ignore[attr-defined]


def two_conf_changes() -> None:
    """One membership change in flight. Leader S1 of {1,2,3}, cut off from 3,
    takes "add 4" and "add 5" back to back plus an entry E; S2 stores all
    three, so S1 counts them committed with the old quorum {1,2} and applies
    {1,2,3,4,5}. S3, S4, S5 then learn the two changes but not E; S3 leads
    {1,2,3,4,5} with votes 3, 4, 5 -- and lacks E. With the guard the second
    change is refused and S3 (at {1,2,3,4}) cannot win without S1 or S2."""
    net = _three(leader_sends_early=True, hold_while_pending=False)
    _win(net, 1)
    _pump(net)
    net.partition([1, 2], [3, 4, 5])
    r = net.raft(1)
    r.cfg.max_size_per_msg = 1 << 20
    _add(r, 4)
    _add(r, 5)
    e = net.propose(1, b"E")
    assert e is not None
    # S2 acks "add 4": S1 commits it, and its next append carries the rest.
    net.process(1)
    net.deliver_all()
    net.process(2)
    net.deliver_all()
    # That append leaves early; S2 acks everything while S1 has not yet
    # applied "add 4", so S1 still counts with {1,2,3}.
    net.take_ready(1)
    net.deliver_all()
    net.process(2)
    net.deliver_all()
    net.persist(1)
    _pump(net, 6)
    r.cfg.max_size_per_msg = 1
    net.partition([1, 3], [2], [4], [5])
    _feed(net, 1, 3, e - 1)
    net.queue.clear()
    net.crash(1, lose_tail=False)
    net.partition([1, 2], [3, 4, 5])
    _try_win(net, 3)


def campaign_unapplied_conf() -> None:
    """No campaign with committed, unapplied membership changes. S3, cut off,
    misses "add 4", "add 5" and an entry E committed by {1,4,5}. S1 then sends
    S3 the two changes (commit index included) but not E, and S3 times out
    before applying them. The driver sends a Ready's messages before its
    entries are applied (the apply runs in a worker meanwhile), so S3's vote
    requests leave, and the answers are counted, while S3 still has its stale
    {1,2,3}: S2 alone makes it leader, and it lacks E."""
    net = _three(hold_while_pending=False)
    _win(net, 1)
    _pump(net)
    net.partition([1, 2, 4, 5], [3])
    r = net.raft(1)
    a = _add(r, 4)
    _pump(net, 30)
    b = _add(r, 5)
    _pump(net, 30)
    assert a is not None and b is not None
    net.partition([1, 4, 5], [2], [3])
    e = net.propose(1, b"E")
    _pump(net, 20)
    assert e is not None and net.raft(1).applied >= e, net.raft(1).applied
    net.partition([1, 3], [2], [4, 5])
    r.cfg.max_size_per_msg = 50  # both changes (25 bytes each) in one append, not E
    _feed(net, 1, 3, b, apply=False)
    net.partition([2, 3], [1, 4, 5])
    net.raft(3).campaign()
    _send_before_apply(net, 3)
    for _ in range(3):
        net.process(2)
        net.deliver_all()
        net.checker.check(net)
    _finish_apply(net, 3)
    _pump(net, 4)


def _send_before_apply(net: Network, nid: int) -> None:
    """The driver's order: persist a Ready, send its messages, apply later."""
    from raft.core import storage_append_resp

    net.take_ready(nid)
    n = net.nodes[nid]
    rd = n.pending
    assert rd is not None and n.raft is not None
    net._fsync(n, rd)
    resp = storage_append_resp(rd)
    if resp is not None:
        n.raft.step(resp)
    net.queue.extend(rd.messages)
    net.sent.extend(rd.messages)
    rd.messages = []


def _finish_apply(net: Network, nid: int) -> None:
    n = net.nodes[nid]
    rd = n.pending
    assert rd is not None and n.raft is not None
    for e in rd.committed_entries:
        net._apply(n, e)
    n.read_states.extend(rd.read_states)
    n.pending = None
    n.raft.advance(rd)


def _try_win(net: Network, nid: int, pending: bool = False) -> None:
    """Campaign once; the checker judges whatever leader comes out."""
    net.raft(nid).campaign()
    for _ in range(3):
        for x in net.nodes:
            if net.nodes[x].raft is not None and not (pending and x == nid):
                net.process(x)
        net.deliver_all({MsgType.VOTE, MsgType.VOTE_RESP, MsgType.PRE_VOTE,
                         MsgType.PRE_VOTE_RESP})
        net.checker.check(net)
    net.persist(nid)
    _pump(net, 4)


def stale_leader_read() -> None:
    """ReadIndex needs a heartbeat round: a leader cut off from the others
    (check-quorum off, so it keeps believing) must not answer a read from its
    own commit index, which a new leader has already passed."""
    from tests.raft.network import Violation

    net = Network((1, 2, 3), seed=1, pre_vote=False, check_quorum=False, election_tick=10)
    _win(net, 1)
    _pump(net)
    net.partition([1], [2, 3])
    _win(net, 3)
    net.propose(3, b"X")
    _pump(net, 6)
    committed = net.raft(3).commit
    net.raft(1).read_index(b"r1")
    _pump(net, 6)
    for rs in net.nodes[1].read_states:
        if rs.index < committed:
            raise Violation(f"read linearizability: node 1 answered a read at {rs.index}, "
                            f"after {committed} was committed")


def leader_commit_before_fsync() -> None:
    """The leader counts its own entry only once fsynced. Leader S1's append
    of X leaves before its fsync (allowed); S2 stores and acks X while S1's
    write is still in flight. Counting itself, S1 would call X committed
    with S2 alone. S1 then loses power, and X with it; S3 wins with S1's vote
    and puts Y at X's index: an index whose committed entry changed."""
    from tests.raft.network import Violation

    net = Network((1, 2, 3), seed=1, pre_vote=False, check_quorum=False, election_tick=10,
                  leader_sends_early=True, hold_while_pending=False)
    _win(net, 1)
    _pump(net)
    x = net.propose(1, b"X")
    assert x is not None
    net.partition([1, 2], [3])
    net.take_ready(1)  # X is being written on S1; its append leaves early
    net.deliver_all({MsgType.APP})
    net.process(2)
    net.deliver_all({MsgType.APP_RESP})
    claimed = net.raft(1).commit >= x  # what S1 believes committed before its fsync
    net.crash(1, lose_tail=True)
    net.restart(1)
    net.partition([1, 3], [2])
    _win(net, 3)
    net.propose(3, b"Y")
    _pump(net, 6)
    r3 = net.raft(3)
    if claimed and r3.commit >= x and r3.log.slice(x, x + 1)[0].data != b"X":
        raise Violation(f"state machine safety: leader 1 counted X committed at {x}, "
                        f"then {r3.log.slice(x, x + 1)[0].data!r} was committed there")


def stale_conf_after_snapshot() -> None:
    """Issue 6 defect 1. S3 persists and acknowledges "add 4" and learns it
    is committed, but has not applied it yet (its apply runs after the send).
    Meanwhile S1 removes 4 again and compacts; S3 receives S1's snapshot, whose
    configuration is {1,2,3}. Finishing the old Ready must not re-apply the
    older "add 4" on top of it."""
    from tests.raft.network import Violation

    net = _three(hold_while_pending=False)
    _win(net, 1)
    _pump(net)
    r = net.raft(1)
    net.partition([1, 2, 4, 5], [3])
    k = _add(r, 4)
    _pump(net, 30)
    assert k is not None
    net.partition([1, 3], [2], [4, 5])
    _feed(net, 1, 3, k, apply=False)
    _send_before_apply(net, 3)  # "add 4" durable and acked on S3, not applied
    net.deliver_all({MsgType.APP_RESP})
    net.partition([1, 2, 4, 5], [3])
    d = r.propose_conf_change(ConfChange(ConfChangeType.REMOVE, 4))
    _pump(net, 30)
    net.propose(1, b"after")
    _pump(net, 10)
    assert d is not None and r.applied > d, (d, r.applied)
    net.compact(1)
    net.partition([1, 3], [2, 4, 5])
    # S1 probes S3 again (as after its next heartbeat answer): S3's entries are
    # compacted away, so the probe is a snapshot. It reaches S3 mid-apply.
    r.prs[3].become_probe()
    r._send_append(3)
    net.process(1)
    net.deliver_all({MsgType.SNAP})
    _finish_apply(net, 3)
    want = set(r.conf_state.voters)
    have = set(net.raft(3).conf_state.voters)
    if net.raft(3).log.first_index() > k and have != want:
        raise Violation(f"membership: node 3 has voters {sorted(have)} after a snapshot "
                        f"with {sorted(want)}")
    _pump(net, 4)


SCENARIOS: dict[str, Callable[[], None]] = {
    "figure8": figure8,
    "two-conf-changes": two_conf_changes,
    "campaign-unapplied-conf": campaign_unapplied_conf,
    "stale-leader-read": stale_leader_read,
    "leader-commit-before-fsync": leader_commit_before_fsync,
    "stale-conf-after-snapshot": stale_conf_after_snapshot,
}

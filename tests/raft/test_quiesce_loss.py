"""A follower that misses the last commit of a group going quiet still applies it.

The leader quiesces with one HEARTBEAT(QUIESCE) carrying the final commit; the
commit-only append before it may be lost too (a lane handover drops what is in
flight). The follower is then not quiesced: it keeps counting ticks, and its
pre-vote wakes the leader, whose wake-up heartbeat carries the commit. Bounded:
within two election timeouts, and without a new leader (docs/notes/lag1.md)."""

from __future__ import annotations

from raft.core import QUIESCE
from raft.types import MsgType
from tests.raft.network import Network
from tests.raft.test_raft_core import settle

ELECTION = 20


def _run_dropping(net: Network, lost) -> None:
    """Stabilize the network, dropping every message `lost` matches."""
    for _ in range(1000):
        busy = False
        for nid in net.nodes:
            busy |= net.process(nid)
        net.queue = [m for m in net.queue if not lost(m)]
        if net.queue:
            net.deliver_all()
            busy = True
        if not busy:
            return
    raise AssertionError("network did not stabilize")


def test_a_lost_quiesce_heartbeat_and_commit_append_delay_the_last_apply_only_boundedly():
    net = Network([1, 2, 3], seed=31, election_tick=ELECTION)
    net.elect(1)
    net.propose(1, b"first")
    net.stabilize()
    term = net.raft(1).term
    last = net.propose(1, b"last")
    assert last is not None
    # Node 3 gets the entry and acknowledges it; the append that tells it the commit is lost.
    _run_dropping(net, lambda m: m.to == 3 and m.type is MsgType.APP and not m.entries)
    lead = net.raft(1)
    assert lead.commit == last and net.raft(3).commit == last - 1
    assert lead.can_quiesce() and lead.quiesce()
    _run_dropping(net, lambda m: m.to == 3 and m.context == QUIESCE)  # and the QUIESCE beat
    assert net.raft(2).quiesced and not net.raft(3).quiesced
    ticks = 0
    while net.raft(3).applied != last and ticks < 2 * ELECTION:
        settle(net, 1)
        ticks += 1
    assert net.raft(3).applied == last, f"node 3 applied {net.raft(3).applied}, not {last}"
    assert net.leader() == 1 and net.raft(1).term == term, "a needless election"

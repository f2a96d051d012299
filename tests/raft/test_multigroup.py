"""MultiRaft: three drivers in one process, real NodeLogs (fsync) and real gRPC on loopback."""

from __future__ import annotations

import asyncio

import pytest

from raft import multigroup
from raft.multigroup import MultiRaft, NotLeader
from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)


class AppendLog:
    """A state machine that records every applied entry, in order."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, bytes]] = []
        self.leaders: list[tuple[int, int]] = []
        self.restored = 0

    def apply(self, index: int, data: bytes) -> None:
        assert not self.entries or index > self.entries[-1][0], "applied out of order"
        self.entries.append((index, data))

    def snapshot_to(self, path: str) -> int:
        entries = list(self.entries)  # one C-level copy: consistent even beside apply()
        with open(path, "wb") as f:
            for i, d in entries:
                f.write(len(d).to_bytes(4, "big") + i.to_bytes(8, "big") + d)
        return entries[-1][0] if entries else 0

    def restore_from(self, path: str) -> None:
        self.restored += 1
        self.entries = []
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):
            n = int.from_bytes(data[pos:pos + 4], "big")
            i = int.from_bytes(data[pos + 4:pos + 12], "big")
            self.entries.append((i, data[pos + 12:pos + 12 + n]))
            pos += 12 + n

    def on_leader_change(self, leader_id: int, term: int) -> None:
        self.leaders.append((leader_id, term))

    def datas(self) -> list[bytes]:
        return [d for _, d in self.entries]


class Cluster:
    def __init__(self, tmp, n: int = 3, **kw) -> None:
        self.tmp = tmp
        self.kw = kw
        self.addrs = {i: f"127.0.0.1:{free_port()}" for i in range(1, n + 1)}
        self.nodes: dict[int, MultiRaft] = {}
        self.sms: dict[int, dict[str, AppendLog]] = {}

    async def start(self, nid: int, groups: list[str]) -> MultiRaft:
        mr = multigroup.create(nid, str(self.tmp / f"n{nid}"), self.addrs[nid], self.addrs,
                               tick_interval_s=0.05, **self.kw)
        self.sms[nid] = {}
        for g in groups:
            self.sms[nid][g] = AppendLog()
            mr.add_group(g, list(self.addrs), state_machine=self.sms[nid][g])
        await mr.start()
        self.nodes[nid] = mr
        return mr

    async def stop(self, nid: int) -> None:
        await self.nodes.pop(nid).stop()

    async def leader_of(self, group: str, timeout: float = 30.0) -> MultiRaft:
        async with asyncio.timeout(timeout):
            while True:
                for mr in self.nodes.values():
                    if mr.status(group)["state"] == "leader":
                        return mr
                await asyncio.sleep(0.02)

    async def propose(self, group: str, data: bytes, timeout: float = 30.0) -> int:
        """Propose through whichever node leads, retrying on NotLeader."""
        async with asyncio.timeout(timeout):
            while True:
                mr = await self.leader_of(group)
                try:
                    return await mr.propose(group, data)
                except (NotLeader, multigroup.ProposalDropped):
                    await asyncio.sleep(0.05)

    async def until(self, pred, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while not pred():
                await asyncio.sleep(0.02)

    async def close(self) -> None:
        for nid in list(self.nodes):
            await self.stop(nid)


async def test_many_groups_apply_same_sequence_with_group_commit(tmp_path):
    groups = [f"g{i}" for i in range(50)]
    c = Cluster(tmp_path, snapshot_every=100_000)
    try:
        for nid in (1, 2, 3):
            await c.start(nid, groups)
        for g in groups:
            await c.leader_of(g)
        leaders = {g: await c.leader_of(g) for g in groups}
        logs = {nid: mr.node_log.stats for nid, mr in c.nodes.items()}
        before = {nid: (s.fsyncs, c.nodes[nid].stats.syncs) for nid, s in logs.items()}

        async def writer(g: str) -> list[int]:
            return [await leaders[g].propose(g, f"{g}-{k}".encode()) for k in range(20)]

        async def burst(g: str) -> list[int]:
            return list(await asyncio.gather(
                *(leaders[g].propose(g, f"{g}-b{k}".encode()) for k in range(20))))

        results = await asyncio.gather(*(writer(g) for g in groups), *(burst(g) for g in groups))
        assert all(len(r) == 20 for r in results)
        for g in groups:
            want = [f"{g}-{k}".encode() for k in range(20)]
            await c.until(lambda g=g: all(len(c.sms[n][g].entries) >= 40 for n in c.nodes))
            seqs = [c.sms[n][g].entries for n in c.nodes]
            assert seqs[0] == seqs[1] == seqs[2], g
            writes = [d for d in c.sms[1][g].datas() if b"-b" not in d]
            assert writes == want
        for nid, mr in c.nodes.items():
            f0, s0 = before[nid]
            syncs = mr.stats.syncs - s0
            # One fsync per drain pass, whatever the number of groups in it.
            assert syncs > 0
            assert mr.node_log.stats.fsyncs - f0 == syncs
            assert mr.stats.max_groups_per_sync > 1
            assert mr.stats.synced_readies > mr.stats.syncs
    finally:
        await c.close()


async def test_leader_stop_new_leader_keeps_acked_entries(tmp_path):
    c = Cluster(tmp_path)
    try:
        for nid in (1, 2, 3):
            await c.start(nid, ["g"])
        acked = [await c.propose("g", f"a{k}".encode()) for k in range(30)]
        assert acked == sorted(acked)
        old = await c.leader_of("g")
        await c.stop(old.node_id)
        new = await c.leader_of("g")
        assert new.node_id != old.node_id
        for k in range(10):
            await c.propose("g", f"b{k}".encode())
        for nid in c.nodes:
            datas = c.sms[nid]["g"].datas()
            assert [f"a{k}".encode() for k in range(30)] == datas[:30]
        # The stopped node restarts from its WAL and catches up.
        await c.start(old.node_id, ["g"])
        await c.until(lambda: len(c.sms[old.node_id]["g"].entries) == 40)
        assert c.sms[old.node_id]["g"].entries == c.sms[new.node_id]["g"].entries
    finally:
        await c.close()


async def test_not_leader_and_read_index(tmp_path):
    c = Cluster(tmp_path)
    try:
        for nid in (1, 2, 3):
            await c.start(nid, ["g"])
        leader = await c.leader_of("g")
        follower = next(mr for mr in c.nodes.values() if mr is not leader)
        await c.until(lambda: follower.leader("g") == leader.node_id)
        with pytest.raises(NotLeader) as ei:
            await follower.propose("g", b"x")
        assert ei.value.leader_id == leader.node_id
        idx = await leader.propose("g", b"y")
        await follower.read_index("g")
        assert follower.status("g")["applied"] >= idx
        assert (idx, b"y") in c.sms[follower.node_id]["g"].entries
    finally:
        await c.close()


async def test_snapshot_catch_up_and_quiescence(tmp_path):
    c = Cluster(tmp_path, snapshot_every=20)
    try:
        for nid in (1, 2):
            await c.start(nid, ["g"])
        for k in range(60):
            await c.propose("g", f"e{k}".encode())
        leader = await c.leader_of("g")
        await c.until(lambda: leader.status("g")["first_index"] > 2)
        await c.start(3, ["g"])  # far behind a compacted log: needs the snapshot
        want = c.sms[leader.node_id]["g"].entries
        # (the image is restored off the loop, before the driver counts the install)
        await c.until(lambda: c.sms[3]["g"].entries[-60:] == want[-60:]
                      and c.nodes[3].stats.snapshots_installed >= 1)
        assert c.sms[3]["g"].restored >= 1
        # Idle: every member quiesces, so the ticker stops ticking the group.
        await c.until(lambda: all(mr.status("g")["quiesced"] for mr in c.nodes.values()))
        assert leader.leader("g") == leader.node_id
    finally:
        await c.close()


async def test_membership_and_transfer(tmp_path):
    c = Cluster(tmp_path, n=4)
    try:
        for nid in (1, 2, 3):
            mr = multigroup.create(nid, str(tmp_path / f"n{nid}"), c.addrs[nid], c.addrs,
                                   tick_interval_s=0.05)
            c.sms[nid] = {"g": AppendLog()}
            mr.add_group("g", [1, 2, 3], state_machine=c.sms[nid]["g"])
            await mr.start()
            c.nodes[nid] = mr
        await c.propose("g", b"before")
        mr4 = multigroup.create(4, str(tmp_path / "n4"), c.addrs[4], c.addrs,
                                tick_interval_s=0.05)
        c.sms[4] = {"g": AppendLog()}
        mr4.add_group("g", [1, 2, 3], state_machine=c.sms[4]["g"])  # not a member: joins empty
        await mr4.start()
        c.nodes[4] = mr4
        leader = await c.leader_of("g")
        await leader.add_member("g", 4)
        await c.propose("g", b"after")
        await c.until(lambda: c.sms[4]["g"].datas()[-2:] == [b"before", b"after"])
        assert mr4.status("g")["voters"] == [1, 2, 3, 4]
        await leader.transfer_leader("g", 4)
        assert mr4.leader("g") == 4
        await mr4.remove_member("g", leader.node_id)
        await c.until(lambda: c.nodes[2 if leader.node_id != 2 else 3].status("g")["voters"]
                      == sorted({1, 2, 3, 4} - {leader.node_id}))
        await c.propose("g", b"last")
    finally:
        await c.close()


async def test_r1_group_commits_on_its_own_fsync_and_survives_restart(tmp_path):
    # R1 streams use the same interface: one voter, quorum of one, still fsync before ack.
    addr = {1: f"127.0.0.1:{free_port()}"}

    async def start() -> tuple[MultiRaft, AppendLog]:
        mr = multigroup.create(1, str(tmp_path / "n1"), addr[1], addr, tick_interval_s=0.05)
        sm = AppendLog()
        mr.add_group("r1", [1], state_machine=sm)
        await mr.start()
        assert await mr.wait_leader("r1", timeout=30) == 1
        return mr, sm

    mr, sm = await start()
    try:
        acked = [await mr.propose("r1", b"m%d" % i) for i in range(20)]
        assert acked == sorted(acked) and len(set(acked)) == 20
        assert mr.node_log.stats.fsyncs >= 1  # committed only after its own fsync
        assert sm.datas() == [b"m%d" % i for i in range(20)]
    finally:
        await mr.stop()
    mr, sm = await start()
    try:
        async with asyncio.timeout(30):
            while sm.datas() != [b"m%d" % i for i in range(20)]:
                await asyncio.sleep(0.02)
        assert await mr.propose("r1", b"after") > acked[-1]
    finally:
        await mr.stop()


async def _single(tmp, **kw) -> MultiRaft:
    from raft.storage import NodeLog

    mr = MultiRaft(1, NodeLog(str(tmp / "wal")), _NoPeers(), snap_dir=str(tmp / "snap"),
                   tick_interval_s=0.01, **kw)
    await mr.start()
    return mr


class _NoPeers:
    """The transport of a one-node cluster: nothing to send."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def send(self, msgs) -> None: ...
    def beat(self) -> None: ...
    def last_seen(self, peer: int) -> float: raise KeyError(peer)
    def add_peer(self, node: int, addr: str) -> None: ...
    def remove_peer(self, node: int) -> None: ...


async def test_group_removed_can_be_created_again_under_the_same_name(tmp_path):
    """Issue 6, defect 6: JetStream deletes and re-creates streams by name."""
    mr = await _single(tmp_path, snapshot_every=100_000)
    try:
        old = AppendLog()
        mr.add_group("S-ORDERS", [1], state_machine=old)
        await mr.wait_leader("S-ORDERS")
        for k in range(5):
            await mr.propose("S-ORDERS", b"old-%d" % k)
        mr.snapshot_now("S-ORDERS")  # the old incarnation leaves snapshot files too
        await c_until(lambda: mr.status("S-ORDERS")["first_index"] > 1)
        await mr.propose("S-ORDERS", b"old-5")
        mr.remove_group("S-ORDERS")
        new = AppendLog()
        mr.add_group("S-ORDERS", [1], state_machine=new)
        await mr.wait_leader("S-ORDERS")
        idx = await mr.propose("S-ORDERS", b"new-0")
        assert new.datas() == [b"new-0"] and mr.status("S-ORDERS")["first_index"] == 2
        assert idx <= 3  # a fresh log: bootstrap at 1, the leader's no-op, then ours
        await mr.removed("S-ORDERS")
    finally:
        await mr.stop()
    # After a restart the group is the new incarnation only.
    mr = await _single(tmp_path, snapshot_every=100_000)
    try:
        again = AppendLog()
        mr.add_group("S-ORDERS", [1], state_machine=again)
        await mr.wait_leader("S-ORDERS")
        await c_until(lambda: again.datas() == [b"new-0"])
    finally:
        await mr.stop()


async def c_until(pred, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.01)


async def test_read_index_gives_up_after_its_timeout(tmp_path):
    """A leader cut off from its followers cannot confirm its lease: the read
    must fail with TimeoutError, not wait forever (issue 6: bounds)."""
    c = Cluster(tmp_path, election_tick=40)  # step-down by check-quorum takes >= 2 s
    try:
        for nid in (1, 2, 3):
            await c.start(nid, ["g"])
        await c.propose("g", b"x")
        leader = await c.leader_of("g")
        await leader.read_index("g", timeout=10)  # connected: answered
        for nid in c.addrs:
            if nid != leader.node_id:
                leader.remove_peer(nid)
        with pytest.raises(TimeoutError):
            await leader.read_index("g", timeout=0.2)
        assert leader.status("g")["state"] == "leader"
        assert not leader._groups["g"].reads and not leader._groups["g"].read_waits
    finally:
        await c.close()


async def test_a_leader_that_removes_itself_settles_every_pending_proposal(tmp_path):
    """Entries a leader appended after its own removal may never reach it
    again (it is no longer sent anything): their proposals must fail with
    ProposalDropped (outcome unknown), not hang. Found by the simulation
    (tests/sim, seed 21): a final proposal on a self-removed leader."""
    c = Cluster(tmp_path)
    try:
        for nid in (1, 2, 3):
            await c.start(nid, ["g"])
        await c.propose("g", b"before")
        leader = await c.leader_of("g")
        stop = asyncio.Event()
        outcomes: list[str] = []

        async def stream() -> None:
            k = 0
            while not stop.is_set():
                try:
                    await leader.propose("g", b"p%d" % k)
                    outcomes.append("ok")
                except NotLeader:
                    return
                except multigroup.ProposalDropped:
                    outcomes.append("dropped")
                k += 1
        streams = [asyncio.ensure_future(stream()) for _ in range(8)]
        await asyncio.sleep(0.05)
        await leader.remove_member("g", leader.node_id)
        await asyncio.sleep(0.5)
        stop.set()
        async with asyncio.timeout(10):  # without the fix some never return
            await asyncio.gather(*streams)
        assert "ok" in outcomes
    finally:
        await c.close()


async def test_a_follower_acks_the_next_append_before_it_applies_the_previous_entry(tmp_path):
    """Lone proposals, one at a time: entry k+1's append tells a follower that k is
    committed. Its APP_RESP for k+1 (which the leader's commit of k+1 waits for) must leave
    before its inline apply of k, which nobody waits for (the driver's `_reply_before_apply`)."""
    from raft.types import MsgType

    c = Cluster(tmp_path, snapshot_every=100_000)
    try:
        for nid in (1, 2, 3):
            await c.start(nid, ["g"])
        leader = await c.leader_of("g")
        await leader.propose("g", b"warm-up")
        follower = next(n for nid, n in c.nodes.items() if n is not leader)
        fid = next(nid for nid, n in c.nodes.items() if n is follower)
        events: list[tuple[str, int]] = []
        sm = c.sms[fid]["g"]
        orig_apply, orig_send = sm.apply, follower.transport.send

        def apply(index: int, data: bytes) -> None:
            events.append(("apply", index))
            orig_apply(index, data)

        def send(msgs):
            events.extend(("resp", m.index) for m in msgs
                          if m.type is MsgType.APP_RESP and not m.reject)
            orig_send(msgs)

        sm.apply, follower.transport.send = apply, send
        first = await leader.propose("g", b"x0")
        for k in range(1, 30):
            await leader.propose("g", f"x{k}".encode())
        await c.until(lambda: ("apply", first + 28) in events)
        pos = {e: i for i, e in reversed(list(enumerate(events)))}
        # Applied after the ack of the next entry (same pass), or before it (the commit came
        # on its own, a lazy commit-index append): never the ack held back by the apply.
        acked_first = [j for j in range(first, first + 29)
                       if ("resp", j + 1) in pos and ("apply", j) in pos
                       and pos[("resp", j + 1)] < pos[("apply", j)]]
        assert len(acked_first) >= 10, events
    finally:
        await c.close()

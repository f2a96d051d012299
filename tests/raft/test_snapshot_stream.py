"""File-based snapshots: LMDB images taken beside live applies, streamed from disk in
chunks to an empty member, with memory bounded by the chunk and not by the state."""

from __future__ import annotations

import asyncio
import os
import threading
import tracemalloc

import pytest

from raft import multigroup, snapfile
from raft.multigroup import MultiRaft, NotLeader, ProposalDropped
from raft.node import CountSM, LmdbSM
from raft.types import ConfState, Message, MsgType, Snapshot, SnapshotMeta
from tests.ports import free_port

pytestmark = pytest.mark.timeout(180)


# ---- the LMDB state machine and the snapshot files alone -------------------------------


def test_lmdb_image_is_exact_while_applies_continue(tmp_path):
    """Images taken in a thread during a stream of applies hold exactly the entries
    up to the index they report: nothing newer, nothing missing."""
    sm = LmdbSM(str(tmp_path / "sm"))
    images: list[tuple[int, str]] = []
    done = threading.Event()

    def snapshots() -> None:
        k = 0
        while not done.is_set() and k < 40:
            path = str(tmp_path / f"img{k}")
            images.append((sm.snapshot_to(path), path))
            k += 1

    t = threading.Thread(target=snapshots)
    t.start()
    for i in range(1, 3001):
        sm.apply(i, i.to_bytes(4, "big") * 64)
    done.set()
    t.join()
    sm.apply(5, b"again")  # re-applied after a restart: skipped
    assert sm.entries()[4] == (5, (5).to_bytes(4, "big") * 64)
    assert len({idx for idx, _ in images}) > 1, "images should see different indexes"
    other = LmdbSM(str(tmp_path / "other"))
    for idx, path in images:
        other.restore_from(path)
        assert other.applied == idx
        assert [i for i, _ in other.entries()] == list(range(1, idx + 1))
    other.restore_from(snapfile_empty(tmp_path))
    assert other.entries() == [] and other.applied == 0
    sm.close()
    other.close()


def test_count_state_machine_image_round_trip(tmp_path):
    sm = CountSM()
    for i in (3, 4, 4, 9):  # 4 twice: a re-apply is skipped
        sm.apply(i, b"x")
    assert sm.snapshot_to(str(tmp_path / "img")) == 9
    other = CountSM()
    other.restore_from(str(tmp_path / "img"))
    assert other.state == (3, 9)
    other.restore_from(snapfile_empty(tmp_path))
    assert other.state == (0, 0)


def snapfile_empty(tmp_path) -> str:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    return str(path)


def test_snapfile_commit_load_and_corruption(tmp_path):
    d = str(tmp_path / "snap")
    meta = SnapshotMeta(42, 7, ConfState((1, 2, 3), (9,)))
    part = snapfile.new_part(d, "S-X")
    with open(part, "wb") as f:
        f.write(os.urandom(700_000))
    size, crc = snapfile.seal(part)
    stored = snapfile.commit(d, "S-X", meta, part, size, crc)
    assert snapfile.load(d, "S-X") == stored and stored.size == 700_000
    # A streamed copy (head + data) lands intact through the receiver.
    rx = snapfile.Receiver(d, "S-X")
    fd = os.open(stored.path, os.O_RDONLY)
    stream = snapfile.encode_head(meta, size, crc) + b"".join(snapfile.read_chunks(fd, size))
    os.close(fd)
    for k in range(0, len(stream), 1000):
        rx.feed(stream[k:k + 1000])
    rx.finish()
    assert rx.meta == meta and (rx.size, rx.crc) == (size, crc)
    # One that stops short is refused.
    short = snapfile.Receiver(d, "S-X")
    short.feed(stream[:-1])
    with pytest.raises(snapfile.SnapshotFileError):
        short.finish()
    # A flipped bit in the committed data file is caught at load.
    with open(stored.path, "r+b") as f:
        f.seek(123_456)
        b = f.read(1)
        f.seek(123_456)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(snapfile.SnapshotFileError):
        snapfile.load(d, "S-X")
    snapfile.remove(d, "S-X")
    assert snapfile.load(d, "S-X") is None
    assert not [n for n in os.listdir(d) if n.startswith(b"S-X".hex())]


# ---- a large snapshot to an empty member -------------------------------------------------


class Probe(LmdbSM):
    """Records, at every apply, how many snapshot bytes node 3 had received so far."""

    def __init__(self, dir: str) -> None:
        super().__init__(dir)
        self.node: MultiRaft | None = None
        self.seen: list[int] = []

    def apply_batch(self, items: list[tuple[int, bytes]]) -> None:
        super().apply_batch(items)
        if self.node is not None:
            self.seen.extend([self.node.stats.snapshot_bytes_received] * len(items))


class Exporting(LmdbSM):
    """A durable machine whose compaction writes only a marker (the store is the state);
    the image a member catches up from is exported when the driver asks for it."""

    exports_images = True
    MARK = b"MARK"

    def snapshot_to(self, path: str) -> int:
        held = self.applied_index()
        self.store.sync()
        with open(path, "wb") as f:
            f.write(self.MARK + held.to_bytes(8, "big"))
        return held

    def export_to(self, path: str) -> int:
        self.exported = getattr(self, "exported", 0) + 1
        return super().snapshot_to(path)

    def restore_from(self, path: str) -> None:
        with open(path, "rb") as f:
            head = f.read(12)
        if head[:4] == self.MARK:  # a restart: the store must hold what the marker names
            want = int.from_bytes(head[4:], "big")
            if self.applied_index() < want:
                raise RuntimeError(f"store holds {self.applied_index()}, marker {want}")
            return
        super().restore_from(path)


class Nodes:
    def __init__(self, tmp, big: type[LmdbSM] = LmdbSM) -> None:
        self.tmp = tmp
        self.big = big
        self.addrs = {i: f"127.0.0.1:{free_port()}" for i in (1, 2, 3)}
        self.nodes: dict[int, MultiRaft] = {}
        self.sms: dict[int, dict[str, LmdbSM]] = {}

    async def start(self, nid: int) -> MultiRaft:
        mr = multigroup.create(nid, str(self.tmp / f"n{nid}"), self.addrs[nid], self.addrs,
                               tick_interval_s=0.05, snapshot_every=10**9)
        sms = {"big": self.big(str(self.tmp / f"n{nid}" / "sm" / "big")),
               "h": Probe(str(self.tmp / f"n{nid}" / "sm" / "h"))}
        for g, sm in sms.items():
            mr.add_group(g, [1, 2, 3], state_machine=sm)
        await mr.start()
        self.nodes[nid], self.sms[nid] = mr, sms
        return mr

    async def stop(self, nid: int) -> None:
        await self.nodes.pop(nid).stop()
        for sm in self.sms.pop(nid).values():
            sm.close()

    async def leader(self, group: str) -> MultiRaft:
        async with asyncio.timeout(30):
            while True:
                for mr in self.nodes.values():
                    if mr.status(group)["state"] == "leader":
                        return mr
                await asyncio.sleep(0.02)

    async def propose(self, group: str, data: bytes) -> None:
        async with asyncio.timeout(60):
            while True:
                try:
                    await (await self.leader(group)).propose(group, data)
                    return
                except (NotLeader, ProposalDropped):
                    await asyncio.sleep(0.05)


async def until(pred, timeout: float = 90.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.02)


async def test_large_snapshot_streams_to_empty_member_with_bounded_memory(tmp_path):
    c = Nodes(tmp_path)
    try:
        for nid in (1, 2):
            await c.start(nid)
        entry = 256 << 10
        for _ in range(16):  # 32 MiB of incompressible entries, 8 in flight
            await asyncio.gather(*(c.propose("big", os.urandom(entry)) for _ in range(8)))
        leader = await c.leader("big")
        before = leader.stats.snapshots_taken
        leader.snapshot_now("big")
        await until(lambda: leader.stats.snapshots_taken > before)
        first = leader.status("big")["first_index"]
        assert first > 100  # compacted: a new member can only start from the snapshot
        image = leader._groups["big"].snap  # noqa: SLF001 (the committed file)
        assert image is not None and image.size > 32 * entry

        stop = asyncio.Event()
        h_acked = 0

        async def other_group() -> None:
            nonlocal h_acked
            while not stop.is_set():
                await c.propose("h", b"tick-%d" % h_acked)
                h_acked += 1

        writer = asyncio.ensure_future(other_group())
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            n3 = await c.start(3)
            c.sms[3]["h"].node = n3
            want = c.sms[leader.node_id]["big"].applied
            await until(lambda: c.sms[3]["big"].applied >= want
                        and n3.stats.snapshots_installed >= 1)  # (restored off the loop)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
            stop.set()
            await writer
        assert n3.stats.snapshot_bytes_received >= image.size
        # Sender and receiver (both in this process) never held the image.
        assert peak < image.size / 4, (peak, image.size)
        # Group h kept committing on node 3 while the big transfer was half done.
        total = n3.stats.snapshot_bytes_received
        assert any(0 < seen < total for seen in c.sms[3]["h"].seen), c.sms[3]["h"].seen[:50]
        assert h_acked > 0
        assert c.sms[3]["big"].entries() == c.sms[leader.node_id]["big"].entries()

        # Restarted, node 3 restores its received snapshot file and still agrees.
        await c.propose("big", b"after")
        await c.stop(3)
        await c.start(3)
        await until(lambda: c.sms[3]["big"].applied == c.sms[leader.node_id]["big"].applied)
        assert c.sms[3]["big"].entries() == c.sms[leader.node_id]["big"].entries()
    finally:
        for nid in list(c.nodes):
            await c.stop(nid)


async def test_marker_compaction_exports_an_image_only_for_a_member_that_needs_it(tmp_path):
    """Compaction of a durable machine writes a marker (a few bytes, whatever the state);
    a member that joins after it gets an image exported for that transfer, at the leader's
    applied index (past the marker), streamed in chunks; the temporary file goes after."""
    c = Nodes(tmp_path, big=Exporting)
    try:
        for nid in (1, 2):
            await c.start(nid)
        for _ in range(40):
            await asyncio.gather(*(c.propose("big", os.urandom(16 << 10)) for _ in range(4)))
        leader = await c.leader("big")
        before = leader.stats.snapshots_taken
        leader.snapshot_now("big")
        await until(lambda: leader.stats.snapshots_taken > before)
        stored = leader._groups["big"].snap  # noqa: SLF001 (the committed file)
        assert stored is not None and stored.size == 12, "compaction dumped the state"
        assert leader.status("big")["first_index"] > 100
        for k in range(20):  # past the marker: the export holds these too
            await c.propose("big", b"after-%d" % k)
        lsm = c.sms[leader.node_id]["big"]
        assert getattr(lsm, "exported", 0) == 0, "no member needed an image yet"
        # Two transfers at once (two members joining) share one export.
        msg = Message(MsgType.SNAP, "big", frm=leader.node_id, to=3, snapshot=Snapshot(stored.meta))

        async def pull() -> bytes:
            return b"".join([piece async for piece in leader.snapshot_source(msg)])

        one, two = await asyncio.gather(pull(), pull())
        assert one == two and len(one) > 160 * (16 << 10)
        assert lsm.exported == 1 and leader.stats.images_exported == 1
        snap_dir = tmp_path / f"n{leader.node_id}" / "snap"
        assert not [n for n in os.listdir(snap_dir) if n.endswith(".export")]
        n3 = await c.start(3)
        # (the image is restored off the loop: the state machine's index moves before the
        # driver's bookkeeping of the install, so wait for both)
        await until(lambda: c.sms[3]["big"].applied >= lsm.applied
                    and n3.stats.snapshots_installed >= 1)
        assert lsm.exported >= 2 and leader.stats.images_exported >= 2
        assert n3.stats.snapshot_bytes_received > 160 * (16 << 10)
        assert c.sms[3]["big"].entries() == lsm.entries()
        assert not [n for n in os.listdir(snap_dir) if n.endswith(".export")]
        # Node 3 compacts on its own (a marker over the installed image), restarts from it.
        await c.propose("big", b"last")
        await until(lambda: c.sms[3]["big"].applied == lsm.applied)
        taken = n3.stats.snapshots_taken
        n3.snapshot_now("big")
        await until(lambda: n3.stats.snapshots_taken > taken)
        await c.stop(3)
        await c.start(3)
        await until(lambda: c.sms[3]["big"].applied == lsm.applied)
        assert c.sms[3]["big"].entries() == lsm.entries()
    finally:
        for nid in list(c.nodes):
            await c.stop(nid)


async def test_marker_over_entries_the_machine_never_saw_still_exports(tmp_path):
    """A compaction whose snapshot index is past the machine's own index (the leader's
    no-op, the bootstrap snapshot: entries a state machine is never given) must still let a
    new member catch up: the export holds the machine's index, below the snapshot's, and is
    the state at the snapshot. (chaos14: an empty R3 stream whose followers were wiped
    never got a quorum back: every transfer failed with `exported image holds index 0,
    older than the snapshot`.)"""
    c = Nodes(tmp_path, big=Exporting)
    try:
        for nid in (1, 2):
            await c.start(nid)
        await c.propose("h", b"elect")  # both groups elect; "big" gets only its no-op
        leader = await c.leader("big")
        await until(lambda: leader.status("big")["applied"] >= 2)
        lsm = c.sms[leader.node_id]["big"]
        assert lsm.applied_index() == 0, "the machine saw an entry"
        before = leader.stats.snapshots_taken
        leader.snapshot_now("big")
        await until(lambda: leader.stats.snapshots_taken > before)
        assert leader.status("big")["first_index"] > 2  # node 3 can only start from it
        n3 = await c.start(3)
        await until(lambda: n3.stats.snapshots_installed >= 1, timeout=20)
        # Node 3 now holds the same kind of snapshot (its machine still at 0): it can be the
        # source of the next member's catch-up, as a leader elected later would be.
        got = n3._groups["big"].snap  # noqa: SLF001 (the installed file)
        assert got is not None and got.path is not None and c.sms[3]["big"].applied_index() == 0
        ask = Message(MsgType.SNAP, "big", frm=3, to=1, snapshot=Snapshot(got.meta))
        assert b"".join([piece async for piece in n3.snapshot_source(ask)])
        await c.propose("big", b"after")
        await until(lambda: c.sms[3]["big"].applied == lsm.applied and lsm.applied > 0,
                    timeout=20)
        assert c.sms[3]["big"].entries() == lsm.entries()
    finally:
        for nid in list(c.nodes):
            await c.stop(nid)

"""A simulated cluster running the real driver, WAL and snapshot files.

`run(seed)` builds five nodes on one `SimLoop` (virtual time), each a real
`raft.multigroup.MultiRaft` over a real `raft.storage.NodeLog` whose `Disk`
is the shared `SimDisk`, talking through `SimNet`, with `SimExecutor` as
every worker thread. Nodes 1-3 found group "g"; 4 and 5 start empty and
may be added (they then receive a snapshot). A director coroutine takes a
seeded random action every few virtual milliseconds -- proposals, ReadIndex
reads, membership changes, leader transfers, forced snapshots, partitions,
power cuts at random moments, and crash points armed inside the storage
(at the k-th disk operation from now, or at the next operation of a given
call site) -- and runs every check of `tests/sim/checkers.py` after each
action. Crashed nodes restart from their simulated disk after a while.
At the end the network heals, every node restarts, and the cluster must
apply everything acknowledged on every member (liveness + the direct check
that no acknowledged write was lost).

The whole run is a function of the seed: `run(seed)` twice gives the same
`RunResult` (test_sim_real checks this).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import secrets
import struct
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import raft.multigroup
import raft.snapfile
from raft.log import InvariantError
from raft.multigroup import MultiRaft
from raft.storage import NodeLog
from raft.types import MsgType
from tests.sim.checkers import CORE_INVARIANT, FAIL_STOP, RECOVERY, Checker, Violation
from tests.sim.simdisk import CrashPlan, SimCrash, SimDisk, patch_modules
from tests.sim.simloop import SimClock, SimExecutor, SimLoop
from tests.sim.simnet import NetFaults, SimNet

GROUP = "g"
ALL = (1, 2, 3, 4, 5)
FOUNDERS = (1, 2, 3)
TICK_S = 0.05
ELECTION_TICK = 10


class HarnessError(Exception):
    """The simulation itself went wrong (not a Raft invariant): never a kill."""


@dataclass
class RunResult:
    seed: int
    acked: int = 0
    proposals: int = 0
    reads: int = 0
    snapshots_installed: int = 0
    snapshots_taken: int = 0
    conf_changes: int = 0
    crashes: int = 0
    disk_crashes: int = 0
    fail_stops: int = 0
    crash_contexts: set[str] = field(default_factory=set)
    crash_sites: set[str] = field(default_factory=set)
    sites_seen: set[str] = field(default_factory=set)
    segments_deleted: int = 0
    probes: int = 0  # crash images recovered after a durable segment deletion
    merged: int = 0  # merged entries applied (merge mode: `propose_quiet(merge=)`)
    virtual_s: float = 0.0
    violation: Violation | None = None
    error: str | None = None

    def fingerprint(self) -> tuple:
        return (self.acked, self.proposals, self.reads, self.snapshots_installed,
                self.conf_changes, self.crashes, self.disk_crashes, sorted(self.crash_sites),
                round(self.virtual_s, 6), None if self.violation is None else str(self.violation))


class SimSM:
    """An in-memory state machine whose images are files on the SimDisk."""

    @property
    def defer_apply(self) -> bool:
        """Odd nodes opt in to the follower hold (raft/multigroup.py FOLLOWER_DEFER_*):
        every schedule runs held and unheld followers side by side."""
        return self.node % 2 == 1

    def __init__(self, node: int, checker: Checker, disk: SimDisk) -> None:
        self.node = node
        self.checker = checker
        self.disk = disk
        self.entries: dict[int, bytes] = {}
        self.last = 0
        self.ack_pos = 0  # checkers.Checker._check_acked bookkeeping
        self.ack_wait: list[int] = []

    def apply(self, index: int, data: bytes) -> None:
        if index <= self.last:
            raise HarnessError(f"node {self.node}: apply {index} after {self.last}")
        self.checker.on_apply(self.node, index, bytes(data))
        if data[:2] == MERGED:
            self.checker.on_merged(self.node, index, bytes(data[2:]).split(b"|"))
        elif data[:1] == b"p":
            self.checker.applied_once(self.node, index, bytes(data))
        self.entries[index] = bytes(data)
        self.last = index

    def on_conf_change(self, index: int, cc: Any) -> None:
        self.checker.on_conf(self.node, index, cc.type.name, cc.node_id)

    def on_leader_change(self, leader_id: int, term: int) -> None:
        pass

    def snapshot_to(self, path: str) -> int:
        parts = [struct.pack("<Q", self.last)]
        for index, data in self.entries.items():
            parts.append(struct.pack("<QI", index, len(data)) + data)
        self.disk.write_file(path, b"".join(parts))
        return self.last

    def restore_from(self, path: str) -> None:
        buf = self.disk.read_file(path)
        entries: dict[int, bytes] = {}
        last = 0
        if buf:
            (last,) = struct.unpack_from("<Q", buf)
            pos = 8
            while pos < len(buf):
                index, n = struct.unpack_from("<QI", buf, pos)
                entries[index] = buf[pos + 12 : pos + 12 + n]
                pos += 12 + n
        self.checker.check_image(self.node, last, entries)
        self.entries, self.last = entries, last
        self.ack_pos, self.ack_wait = 0, []


@dataclass
class Node:
    id: int
    mr: MultiRaft | None = None
    sm: SimSM | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    restart_at: float | None = None
    eio_at: float | None = None  # when a WAL call of this incarnation failed with EIO
    recovery_ops: int = 3  # disk operations its last start made (where a recovery can crash)


class _SeededSecrets:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def token_bytes(self, n: int) -> bytes:
        return self.rng.getrandbits(8 * n).to_bytes(n, "big")

    def token_hex(self, n: int) -> str:
        return self.token_bytes(n).hex()


# Director actions and their base weights; each seed scales them (fault mix varies).
ACTIONS = {
    "propose": 30, "read": 6, "conf": 3, "transfer": 1, "snapshot": 2, "kill": 1.2,
    "arm": 2.5, "partition": 0.8, "heal": 1.5, "idle": 8,
}
VARIED = ("read", "conf", "transfer", "snapshot", "kill", "arm", "partition")


class Cluster:
    def __init__(self, seed: int, steps: int | None = None, merge: bool = False,
                 single: bool = False) -> None:
        self.seed = seed
        # Single mode: one node, a one-voter group (a standalone JetStream node's
        # groups, whose own fsync is the quorum): crashes, torn writes and EIO at every
        # storage call around that fsync, the commit and the apply.
        self.single = single
        self.all = (1,) if single else ALL
        self.founders = (1,) if single else FOUNDERS
        # Merge mode: a burst of proposals is quiet ones with a `merge` (one entry when
        # the drain pass takes them together) ended by an awaited one. Off: the recorded
        # schedules of the mutants stay as they were.
        self.merge = merge
        rng = random.Random(seed)
        self.rng = random.Random(rng.getrandbits(64))
        self.loop = SimLoop()
        self.disk = SimDisk(random.Random(rng.getrandbits(64)),
                            tear=rng.choice((0.3, 0.6, 0.9)), flip=rng.choice((0.0, 0.1, 0.3)))
        self.disk.on_crash = self._on_disk_crash
        self.disk.on_eio = self._on_eio
        self.disk.on_durable_unlink = self._probe_crash_image
        faults = NetFaults(drop=rng.choice((0.0, 0.01, 0.05)), dup=rng.choice((0.0, 0.01, 0.05)),
                           slow=rng.choice((0.0, 0.05, 0.2)))
        self.net = SimNet(self.loop, random.Random(rng.getrandbits(64)), faults)
        self.executor = SimExecutor(self.loop, random.Random(rng.getrandbits(64)),
                                    max_delay_s=rng.choice((0.001, 0.004, 0.02)))
        self.secrets = _SeededSecrets(random.Random(rng.getrandbits(64)))
        # The driver's ReadIndex nonces: own stream, so snapshot file names stay as they were.
        self.read_secrets = _SeededSecrets(random.Random(f"reads-{seed}"))
        self.segment_bytes = rng.choice((1500, 3000, 6000))
        self.snapshot_every = rng.choice((15, 30, 60))
        self.steps = steps if steps is not None else rng.randrange(700, 1000)
        weights = dict(ACTIONS)
        for k in VARIED:
            weights[k] *= rng.choice((0.3, 1, 1, 2))
        if single:  # the only node: down less often, or little gets acked at all
            weights["kill"] *= 0.2
            weights["arm"] *= 0.3
        self.kinds = sorted(weights)
        self.weights = [weights[k] for k in self.kinds]
        self.checker = Checker(frozenset(self.founders))
        self.nodes = {nid: Node(nid) for nid in self.all}
        self.result = RunResult(seed)
        self.removed: set[int] = set()
        self.nprop = 0
        self.clients: set[asyncio.Task[Any]] = set()
        self.failure: BaseException | None = None

    # ---- running ------------------------------------------------------------------

    def run(self) -> RunResult:
        undo = patch_modules(self.disk, [raft.multigroup])
        saved_secrets = raft.snapfile.secrets
        raft.snapfile.secrets = self.secrets
        raft.multigroup.secrets = self.read_secrets
        raft_log = logging.getLogger("raft")
        level = raft_log.level
        raft_log.setLevel(logging.CRITICAL + 1)
        asyncio.set_event_loop(self.loop)
        self.loop._default_executor = self.executor  # asyncio.to_thread, simulated
        self.loop.set_exception_handler(self._loop_error)
        try:
            self.loop.run_until_complete(self._main())
        except Violation as v:
            self.result.violation = v
        except HarnessError as e:
            self.result.error = str(e)
        finally:
            self._teardown()
            asyncio.set_event_loop(None)
            raft_log.setLevel(level)
            raft.snapfile.secrets = saved_secrets
            raft.multigroup.secrets = secrets
            undo()
        r = self.result
        r.sites_seen = set(self.disk.site_counts)
        r.virtual_s = self.loop.time() - 1000.0
        r.acked = len(self.checker.acked)
        r.reads = self.checker.reads
        r.conf_changes = len(self.checker.conf_changes)
        r.merged = len(self.checker.merged)
        return r

    def _loop_error(self, loop: asyncio.AbstractEventLoop, ctx: dict[str, Any]) -> None:
        exc = ctx.get("exception")
        if isinstance(exc, SimCrash | asyncio.CancelledError):
            return
        if self.failure is None:
            self.failure = exc or HarnessError(ctx.get("message", "loop error"))

    def _teardown(self) -> None:
        for n in self.nodes.values():
            self._drop(n)
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    async def _main(self) -> None:
        for nid in self.all:
            await self._start(nid)
        for step in range(self.steps):
            await asyncio.sleep(self.rng.expovariate(1 / 0.01))
            self._restart_due()
            kind = self.rng.choices(self.kinds, self.weights)[0]
            try:
                getattr(self, "_do_" + kind)()
            except (raft.multigroup.ProposalDropped, raft.multigroup.NotLeader, KeyError):
                pass  # a node that stopped itself (fail-stop): the check below restarts it
            self.check()
            del step
        await self._converge()

    def spawn(self, coro: Coroutine[Any, Any, Any], node: Node | None = None) -> None:
        task = asyncio.ensure_future(coro)
        tasks = node.tasks if node is not None else self.clients
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    # ---- nodes --------------------------------------------------------------------------

    async def _start(self, nid: int) -> None:
        n = self.nodes[nid]
        self.disk.revive(nid)
        t = self.net.transport(nid, list(self.all))
        sm = SimSM(nid, self.checker, self.disk)
        ops = self.disk.node_ops.get(nid, 0)
        try:
            log = NodeLog(f"/n{nid}/wal", self.segment_bytes, disk=self.disk)
            mr = MultiRaft(nid, log, t, **self._driver_options(nid))
            t.bind(mr.transport_callbacks())
            mr.add_group(GROUP, self.founders, state_machine=sm)
            await mr.start()
        except SimCrash:
            self.disk.crash(nid)
            t.kill()
            n.restart_at = self.loop.time() + 0.2
            return
        except Violation:
            raise
        except Exception as e:  # noqa: BLE001 (any failure to start from its own disk)
            raise Violation(RECOVERY, f"node {nid} cannot restart: {e!r} at {_where(e)}") from e
        n.mr, n.sm, n.restart_at = mr, sm, None
        n.recovery_ops = max(3, self.disk.node_ops.get(nid, 0) - ops)

    async def _restart(self, nid: int) -> None:
        try:
            await self._start(nid)
        except Violation as v:
            self.failure = self.failure or v

    def _driver_options(self, nid: int) -> dict[str, Any]:
        opts: dict[str, Any] = dict(
            tick_interval_s=TICK_S, election_tick=ELECTION_TICK, seed=nid,
            snapshot_every=self.snapshot_every, snap_dir=f"/n{nid}/snap",
            clock=SimClock(self.loop), apply_executor=self.executor,
            io_executor=self.executor,
            # Every WAL sync through the simulated executor, whose delay is the
            # fsync's duration: a crash can land inside it, as a kill -9 can
            # during a real fsync made on the loop (INLINE_SYNC_BYTES), which
            # an inline call in the simulation would hide.
            inline_sync_bytes=0)
        accepted = inspect.signature(MultiRaft.__init__).parameters
        return {k: v for k, v in opts.items() if k in accepted}

    def _drop(self, n: Node) -> None:
        """Forget a dead node's process: its tasks, transport and driver."""
        mr = n.mr
        if mr is not None:
            self.result.snapshots_installed += mr.stats.snapshots_installed
            self.result.snapshots_taken += mr.stats.snapshots_taken
            self.result.segments_deleted += mr.node_log.stats.segments_deleted
            mr._running = False
            for t in (*mr._tasks, *(getattr(mr, a, None) for a in ("_drain_task", "_tick_task"))):
                if t is not None:
                    t.cancel()
        t = self.net.endpoints.get(n.id)
        if t is not None:
            t.kill()
        for task in n.tasks:
            task.cancel()
        n.mr = n.sm = None
        n.eio_at = None

    def kill(self, nid: int) -> None:
        """Power cut at an arbitrary moment (not inside a disk operation)."""
        n = self.nodes[nid]
        if n.mr is None:
            return
        self.result.crashes += 1
        self.disk.crash(nid)
        self._drop(n)
        n.restart_at = self.loop.time() + self.rng.uniform(0.05, 1.5)

    def _on_disk_crash(self, nid: int, site: str, stack: set[str]) -> frozenset[str]:
        """A planned crash point fired inside node `nid`'s storage."""
        n = self.nodes[nid]
        ctx = self._crash_context(n, site, stack)
        self.result.crashes += 1
        self.result.disk_crashes += 1
        self.result.crash_sites.add(site)
        self.result.crash_contexts |= ctx
        self._drop(n)
        n.restart_at = self.loop.time() + self.rng.uniform(0.05, 1.5)
        return ctx

    def _probe_crash_image(self, nid: int, dir: str) -> None:
        """A WAL segment's deletion just became durable: a crash right here must
        recover. Random crash points reach this moment only by luck (the run of
        operations between the directory fsync and the next WAL fsync is short),
        so every such moment is checked directly: recover a copy of the node's
        durable files with the real NodeLog. The node itself runs on untouched."""
        if not dir.endswith("/wal"):
            return
        self.result.probes += 1
        image = self.disk.durable_image(nid)
        try:
            NodeLog(dir, self.segment_bytes, disk=image)
        except Exception as e:  # noqa: BLE001 (any failure to recover is the finding)
            v = Violation(RECOVERY, f"node {nid}: a crash after a segment deletion would not "
                                    f"restart: {e!r}")
            self.failure = self.failure or v

    def _on_eio(self, nid: int, site: str) -> None:
        if "@raft.storage." in site:
            self.nodes[nid].eio_at = self.loop.time()

    def _crash_context(self, n: Node, site: str, stack: set[str]) -> frozenset[str]:
        """Is the node inside a segment roll, a compaction or a snapshot install?"""
        ctx: set[str] = set()
        mr = n.mr
        if mr is None:
            return frozenset({"restart"})
        log = mr.node_log
        chunks = [*getattr(log, "_inflight", []), *getattr(log, "_pending", [])]
        if len({c.seg for c in chunks}) > 1 or getattr(log, "_dir_dirty", False) or \
                stack & {"_roll", "_open_segment"}:
            ctx.add("roll")
        types = _record_types(chunks)
        g = mr._groups.get(GROUP)
        if 4 in types or "_after_sync" in site or stack & {"_save_and_compact", "_write_image"} \
                or (g is not None and g.snapshotting):
            ctx.add("compaction")
        if 3 in types or "snapfile.Receiver" in site or stack & {"feed", "finish"} \
                or (g is not None and (g.installing or g.incoming is not None)):
            ctx.add("install")
        return frozenset(ctx)

    def _restart_due(self) -> None:
        now = self.loop.time()
        for n in self.nodes.values():
            if n.mr is None and n.restart_at is not None and n.restart_at <= now:
                n.restart_at = None
                self.spawn(self._restart(n.id))

    # ---- checks ----------------------------------------------------------------------------

    def live(self) -> dict[int, Node]:
        return {nid: n for nid, n in self.nodes.items()
                if n.mr is not None and GROUP in n.mr._groups
                and getattr(n.mr, "failed", None) is None}

    def check(self) -> None:
        if self.failure is not None:
            exc, self.failure = self.failure, None
            if isinstance(exc, Violation):
                raise exc
            raise HarnessError(f"unexpected error in the simulation: {exc!r}") from exc
        self._check_fail_stop()
        live = self.live()
        cores = {nid: n.mr._groups[GROUP].core for nid, n in live.items()}
        sms = {nid: n.sm for nid, n in live.items()}
        self.checker.check(cores, sms)

    def _check_fail_stop(self) -> None:
        now = self.loop.time()
        for nid, n in self.nodes.items():
            if n.mr is None:
                continue
            failed = getattr(n.mr, "failed", None)
            if failed is None:
                if n.eio_at is not None and now > n.eio_at + 2.0:
                    raise Violation(FAIL_STOP, f"node {nid} still runs 2 s after a failed "
                                               f"WAL call")
                continue
            if isinstance(failed, SimCrash):
                continue
            if isinstance(failed, Violation):
                raise failed
            if isinstance(failed, InvariantError):
                raise Violation(CORE_INVARIANT, f"node {nid}: {failed}")
            if n.eio_at is None and not _caused_by_eio(failed):
                raise HarnessError(f"node {nid} stopped itself: {failed!r}")
            # Fail-stop after an injected I/O error, as it must: the process
            # exits and its supervisor restarts it.
            self.result.fail_stops += 1
            self.kill(nid)

    # ---- actions -------------------------------------------------------------------------------

    def leader(self) -> Node | None:
        best = None
        for n in self.live().values():
            core = n.mr._groups[GROUP].core
            if core.state.name == "LEADER" and (best is None or core.term > best[0]):
                best = (core.term, n)
        return best[1] if best else None

    def pick_live(self) -> Node | None:
        live = list(self.live().values())
        return self.rng.choice(live) if live else None

    def _do_idle(self) -> None:
        pass

    def _do_propose(self) -> None:
        lead = self.leader()
        n = lead if lead is not None and self.rng.random() < 0.9 else self.pick_live()
        if n is None:
            return
        burst = self.rng.randrange(1, 6)
        for k in range(burst):
            self.nprop += 1
            self.result.proposals += 1
            if self.merge and k < burst - 1:
                self._propose_merged(n, b"p%d" % self.nprop)
            else:
                self.spawn(self._propose(n, b"p%d" % self.nprop))

    def _propose_merged(self, n: Node, data: bytes) -> None:
        if n.mr is None:
            return
        try:
            n.mr.propose_quiet(GROUP, data, _ignore_failure, None, merge=merge_parts)
        except (raft.multigroup.NotLeader, raft.multigroup.ProposalDropped, KeyError,
                SimCrash):
            return

    async def _propose(self, n: Node, data: bytes) -> None:
        mr = n.mr
        if mr is None:
            return  # the node died before the client got to it
        try:
            index = await mr.propose(GROUP, data)
        except (raft.multigroup.NotLeader, raft.multigroup.ProposalDropped, KeyError,
                SimCrash):
            return
        self.checker.on_ack(index, data)

    def _do_read(self) -> None:
        n = self.pick_live()
        if n is None:
            return
        need = max([r.mr._groups[GROUP].core.commit for r in self.live().values()]
                   + [max(self.checker.acked, default=0)])
        self.spawn(self._read(n, need), n)

    async def _read(self, n: Node, need: int) -> None:
        mr = n.mr
        if mr is None:
            return
        try:
            async with asyncio.timeout(3.0):
                await mr.read_index(GROUP)
        except (raft.multigroup.NotLeader, raft.multigroup.ProposalDropped, KeyError,
                TimeoutError, SimCrash):
            return
        if n.mr is mr:
            try:
                self.checker.check_read(n.id, need, mr._groups[GROUP].core.applied)
            except Violation as v:
                self.failure = self.failure or v

    def _do_conf(self) -> None:
        lead = self.leader()
        if lead is None:
            return
        cs = lead.mr._groups[GROUP].core.conf_state
        voters, learners = set(cs.voters), set(cs.learners)
        r = self.rng.random()
        spare = [x for x in self.all if x not in voters and x not in self.removed]
        if r < 0.5 and spare:
            target = self.rng.choice(spare)
            coro = lead.mr.add_member(GROUP, target, learner=self.rng.random() < 0.3
                                      and target not in learners)
        elif len(voters - self.removed) > 3:
            # Removals already asked for count too: never below three voters.
            target = self.rng.choice(sorted(voters - self.removed))
            self.removed.add(target)  # never re-add a removed id
            coro = lead.mr.remove_member(GROUP, target)
        else:
            return
        self.spawn(self._ignore(coro, 5.0))

    async def _ignore(self, coro: Any, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                await coro
        except (raft.multigroup.NotLeader, raft.multigroup.ProposalDropped, KeyError,
                TimeoutError, SimCrash):
            pass

    def _do_transfer(self) -> None:
        lead = self.leader()
        if lead is None:
            return
        to = self.rng.choice(sorted(lead.mr._groups[GROUP].core.conf_state.voters))
        self.spawn(self._ignore(lead.mr.transfer_leader(GROUP, to, timeout=1.0), 2.0), lead)

    def _do_snapshot(self) -> None:
        n = self.pick_live()
        if n is not None:
            n.mr.snapshot_now(GROUP)

    def _do_kill(self) -> None:
        down = sum(1 for n in self.nodes.values() if n.mr is None)
        n = self.pick_live()
        if n is not None and down < 2:
            self.kill(n.id)

    def _do_arm(self) -> None:
        """Arm a crash point in a node's storage (a down node: in its recovery)."""
        nid = self.rng.choice(self.all)
        if nid in self.disk.plans:
            return
        sites = sorted(self.disk.site_counts)
        if self.nodes[nid].mr is None:
            # A down node: crash inside its recovery (replay, truncation, repair),
            # at any of the operations its last start made.
            n = self.nodes[nid].recovery_ops
            self.disk.plans[nid] = CrashPlan(countdown=self.rng.randrange(1, n + 1))
        elif self.rng.random() < 0.15:
            wal = [x for x in sites if "@raft.storage." in x]
            if wal:
                self.disk.plans[nid] = CrashPlan(site=self.rng.choice(wal), eio=True)
        elif sites and self.rng.random() < 0.6:
            # Uniform over call sites seen so far: rare sites get their turn.
            self.disk.plans[nid] = CrashPlan(site=self.rng.choice(sites),
                                             nth=self.rng.randrange(1, 4))
        else:
            self.disk.plans[nid] = CrashPlan(countdown=self.rng.randrange(1, 120))

    def _do_partition(self) -> None:
        ids = list(self.all)
        self.rng.shuffle(ids)
        cut = self.rng.randrange(1, 3)
        self.net.partition([ids[:cut], ids[cut:]])

    def _do_heal(self) -> None:
        self.net.heal()

    # ---- the end -------------------------------------------------------------------------------

    async def _converge(self) -> None:
        """Heal everything; every member must apply every acknowledged entry."""
        self.disk.plans.clear()
        self.net.heal()
        self.net.faults = NetFaults(cut_snapshot=0.0)
        for n in self.nodes.values():
            if n.mr is None:
                n.restart_at = self.loop.time()
        deadline = self.loop.time() + 60.0
        final: asyncio.Future[None] | None = None
        while self.loop.time() < deadline:
            await asyncio.sleep(0.05)
            self._restart_due()
            self.check()
            lead = self.leader()
            if lead is None:
                continue
            core = lead.mr._groups[GROUP].core
            if core.log.term_or_zero(core.commit) != core.term:
                continue
            if b"final" not in self.checker.acked.values():
                if final is None or final.done():
                    final = asyncio.ensure_future(self._final(lead))
                continue
            if self._all_applied(core):
                self._check_final()
                return
        raise HarnessError("no convergence after healing: " + self._describe())

    async def _final(self, lead: Node) -> None:
        self.nprop += 1
        await self._propose(lead, b"final")

    def _all_applied(self, lead_core: Any) -> bool:
        cs = lead_core.conf_state
        for nid in (*cs.voters, *cs.learners):
            n = self.nodes[nid]
            if n.mr is None or GROUP not in n.mr._groups:
                return False
            if n.mr._groups[GROUP].core.applied < lead_core.commit:
                return False
        return True

    def _check_final(self) -> None:
        """Directly: every member's state machine holds every acked entry."""
        lead = self.leader()
        assert lead is not None
        cs = lead.mr._groups[GROUP].core.conf_state
        for nid in (*cs.voters, *cs.learners):
            sm = self.nodes[nid].sm
            for index, data in self.checker.acked.items():
                if sm.entries.get(index) != data:
                    from tests.sim.checkers import ACKED_LOST
                    raise Violation(ACKED_LOST, f"after healing node {nid} lacks acked {index}")

    def _describe(self) -> str:
        out = []
        for nid, n in self.nodes.items():
            if n.mr is None:
                out.append(f"{nid}:down")
                continue
            c = n.mr._groups[GROUP].core if GROUP in n.mr._groups else None
            if c is None:
                out.append(f"{nid}:nogroup")
                continue
            out.append(f"{nid}:{c.state.name} t={c.term} lead={c.lead} c={c.commit} "
                       f"a={c.applied} last={c.log.last_index()} v={c.conf_state.voters} "
                       f"failed={getattr(n.mr, 'failed', None)!r}")
        return "; ".join(out)


def _record_types(chunks: list[Any]) -> set[int]:
    from raft.wal import Scanner

    types: set[int] = set()
    for ch in chunks:
        sc = Scanner(bytes(ch.buf))
        types.update(int(r.type) for r in sc)
        sc.close()
    return types


def _caused_by_eio(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, OSError) and "simulated EIO" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _where(e: BaseException) -> str:
    import traceback

    frames = traceback.extract_tb(e.__traceback__)[-3:]
    return " < ".join(f"{f.name}:{f.lineno}" for f in reversed(frames))


def run(seed: int, steps: int | None = None, merge: bool = False) -> RunResult:
    return Cluster(seed, steps, merge).run()


def run_single(seed: int) -> RunResult:
    """One node, one voter (tests/sim/test_sim_single.py)."""
    return Cluster(seed, single=True).run()


MERGED = b"M:"


def merge_parts(datas: list[bytes]) -> bytes:
    """The sim's `merge`: the parts behind a marker (proposal data never holds `|`)."""
    return MERGED + b"|".join(datas)


def _ignore_failure(_arg: object, _exc: BaseException) -> None:
    """A quiet proposal that failed: nobody was told it succeeded, nothing to check."""


_ = (Callable, MsgType)  # re-exported names used by mutants' helpers

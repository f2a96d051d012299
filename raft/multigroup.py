"""The multi-group Raft driver: many pure cores on one asyncio loop.

`MultiRaft` owns every group of a node. It does the I/O the pure core
(`raft/core.py`) leaves out, following the core's driver contract:

* **One ready loop with group commit.** Any input (a message, a proposal, a
  tick) marks its group dirty. One drain pass collects the `Ready` of every
  dirty group, buffers all hard states, snapshots and entries into the
  node's single WAL, and makes them durable with ONE `sync_async()` (write +
  fsync in the WAL thread, so the loop keeps serving; inputs arriving meanwhile
  accumulate in the cores and form the next batch; a pass with at most
  INLINE_SYNC_BYTES to write fsyncs on the loop, cheaper than the thread hop). Then, per group: step
  STORAGE_APPEND_RESP, send messages, apply committed entries, `advance()`.
* **Leader appends leave before the local fsync.** A leader's APP and
  HEARTBEAT depend only on its term, which is already durable (it was
  fsynced before the votes that elected it were requested); Raft allows the
  leader to write its log in parallel with replication (thesis §10.2.1). The
  leader still counts itself toward commit only after its own fsync. Every
  other message (votes, APP_RESP, ...) leaves after the fsync.
* **Event-driven timers.** One loop-level ticker ticks only the groups that
  are not quiesced. Idle leaders quiesce; the transport's node-level
  liveness beat replaces per-group heartbeats, and when a peer node goes
  silent the quiesced groups it leads are woken so they can elect.
* **Snapshots are files.** After `snapshot_every` applied entries (and for
  groups that pin old WAL segments) the state machine writes an image of
  itself to a file in a worker thread (`snapshot_to`), the driver commits it
  (`raft/snapfile.py`) and compacts the log behind it; lagging or new members
  receive it streamed from disk in chunks, and the receiver writes it to
  disk in chunks. No image is ever held whole in memory. A durable state
  machine may snapshot a mere marker and export an image only when a
  member needs one (`exports_images`, below).

State machine protocol (duck-typed; see `StateMachine`): `apply(index,
data)` in log order on every member (leader no-ops, which are empty, are not
passed; empty proposals are refused), `snapshot_to(path) -> index`,
`restore_from(path)`, `on_leader_change(leader_id, term)` (leader_id 0 =
leadership lost), and optionally `on_conf_change(index, ConfChange)`.
A durable state machine may write only a marker in `snapshot_to` (its
store is the state) and set `exports_images`: a member that needs the
snapshot then gets `export_to(path) -> index`, an image taken when it is
needed, at an index at or past the snapshot's; `restore_from` takes it and
`apply` skips the entries it already holds. After
a restart the driver restores the last snapshot and re-applies the committed
entries after it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from raft import snapfile
from raft.core import Config, Raft, StateType, decode_conf_change, storage_append_resp
from raft.disk import OS_DISK, Disk
from raft.runtime import (
    Clock,
    DedicatedThread,
    DefaultThreads,
    Executor,
    LoopClock,
    iterate_in,
)
from raft.storage import NodeLog
from raft.types import (
    NONE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MsgType,
    Ready,
    SnapshotMeta,
)

log = logging.getLogger(__name__)

PINNING_SNAPSHOTS = 8  # groups snapshotted per pass to release old WAL segments
# A drain pass whose committed entries are at most this many and this big
# applies them on the loop: at low load the two thread switches of a hop to
# the apply worker cost more than the apply (measured: about 0.3 ms of a
# 2 ms window-1 commit on the shared machine). 0 = always the worker.
INLINE_APPLY_ENTRIES = 4
INLINE_APPLY_BYTES = 64 << 10
# A drain pass that writes at most this many WAL bytes fsyncs on the loop: at
# low load the hop to the WAL thread and back (two thread switches, 0.2-1 ms on
# the shared machine) costs more than the fsync. 0 = always the WAL thread.
INLINE_SYNC_BYTES = 64 << 10
# `propose_quiet(merge=)`: queued proposals merged into one entry at most this big
# and this many (a bigger proposal stays alone).
MERGE_MAX_BYTES = 256 << 10
MERGE_MAX_COUNT = 1024
# A follower of a group whose state machine sets `defer_apply` holds its
# committed entries back (it is in no hurry: nothing waits for its apply) until
# FOLLOWER_DEFER_ENTRIES of them, or FOLLOWER_DEFER_S after the first one, and
# applies them as ONE run: one store transaction instead of one per publish,
# and no apply right after each APP_RESP, when the leader needs the core
# (docs/notes/r3f.md). Never held: a leader's or candidate's entries, a
# membership change, entries a read waits for, more than the inline apply takes.
FOLLOWER_DEFER_ENTRIES = INLINE_APPLY_ENTRIES
FOLLOWER_DEFER_S = 0.02
_EARLY = frozenset({MsgType.APP, MsgType.HEARTBEAT})  # leader messages that need only the term


class NotLeader(Exception):
    """This node does not lead the group; `leader_id` is the known leader (0 = none)."""

    def __init__(self, leader_id: int) -> None:
        super().__init__(f"not leader (leader is {leader_id or 'unknown'})")
        self.leader_id = leader_id


class ProposalDropped(Exception):
    """The proposal was not committed (overwritten by a new leader, busy, or node stopping)."""


class NodeFailed(ProposalDropped):
    """The node stopped itself after a fatal error (fail-stop): the outcome of
    anything in flight is unknown. `cause` is the error."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"node stopped after a fatal error: {cause!r}")
        self.cause = cause


class StateMachine(Protocol):
    def apply(self, index: int, data: bytes) -> None: ...

    def snapshot_to(self, path: str) -> int:
        """Write a consistent image of the state to the new file `path` and
        return the index of the last entry `apply` had put in that image (0 if
        none; the driver knows no-ops and membership changes). Runs in a worker
        thread while `apply` goes on in the loop: the state machine makes that
        safe (LMDB: copy from one read transaction that also reads the applied
        index). The driver never runs it together with `restore_from`."""
        ...

    def restore_from(self, path: str) -> None:
        """Replace the whole state by the image in `path` (a file the driver
        keeps: copy it, do not move it). A 0-byte image is the empty state.
        May run in a worker thread; no `apply` of the group runs meanwhile."""
        ...

    def on_leader_change(self, leader_id: int, term: int) -> None: ...


@dataclass
class DriverStats:
    drains: int = 0  # drain passes that handled at least one Ready
    syncs: int = 0  # drain passes that fsynced (one sync_async each)
    inline_syncs: int = 0  # of those, small ones fsynced on the loop (INLINE_SYNC_BYTES)
    readies: int = 0  # group Readies handled
    synced_readies: int = 0  # Readies covered by those syncs
    max_groups_per_sync: int = 0
    entries_persisted: int = 0
    entries_applied: int = 0
    snapshots_taken: int = 0
    snapshots_installed: int = 0
    snapshots_discarded: int = 0  # images dropped (raced a membership change or an install)
    restores_skipped: int = 0  # restarts where the state machine already held the snapshot
    snapshot_bytes_sent: int = 0
    images_exported: int = 0  # catch-up images exported (exports_images; shared by transfers)
    snapshot_bytes_received: int = 0
    ticks: int = 0
    wakes_for_dead_peer: int = 0
    sync_rolls: int = 0  # drain-pass syncs whose batch started a new WAL segment
    # Leader Readies whose commit or apply waited for this node's own fsync (the
    # followers' answers came first): the commits where pipelining the leader's
    # write could matter at all, given that nothing is applied before the local fsync.
    own_sync_last: int = 0
    eager_passes: int = 0  # passes run from the transport callback, no loop turn (_drain_now)


@dataclass(eq=False)
class _Group:
    name: str
    core: Raft
    sm: Any
    snap: snapfile.Stored | None = None
    # A proposal's Future, or a _Quiet (propose_quiet) that behaves like one here.
    pending: dict[int, tuple[int, asyncio.Future[int]]] = field(default_factory=dict)
    props: list[tuple[bytes, asyncio.Future[int]]] = field(default_factory=list)
    reads: dict[bytes, asyncio.Future[None]] = field(default_factory=dict)
    read_waits: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    leader_waiters: list[asyncio.Future[None]] = field(default_factory=list)
    incoming: snapfile.Stored | None = None  # received, sealed, not yet stepped in
    lead_seen: tuple[int, int] = (NONE, 0)
    durable_tv: tuple[int, int] = (0, NONE)  # term and vote known fsynced
    idle_ticks: int = 0
    snapshotting: bool = False
    snap_task: asyncio.Task[Any] | None = None
    installing: bool = False  # a received snapshot is being committed / restored
    # The state machine's own index in the state `snap` stands for (None: not known, take
    # snap's index). Below snap's index when the entries between were never given to the
    # machine (leader no-ops, the bootstrap snapshot): an export at this index or past it
    # is the state at snap's index.
    image_floor: int | None = None
    conf_applied: list[int] = field(default_factory=list)  # conf changes during snapshotting
    # What a durable state machine already held at start. It can be above the
    # commit index the WAL remembers (a commit-only hard state is not fsynced
    # before the apply), so the core re-applies up to it as it re-learns the
    # commit; no image is taken before (it would hold entries not applied here).
    held_at_start: int = 0
    # Follower apply deferral (FOLLOWER_DEFER_*): the task that ends it at its
    # deadline, and whether the next pass must apply what is held.
    defer_task: asyncio.Task[Any] | None = None
    apply_now: bool = False


class MultiRaft:
    def __init__(
        self,
        node_id: int,
        node_log: NodeLog,
        transport: Any = None,
        *,
        tick_interval_s: float = 0.1,
        election_tick: int = 10,
        heartbeat_tick: int = 1,
        snapshot_every: int = 10_000,
        snap_dir: str | None = None,
        quiesce_after_ticks: int = 3,
        dead_after_ticks: int | None = None,
        max_uncommitted_entries: int = 16384,
        seed: int | None = None,
        clock: Clock | None = None,
        apply_executor: Executor | None = None,
        io_executor: Executor | None = None,
        on_fatal: Any = None,
        inline_apply_entries: int = INLINE_APPLY_ENTRIES,
        inline_sync_bytes: int = INLINE_SYNC_BYTES,
        follower_defer_s: float = FOLLOWER_DEFER_S,
    ) -> None:
        self.node_id = node_id
        # The world, behind interfaces (raft/runtime.py): a simulation passes
        # its own deterministic clock, transport and executors.
        self.clock: Clock = clock or LoopClock()
        self.apply_executor: Executor = apply_executor or DedicatedThread("raft-apply")
        self.io_executor: Executor = io_executor or DefaultThreads()
        # The drain loop's WAL write+fsync, on every commit: a thread of its own.
        self.wal_executor: Executor = io_executor or DedicatedThread("raft-wal")
        self.node_log = node_log
        self.transport = transport
        self.tick_interval_s = tick_interval_s
        self.election_tick = election_tick
        self.heartbeat_tick = heartbeat_tick
        self.snapshot_every = snapshot_every
        self.snap_dir = snap_dir or node_log.dir.rstrip("/") + ".snap"
        # Snapshot files go through the WAL's Disk (a simulation's SimDisk).
        self.disk: Disk = getattr(node_log, "disk", OS_DISK)
        self.quiesce_after_ticks = quiesce_after_ticks
        self.dead_after_s = (dead_after_ticks or election_tick) * tick_interval_s
        self.max_uncommitted_entries = max_uncommitted_entries
        self.inline_apply_entries = inline_apply_entries
        self.inline_sync_bytes = inline_sync_bytes
        self.follower_defer_s = follower_defer_s  # 0: followers apply at once
        self.stats = DriverStats()
        self._seed = seed if seed is not None else node_id * 7919
        self._groups: dict[str, _Group] = {}
        # Insertion-ordered (dicts as ordered sets): a run replays from its seed.
        self._dirty: dict[str, None] = {}
        self._active: dict[str, None] = {}  # groups the ticker ticks (not quiesced)
        self._kick = asyncio.Event()
        self._passing = False  # a drain pass is in flight (its Readies not advanced yet)
        self._eager_tail: asyncio.Task[Any] | None = None  # see `_drain_now`
        self._force_sync = False
        self._peers: dict[int, bool] = {}  # peer -> believed alive
        # Loop time the tick loop last came back from a stall (ticks late by more
        # than an interval): peers' silence is measured from here at the earliest.
        self._resumed_at = float("-inf")
        # ReadIndex contexts: this process's random nonce, then a counter. A
        # leader may still answer a read of an earlier process of this node
        # after a restart; with a counter alone (restarting at 1) that late
        # answer would resolve a new read of the same number with an index
        # older than the new read's start (a stale read, tests/sim seed 925).
        self._ctx_nonce = secrets.token_bytes(8)
        self._ctx = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._running = False
        self._transport_stopped = False
        # group -> lock serializing its snapshot-file commits and deletions (one
        # small Lock per group name ever hosted); names whose files await deletion.
        self._files: dict[str, asyncio.Lock] = {}
        self._dropping: dict[str, int] = {}
        self._apply_idle = asyncio.Event()  # clear while a batch is in the apply worker
        self._apply_idle.set()
        # What is in flight, for `activity()` (crash tests aim kills with it).
        self._receiving = 0  # snapshot streams being received
        self._exports: dict[str, _Export] = {}  # group -> catch-up image in use (exports_images)
        self._sync_roll = False  # the drain pass's sync writes a segment roll
        self._synced_top = 0  # newest segment at the previous drain-pass sync
        # Fail-stop: the first fatal error, and who to tell (the process exits).
        self.failed: BaseException | None = None
        self.on_fatal = on_fatal

    # ---- wiring --------------------------------------------------------------

    def bind_transport(self, transport: Any) -> None:
        self.transport = transport

    def transport_callbacks(self) -> dict[str, Any]:
        """Keyword arguments for `GrpcTransport(...)` that route into this driver."""
        return {
            "on_messages": self.on_messages,
            "on_snapshot": self.on_snapshot,
            "snapshot_source": self.snapshot_source,
            "on_liveness": self.on_liveness,
        }

    async def start(self) -> None:
        if self.transport is not None and not self._running:
            await self.transport.start()
        self._running = True
        self._drain_task = self._spawn(self._drain_loop())
        self._tick_task = self._spawn(self._tick_loop())

    async def stop(self) -> None:
        """Stop ticking and draining, fail waiters, stop the transport, close the log."""
        self._running = False
        self._tick_task.cancel()
        self._kick.set()  # the drain loop finishes its pass (and its fsync) and exits
        for g in self._groups.values():
            if g.defer_task is not None:  # held entries stay committed in the WAL
                g.defer_task.cancel()
        # Snapshot tasks and the drain pass may be inside a sync thread: let
        # them finish rather than close the log under them.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for g in self._groups.values():
            self._fail_all(g, ProposalDropped("node stopping"))
        await self._stop_transport()
        for ex in dict.fromkeys((self.apply_executor, self.io_executor, self.wal_executor)):
            close = getattr(ex, "close", None)
            if close is not None:
                close()
        if self.failed is None:
            self.node_log.close()  # flushes what is buffered
        # After a fatal error nothing more is written: close() would flush.

    def add_peer(self, node: int, addr: str, direct: str | None = None) -> None:
        """Reach node `node` at `addr` (or its direct TCP lane at `direct`) from now on."""
        if direct is None:
            self.transport.add_peer(node, addr)
        else:
            self.transport.add_peer(node, addr, direct)
        self._peers.setdefault(node, True)

    def remove_peer(self, node: int) -> None:
        """Stop talking to node `node` (remove it from its groups first)."""
        self.transport.remove_peer(node)
        self._peers.pop(node, None)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._fail_stop(task.exception())

    async def _stop_transport(self) -> None:
        if self.transport is not None and not self._transport_stopped:
            self._transport_stopped = True
            await self.transport.stop()

    def _fail_stop(self, exc: BaseException | None) -> None:
        """A fatal error: stop the node rather than limp on.

        A ready loop that died while ticks and liveness beats go on would make
        peers trust a leader that commits nothing; a WAL whose write or fsync
        failed cannot be trusted either (the kernel may have dropped the dirty
        pages and cleared the error: a retry could report success for data
        that is gone). So: no more ticks, beats, sends or fsyncs; every waiter
        fails with NodeFailed; the transport closes its streams, so peers stop
        hearing from us and elect a new leader; `on_fatal` lets the process
        exit. A restart recovers from what is on disk."""
        if exc is None or self.failed is not None:
            return
        self.failed = exc
        log.critical("[FTL] multiraft %d: fatal error, node stops: %r", self.node_id, exc,
                     exc_info=exc)
        self._running = False
        tick = getattr(self, "_tick_task", None)
        if tick is not None:
            tick.cancel()
        self._kick.set()
        for g in self._groups.values():
            self._fail_all(g, NodeFailed(exc))
        self._spawn(self._stop_transport())
        if self.on_fatal is not None:
            self.on_fatal(exc)

    # ---- groups ----------------------------------------------------------------

    def add_group(
        self, group: str, voters: Iterable[int], learners: Iterable[int] = (), *,
        state_machine: Any,
    ) -> None:
        """Host `group`. A fresh log is bootstrapped when this node is in the
        initial configuration; otherwise the node joins empty and waits for
        the leader's snapshot (add it with `add_member` on the leader)."""
        if group in self._groups:
            raise ValueError(f"group {group!r} exists")
        voters, learners = sorted(set(voters)), sorted(set(learners))
        gl = self.node_log.group(group)
        hs, cs = gl.initial_state()
        fresh = gl.last_index() == 0 and gl.first_index() == 1 and hs == HardState()
        snap: snapfile.Stored | None = None
        if fresh and group not in self._dropping:
            # Snapshot files of an earlier incarnation (removed, then a crash
            # before they were deleted) must not be taken for this one's.
            snapfile.remove(self.snap_dir, group, disk=self.disk)
        if fresh and self.node_id in (*voters, *learners):
            # Every initial member installs the same index-1 snapshot holding
            # the configuration; its data is the empty state (no file).
            meta = SnapshotMeta(1, 1, ConfState(tuple(voters), tuple(learners)))
            self.node_log.apply_snapshot(group, meta)
            self._force_sync = True
            state_machine.restore_from(self._empty_image())
            snap = snapfile.Stored(meta, None)
        elif not fresh:
            snap = self._recover_snapshot(group, state_machine)
        applied = snap.meta.index if snap else 0
        cfg = Config(
            id=self.node_id, group=group, election_tick=self.election_tick,
            heartbeat_tick=self.heartbeat_tick, applied=applied,
            max_uncommitted_entries=self.max_uncommitted_entries,
        )
        cfg.rng.seed(self._seed * 1_000_003 + zlib.crc32(group.encode()))  # stable across runs
        g = _Group(group, Raft(cfg, gl), state_machine, snap=snap,
                   image_floor=_machine_index(state_machine))
        g.durable_tv = (hs.term, hs.vote)
        held = getattr(state_machine, "applied_index", None)
        if held is not None and not fresh:
            g.held_at_start = held()
        self._groups[group] = g
        for nid in g.core.prs:
            if nid != self.node_id:
                self._peers.setdefault(nid, True)
        self._active[group] = None
        self._mark(group)

    def _recover_snapshot(self, group: str, sm: Any) -> snapfile.Stored | None:
        gl = self.node_log.group(group)
        log_snap = gl.snapshot().meta
        # A received snapshot staged before a crash counts only if the WAL's
        # SNAPSHOT_META naming it was fsynced (load decides from log_index).
        stored = snapfile.load(self.snap_dir, group, disk=self.disk, log_index=log_snap.index)
        if stored is None:
            if log_snap.index > 1:
                raise snapfile.SnapshotFileError(
                    f"{group}: log compacted to {log_snap.index} but no snapshot file")
            if log_snap.index == 0:
                return None
            self._restore_at_start(sm, log_snap.index, None)  # bootstrap: the empty state
            return snapfile.Stored(log_snap, None)
        meta = stored.meta
        if meta.index > gl.last_index():
            self.node_log.apply_snapshot(group, meta)
            self._force_sync = True
        elif meta.index > log_snap.index:
            # Crash between saving the file and the COMPACT record: redo it.
            self.node_log.compact(group, meta.index, meta.conf_state)
        self._restore_at_start(sm, meta.index, stored.path)
        return stored

    def _restore_at_start(self, sm: Any, index: int, path: str | None) -> None:
        """Bring a restarting group's state machine to the snapshot at `index`.
        A durable state machine that already holds it (`applied_index()`) is
        left alone: no image is copied back; the entries after it are
        re-applied and it skips those it holds."""
        held = getattr(sm, "applied_index", None)
        if held is not None and held() >= index:
            self.stats.restores_skipped += 1
            return
        sm.restore_from(path or self._empty_image())

    def _empty_image(self) -> str:
        """A 0-byte image: what `restore_from` takes as the empty state."""
        return snapfile.empty_image(self.snap_dir, disk=self.disk)

    def remove_group(self, group: str) -> None:
        """Stop hosting `group` and forget its log: a DROP record in the WAL
        (durable with the next sync), then its snapshot files. The name can be
        hosted again at once (`add_group` starts a fresh group); the state
        machine's own data is the caller's."""
        g = self._groups.pop(group, None)
        if g is None:
            return
        self._active.pop(group, None)
        self._dirty.pop(group, None)
        if g.defer_task is not None:  # nothing left to apply: the hold's deadline goes
            g.defer_task.cancel()
        self._fail_all(g, ProposalDropped("group removed"))
        self.node_log.drop_group(group)
        self._force_sync = True
        self._kick.set()
        # The files go once the DROP is durable (a crash before that finds the
        # group's log and its snapshot together, as they were), and after any
        # commit of the removed group's files still in flight: the name's
        # file operations are serialized by its lock, in order. Counted now,
        # not when the task starts: `removed()` awaited right after this call
        # must wait for it (the caller deletes the state machine's data next).
        self._dropping[group] = self._dropping.get(group, 0) + 1
        task = self._spawn(self._delete_files_after_drop(group))
        task.add_done_callback(lambda _t: self._dropped(group))  # also if never started

    def _dropped(self, group: str) -> None:
        self._dropping[group] -= 1
        if not self._dropping[group]:
            del self._dropping[group]

    def _files_lock(self, group: str) -> asyncio.Lock:
        lock = self._files.get(group)
        if lock is None:
            lock = self._files[group] = asyncio.Lock()
        return lock

    async def _delete_files_after_drop(self, group: str) -> None:
        # A batch handed to the apply worker before the removal may still
        # be writing to the group's state machine.
        await self._apply_idle.wait()
        await self.node_log.sync_async(self.io_executor.run)
        async with self._files_lock(group):
            g = self._groups.get(group)
            if g is None or g.snap is None or g.snap.path is None:
                # Gone, or re-created and still on its bootstrap snapshot
                # (no file): whatever is on disk belongs to the old one.
                snapfile.remove(self.snap_dir, group, disk=self.disk)

    async def removed(self, group: str) -> None:
        """Until a removed group is fully gone: no apply of it in flight, its
        DROP durable, its files deleted. Await it before deleting the state
        machine's own data."""
        while group in self._dropping:
            await self.clock.sleep(self.tick_interval_s)

    def groups(self) -> list[str]:
        return list(self._groups)

    def _group(self, group: str) -> _Group:
        if self.failed is not None:
            raise NodeFailed(self.failed)
        g = self._groups.get(group)
        if g is None:
            raise KeyError(f"unknown group {group!r}")
        return g

    # ---- public API --------------------------------------------------------------

    async def propose(self, group: str, data: bytes) -> int:
        """Index of `data` once committed (fsynced by a quorum) and applied here."""
        return await self.propose_nowait(group, data)

    def propose_nowait(self, group: str, data: bytes) -> asyncio.Future[int]:
        """`propose` without a coroutine: the future resolves as `propose` returns (a
        caller that needs no task per proposal, e.g. a publish, saves its cost)."""
        if not data:
            raise ValueError("empty proposals are reserved for leader no-ops")
        g = self._group(group)
        if g.core.state is not StateType.LEADER:
            raise NotLeader(g.core.lead)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        g.props.append((bytes(data), fut))
        self._mark(group)
        return fut

    def propose_quiet(self, group: str, data: bytes, on_error: Any, arg: Any = None,
                      merge: Callable[[list[bytes]], bytes] | None = None) -> None:
        """A proposal nobody awaits (a publish whose answer is an apply effect): no
        Future, no done callback per entry. Only a failure is reported, as
        `on_error(arg, exc)` in a later loop turn, exactly when `propose` would raise.

        `merge`: quiet proposals with the same `merge` that are queued one after the
        other when the drain pass takes them become ONE entry, `merge(datas)` (in
        queue order; at most MERGE_MAX_COUNT / MERGE_MAX_BYTES). The state machine
        must apply that entry exactly as the proposals one after the other; they
        commit or fail together (a failure is reported to each)."""
        if not data:
            raise ValueError("empty proposals are reserved for leader no-ops")
        g = self._group(group)
        if g.core.state is not StateType.LEADER:
            raise NotLeader(g.core.lead)
        g.props.append((bytes(data), _Quiet(on_error, arg, merge)))
        self._mark(group)

    async def read_index(self, group: str, timeout: float | None = None) -> None:
        """Linearizable read barrier: returns once the local state machine has
        applied everything committed before the call. Raises TimeoutError
        after `timeout` seconds (default: two election timeouts), e.g. when
        the leader cannot reach a quorum; the read may simply be retried."""
        g = self._group(group)
        if g.core.lead == NONE:
            raise NotLeader(NONE)
        if timeout is None:
            timeout = 2 * self.election_tick * self.tick_interval_s
        ctx = b"r" + self._ctx_nonce + next(self._ctx).to_bytes(8, "big")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        g.reads[ctx] = fut
        g.core.read_index(ctx)
        self._mark(group)
        try:
            async with self.clock.timeout(timeout):
                await fut
        finally:
            g.reads.pop(ctx, None)
            g.read_waits = [(i, f) for i, f in g.read_waits if not f.done()]

    async def transfer_leader(self, group: str, to: int, timeout: float = 10.0) -> None:
        g = self._group(group)
        async with self.clock.timeout(timeout):
            while g.core.lead != to:
                g.core.transfer_leader(to)
                self._mark(group)
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                g.leader_waiters.append(fut)
                try:
                    async with self.clock.timeout(self.dead_after_s):
                        await asyncio.shield(fut)
                except TimeoutError:
                    pass

    async def wait_leader(self, group: str, timeout: float = 10.0) -> int:
        """Until the group has a leader (tests, startup); returns its id."""
        g = self._group(group)
        async with self.clock.timeout(timeout):
            while g.core.lead == NONE:
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                g.leader_waiters.append(fut)
                await fut
        return g.core.lead

    async def add_member(self, group: str, node: int, learner: bool = False) -> int:
        kind = ConfChangeType.ADD_LEARNER if learner else ConfChangeType.ADD_VOTER
        self._peers.setdefault(node, True)
        return await self._conf_change(group, ConfChange(kind, node))

    async def remove_member(self, group: str, node: int) -> int:
        return await self._conf_change(group, ConfChange(ConfChangeType.REMOVE, node))

    async def _conf_change(self, group: str, cc: ConfChange) -> int:
        g = self._group(group)
        idx = g.core.propose_conf_change(cc)
        # A leader takes one change at a time, and none until it has applied its own
        # election's entries: wait out that barrier (a few election timeouts) before giving up.
        deadline = self.clock.now() + 3 * self.election_tick * self.tick_interval_s
        while idx is None and g.core.state is StateType.LEADER:
            if self.clock.now() > deadline:
                raise ProposalDropped("a membership change is already in flight")
            await self.clock.sleep(self.tick_interval_s)
            idx = g.core.propose_conf_change(cc)
        if idx is None:
            raise NotLeader(g.core.lead)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        g.pending[idx] = (g.core.term, fut)
        self._mark(group)
        return await fut

    def leader(self, group: str) -> int:
        return self._group(group).core.lead

    def status(self, group: str) -> dict[str, Any]:
        g = self._group(group)
        c = g.core
        cs = c.conf_state
        return {
            "id": self.node_id, "group": group, "state": c.state.name.lower(),
            "term": c.term, "leader": c.lead, "commit": c.commit, "applied": c.applied,
            "last_index": c.log.last_index(), "first_index": c.log.first_index(),
            "quiesced": c.quiesced, "voters": list(cs.voters), "learners": list(cs.learners),
            # A follower holding committed entries back (FOLLOWER_DEFER_*): durable here
            # and applied within the hold's deadline, so caught up for health checks.
            "holding": g.defer_task is not None,
            "match": {nid: p.match for nid, p in c.prs.items()} if c.state is StateType.LEADER
            else {},
        }

    # ---- inputs from the transport ---------------------------------------------------

    def on_messages(self, msgs: list[Message]) -> None:
        if self.failed is not None:
            return
        for m in msgs:
            g = self._groups.get(m.group)
            if g is None:
                continue  # not (yet) hosted here
            core = g.core
            # An answer to an active leader (not quiesced: a step may wake it).
            answer = (m.type is MsgType.APP_RESP and core.state is StateType.LEADER
                      and not core.quiesced)
            try:
                core.step(m)
            except Exception as exc:  # a broken invariant: this node cannot go on
                log.error("multiraft %d: step %s failed in %s", self.node_id, m.type, m.group)
                self._fail_stop(exc)
                return
            if (answer and core.state is StateType.LEADER and not core.quiesced
                    and not core.has_ready()):
                # It changed only the peer's progress (at window 1: the answer
                # after the one that committed): no pass, whose `_after` would
                # find nothing to do (applied, leader, quiescence unchanged).
                continue
            self._dirty[m.group] = None
        if not self._dirty:
            return
        # The kick is set only if the drain task is to run the pass: setting it
        # schedules the task's wake-up, which an eager pass would leave empty.
        if not self._passing and self._running and self._eager_ok():
            self._drain_now()
        else:
            self._kick.set()

    def on_liveness(self, peer: int) -> None:
        if not self._peers.get(peer, False):
            self._peers[peer] = True

    async def on_snapshot(self, header: Message, chunks: AsyncIterator[bytes]) -> bool:
        """A leader streams a snapshot: write it to a `.part` file chunk by
        chunk, fsync and check it, then step its SNAP message."""
        g = self._groups.get(header.group)
        if g is None or header.snapshot is None:
            return False
        rx = snapfile.Receiver(self.snap_dir, header.group, disk=self.disk)
        self._receiving += 1
        try:
            async for piece in chunks:
                await self.io_executor.run(rx.feed, piece)
                self.stats.snapshot_bytes_received += len(piece)
            await self.io_executor.run(rx.finish)
        except BaseException:
            rx.close()
            snapfile.discard(rx.path, disk=self.disk)
            raise
        finally:
            self._receiving -= 1
        if rx.meta != header.snapshot.meta or self._groups.get(header.group) is not g:
            snapfile.discard(rx.path, disk=self.disk)
            return False
        prev, g.incoming = g.incoming, snapfile.Stored(rx.meta, rx.path, rx.size, rx.crc)
        self.on_messages([header])  # a broken invariant here is fatal too
        # Only a snapshot the core took replaces the one a pending install will read: a
        # deposed leader's transfer that ends after the new leader's was stepped is ignored
        # by the core (lower term), and its file must not take the new one's place.
        pending = g.core.log.unstable.snapshot
        keep, drop = ((g.incoming, prev) if pending is not None and pending.meta == rx.meta
                      else (prev, g.incoming))
        g.incoming = keep
        if drop is not None and (keep is None or drop.path != keep.path):
            snapfile.discard(drop.path, disk=self.disk)
        return self.failed is None

    async def snapshot_source(self, msg: Message) -> AsyncIterator[bytes]:
        """The snapshot a SNAP message announces, as the transport streams it:
        the snapfile head, then the data file read from disk chunk by chunk."""
        g = self._groups.get(msg.group)
        want = msg.snapshot.meta.index if msg.snapshot else -1
        stored = g.snap if g is not None else None
        if stored is None or stored.meta.index != want:
            raise RuntimeError(f"{msg.group}: no snapshot data at index {want}")
        if stored.path is not None and getattr(g.sm, "exports_images", False):
            async for piece in self._exported(g, stored.meta):
                yield piece
            return
        yield snapfile.encode_head(stored.meta, stored.size, stored.crc)
        if stored.path is None:
            return
        async for piece in self._file_chunks(stored.path, stored.size):
            yield piece

    async def _file_chunks(self, path: str, size: int) -> AsyncIterator[bytes]:
        # A newer snapshot may delete the file once it is open: the fd keeps it
        # readable. (Deleted before that: the transfer fails and Raft retries.)
        fd = self.disk.open(path)
        try:
            pieces = snapfile.read_chunks(fd, size, disk=self.disk)
            async for piece in iterate_in(self.io_executor, pieces):
                self.stats.snapshot_bytes_sent += len(piece)
                yield piece
        finally:
            self.disk.close(fd)

    async def _exported(self, g: _Group, meta: SnapshotMeta) -> AsyncIterator[bytes]:
        """A state machine whose snapshot files are only markers (its store is
        durable; compaction needed no image) exports a catch-up image now, for
        this one transfer: written to a temporary file in the io thread (never
        held in memory), streamed in chunks, deleted. It holds the state at
        the store's applied index, at or past `meta.index`; the entries in
        between are committed, and the receiver skips those its image holds."""
        ex = self._export_for(g, meta)
        ex.users += 1
        try:
            index, size, crc = await asyncio.shield(ex.writing)
            # The machine is never given no-ops (nor the bootstrap entry): its index may
            # stay below the snapshot's for good, and the image is still that state. Only
            # an image older than what the snapshot's own machine state held is refused.
            floor = meta.index if g.image_floor is None or g.snap is None \
                or g.snap.meta != meta else min(meta.index, g.image_floor)
            if index < floor:
                raise RuntimeError(f"{g.name}: exported image holds index {index}, "
                                   f"older than the snapshot at {meta.index} (machine "
                                   f"index {floor})")
            yield snapfile.encode_head(meta, size, crc)
            async for piece in self._file_chunks(ex.path, size):
                yield piece
        finally:
            ex.users -= 1
            if not ex.users:
                if self._exports.get(g.name) is ex:
                    del self._exports[g.name]
                if ex.writing.done():
                    _discard_export(ex.writing, ex.path, self.disk)
                else:  # the transfer ended early: the thread still writes; delete it after
                    ex.writing.add_done_callback(
                        lambda t: _discard_export(t, ex.path, self.disk))

    def _export_for(self, g: _Group, meta: SnapshotMeta) -> _Export:
        """The export in use by another transfer of the group (two members joining at
        once share one image) if it can stand for `meta`, else a new one."""
        ex = self._exports.get(g.name)
        if ex is not None and ex.group is g and not (
                ex.writing.done() and (ex.writing.cancelled() or ex.writing.exception()
                                       or ex.writing.result()[0] < meta.index)):
            return ex
        path = snapfile.new_export(self.snap_dir, g.name, disk=self.disk)
        writing = asyncio.ensure_future(self.io_executor.run(_write_export, g.sm, path, self.disk))
        ex = self._exports[g.name] = _Export(g, path, writing)
        self.stats.images_exported += 1
        return ex

    # ---- the ready loop ------------------------------------------------------------------

    def _mark(self, group: str) -> None:
        self._dirty[group] = None
        self._kick.set()

    async def _drain_loop(self) -> None:
        try:
            while self._running:
                await self._kick.wait()
                self._kick.clear()
                # A loop, not an if: between one eager pass's end and this
                # task's resumption, an answer may start the next one, and two
                # passes at once would take the same Readies twice (a double
                # apply; tests/raft/test_commit_path.py, review session 10).
                while self._eager_tail is not None:
                    await asyncio.wait((self._eager_tail,))
                if self._running:
                    self._passing = True
                    try:
                        await self._drain_once()
                    finally:
                        self._passing = False
        except Exception as exc:  # write/fsync error, apply error, broken invariant
            self._fail_stop(exc)

    # A leader's commit pass run at once from the transport's callback
    # (`on_messages`) instead of the drain task's next loop turn: only while no
    # pass is in flight (a group's Ready is advanced before the next is taken,
    # and nothing is applied before the local fsync of its entries), for at
    # most this many dirty groups, when none of them has anything to write
    # (`_eager_ok`). Such a pass normally never awaits.
    EAGER_GROUPS_MAX = 8

    def _eager_ok(self) -> bool:
        """Every dirty group is led here and its next pass writes nothing and
        applies a few small entries on the loop: a leader's commit after an
        APP_RESP (a window-1 commit's last step; the loop turn it saves took
        0.1-0.2 ms in raft_trace at load 23). Not for followers: an eager
        append pass (append, fsync, APP_RESP from the callback) measured no
        better than the drain task's, in p50 or CPU (docs/notes/w1.md), and
        their commit-only passes are off a commit's path."""
        if len(self._dirty) > self.EAGER_GROUPS_MAX:
            return False
        for name in self._dirty:
            g = self._groups.get(name)
            if g is None:
                continue
            c = g.core
            lg = c.log
            if (c.state is not StateType.LEADER or g.props or g.incoming is not None
                    or lg.unstable.entries or lg.unstable.snapshot is not None
                    or c.term != c.prev_hs.term or c.vote != c.prev_hs.vote):
                return False
            n = lg.committed - lg.applied
            if n > self.inline_apply_entries or (
                    n and sum(len(e.data) for e in lg.next_committed_ents()) > INLINE_APPLY_BYTES):
                return False
        return True

    def _drain_now(self) -> None:
        """Run a pass that `_eager_ok` allowed, here and now, up to its first
        suspension (normally none: an fsync and an apply on the loop, or no
        fsync at all); a pass that does suspend finishes as a task, and the
        drain task waits for its end (`_eager_tail`) before the next pass."""
        self.stats.eager_passes += 1
        self._passing = True
        try:
            rest = _start_now(self._drain_once())
        except Exception as exc:
            self._passing = False
            self._fail_stop(exc)
            return
        if rest is None:
            self._passing = False
            if not self._dirty:
                self._kick.clear()  # nothing left for the drain task
            return
        self._eager_tail = self._spawn(self._eager_rest(rest))

    async def _eager_rest(self, rest: Any) -> None:
        try:
            await rest
        finally:
            self._passing = False
            self._eager_tail = None
            self._kick.set()

    async def _drain_once(self) -> None:
        dirty, self._dirty = self._dirty, {}
        work: list[tuple[_Group, Ready]] = []
        early: list[Message] = []
        need_sync, self._force_sync = self._force_sync, False
        installs: list[tuple[_Group, snapfile.Stored]] = []
        for name in dirty:
            g = self._groups.get(name)
            if g is None:
                continue
            self._flush_proposals(g)
            if not g.core.has_ready():
                self._after(g)
                continue
            rd = g.core.ready()
            if rd.committed_entries and self._hold_apply(g, rd):
                rd.committed_entries = []  # not applied: the core offers them again
            early.extend(self._take_early(g, rd))
            work.append((g, rd))
        queued = False
        if early and (need_sync or any(rd.must_sync for _, rd in work)):
            # A leader's appends need only its term, durable since its election:
            # they leave before its own records are even buffered (encoding them
            # is off the followers' path; a pass with nothing to fsync sends them
            # in `_finish`, below).
            queued, early = self._send(early), []
        for g, rd in work:
            need_sync |= self._persist(g, rd, installs)
        if not need_sync and not installs:
            # Nothing to fsync (a leader's commit pass): the early messages
            # gain nothing by leaving first; `_finish` sends them with the rest.
            if work:
                self.stats.drains += 1
                self.stats.readies += len(work)
            await self._finish(work, installs, early, synced=False)
            return
        # A leader's appends leave before its own fsync (they need only the
        # term, durable since its election); it counts itself only after the
        # fsync (`_finish`). Over direct lanes the appends are in the kernel
        # when `_send` returns, and a small pass then fsyncs on the loop: the
        # leader's thread blocks in the fsync while the followers it woke run
        # (on 2 cores: a hand-off to the WAL thread put a 4th runnable thread
        # beside the leader and its 2 followers, and cost ~5 wake-ups and
        # ~25 % of the leader's CPU per window-1 commit; docs/notes/w1.md).
        # Whether the early appends still wait for a writer task's loop turn.
        if early:
            queued = self._send(early)
        await self._commit_installs(installs)
        if need_sync:
            runner = await self._sync_runner(queued)
            # A received snapshot's answers wait for its promotion (below).
            await self._sync_pass(len(work), runner,
                                  None if installs else lambda: self._answer(work))
        for g, _ in installs:
            async with self._files_lock(g.name):
                if self._groups.get(g.name) is g:
                    await self.io_executor.run(snapfile.promote, self.snap_dir, g.name, self.disk)
        installs[:] = [(g, st) for g, st in installs if self._groups.get(g.name) is g]
        for g, stored in installs:
            # Off the loop: copying a large image must not stall other groups.
            await self.io_executor.run(g.sm.restore_from, stored.path or self._empty_image())
            g.image_floor = _machine_index(g.sm)
        self.stats.drains += 1
        self.stats.readies += len(work)
        await self._finish(work, installs, [])

    async def _sync_pass(self, groups: int, runner: Any, then: Any = None) -> None:
        """The drain pass's write+fsync, in `runner`; `then()` once it is durable."""
        top = self._newest_segment()
        self._sync_roll = top != self._synced_top
        try:
            await self.node_log.sync_async(runner, then)
        finally:
            self._sync_roll = False
        self.stats.sync_rolls += top != self._synced_top
        self._synced_top = top
        self._count_sync(groups)

    def _answer(self, work: list[tuple[_Group, Ready]]) -> None:
        """Right after the pass's fsync (and before anything else of the pass:
        segment deletions, the storage step, the apply), the messages that
        waited only for it: a follower's APP_RESP, votes. Taken out of the
        Readies, so `_finish` does not send them again."""
        msgs: list[Message] = []
        for _, rd in work:
            if rd.messages:
                msgs.extend(rd.messages)
                rd.messages = []
        if msgs:
            self._send(msgs)

    async def _sync_runner(self, sent_early: bool) -> Any:
        """Where the drain pass's write+fsync runs: on the loop for a small
        pass, else the WAL thread. A leader's pass whose appends wait for a
        writer task (`sent_early`: gRPC lanes) yields one loop turn before an
        fsync on the loop, so the writers hand those appends to gRPC (whose
        own thread sends them while this thread fsyncs, the GIL released).
        Appends already in the kernel (direct lanes) need no turn: the fsync
        starts at once (measured: the turn cost 0.3-0.5 ms of a window-1
        commit at load 20, the leader's fsync starting after the follower's)."""
        pending = getattr(self.node_log, "pending_bytes", None)
        if (pending is None or self.inline_sync_bytes <= 0
                or pending() > self.inline_sync_bytes):
            return self.wal_executor.run
        if sent_early and getattr(self.transport, "send_now", None) is not None:
            await asyncio.sleep(0)
        self.stats.inline_syncs += 1
        return _run_here

    def _send(self, msgs: list[Message], lazy_commit: bool = False) -> bool:
        """Hand a drain pass's messages to the transport, on the wire now: the
        pass goes on to await an fsync or an apply, and a flush left to the end
        of the loop turn would hold a leader's appends (and a follower's
        responses) back until then (measured: 0.2-0.4 ms of a window-1 commit).

        `lazy_commit` (a pass that fsynced nothing): a leader's appends without
        entries only tell followers the new commit index; nothing waits on
        them, so they ride with the next flush to the peer (the next
        proposal's append) or leave within the transport's LAZY_FLUSH_S.

        True unless the transport says all of it is in the sockets already
        (`send_now` returning False); a transport without `send_now` (the
        simulation) counts as waiting, as before."""
        send_lazy = getattr(self.transport, "send_lazy", None)
        if lazy_commit and send_lazy is not None:
            lazy = [m for m in msgs if m.type is MsgType.APP and not m.entries]
            if lazy:
                send_lazy(lazy)
                msgs = [m for m in msgs if not (m.type is MsgType.APP and not m.entries)]
                if not msgs:
                    return True
        send_now = getattr(self.transport, "send_now", None)
        if send_now is None:
            self.transport.send(msgs)
            return True
        return send_now(msgs) is not False

    def _newest_segment(self) -> int:
        segments = getattr(self.node_log, "segments", None)  # a test double may lack it
        segs = segments() if segments is not None else []
        return segs[-1] if segs else 0

    def activity(self) -> dict[str, int]:
        """What is in flight right now (operators, and the process crash test,
        which aims kill -9 at these moments): a drain-pass sync that writes a
        segment roll, snapshots being written/committed/compacted, snapshots
        being received or installed, membership changes proposed by this
        leader and not applied yet. O(groups): on request only."""
        gs = list(self._groups.values())
        return {
            "sync_roll": int(self._sync_roll),
            "snapshotting": sum(g.snapshotting for g in gs),
            "installing": self._receiving + sum(g.installing for g in gs),
            "conf_changing": sum(g.core.state is StateType.LEADER
                                 and g.core.pending_conf_index > g.core.log.applied for g in gs),
        }

    def _count_sync(self, groups: int) -> None:
        s = self.stats
        s.syncs += 1
        s.synced_readies += groups
        s.max_groups_per_sync = max(s.max_groups_per_sync, groups)

    async def _commit_installs(self, installs: list[tuple[_Group, snapfile.Stored]]) -> None:
        """Stage received snapshot files (data and a `.pending` meta, durable)
        before the fsync of their SNAPSHOT_META records, so the WAL never names
        a missing snapshot; they are promoted after that fsync, so a crash in
        between never leaves a snapshot newer than the log (defect 4)."""
        for i, (g, inc) in enumerate(installs):
            if g.snap_task is not None:
                # Our own snapshot of the group is being written: let it finish
                # first, so the received file is the last one committed and
                # snapshot_to never overlaps restore_from.
                await asyncio.gather(g.snap_task, return_exceptions=True)
            async with self._files_lock(g.name):
                if self._groups.get(g.name) is not g:
                    snapfile.discard(inc.path, disk=self.disk)  # removed meanwhile
                    continue
                # Staged only (data and a `.pending` meta, durable): it becomes
                # the group's snapshot after the SNAPSHOT_META record's fsync.
                g.snap = await self.io_executor.run(
                    snapfile.stage, self.snap_dir, g.name, inc.meta, inc.path, inc.size,
                    inc.crc, self.disk)
                g.image_floor = None  # known once the image is restored
            installs[i] = (g, g.snap)
        # A group removed meanwhile is not restored (its state machine may be closed).
        installs[:] = [(g, st) for g, st in installs if self._groups.get(g.name) is g]

    async def _finish(self, work: list[tuple[_Group, Ready]], installs: list,
                      early: list[Message], synced: bool = True) -> None:
        # A group removed during the fsync: its state machine is no longer ours.
        work = [(g, rd) for g, rd in work if self._groups.get(g.name) is g]
        out: list[Message] = list(early)
        for g, stored in installs:
            self._install(g, stored.meta)
        for g, rd in work:
            if rd.hard_state is not None:
                g.durable_tv = (rd.hard_state.term, rd.hard_state.vote)
            resp = storage_append_resp(rd)
            if resp is not None:
                c0 = g.core.log.committed
                g.core.step(resp)
                if rd.entries and g.core.state is StateType.LEADER and (
                        g.core.log.committed > c0 or c0 >= resp.index):
                    # Followers had answered before this fsync ended: the commit
                    # (or its apply) waited for the leader's own write.
                    self.stats.own_sync_last += 1
            out.extend(rd.messages)
        # Apply every group's committed entries in ONE hop to the apply worker
        # (log order per group); the loop keeps stepping messages meanwhile.
        batches = [(g.sm, ents) for g, rd in work if (ents := self._to_apply(g, rd))]
        inline = not batches or self._small(batches)
        if out and inline:
            # A follower's answers (APP_RESP, votes...) are what a commit waits
            # for: they leave before the inline apply; a leader's appends wait
            # for it (below). Durability is unchanged: the pass's fsync is done.
            answers = [m for m in out if m.type not in _EARLY]
            if answers:
                out = [m for m in out if m.type in _EARLY]
                self._send(answers)
        if out and not inline:
            self._send(out)
        if batches and inline:
            # A few small entries (low load): two thread switches would cost
            # far more than the apply itself; a commit waits for both.
            _apply_batches(batches)
        elif batches:
            self._apply_idle.clear()
            try:
                await self.apply_executor.run(_apply_batches, batches)
            finally:
                self._apply_idle.set()
            # A group removed while the worker applied (a stream deleted during its own
            # purge): its log is dropped, advancing its core would trip the invariants.
            work = [(g, rd) for g, rd in work if self._groups.get(g.name) is g]
        for g, rd in work:
            self._settle(g, rd)
            g.core.advance(rd)
            self._after(g)
        if out and inline:
            # Sent after the (inline, small) apply: the proposers resolved just
            # now resume before the writer tasks spend their loop turns on
            # these messages (a leader's commit-index appends to its
            # followers: about 0.3 ms of a window-1 commit when sent first).
            self._send(out, lazy_commit=not synced)

    def _small(self, batches: list[tuple[Any, list[Entry]]]) -> bool:
        """Few entries and bytes: applied on the loop, not in the worker."""
        n = size = 0
        for _, ents in batches:
            n += len(ents)
            if n > self.inline_apply_entries:
                return False
            size += sum(len(e.data) for e in ents)
        return size <= INLINE_APPLY_BYTES

    def _flush_proposals(self, g: _Group) -> None:
        """Step queued proposals as one PROP: one append and one APP per follower."""
        if not g.props:
            return
        props, g.props = g.props, []
        if len(props) > 1:
            props = _merged(props)
        core = g.core
        if core.state is not StateType.LEADER:
            for _, fut in props:
                _fail(fut, NotLeader(core.lead))
            return
        before = core.log.last_index()
        core.step(Message(MsgType.PROP, frm=self.node_id,
                          entries=[Entry(0, 0, EntryType.NORMAL, d) for d, _ in props]))
        if core.log.last_index() != before + len(props) or core.state is not StateType.LEADER:
            err: Exception = (NotLeader(core.lead) if core.state is not StateType.LEADER
                              else ProposalDropped("too many uncommitted entries or transfer"))
            for _, fut in props:
                _fail(fut, err)
            return
        for i, (_, fut) in enumerate(props, start=before + 1):
            g.pending[i] = (core.term, fut)

    def _persist(self, g: _Group, rd: Ready, installs: list) -> bool:
        """Buffer the Ready's durable parts; True if they need an fsync now."""
        if rd.snapshot is not None:
            meta = rd.snapshot.meta
            inc = g.incoming
            if inc is None or inc.meta.index != meta.index:
                raise RuntimeError(f"{g.name}: snapshot {meta.index} without its data")
            installs.append((g, inc))
            g.incoming = None
            g.installing = True
            self.node_log.apply_snapshot(g.name, meta)
        if rd.entries:
            self.node_log.append(g.name, rd.entries)
            self.stats.entries_persisted += len(rd.entries)
        if rd.hard_state is not None:
            self.node_log.set_hard_state(g.name, rd.hard_state)
        return rd.must_sync or rd.snapshot is not None

    def _take_early(self, g: _Group, rd: Ready) -> list[Message]:
        """Split off leader messages that may leave before our fsync."""
        hs = rd.hard_state
        if g.core.state is not StateType.LEADER or rd.snapshot is not None:
            return []
        if hs is not None and (hs.term, hs.vote) != g.durable_tv:
            return []  # the term itself is not durable yet
        early = [m for m in rd.messages if m.type in _EARLY]
        if early:
            rd.messages = [m for m in rd.messages if m.type not in _EARLY]
        return early

    def _install(self, g: _Group, meta: SnapshotMeta) -> None:
        """Bookkeeping once a received snapshot is committed and restored."""
        g.installing = False
        self.stats.snapshots_installed += 1
        for idx in [i for i in g.pending if i <= meta.index]:
            _, fut = g.pending.pop(idx)
            _fail(fut, ProposalDropped("outcome unknown: replaced by a snapshot"))

    def _to_apply(self, g: _Group, rd: Ready) -> list[Entry]:
        """The Ready's committed entries the state machine must see: not the
        leaders' empty no-ops, and none at or below a snapshot restored since
        the Ready was taken (that snapshot already holds their effect, and a
        membership change among them would overwrite its newer configuration)."""
        floor = g.core.log.first_index() - 1
        return [e for e in rd.committed_entries
                if e.index > floor and (e.data or e.type is not EntryType.NORMAL)]

    def _hold_apply(self, g: _Group, rd: Ready) -> bool:
        """Whether a follower keeps this Ready's committed entries for later
        (FOLLOWER_DEFER_*); arms the deadline that ends the hold."""
        ents = rd.committed_entries
        if (self.follower_defer_s <= 0 or g.apply_now
                or g.core.state is not StateType.FOLLOWER
                or not getattr(g.sm, "defer_apply", False)
                or len(ents) >= FOLLOWER_DEFER_ENTRIES
                or rd.snapshot is not None or rd.read_states or g.read_waits or g.reads
                or g.installing or g.held_at_start > g.core.applied
                or any(e.type is not EntryType.NORMAL for e in ents)
                or sum(len(e.data) for e in ents) > INLINE_APPLY_BYTES):
            g.apply_now = False
            if g.defer_task is not None:  # applied now: its deadline is moot
                g.defer_task.cancel()
                g.defer_task = None
            return False
        if g.defer_task is None:
            g.defer_task = self._spawn(self._apply_due(g))
        return True

    def apply_held(self, group: str) -> asyncio.Future[None] | None:
        """A read served from this follower's state machine (a direct get): what the
        hold keeps back is applied now, up to the commit index known here. None when
        nothing is held (no wait), or when the driver stopped or failed (no pass would ever
        settle the future: the read takes the state as it stands); else a future done once
        it is applied."""
        g = self._groups.get(group)
        # (`apply_now` without a task: the deadline fired, its pass is still to come.)
        if not self._running or g is None or (g.defer_task is None and not g.apply_now):
            return None
        g.apply_now = True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        g.read_waits.append((g.core.log.committed, fut))
        self._mark(group)
        return fut

    async def _apply_due(self, g: _Group) -> None:
        """The hold's deadline: the group's next pass applies what it holds."""
        await self.clock.sleep(self.follower_defer_s)
        g.defer_task = None  # (a cancelled task never gets here: no newer one is cleared)
        if self._groups.get(g.name) is g and self._running:
            g.apply_now = True
            self._mark(g.name)

    def _holding(self, g: _Group) -> bool:
        """The group's only pending work is committed entries it holds back:
        no pass until its deadline (or other work) comes."""
        core = g.core
        lg = core.log
        return (g.defer_task is not None and not g.apply_now
                and core.state is StateType.FOLLOWER and not core.msgs
                and not core.read_states and not lg.unstable.entries
                and lg.unstable.snapshot is None and not core._hs_changed())

    def _settle(self, g: _Group, rd: Ready) -> None:
        """After the apply: resolve proposals, record conf changes, hand out reads."""
        for e in rd.committed_entries:
            if e.type is EntryType.CONF_CHANGE and g.snapshotting:
                g.conf_applied.append(e.index)
            p = g.pending.pop(e.index, None)
            if p is not None and not p[1].done():
                if p[0] == e.term:
                    p[1].set_result(e.index)
                else:
                    p[1].set_exception(ProposalDropped("overwritten by a new leader"))
        self.stats.entries_applied += len(rd.committed_entries)
        for rs in rd.read_states:
            fut = g.reads.pop(rs.context, None)
            if fut is not None:
                g.read_waits.append((rs.index, fut))

    def _after(self, g: _Group) -> None:
        """Bookkeeping once a group's Ready is done (or it had none)."""
        core = g.core
        applied = core.applied
        if g.read_waits:
            keep = []
            for idx, fut in g.read_waits:
                if idx <= applied:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    keep.append((idx, fut))
            g.read_waits = keep
        self._notice_leader(g)
        if g.pending and core.state is not StateType.LEADER:
            self._drop_overwritten(g)
        if g.pending and self.node_id not in core.prs:
            # This node left the group (it may have led the change): nobody
            # will send it the fate of its uncommitted proposals any more.
            for _, fut in g.pending.values():
                _fail(fut, ProposalDropped("this node left the group: outcome unknown"))
            g.pending.clear()
        if core.quiesced:
            self._active.pop(g.name, None)
        else:
            self._active[g.name] = None
        if (core.has_ready() and not self._holding(g)) or g.props:
            self._mark(g.name)
        snap_index = core.log.first_index() - 1
        if not g.snapshotting and applied - snap_index >= self.snapshot_every:
            self._snapshot(g)

    def _drop_overwritten(self, g: _Group) -> None:
        """Fail the proposals whose entries a new leader's appends removed from
        this node's log (a deposed leader's uncommitted tail). They used to wait
        for a commit at their index, which in an idle group never comes (the
        1,000-busy-group stall of 2026-11-27). The outcome is unknown, not
        "lost": another member may still hold the entry and win an election.
        Pending indexes ascend in insertion order and every one of them was in
        the log at the previous check, so the scan stops at the first survivor."""
        log_ = g.core.log
        last = log_.last_index()
        gone = []
        for idx in reversed(g.pending):
            if idx <= last and log_.term_or_zero(idx) in (g.pending[idx][0], 0):
                break  # still ours (0: compacted, i.e. committed and settled)
            gone.append(idx)
        for idx in gone:
            _, fut = g.pending.pop(idx)
            _fail(fut, ProposalDropped("outcome unknown: a new leader's appends replaced "
                                       "the entry in this node's log"))

    def _notice_leader(self, g: _Group) -> None:
        cur = (g.core.lead, g.core.term)
        if cur == g.lead_seen:
            return
        lost = g.lead_seen[0] != cur[0]
        g.lead_seen = cur
        if lost:
            for fut in g.reads.values():
                _fail(fut, NotLeader(cur[0]))
            g.reads.clear()
        try:
            g.sm.on_leader_change(cur[0], cur[1])
        except Exception:
            log.exception("multiraft %d: on_leader_change failed in %s", self.node_id, g.name)
        waiters, g.leader_waiters = g.leader_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _fail_all(self, g: _Group, exc: Exception) -> None:
        for _, fut in g.pending.values():
            _fail(fut, exc)
        for _, fut in g.props:
            _fail(fut, exc)
        for fut in g.reads.values():
            _fail(fut, exc)
        for _, fut in g.read_waits:
            _fail(fut, exc)
        g.pending.clear()
        g.props.clear()
        g.reads.clear()
        g.read_waits.clear()

    # ---- snapshots and compaction ----------------------------------------------------

    def _snapshot(self, g: _Group) -> None:
        if g.snapshotting or g.installing:
            return  # never two images at once, nor an image during a restore
        if g.core.applied < g.held_at_start:
            return  # still re-applying what the state machine held at start
        core = g.core
        g.snapshotting = True
        g.conf_applied = []
        g.snap_task = self._spawn(self._save_and_compact(g, core.applied, core.conf_state))

    async def _save_and_compact(self, g: _Group, start: int, conf: ConfState) -> None:
        part = snapfile.new_part(self.snap_dir, g.name, disk=self.disk)
        try:
            # The image is written in a thread while applies go on; it tells
            # which applied index it holds (>= start).
            try:
                index, size, crc = await self.io_executor.run(_write_image, g.sm, part, self.disk)
            except OSError as exc:
                # Nothing durable names the image yet: drop it, the next
                # trigger tries again. (Errors after this point are fatal.)
                log.warning("multiraft %d: snapshot image of %s failed: %r",
                            self.node_id, g.name, exc)
                self.stats.snapshots_discarded += 1
                return
            meta = self._image_meta(g, start, index, conf)
            if meta is None:
                self.stats.snapshots_discarded += 1
                return
            # The hard state whose commit covers `meta.index` was buffered
            # before the entries were applied: make it durable before the
            # snapshot file can claim that index.
            await self.node_log.sync_async(self.io_executor.run)
            async with self._files_lock(g.name):
                if self._groups.get(g.name) is not g:
                    return  # removed meanwhile: leave no meta file behind
                stored = await self.io_executor.run(
                    snapfile.commit, self.snap_dir, g.name, meta, part, size, crc, self.disk)
            part = None
            gl = self.node_log.group(g.name)
            if self._groups.get(g.name) is not g or meta.index <= gl.first_index() - 1:
                return  # removed, or a newer snapshot was installed meanwhile
            g.snap = stored
            g.image_floor = min(index, meta.index)  # the machine's index (see _image_meta)
            self.node_log.compact(g.name, meta.index, meta.conf_state)
            self.stats.snapshots_taken += 1
        finally:
            snapfile.discard(part, disk=self.disk)
            g.snapshotting = False
            g.snap_task = None

    def _image_meta(self, g: _Group, start: int, index: int,
                    conf: ConfState) -> SnapshotMeta | None:
        """Metadata of an image holding entries up to `index`, or None if it
        cannot be used: the group moved on under it (a snapshot installed,
        the group removed) or a membership change applied after `start` is in
        it, so `conf` would be wrong (the next trigger takes a new image)."""
        core = g.core
        # A member that installed a leader's exported image may hold entries
        # past its own applied index (the export was taken at the leader's
        # applied index, past the snapshot it stood for): its state covers at
        # least core.applied, which is what the snapshot may name.
        index = min(index, core.applied)
        # The state machine counts only entries it was given: no-ops and
        # membership changes between its index and `start` do not change the
        # state, so the image is also the state at `start`.
        index = max(index, start)
        if self._groups.get(g.name) is not g or index <= core.log.first_index() - 1:
            return None
        if any(start < c <= index for c in g.conf_applied):
            return None
        term = core.log.term_or_zero(index)
        return SnapshotMeta(index, term, conf) if term else None

    def snapshot_now(self, group: str) -> None:
        """Snapshot and compact `group` at its applied index (operators, tests)."""
        g = self._group(group)
        if not g.snapshotting and g.core.applied > g.core.log.first_index() - 1:
            self._snapshot(g)

    def _snapshot_pinning(self) -> None:
        # A few at a time: thousands of groups pinning the oldest segment
        # must not all write images at once.
        for name in self.node_log.pinning_groups(limit=PINNING_SNAPSHOTS):
            g = self._groups.get(name)
            if g is not None and not g.snapshotting:
                if g.core.applied > g.core.log.first_index() - 1:
                    self._snapshot(g)

    # ---- ticks, quiescence, liveness --------------------------------------------------

    async def _tick_loop(self) -> None:
        clock = self.clock
        next_at = clock.now()
        while True:
            next_at += self.tick_interval_s
            await clock.sleep(max(0.0, next_at - clock.now()))
            if clock.now() - next_at > self.tick_interval_s:
                # The loop was stalled (overloaded machine, a long pass): missed
                # ticks are dropped, not caught up. A burst of ticks before the
                # input that queued meanwhile is read would age every group's
                # election timer, and every peer's silence, by the stall itself
                # (measured: 1,000 busy groups on a loaded machine lost their
                # leaders this way). Timeouts count ticks the loop actually ran.
                next_at = clock.now()
                self._resumed_at = next_at
            self._on_tick()

    def _on_tick(self) -> None:
        self.stats.ticks += 1
        if self.transport is not None and self._peers:
            self.transport.beat()
            self._check_peers()
        for name in list(self._active):
            g = self._groups.get(name)
            if g is None:
                self._active.pop(name, None)
                continue
            self._tick_group(g)
        if self.stats.ticks % 50 == 0:
            self._snapshot_pinning()

    def _tick_group(self, g: _Group) -> None:
        core = g.core
        # Quiesce before ticking: a group that has just gone quiet needs no heartbeat.
        # (Late answers to earlier heartbeats do not wake it: see Raft._is_late_heartbeat_resp.)
        if core.state is StateType.LEADER and core.can_quiesce():
            g.idle_ticks += 1
            if g.idle_ticks >= self.quiesce_after_ticks:
                core.quiesce()
                g.idle_ticks = 0
        else:
            g.idle_ticks = 0
        if not core.quiesced:
            core.tick()
        if core.quiesced:
            self._active.pop(g.name, None)
        if core.has_ready():
            self._mark(g.name)

    def _check_peers(self) -> None:
        """A peer is dead after dead_after_s of silence while this loop ran:
        after a local stall, its beats may be waiting unread in our sockets."""
        now = self.clock.now()
        for peer, alive in self._peers.items():
            try:
                seen = self.transport.last_seen(peer)
            except KeyError:
                continue
            is_alive = seen > 0 and now - max(seen, self._resumed_at) <= self.dead_after_s
            if alive and not is_alive:
                silence = f"silent for {now - seen:.2f}s" if seen > 0 else "not heard from yet"
                log.warning("multiraft %d: node %d %s: waking the groups it leads",
                            self.node_id, peer, silence)
                self._wake_led_by(peer)
            self._peers[peer] = is_alive

    def _wake_led_by(self, peer: int) -> None:
        """A peer node went silent: its quiesced groups must be able to elect."""
        for g in self._groups.values():
            if g.core.quiesced and g.core.lead == peer:
                g.core.wake()
                self._active[g.name] = None
                self._mark(g.name)
                self.stats.wakes_for_dead_peer += 1


def _start_now(coro: Any) -> Any:
    """Run `coro` here up to its first suspension, not a loop turn later as
    a new task would; None if it ended there (its result is dropped), else a
    task running the rest. Its exceptions up to then are raised here."""
    try:
        waited = coro.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_resume(coro, waited))


async def _resume(coro: Any, waited: Any) -> Any:
    """Drive a coroutine that `_start_now` suspended on `waited` (a Future, or
    None for a bare yield) to its end, as its own task would have."""
    while True:
        try:
            if waited is None:
                await asyncio.sleep(0)
            else:
                await asyncio.wait((waited,))
        except asyncio.CancelledError as exc:
            # As a task's cancel would: the awaited future is cancelled too, so a
            # job queued for an executor (a WAL write of a node being torn down)
            # never starts (seen when follower passes could suspend here: the
            # simulation's crashed nodes then wrote on their closed files).
            if waited is not None:
                waited.cancel()
            try:
                waited = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
            continue
        try:
            waited = coro.send(None)
        except StopIteration as stop:
            return stop.value


async def _run_here(fn: Any, *args: Any) -> Any:
    return fn(*args)


class _Quiet:
    """Stands where a proposal's Future would (`done`, `set_result`, `set_exception`)
    for `propose_quiet`: a success costs nothing; a failure is handed to the loop."""

    __slots__ = ("on_error", "arg", "merge", "_done")

    def __init__(self, on_error: Any, arg: Any, merge: Any = None) -> None:
        self.on_error, self.arg, self.merge, self._done = on_error, arg, merge, False

    def done(self) -> bool:
        return self._done

    def set_result(self, _index: int) -> None:
        self._done = True

    def set_exception(self, exc: BaseException) -> None:
        if not self._done:
            self._done = True
            # Never inside the driver's own pass: the callback may propose again.
            try:
                asyncio.get_running_loop().call_soon(self.on_error, self.arg, exc)
            except RuntimeError:  # no loop running (a node torn down): tell it now
                self.on_error(self.arg, exc)


class _QuietRun:
    """Stands for the `_Quiet`s of proposals merged into one entry: they share its fate."""

    __slots__ = ("parts", "_done")

    def __init__(self, parts: list[_Quiet]) -> None:
        self.parts, self._done = parts, False

    def done(self) -> bool:
        return self._done

    def set_result(self, _index: int) -> None:
        self._done = True

    def set_exception(self, exc: BaseException) -> None:
        if not self._done:
            self._done = True
            for q in self.parts:
                q.set_exception(exc)


def _merged(props: list[tuple[bytes, Any]]) -> list[tuple[bytes, Any]]:
    """`props` with each run of consecutive quiet proposals that share a `merge`
    function replaced by one merged proposal (order kept; other proposals untouched)."""
    out: list[tuple[bytes, Any]] = []
    run: list[tuple[bytes, Any]] = []
    size = 0
    for item in props:
        fut = item[1]
        merge = fut.merge if type(fut) is _Quiet else None
        if run and (merge is None or merge is not run[0][1].merge
                    or len(run) >= MERGE_MAX_COUNT or size + len(item[0]) > MERGE_MAX_BYTES):
            _close_run(run, out)
            run, size = [], 0
        if merge is None or len(item[0]) > MERGE_MAX_BYTES:
            out.append(item)
        else:
            run.append(item)
            size += len(item[0])
    _close_run(run, out)
    return out


def _close_run(run: list[tuple[bytes, Any]], out: list[tuple[bytes, Any]]) -> None:
    if len(run) == 1:
        out.append(run[0])
    elif run:
        merge = run[0][1].merge
        out.append((bytes(merge([d for d, _ in run])), _QuietRun([q for _, q in run])))


def _fail(fut: asyncio.Future[Any], exc: Exception) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _apply_batches(batches: list[tuple[Any, list[Entry]]]) -> None:
    """In the apply worker: each state machine gets its committed entries in
    log order, runs of normal entries as one `apply_batch` when it has one
    (one LMDB write txn), membership changes through `on_conf_change`."""
    for sm, ents in batches:
        batch_fn = getattr(sm, "apply_batch", None)
        run: list[tuple[int, bytes]] = []
        for e in ents:
            if e.type is EntryType.NORMAL:
                run.append((e.index, e.data))
                continue
            _apply_run(sm, batch_fn, run)
            run = []
            hook = getattr(sm, "on_conf_change", None)
            if hook is not None:
                hook(e.index, decode_conf_change(e.data))
        _apply_run(sm, batch_fn, run)


def _apply_run(sm: Any, batch_fn: Any, run: list[tuple[int, bytes]]) -> None:
    if not run:
        return
    if batch_fn is not None:
        batch_fn(run)
        return
    for index, data in run:
        sm.apply(index, data)


def _write_image(sm: Any, part: str, disk: Disk) -> tuple[int, int, int]:
    """In a worker thread: the state machine writes its image, then it is
    fsynced and checksummed. Returns (index, size, crc)."""
    index = sm.snapshot_to(part)
    if not isinstance(index, int):
        raise TypeError("snapshot_to() must return the applied index of the image")
    size, crc = snapfile.seal(part, disk=disk)
    return index, size, crc


def _machine_index(sm: Any) -> int | None:
    """A durable machine's own applied index (what it holds), or None."""
    held = getattr(sm, "applied_index", None)
    return None if held is None else int(held())


def _write_export(sm: Any, path: str, disk: Disk) -> tuple[int, int, int]:
    """In a worker thread: the state machine exports a catch-up image, then
    it is checksummed (not fsynced: it is sent, then deleted). Returns
    (index, size, crc)."""
    index = sm.export_to(path)
    if not isinstance(index, int):
        raise TypeError("export_to() must return the applied index of the image")
    size, crc = snapfile.checksum(path, disk=disk)
    return index, size, crc


@dataclass
class _Export:
    """A catch-up image being written or sent; deleted when its last transfer ends."""

    group: Any  # the _Group it was taken of (a re-created group does not share it)
    path: str
    writing: asyncio.Future[tuple[int, int, int]]  # -> (index, size, crc)
    users: int = 0


def _discard_export(task: asyncio.Future[Any], path: str, disk: Disk) -> None:
    """Done callback: delete an export whose transfer ended before it was written
    (its outcome is read, so a failure is not reported as never retrieved)."""
    if not task.cancelled():
        task.exception()
    snapfile.discard(path, disk=disk)


def create(
    node_id: int, dir: str, listen: str, peers: dict[int, str], **kw: Any
) -> MultiRaft:
    """A MultiRaft with a NodeLog in `dir`/wal and a GrpcTransport on `listen`."""
    from raft.transport_grpc import GrpcTransport  # grpc is heavy: only when wanted

    tls = kw.pop("tls", None)
    direct = kw.pop("direct", None)  # node -> direct TCP lane address (raft/tcp_lane.py)
    node_log = NodeLog(f"{dir}/wal", disk=kw.pop("disk", None), **kw.pop("log_options", {}))
    mr = MultiRaft(node_id, node_log, snap_dir=f"{dir}/snap", **kw)
    mr.bind_transport(GrpcTransport(node_id, listen, peers, tls=tls, direct=direct,
                                    **mr.transport_callbacks()))
    return mr

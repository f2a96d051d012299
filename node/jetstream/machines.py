"""The Raft state machines of JetStream: what `MultiRaft` applies committed entries to.

* `MetaMachine` (group `$js`): the stream catalogue. Its entries create and delete streams
  (JSON: `{"op": "create", "name", "config", "created_ns", "group"}` / `{"op": "delete",
  "name"}`), so a stream outlives restarts exactly when its create was committed.
* `StreamMachine` (one group per stream): wraps the pure `Stream` over its store and hands
  the effects to the node (`on_effects`, called on the event loop, in apply order).

Both keep their state in the node's LMDB environment, with the group's applied Raft index in
the same write transaction as the data (`applied_index()` lets the driver skip restores).

Snapshots and compaction (docs/jetstream.md, durability rule 4): LMDB itself is the image.
`snapshot_to` reads the applied index LMDB has COMMITTED (a fresh read transaction, never the
in-memory counter, which runs ahead of an open write transaction), then fsyncs the environment
including its meta page, and only then names that index; the driver compacts the WAL up to
it. The image file only records the index: `restore_from` accepts it when LMDB already holds
that index (a restart) and refuses otherwise, because a single node has nowhere to copy the
missing state from. Clustered (`full_images`), compaction of an LMDB stream is the same
marker (O(1): no image per `snapshot_every` entries, whatever the stream's size); the data
leaves the node only when a member needs the snapshot: the driver then asks `export_to` for
a catch-up image (`dump_image`, one read transaction, written to a file) at the store's
applied index, at or past the marker's, and streams it. A memory stream's snapshots stay
images (`dump_mem_image`): its state is not durable anywhere else, and at R>1 a publish is
acknowledged once a quorum holds it, so a restarting or catching-up replica needs them.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import threading
import weakref
from collections.abc import Callable
from typing import Any

from node.jetstream import config as stream_config
from node.jetstream.changes import ChangeMark
from node.jetstream.cluster_meta import Catalogue
from node.jetstream.crypt import read_file, write_file
from node.jetstream.inflight import Inflight
from node.jetstream.store.lmdbstore import (
    IMAGE_MAGIC,
    LmdbStore,
    NodeEnv,
    dump_image,
    load_image,
)
from node.jetstream.store.memstore import (
    MEM_IMAGE_MAGIC,
    MemStore,
    dump_mem_image,
    load_mem_image,
)
from node.jetstream.stream import ConsumerEvent, Delivered, Effect, Result, Stream

_U64 = struct.Struct("<Q")
META_STORE = "$js.meta"  # a name no stream can have ('.' is not allowed in stream names)
KEEP_MAX = 65536  # per-index results kept for proposers (more than any batch in flight)

EffectSink = Callable[["StreamMachine", list[Effect]], None]


class StoreLostError(RuntimeError):
    """The store no longer holds what a snapshot says it held: refuse to go on."""


def _committed_applied(store: Any) -> int:
    """The applied index as committed (a read transaction of its own when called outside
    an apply; MemStore: what it holds)."""
    raw = store.get_meta("applied")
    return _U64.unpack(raw)[0] if raw else 0


def _files(env: NodeEnv | None) -> Any:
    """The encrypted store's file codec (every snapshot file sealed whole), or None."""
    return None if env is None else env.files


def _write_file(env: NodeEnv | None, path: str, fill: Callable[[Any], Any]) -> Any:
    with open(path, "wb") as f:
        out = write_file(_files(env), f, fill)
        f.flush()
        os.fsync(f.fileno())
    return out


def _read_all(env: NodeEnv | None, path: str) -> bytes:
    with open(path, "rb") as f:
        return bytes(read_file(_files(env), f).read())


def _is_image(path: str, magic: bytes) -> bool:
    with open(path, "rb") as f:
        return f.read(len(magic)) == magic


def _write_marker(env: NodeEnv | None, path: str, name: str, index: int) -> None:
    body = json.dumps({"store": name, "applied": index}).encode()
    _write_file(env, path, lambda out: out.write(body))


def _check_marker(path: str, held: int, name: str, env: NodeEnv | None = None,
                  body: bytes | None = None) -> bool:
    """True for the empty image (reset to the empty state); raises if LMDB lacks the index."""
    if os.path.getsize(path) == 0:
        return True
    want = json.loads(body if body is not None else _read_all(env, path))["applied"]
    if held < want:
        raise StoreLostError(f"{name}: the store holds index {held} but the snapshot needs "
                             f"{want}: the store directory lost data; refusing to start")
    return False


class MetaMachine:
    """The stream catalogue (group `$js`): the fold of `cluster_meta` entries.

    Its state is ONE LMDB value (the catalogue with its applied index), so a snapshot reads
    a consistent pair in one read, and its image is that value as a file: a member that joins
    the meta group after compaction installs it (a stream's image is still only a marker)."""

    def __init__(self, env: NodeEnv, on_change: Callable[[], None], self_peer: int = 1) -> None:
        self.env = env
        self.store = LmdbStore(env, META_STORE)
        self.on_change = on_change
        self.self_peer = self_peer
        self.catalogue = self._load()

    @property
    def streams(self) -> dict[str, dict[str, Any]]:
        return self.catalogue.streams

    def _load(self) -> Catalogue:
        raw = self.store.get_meta("catalogue")
        if raw:
            return Catalogue.from_json(json.loads(raw))
        old = self.store.get_meta("streams")  # written before the catalogue had peers
        return Catalogue.from_json(json.loads(old)) if old else Catalogue()

    def apply(self, index: int, data: bytes) -> None:
        self.apply_batch([(index, data)])

    def apply_batch(self, run: list[tuple[int, bytes]]) -> None:
        changed = False
        with self.store.batch():
            applied = _committed_applied(self.store)
            for index, data in run:
                if index <= applied:
                    continue  # already in LMDB before a restart
                self.catalogue.apply(json.loads(data), self.self_peer, index)
                applied, changed = index, True
            if changed:
                self._put(applied)
        if changed:
            self.on_change()

    def _put(self, applied: int) -> None:
        image = {**self.catalogue.to_json(), "applied": applied}
        self.store.put_meta("catalogue", json.dumps(image).encode())
        self.store.put_meta("applied", _U64.pack(applied))

    def applied_index(self) -> int:
        return _committed_applied(self.store)

    def snapshot_to(self, path: str) -> int:
        raw = self.store.get_meta("catalogue")  # one read: the catalogue and its index
        image = json.loads(raw) if raw else {"streams": {}, "removed": [], "applied": 0}
        self.env.sync()  # what the image covers is durable before the WAL below it goes
        body = json.dumps({"store": META_STORE, **image}).encode()
        _write_file(self.env, path, lambda out: out.write(body))
        return int(image["applied"])

    def restore_from(self, path: str) -> None:
        if os.path.getsize(path) == 0:
            with self.store.batch():
                self.store.drop()
            self.catalogue = Catalogue()
            self.on_change()
            return
        body = _read_all(self.env, path)
        image = json.loads(body)
        if "streams" not in image:  # a marker of the single-node layout: LMDB must hold it
            _check_marker(path, self.applied_index(), META_STORE, body=body)
            return
        if self.applied_index() >= int(image["applied"]):
            return
        self.catalogue = Catalogue.from_json(image)
        with self.store.batch():
            self._put(int(image["applied"]))
        self.on_change()

    def on_leader_change(self, leader_id: int, term: int) -> None:
        pass


class StreamMachine:
    """One stream's group state machine. `lock` guards the pure `Stream` against the event
    loop's reads (plan, info) while an apply runs in the driver's apply worker."""

    def __init__(self, name: str, group: str, cfg: stream_config.Config, env: NodeEnv | None,
                 sink: EffectSink, created_ns: int, domain: str = "",
                 changes: ChangeMark | None = None) -> None:
        self.name = name
        self.domain = domain  # the JetStream domain PubAcks name (node/jetstream/domain.py)
        self.group = group
        self.initial_cfg = cfg
        self.env = env
        self.sink = sink
        self.created_ns = created_ns
        self.lock = threading.RLock()
        self.store: Any = self._new_store()
        self.stream = Stream(cfg, self.store, self.domain)
        # Consumer groups hosted here that read their messages from this replica (weak: a
        # group's machine dropped without `drop` still leaves).
        self.readers: weakref.WeakSet[Any] = weakref.WeakSet()
        # Result effects (purge, message delete) and Delivered effects by Raft index, for
        # the coroutine that proposed the entry; popped by it once `propose` resolves. Only
        # kept once `track` is set (after the start-up replay, whose entries nobody awaits).
        self.results: dict[int, dict[str, Any]] = {}
        self.delivered: dict[int, list[Delivered]] = {}
        self._delivered_kept = 0  # Delivered effects held in `delivered` (bounded)
        self.events: dict[int, list[ConsumerEvent]] = {}  # for the advisories
        self.track = False
        # Clustered: a member that joins or lags behind a compaction installs the data
        # (LMDB: an image exported when it is needed; memory: the snapshot is the image);
        # one node only needs a marker.
        self.full_images = False
        # Clustered: told when the group's leader changes (on the event loop).
        self.leader_hook: Callable[[int, int], None] | None = None
        # Moved after every change of the stored state, the reservations or the leader:
        # the node's passes over all its streams skip rounds where it did not move.
        self.changes = changes if changes is not None else ChangeMark()  # alone: its own
        # Publishes this node proposed as the leader, not yet applied (inflight.py).
        self.inflight = Inflight(self.changes)
        # Clustered: does this node lead the group now? Only a leader's PubAcks are sent
        # (JetStreamService._on_effects), so a follower's apply does not build them.
        self.leads: Callable[[], bool] | None = None
        # `early(sm, effects) -> effects left`: sees a run's effects before its store
        # commit (the node sends PubAcks there when the apply runs on its event loop).
        self.early: Callable[[StreamMachine, list[Effect]], list[Effect]] | None = None

    def _new_store(self) -> Any:
        if self.env is None:
            return MemStore(self.group)
        return LmdbStore(self.env, self.group)

    @property
    def memory(self) -> bool:
        return self.env is None

    def counted_bytes(self) -> int:
        """The bytes the limits count for this stream: stored, plus the publishes this node
        (its leader) holds in flight as far as the stream's own limits let them in."""
        with self.lock:
            return self.inflight.bound(self.store.bytes(), self.store.msgs(), self.stream.cfg)

    def apply(self, index: int, data: bytes) -> None:
        self.apply_batch([(index, data)])

    def apply_batch(self, run: list[tuple[int, bytes]]) -> None:
        """Every entry of the run in ONE store transaction (consumer states written once);
        effects kept per entry so a request can find the result of its own entry."""
        with self.lock:
            # Read once per run: a leader change during the run costs at most the PubAcks
            # of that run (the client's publish times out; no message is lost or doubled).
            self.stream.acks = self.leads is None or self.leads()
            inflight = self.inflight
            effects = self.stream.apply_batch(
                run, self._keep if self.track else None,
                None if self.early is None else self._before_commit,
                inflight.own if inflight.msgs else None)
            # Under the same lock as the stored bytes it makes visible: a limit check reads
            # store + in flight at once and sees each publish exactly once.
            self.inflight.release_entries(run)
        self.changes.move()
        if effects:
            self.sink(self, effects)

    @property
    def defer_apply(self) -> bool:
        """A follower may hold its committed publishes back a little and apply several as
        one run (raft/multigroup.py FOLLOWER_DEFER_*): nothing here waits for its apply
        but a direct get, which applies what is held first (`MultiRaft.apply_held`).
        Not while a consumer group hosted here delivers from this replica: its
        deliveries would wait for the hold."""
        return not self.readers

    def _before_commit(self, effects: list[Effect]) -> list[Effect]:
        early = self.early
        return effects if early is None else early(self, effects)

    def _keep(self, index: int, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Result):
                self.results[index] = effect.payload
            elif isinstance(effect, Delivered):  # a delivery round: several per entry
                self.delivered.setdefault(index, []).append(effect)
                self._delivered_kept += 1
            elif isinstance(effect, ConsumerEvent):
                self.events.setdefault(index, []).append(effect)
        # A follower (clustered) keeps them too, and nobody there pops them: the oldest go
        # (deliveries counted one by one: an entry holds a whole round).
        for kept in (self.results, self.events):
            while len(kept) > KEEP_MAX:
                del kept[next(iter(kept))]
        while self._delivered_kept > KEEP_MAX:
            self._delivered_kept -= len(self.delivered.pop(next(iter(self.delivered))))

    def take_delivered(self, index: int) -> list[Delivered]:
        """The Delivered effects of the entry at `index` (for the proposer, once)."""
        got = self.delivered.pop(index, [])
        self._delivered_kept -= len(got)
        return got

    def applied_index(self) -> int:
        return _committed_applied(self.store)

    @property
    def exports_images(self) -> bool:
        """Whether the driver must ask `export_to` for the image a member catches up
        from (the snapshot files are markers)."""
        return self.full_images and self.env is not None

    def export_to(self, path: str) -> int:
        """A catch-up image for a member that needs the snapshot: every key of the stream
        from ONE read transaction (applies go on meanwhile), at the applied index that
        transaction held, which is at or past any marker this store named. Not a
        durability point: it is sent and deleted; the receiver fsyncs its copy."""
        assert self.env is not None
        with open(path, "wb") as f:
            return int(write_file(_files(self.env), f, lambda out: dump_image(self.store, out)))

    def snapshot_to(self, path: str) -> int:
        if self.env is None and self.full_images:
            # Clustered memory stream: at R>1 a publish is acknowledged once a quorum holds
            # it, so the image must carry the messages (a replica installing a marker would
            # have nothing). The state is read under the lock: applies run in another
            # thread, and the image must be exactly the state at the index it names.
            with self.lock, open(path, "wb") as f:
                dump_mem_image(self.store, f)
                index = self.stream.applied
                f.flush()
                os.fsync(f.fileno())
            return index
        if self.env is None:
            index = self.stream.applied  # memory: an R1 memory stream starts empty anyway
        else:
            index = _committed_applied(self.store)
            self.env.sync()
        _write_marker(self.env, path, self.group, index)
        return index

    def restore_from(self, path: str) -> None:
        try:
            self._restore_from(path)
        finally:
            self.changes.move()  # the stored state may have been replaced

    def _restore_from(self, path: str) -> None:
        if self.env is None and os.path.getsize(path) and _is_image(path, MEM_IMAGE_MAGIC):
            with open(path, "rb") as f:
                f.read(len(MEM_IMAGE_MAGIC))
                store = load_mem_image(self.group, f)
            with self.lock:
                self.store = store
                self.stream = Stream(self.initial_cfg, self.store, self.domain)
                self._forget_effects()
            return
        body = None
        if self.env is not None and os.path.getsize(path):
            with open(path, "rb") as f:
                src = read_file(_files(self.env), f)
                head = src.read(len(IMAGE_MAGIC))
                if head == IMAGE_MAGIC:
                    # A replica catching up (or a store that lost data): the image IS the state.
                    with self.lock:
                        load_image(self.store, src)
                        self.stream = Stream(self.initial_cfg, self.store, self.domain)
                        self._forget_effects()
                    return
                body = head + src.read()
        if _check_marker(path, self.applied_index(), self.group, self.env, body):
            with self.lock:
                if self.env is not None:
                    self.store.drop()
                else:
                    self.store = self._new_store()
                self.stream = Stream(self.initial_cfg, self.store, self.domain)
                self._forget_effects()

    def _forget_effects(self) -> None:
        """A restored state: the effects kept for proposers describe entries of the state
        it replaced (the proposers get none)."""
        self.results.clear()
        self.delivered.clear()
        self._delivered_kept = 0
        self.events.clear()

    def on_leader_change(self, leader_id: int, term: int) -> None:
        # A deposed leader holds no reservation; a new one starts from the applied state
        # (its own proposals of an earlier term, if still applied, release nothing).
        self.inflight.clear()
        self.changes.move()  # the streams this node leads changed
        if self.leader_hook is not None:
            self.leader_hook(leader_id, term)

    def drop(self) -> None:
        """The stream was deleted: its keys go (after its group is fully removed)."""
        with self.lock:
            if self.env is not None:
                self.store.drop()


class _OneConsumer:
    """What the node's consumer paths read of `sm.stream` (consumers, created times, config)
    for a consumer group: its one consumer, and its stream's config."""

    def __init__(self, machine: ConsumerMachine) -> None:
        self._m = machine

    @property
    def consumers(self) -> dict[str, Any]:
        return {self._m.consumer: self._m.core.consumer}

    @property
    def consumer_created(self) -> dict[str, int]:
        # CONSUMER.INFO's `created`: the stream's CONSUMER_UPSERT time, as for any consumer
        made = self._m.stream_machine.stream.consumer_created.get(self._m.consumer)
        return {self._m.consumer: made or self._m.created_ns}

    @property
    def cfg(self) -> Any:
        return self._m.stream_cfg()


class ConsumerMachine:
    """A consumer's own group (node/jetstream/cgroup.py): the consumer's deliveries and acks,
    applied to its state in a store of the group's own (LMDB under the group's name, or
    memory for a `mem_storage` consumer), with the applied index in the same transaction.

    Messages are read from the stream's replica on this node (`stream_store`: the group's
    peers are a subset of the stream's). It offers what the node's delivery and ack paths
    read of a StreamMachine (`name` is the stream's key, `group` its own group, `lock`,
    `store` for reading messages, `stream.consumers`, `delivered` / `events` by index).
    Snapshots are whole images (the state is one small record): a member that joins or lags
    behind a compaction installs it."""

    def __init__(self, stream: StreamMachine, consumer: str, group: str, cfg: dict[str, Any],
                 start_sseq: int, lps_until: int, created_ns: int, memory: bool,
                 sink: Callable[[ConsumerMachine, list[Effect]], None],
                 initial: bytes = b"") -> None:
        self.stream_machine = stream
        stream.readers.add(self)  # its stream's replica here applies without a hold
        # the state the group starts from (a consumer that moved out of its stream's
        # group brings its acks and redelivery counts: the meta entry's `state`)
        self.initial = initial
        self.name = stream.name
        self.consumer = consumer
        self.group = group
        self.created_ns = created_ns
        self.env = None if memory or stream.env is None else stream.env
        self.own = MemStore(group) if self.env is None else LmdbStore(self.env, group)
        self.sink = sink
        self.lock = stream.lock  # plans read the stream's store: one lock for both
        self.cfg, self.start, self.lps = cfg, start_sseq, lps_until
        self.core = self._load()
        self.stream = _OneConsumer(self)
        self.delivered: dict[int, list[Delivered]] = {}
        self.events: dict[int, list[ConsumerEvent]] = {}
        self.track = False
        self.leader_hook: Callable[[int, int], None] | None = None

    def _load(self) -> Any:
        from node.jetstream.cgroup import ConsumerCore  # cgroup imports stream, not machines
        from node.jetstream.consumer import Consumer, ConsumerState
        raw = self.own.get_consumer(self.consumer) or self.initial
        state = ConsumerState.decode(raw) if raw else None
        return ConsumerCore(self.consumer, Consumer(self.cfg, state, self.start, self.lps))

    @property
    def store(self) -> Any:
        return self.stream_machine.store  # the messages the consumer delivers

    def stream_cfg(self) -> Any:
        return self.stream_machine.stream.cfg

    def reconfigure(self, cfg: dict[str, Any]) -> None:
        """The stream applied a CONSUMER_UPSERT for this consumer: its state carries on."""
        with self.lock:
            self.cfg = cfg
            self.core.consumer.reconfigure(cfg)

    def apply(self, index: int, data: bytes) -> None:
        self.apply_batch([(index, data)])

    def apply_batch(self, run: list[tuple[int, bytes]]) -> None:
        from node.jetstream import ops
        effects: list[Effect] = []
        with self.lock, self.own.batch():
            applied = _committed_applied(self.own)
            for index, data in run:
                if index <= applied:
                    continue  # already in the store before a restart
                produced = self.core.apply(ops.decode(data))
                if self.track:
                    self._keep(index, produced)
                effects += produced
                applied = index
            self.own.put_consumer(self.consumer, self.core.consumer.state.encode())
            self.own.put_meta("applied", _U64.pack(applied))
        self.sink(self, effects)  # also without effects: an ack moved the state to report

    def _keep(self, index: int, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Delivered):  # a delivery round: several per entry
                self.delivered.setdefault(index, []).append(effect)
            elif isinstance(effect, ConsumerEvent):
                self.events.setdefault(index, []).append(effect)
        for kept in (self.delivered, self.events):
            while len(kept) > KEEP_MAX:
                del kept[next(iter(kept))]

    def take_delivered(self, index: int) -> list[Delivered]:
        """The Delivered effects of the entry at `index` (for the proposer, once)."""
        return self.delivered.pop(index, [])

    def applied_index(self) -> int:
        return _committed_applied(self.own)

    def snapshot_to(self, path: str) -> int:
        with self.lock:
            index = _committed_applied(self.own)
            state = self.own.get_consumer(self.consumer) or b""
        if self.env is not None:
            self.env.sync()  # what the image names is durable before the WAL below it goes
        # the state record is binary (consumer.py ConsumerState.encode): base64 in the JSON
        body = json.dumps({"consumer": self.consumer, "applied": index,
                           "state_b64": base64.b64encode(state).decode()}).encode()
        # sealed as the stream's snapshot files are (an encrypted store leaks nothing)
        _write_file(self.stream_machine.env, path, lambda out: out.write(body))
        return index

    def restore_from(self, path: str) -> None:
        """A whole image: the state at its index (an empty file: the initial state)."""
        body = _read_all(self.stream_machine.env, path) if os.path.getsize(path) else b""
        image = json.loads(body) if body else {"applied": 0}
        with self.lock, self.own.batch():
            if _committed_applied(self.own) >= int(image["applied"]) and body:
                return  # a restart: the store already holds it
            state = (base64.b64decode(image["state_b64"]) if "state_b64" in image
                     else image.get("state", "").encode())  # an image of the JSON record
            if state:
                self.own.put_consumer(self.consumer, state)
            else:
                self.own.delete_consumer(self.consumer)
            self.own.put_meta("applied", _U64.pack(int(image["applied"])))
            self.core = self._load()
            self.delivered.clear()
            self.events.clear()

    def on_leader_change(self, leader_id: int, term: int) -> None:
        if self.leader_hook is not None:
            self.leader_hook(leader_id, term)

    def drop(self) -> None:
        self.stream_machine.readers.discard(self)
        with self.lock:
            if self.env is not None:
                self.own.drop()

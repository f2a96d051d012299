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

import json
import os
import struct
import threading
from collections.abc import Callable
from typing import Any

from node.jetstream import config as stream_config
from node.jetstream.cluster_meta import Catalogue
from node.jetstream.crypt import read_file, write_file
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
                 sink: EffectSink, created_ns: int, domain: str = "") -> None:
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
        # Result effects (purge, message delete) and Delivered effects by Raft index, for
        # the coroutine that proposed the entry; popped by it once `propose` resolves. Only
        # kept once `track` is set (after the start-up replay, whose entries nobody awaits).
        self.results: dict[int, dict[str, Any]] = {}
        self.delivered: dict[int, Delivered] = {}
        self.events: dict[int, list[ConsumerEvent]] = {}  # for the advisories
        self.track = False
        # Clustered: a member that joins or lags behind a compaction installs the data
        # (LMDB: an image exported when it is needed; memory: the snapshot is the image);
        # one node only needs a marker.
        self.full_images = False
        # Clustered: told when the group's leader changes (on the event loop).
        self.leader_hook: Callable[[int, int], None] | None = None

    def _new_store(self) -> Any:
        if self.env is None:
            return MemStore(self.group)
        return LmdbStore(self.env, self.group)

    @property
    def memory(self) -> bool:
        return self.env is None

    def apply(self, index: int, data: bytes) -> None:
        self.apply_batch([(index, data)])

    def apply_batch(self, run: list[tuple[int, bytes]]) -> None:
        """Every entry of the run in ONE store transaction (consumer states written once);
        effects kept per entry so a request can find the result of its own entry."""
        with self.lock:
            effects = self.stream.apply_batch(run, self._keep if self.track else None)
        if effects:
            self.sink(self, effects)

    def _keep(self, index: int, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Result):
                self.results[index] = effect.payload
            elif isinstance(effect, Delivered):
                self.delivered[index] = effect
            elif isinstance(effect, ConsumerEvent):
                self.events.setdefault(index, []).append(effect)
        # A follower (clustered) keeps them too, and nobody there pops them: the oldest go.
        for kept in (self.results, self.delivered, self.events):
            while len(kept) > KEEP_MAX:
                del kept[next(iter(kept))]

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
        if self.env is None and os.path.getsize(path) and _is_image(path, MEM_IMAGE_MAGIC):
            with open(path, "rb") as f:
                f.read(len(MEM_IMAGE_MAGIC))
                store = load_mem_image(self.group, f)
            with self.lock:
                self.store = store
                self.stream = Stream(self.initial_cfg, self.store, self.domain)
                self.results.clear()
                self.delivered.clear()
                self.events.clear()
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
                        self.results.clear()
                        self.delivered.clear()
                        self.events.clear()
                    return
                body = head + src.read()
        if _check_marker(path, self.applied_index(), self.group, self.env, body):
            with self.lock:
                if self.env is not None:
                    self.store.drop()
                else:
                    self.store = self._new_store()
                self.stream = Stream(self.initial_cfg, self.store, self.domain)
                self.results.clear()
                self.delivered.clear()
                self.events.clear()

    def on_leader_change(self, leader_id: int, term: int) -> None:
        if self.leader_hook is not None:
            self.leader_hook(leader_id, term)

    def drop(self) -> None:
        """The stream was deleted: its keys go (after its group is fully removed)."""
        with self.lock:
            if self.env is not None:
                self.store.drop()

"""JetStream in the node: the async edge around the pure core (`jetraft serve -js`).

    service = JetStreamService(server)
    await service.start()      # LMDB env, MultiRaft, the catalogue, every stream's group
    ...
    await service.stop()

What lives where:
* `api.py` names the handler of a `$JS.API.` subject; the handlers below parse with the pure
  modules (`config`, `consumer_config`, `requests`, `get`, `pull`) and reply with `replies`.
* Every stream is a Raft group on the node's `MultiRaft` (one voter here), its log in the
  node's one WAL under `<store_dir>/raft`, its state in the node's one LMDB environment under
  `<store_dir>/lmdb` (`machines.py`). The catalogue is the `$js` group.
* A publish to a stream subject becomes a STREAM_MSG proposal. The driver fsyncs it, the apply
  worker runs `Stream.apply_batch` (one LMDB transaction, synced later at a sync point), and
  the PubAck is one of the effects, sent from the event loop after that (`_on_effects`).
* A pull request waits in the consumer's `PullQueue`; the consumer's pump asks `plan`, proposes
  CONSUMER_DELIVERED, and sends the message with its `$JS.ACK` reply once that entry applied.
  Acks arriving on `$JS.ACK.>` become CONSUMER_ACK proposals.

nats-server sends v1 ack subjects (`$JS.ACK.<stream>.<consumer>.<dlv>.<sseq>.<cseq>.<ts>.<pend>`,
checked against 2.15.1); so do we, and both layouts are accepted back.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import json
import os
import secrets
import threading
import time
import traceback
from typing import Any

from node.jetstream import (
    advisories,
    api,
    backup,
    cgroup,
    cluster_meta,
    consumer_config,
    crypt,
    dirs,
    domain,
    get,
    gojson,
    jsaccount,
    ops,
    pause,
    replies,
    requests,
)
from node.jetstream import config as stream_config
from node.jetstream import inflight as inflight_mod
from node.jetstream import placement as placement_mod
from node.jetstream.apiqueue import ApiQueues
from node.jetstream.batch import BatchCollector, is_fast_batch
from node.jetstream.changes import ChangeMark
from node.jetstream.cluster import ClusterJS, Frames, _request_json
from node.jetstream.consumer import (
    AckInfo,
    AckKind,
    Delivery,
    Drop,
    StreamView,
    initial_position,
    next_request,
    parse_ack_body,
    parse_ack_subject,
)
from node.jetstream.errors import ApiError, StartRefused
from node.jetstream.machines import (
    META_STORE,
    ConsumerMachine,
    MetaMachine,
    StoreLostError,
    StreamMachine,
)
from node.jetstream.pacing import Pacer
from node.jetstream.placement import Placement, pick_leader
from node.jetstream.pull import PullQueue, Status
from node.jetstream.push import FC_REQUEST, PushFlow, fc_subject, parse_fc_subject
from node.jetstream.sourcing import listen_subjects
from node.jetstream.sourcing_wire import SourcingWire
from node.jetstream.store import CorruptRecordError
from node.jetstream.store.base import file_size, memory_size
from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv, stored_names
from node.jetstream.stream import Delivered, Effect, Reply, Republish, Stored, rfc3339
from node.subject import subject_matches
from raft.multigroup import FOLLOWER_DEFER_S, MultiRaft, NotLeader, ProposalDropped
from raft.snapfile import SnapshotFileError
from raft.storage import ARCHIVE_DIR, NodeLog

META_GROUP = "$js"
NODE_ID = 1
TICK_S = 0.05          # Raft tick; a single voter elects itself within 3-6 ticks
ELECTION_TICK = 3
# Clustered: a leader lost is replaced within about 2-4 s (nats-server: 4-9 s). Shorter
# timeouts (0.5 s) left 1,000 R3 streams on a loaded 2-core box in a standing election
# storm: the tick loop alone outlasted the election timeout (benchmarks/cluster_scale.py).
CLUSTER_TICK_S = 0.1
CLUSTER_ELECTION_TICK = 20
MAX_ROUND = 256        # deliveries proposed together for one consumer
ACK_HOLD_S = 0.005     # longest a plain ack nobody waits on is held to join a run
ACK_RUN_MAX = 1024     # a run this long is proposed at once
# clustered: a pull request forwarded from another node is kept this long before a missing
# interest in its inbox drops it (the interest travels on the routes, the request does not)
UNHEARD_GRACE_NS = 2_000_000_000
PULL_TICK_S = 0.1      # pull-request expiries (408) and redeliveries are looked at this often
_NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
# Served in the global account only for now (see _answer)
_PAGED = {"total": 0, "offset": 0, "limit": 0}
# the fields nats-server's 10039 replies carry besides the error (checked, 2.15.1)
_NOT_ENABLED_EXTRA: dict[str, dict[str, Any]] = {
    "STREAM.INFO": _PAGED, "STREAM.PURGE": {"purged": 0},
    "STREAM.NAMES": {**_PAGED, "streams": None}, "STREAM.LIST": {**_PAGED, "streams": []},
    "STREAM.RESTORE": {"deliver_subject": ""},
    "CONSUMER.NAMES": {**_PAGED, "consumers": []}, "CONSUMER.LIST": {**_PAGED, "consumers": []},
}
_JSON = {"separators": (",", ":")}


# `_early_replies` sends at most this many PubAcks of a run before its store commit: the
# latency case is a lone publish; a longer run (publishes in flight) gains nothing from it.
EARLY_REPLIES_MAX = 8
# Longest a read or a count waits for what a stream's follower holds back
# (`apply_held`): a held entry is applied within a pass, so only a group whose
# driver failed or stopped takes this long, and is then read as it stands.
HELD_WAIT_S = 1.0


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, **_JSON).encode()  # type: ignore[arg-type]


def _retrieve(fut: asyncio.Future[None]) -> None:
    """Marks a future's exception as seen: asyncio logs one nobody retrieved."""
    if not fut.cancelled():
        fut.exception()


def _is_error(reply: bytes) -> bool:
    """Whether an API reply is an error reply (the counters of INFO and /jsz)."""
    try:
        return "error" in json.loads(reply)
    except (ValueError, TypeError):
        return False


def _kind(op: str) -> str:
    """The reply `type` suffix nats-server uses for an API op."""
    return {
        "STREAM.CREATE": "stream_create_response", "STREAM.UPDATE": "stream_update_response",
        "STREAM.INFO": "stream_info_response", "STREAM.DELETE": "stream_delete_response",
        "STREAM.PURGE": "stream_purge_response", "STREAM.NAMES": "stream_names_response",
        "STREAM.LIST": "stream_list_response", "STREAM.MSG.GET": "stream_msg_get_response",
        "STREAM.MSG.DELETE": "stream_msg_delete_response",
        "CONSUMER.CREATE": "consumer_create_response",
        "CONSUMER.DURABLE.CREATE": "consumer_create_response",
        "CONSUMER.INFO": "consumer_info_response", "CONSUMER.DELETE": "consumer_delete_response",
        "CONSUMER.NAMES": "consumer_names_response", "CONSUMER.LIST": "consumer_list_response",
        "INFO": "account_info_response",
        "STREAM.LEADER.STEPDOWN": "stream_leader_stepdown_response",
        "CONSUMER.LEADER.STEPDOWN": "consumer_leader_stepdown_response",
        "META.LEADER.STEPDOWN": "meta_leader_stepdown_response",
        "SERVER.REMOVE": "meta_server_remove_response",
        "STREAM.PEER.REMOVE": "stream_remove_peer_response",
        "CONSUMER.PAUSE": "consumer_pause_response", "CONSUMER.UNPIN": "consumer_unpin_response",
        "STREAM.SNAPSHOT": "stream_snapshot_response",
        "STREAM.RESTORE": "stream_restore_response",
    }.get(op, "error_response")


class _NoPeers:
    """The transport of a node without peers: nothing to send (single voter groups)."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def send(self, msgs: list[Any]) -> None:
        if msgs:
            raise RuntimeError(f"single-node JetStream got messages to send: {msgs[:1]!r}")

    def beat(self) -> None:
        pass

    def last_seen(self, peer: int) -> float:
        raise KeyError(peer)

    def add_peer(self, node: int, addr: str) -> None:
        raise RuntimeError("single-node JetStream has no peers")

    def remove_peer(self, node: int) -> None:
        pass


class _Pull:
    """The leader's side of one consumer: its pump, and for a pull consumer its waiting
    requests. A push consumer (`push` = its deliver subject) is a request that never ends."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.queue = PullQueue(cfg)
        self.push: str = cfg.get("deliver_subject") or ""
        self.headers_only = bool(cfg.get("headers_only"))
        self.inactive_ns: int = cfg.get("inactive_threshold") or 0  # 0: never deleted
        self.last_active = time.time_ns()
        self.pumping = False
        self.again = False
        self.deleting = False
        self.dropping = False
        # flow control and idle heartbeats of a push consumer (push.py)
        self.flow = PushFlow(cfg, time.time_ns()) if self.push else None
        self.delivered_ns = self.acked_ns = 0  # CONSUMER.INFO's last_active times
        self.paused = False
        self.pause_seen = ""  # a pause_until seen in effect: its end is advised once
        self.pin_headers: dict[str, str] = {}  # request reply -> Nats-Pin-Id it is served
        self.pacer: Pacer | None = None  # replay original / rate_limit_bps (pacing.py)
        self.round: asyncio.Future[None] | None = None  # a delivery round not sent yet

    def wants(self) -> bool:
        return bool(self.push or self.queue.waiting)


class JetStreamService:
    meta_group = META_GROUP

    def __init__(self, server: Any) -> None:
        self.server = server
        self.log = server.log
        # `jetstream { domain }` (node/jetstream/domain.py): named in PubAcks, stream and account
        # info and advisories; "" none.
        self.domain: str = server.options.jetstream.domain
        # A stream's publishes in flight past which more are dropped (inflight.py).
        self.max_buffered = (server.options.jetstream.max_buffered_msgs
                             or inflight_mod.DEFAULT_MAX_MSGS,
                             server.options.jetstream.max_buffered_size
                             or inflight_mod.DEFAULT_MAX_SIZE)
        self._dropping_logged: dict[str, float] = {}  # stream key -> last [WRN] (monotonic)
        # `request_queue_limit`: API requests being served (apiqueue.py)
        self.api_queues = ApiQueues(server.options.jetstream.request_queue_limit)
        self.store_dir = os.path.abspath(server.options.jetstream.store_dir)
        self.env: NodeEnv | None = None
        self.mr: MultiRaft | None = None
        self.meta: MetaMachine | None = None
        self.streams: dict[str, StreamMachine] = {}
        # Moves on every change the passes over all streams look for (changes.py): the
        # expiry scan of `_tick_loop` and the cluster's usage report skip idle rounds.
        self.changes = ChangeMark()
        self._expirable: list[StreamMachine] = []
        self._expirable_at = -1  # the mark `_expirable` was built at
        # consumers with a Raft group of their own hosted here (cgroup.py), by (stream, name)
        self.cgroups: dict[tuple[str, str], ConsumerMachine] = {}
        self.subs: dict[str, list[Any]] = {}
        self._subscribed: dict[str, list[str]] = {}  # the subjects `subs` listen on
        self.pulls: dict[tuple[str, str], _Pull] = {}
        self.creating: set[tuple[str, str]] = set()  # consumers whose create has not replied
        # consumers moving out of their stream's group: the acks that arrived meanwhile
        self._moving: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        self._reporting: dict[tuple[str, str], bool] = {}  # consumer groups' reports in flight
        self.batches: dict[str, BatchCollector] = {}  # open atomic batches, per stream
        self._expiring: set[str] = set()  # streams with an EXPIRE entry in flight
        self.consumer_created: dict[tuple[str, str], int] = {}
        # Plain +ACKs per (stream key, consumer) not proposed yet (`_queue_ack`): a run
        # becomes ONE CONSUMER_ACKS entry (`_flush_acks`). Each: (stream seq, reply for a
        # double ack or ""); `_ack_flush`: the scheduled flush of each run.
        self._ack_runs: dict[tuple[str, str], list[tuple[int, str]]] = {}
        self._ack_flush: dict[tuple[str, str], asyncio.TimerHandle | asyncio.Handle] = {}
        # the last ack proposal of each consumer, until applied (CONSUMER.INFO waits on it)
        self._ack_last: dict[tuple[str, str], asyncio.Future[int]] = {}
        self.client: Any = None  # the global account's internal client
        # Every account's own internal client (its `$JS.API`, acks, stream subjects) and its
        # JetStream limits (None: JetStream not enabled for it), jsaccount.py
        self.clients: dict[str, Any] = {}
        self.limits: dict[str, jsaccount.Tiers | None] = {}
        # stream key -> (account, its limits, stream config, server options, no byte limit)
        self._byte_limits: dict[str, tuple[Any, ...]] = {}
        # accounts refused JetStream: their limits overflow the server's (`_reserve`)
        self.refused: dict[str, ApiError] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._meta_lock = asyncio.Lock()
        self._opening: dict[str, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ticker: asyncio.Task[Any] | None = None
        self.api_total = self.api_errors = 0
        self.api_counts: dict[str, list[int]] = {}  # account -> [total, errors] (its INFO)
        # Clustered (node/jetstream/cluster.py) when the node has a cluster port; None: one
        # node, every group a single voter with id NODE_ID.
        self.jsc: ClusterJS | None = None
        self.node_id = NODE_ID
        self.sourcing = SourcingWire(self)  # mirrors and sources (sourcing_wire.py)
        self._loop_thread = 0
        # stream -> runs of its PubAcks queued for `_on_effects` (see `_early_replies`)
        self._held: dict[str, int] = {}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        dirs.prepare_store_dir(self.store_dir)  # durable directories (tests/durability)
        backup.sweep_uploads(self.store_dir)
        sealed = self._open_crypt()  # before the first byte is written: a wrong key changes nothing
        if self.server.options.jetstream.domain:
            self.log.info(f"  Domain:          {self.server.options.jetstream.domain}")
        self.env = NodeEnv(os.path.join(self.store_dir, "lmdb"), on_fatal=self._on_fatal_threadsafe,
                           sealer=sealed and sealed.lmdb, files=sealed and sealed.files,
                           tokens=sealed and sealed.tokens)
        raft_dir = os.path.join(self.store_dir, "raft")
        node_log = _node_log(os.path.join(raft_dir, "wal"),
                             self.server.options.jetstream.audit_archive, sealed and sealed.wal)
        cluster = getattr(self.server, "cluster", None)
        if cluster is not None:
            self.jsc = ClusterJS(self, cluster)
            self.node_id = cluster.self_id
        # A cluster's groups elect over the network: nats-server-like timeouts, not the
        # single voter's few ticks.
        tick, election = (TICK_S, ELECTION_TICK) if self.jsc is None else \
            (CLUSTER_TICK_S, CLUSTER_ELECTION_TICK)
        self.mr = MultiRaft(self.node_id, node_log, _NoPeers() if self.jsc is None else None,
                            tick_interval_s=tick, election_tick=election,
                            snap_dir=os.path.join(raft_dir, "snap"),
                            on_fatal=self._on_fatal, snapshot_every=_snapshot_every(),
                            follower_defer_s=_follower_defer_s())
        if self.jsc is not None:
            self.jsc.bind_transport(self.mr)
        await self.mr.start()
        self.meta = MetaMachine(self.env, self._meta_changed_threadsafe, self.node_id)
        if self.jsc is None:
            self.mr.add_group(META_GROUP, [NODE_ID], state_machine=self.meta)
            await self._ready(META_GROUP)
            await self._forget_memory_streams()
            self._drop_orphans()
            for name in sorted(self.meta.streams):
                await self._open_stream(name)
            await self._forget_memory_consumers()
        self.client = self.account_added(jsaccount.GLOBAL)
        for account in list(self.server.accounts):
            self.account_added(account)
        if self.refused and self.server.options.operator is None:
            err = next(iter(self.refused.values()))
            raise StartRefused("Can't start JetStream: Error enabling jetstream on configured "
                             f"accounts: {err}")
        for name in list(self.streams):
            if _acc(name) not in self.server.accounts:
                # its account left the config: kept on disk, served again once it is back
                self.log.warn(f"JetStream: stream {_name(name)!r} of unknown account "
                              f"{_acc(name)!r} is not served")
                continue
            self._subscribe_stream(name)
            self._start_push(name)
        if self.jsc is not None:
            await self.jsc.start()
        self.sourcing.start()
        self._ticker = asyncio.ensure_future(self._tick_loop())
        self.log.info(f"JetStream started: {len(self.streams)} streams, store {self.store_dir}")

    def _open_crypt(self) -> Any:
        """Encryption at rest (node/jetstream/crypt.py): the store's key file checked against
        `jetstream { key, cipher }`; any mismatch raises and the node stops ([FTL])."""
        o = self.server.options.jetstream
        if o.key == "":
            raise ValueError("jetstream.key is empty: refusing to start")
        if o.key is not None:
            try:
                import cryptography  # noqa: F401 - the AEADs of crypt.py
            except ImportError as exc:
                raise ValueError("jetstream.key needs the `cryptography` package "
                                 "(a dependency of jetraft): refusing to start") from exc
        cipher = o.cipher or "chacha"
        sealed = crypt.open_store(self.store_dir, o.key, cipher, o.prev_key)
        if sealed is not None:
            self.log.info(f"  Encryption:      {crypt.DISPLAY[cipher]}")
        if sealed is not None and sealed.rotated:
            self.log.info("JetStream store keys re-wrapped under the new jetstream.key "
                          "(opened with jetstream.prev_key); prev_key can be removed")
        return sealed

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        for stream, consumer in list(self._ack_runs):  # held acks: proposed, not dropped
            self._flush_acks(stream, consumer)
        for client in self.clients.values():
            if self._on_interest in client.account.interest_listeners:
                client.account.interest_listeners.remove(self._on_interest)
        if self.jsc is not None:
            await self.jsc.stop()
        for task in list(self._tasks):
            task.cancel()
        self.sourcing.stop()
        if self.mr is not None:
            await self.mr.stop()
        if self.env is not None:
            self.env.close()
            self.env = None

    def account_added(self, account: str) -> Any:
        """An account the node knows (at start, registered later, or its JWT updated): its
        limits are (re)read, and its own internal client listens on its `$JS.API.>` (an
        account without JetStream gets nats-server's 10039 there), `$JS.ACK.>`, `$JS.FC.>`."""
        opts = self.server.options
        self.limits[account] = jsaccount.limits_for(opts.accounts, account,
                                                    opts.operator is not None)
        self._reserve(account)
        client = self.clients.get(account)
        if client is not None:
            return client
        client = self.server.internal_client(_jetstream_kind(), "jetstream", account)
        # Each node's JetStream serves its own clients; routes must not spread this
        # client's interest (node/cluster).
        client.local_only = True
        client.subscribe_internal(api.API_PREFIX + ">", functools.partial(self._on_api, account))
        client.subscribe_internal(api.ACK_PREFIX + ">", functools.partial(self._on_ack, account))
        client.subscribe_internal("$JS.FC.>", functools.partial(self._on_flow_control, account))
        client.account.interest_listeners.append(self._on_interest)
        self.clients[account] = client
        return client

    def _reserve(self, account: str) -> None:
        """Standalone, nats-server gives an account JetStream only while all accounts'
        limits fit in the server's `max_mem` / `max_file` (jsaccount.py); one that does
        not fit has none (a configured one stops the node at start: `start`)."""
        tiers = self.limits.get(account)
        if self.jsc is not None or tiers is None:
            return
        o = self.server.options.jetstream
        others = [t for a, t in self.limits.items() if t is not None and a != account]
        err = jsaccount.server_admits_accounts(o.max_mem, o.max_file, [*others, tiers])
        if err is None:
            self.refused.pop(account, None)
            return
        self.limits[account] = None
        self.refused[account] = ApiError.of(err)
        self.log.error(f"Error configuring jetstream for account [{account}]: "
                       f"{self.refused[account]}")

    def _client(self, stream_key: str) -> Any:
        """The internal client of the stream's account (never another account's). Raises
        KeyError for an account this node cannot know."""
        account = jsaccount.account_of(stream_key)
        client = self.clients.get(account)
        if client is not None:
            return client
        if account not in self.server.accounts and self.server.options.operator is not None:
            # clustered, operator mode: a stream of an account no client of this node has
            # used yet; its JWT comes from the resolver (registering it attaches it here)
            self.server.refresh_operator_account(account)
        return self.clients.get(account) or self.account_added(account)

    def _limits_of(self, account: str) -> jsaccount.Tiers | None:
        if account not in self.limits:
            try:
                self._client(jsaccount.key(account, "_"))
            except KeyError:
                return None
        return self.limits.get(account)

    def _key(self, call: api.Call) -> str:
        return jsaccount.key(call.account, call.stream)

    def _on_fatal_threadsafe(self, exc: BaseException) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._on_fatal, exc)

    def _on_interest(self, sub: Any, delta: int) -> None:
        """A push consumer starts delivering when its deliver subject gets a subscriber, as
        nats-server's does, not at the next tick: a client (nats.js's KV watch) subscribes
        after CONSUMER.CREATE, and a put meanwhile would change the first message's pending."""
        if delta <= 0 or not self.pulls:
            return
        for (stream, name), pull in list(self.pulls.items()):
            if pull.push and subject_matches(sub.subject, pull.push):
                self._pump(stream, name)

    def _on_fatal(self, exc: BaseException) -> None:
        self.log.fatal(f"JetStream storage failed, stopping: {exc!r}")
        self.server.shutdown(70)

    async def _forget_memory_streams(self) -> None:
        """A standalone nats-server does not bring memory streams back after a restart
        (checked against 2.15.1: STREAM.INFO says not found): delete them through the
        catalogue; `_drop_orphans` then drops their logs."""
        assert self.meta is not None and self.mr is not None
        for name, entry in sorted(self.meta.streams.items()):
            if entry["config"].get("storage") == "memory":
                await self.mr.propose(META_GROUP, _dumps(cluster_meta.delete(name)))

    async def _forget_memory_consumers(self) -> None:
        """A standalone nats-server keeps a `mem_storage` consumer in memory only: after a
        restart it is gone, config and state (2.15.1, SIGTERM and kill -9 alike), and the
        stream keeps every message (even under interest retention). The forgetting is an
        entry of the stream's log (CONSUMER_FORGET), so replicas and the audit's replay agree."""
        for name, sm in sorted(self.streams.items()):
            with sm.lock:
                gone = sorted(c for c, consumer in sm.stream.consumers.items()
                              if consumer.cfg.get("mem_storage"))
            for cname in gone:
                await self._propose(sm, ops.ConsumerForget(time.time_ns(), cname))
                self.consumer_created.pop((name, cname), None)

    def _drop_orphans(self) -> None:
        """A crash between a stream's delete entry and the removal of its data leaves its
        WAL group (pinning old segments) and its LMDB keys: the catalogue decides."""
        assert self.meta is not None and self.mr is not None and self.env is not None
        groups, names = orphans(self.meta.streams, self.mr.node_log.groups(),
                                stored_names(self.env))
        for group in groups:
            self.log.warn(f"JetStream: dropping the log of deleted stream group {group}")
            self.mr.node_log.drop_group(group)
        for name in names:
            self.log.warn(f"JetStream: dropping the data of deleted stream group {name}")
            LmdbStore(self.env, name).drop()

    async def _ready(self, group: str) -> None:
        """Leader elected and everything committed before applied here."""
        assert self.mr is not None
        await self.mr.wait_leader(group)
        await self.mr.read_index(group)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        if isinstance(exc, (StoreLostError, SnapshotFileError)):
            # A stream group whose store lost acknowledged data (or whose snapshot file is
            # gone) must not be served without that stream: stop, as after a failed fsync.
            self._on_fatal(exc)
            return
        # Which task, and where it was (one line: a test's log check prints it).
        where = " < ".join(f"{f.name}:{f.lineno}" for f in
                           reversed(traceback.extract_tb(exc.__traceback__)[-4:]))
        self.log.error(f"JetStream task {getattr(task.get_coro(), '__qualname__', '?')} "
                       f"failed: {exc!r} at {where}")

    # ------------------------------------------------------------------ streams

    def _meta_changed_threadsafe(self) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._meta_changed)

    def _meta_changed(self) -> None:
        """The catalogue changed (maybe by a replayed entry): open and close groups to match."""
        assert self.meta is not None
        if self.jsc is not None:
            self._meta_changed_cluster()
            return
        for name in list(self.streams):
            if name not in self.meta.streams:
                self._spawn(self._close_stream(name))
        for name in self.meta.streams:
            if name not in self.streams:
                self._spawn(self._open_stream(name))

    def _meta_changed_cluster(self) -> None:
        """Host the groups assigned to this node (the duty loop lets go of the others once
        their leader removed us), and listen on EVERY stream's subjects: a publish may reach
        any node, which forwards it to the stream's leader."""
        assert self.meta is not None and self.jsc is not None
        if self.client is None or not self.jsc.meta_started:
            return
        cat = self.meta.catalogue
        for name in list(self.streams):
            if name not in cat.streams:
                self._spawn(self._close_stream(name))
        for name, a in cat.streams.items():
            if self.node_id in a["peers"] and name not in self.streams:
                self._spawn(self._open_stream(name))
        for name in list(self.subs):
            if name not in cat.streams:
                for sub in self.subs.pop(name):
                    sub.client.remove_sub(sub)
        for name, a in cat.streams.items():
            subjects = listen_subjects(a["config"], name)  # a mirror captures nothing
            if self._subscribed.get(name) != subjects:
                self._subscribe_stream(name, subjects)
        self._sync_consumer_groups()

    def _stream_created(self, name: str) -> None:
        """The meta leader committed a create: advise it (once, from the meta leader)."""
        self._advise(advisories.stream_action("create", _name(name), *self._stamp()), _acc(name))

    async def _open_stream(self, name: str) -> None:
        """Host the stream's group; returns once it is ready and subscribed, also when
        another caller (a create request, a catalogue change) is already opening it."""
        opening = self._opening.get(name)
        if opening is not None:
            await asyncio.shield(opening)
            return
        assert self.meta is not None and self.mr is not None and self.loop is not None
        entry = self.meta.streams.get(name)
        if entry is None or name in self.streams:
            return
        done = self._opening[name] = self.loop.create_future()
        try:
            await self._host_stream(name, entry)
        finally:
            del self._opening[name]
            done.set_result(None)

    async def _host_stream(self, name: str, entry: dict[str, Any]) -> None:
        assert self.mr is not None
        cfg = stream_config.from_wire(entry["config"])
        group = entry["group"]
        memory = cfg["storage"] == "memory"
        sm = StreamMachine(name, group, cfg, None if memory else self.env,
                           self._effects_threadsafe, entry["created_ns"], self.domain,
                           self.changes)
        self.streams[name] = sm
        self.changes.move()
        if self.jsc is not None:
            # The first peers bootstrap the group together; a peer added later (scaling,
            # a replaced peer) joins empty and is caught up by its leader.
            voters = [] if entry.get("scaled") else list(entry["peers"])
            sm.leader_hook = lambda lid, _term: self._on_stream_leader(name, lid)
            sm.leads = lambda: self.jsc is not None and self.jsc.leads(name)
            sm.full_images = True
            self.mr.add_group(group, voters, state_machine=sm)
            sm.track = True
            sm.early = self._early_replies  # the leader's PubAcks (followers build none)
            self.sourcing.sync(name)  # its links source only while this node leads
            self._sync_consumer_groups()
            return
        self.mr.add_group(group, [NODE_ID], state_machine=sm)
        await self._ready(group)
        sm.track = True
        sm.early = self._early_replies
        with sm.lock:
            for cname in sm.stream.consumers:
                self.consumer_created.setdefault((name, cname), time.time_ns())
        if self.client is not None:
            self._subscribe_stream(name)
            self._start_push(name)
            self.sourcing.sync(name)

    def _start_push(self, name: str) -> None:
        """Push consumers deliver on their own: start their pumps (at start, after a create)."""
        sm = self.streams[name]
        for cname in list(sm.stream.consumers):
            if self._leads_consumer(name, cname) and self._pull(name, cname).push:
                self._pump(name, cname)

    async def _close_stream(self, name: str) -> None:
        assert self.mr is not None
        sm = self.streams.pop(name, None)
        if sm is None:
            return
        self.changes.move()
        self.sourcing.closed(name)
        keep_subs = self.jsc is not None and self.meta is not None and name in self.meta.streams
        for sub in [] if keep_subs else self.subs.pop(name, []):
            sub.client.remove_sub(sub)
        for key in [k for k in self.pulls if k[0] == name]:
            del self.pulls[key]
        self.batches.pop(name, None)
        self.mr.remove_group(sm.group)
        await self.mr.removed(sm.group)
        sm.drop()

    def _subscribe_stream(self, name: str, subjects: list[str] | None = None) -> None:
        if self.jsc is not None and subjects is None:
            return  # clustered: the catalogue decides (_meta_changed_cluster)
        for sub in self.subs.pop(name, []):
            sub.client.remove_sub(sub)
        if subjects is None:  # a mirror captures nothing
            subjects = listen_subjects(self.streams[name].stream.cfg, name)
        self._subscribed[name] = list(subjects)

        def on_msg(_sub: Any, subject: str, reply: str | None, hdr: bytes | None,
                   payload: bytes) -> None:
            self._on_publish(name, subject, reply, hdr, payload)

        # Message tracing (node/msgtrace.py) reports a stream capture as a `js` event.
        on_msg.trace_stream = jsaccount.name_of(name)  # type: ignore[attr-defined]
        try:
            client = self._client(name)  # the stream's account's subjects, nobody else's
        except KeyError:
            self.log.warn(f"JetStream: stream {_name(name)!r} of unknown account "
                          f"{_acc(name)!r} is not served here")
            self._subscribed.pop(name, None)  # looked at again at the next catalogue change
            return
        # inline: a client's plain PUB is proposed in its own turn (no Message framed, no
        # inbox turn); `_on_publish` only checks and queues a proposal or forwards it.
        self.subs[name] = [client.subscribe_internal(s, on_msg, inline=True) for s in subjects]

    def _configs_all(self) -> dict[str, stream_config.Config]:
        """Every account's streams' configs by registry key."""
        if self.jsc is not None:
            return self.jsc.configs()
        return {n: sm.stream.cfg for n, sm in self.streams.items()}

    def _configs(self, account: str = jsaccount.GLOBAL) -> dict[str, stream_config.Config]:
        """The account's streams' configs by stream name (subject overlaps, names, lists
        and limits are per account)."""
        return {jsaccount.name_of(k): cfg for k, cfg in self._configs_all().items()
                if jsaccount.account_of(k) == account}

    async def _propose(self, sm: StreamMachine, op: ops.Op) -> int:
        assert self.mr is not None
        return await self.mr.propose(sm.group, ops.encode(op))

    def _propose_future(self, sm: StreamMachine, op: ops.Op) -> asyncio.Future[int]:
        """`_propose` as a plain future (no Task per proposal: a fetch proposes one entry
        per delivered message); a refused proposal is a future holding its error."""
        assert self.mr is not None
        try:
            return self.mr.propose_nowait(sm.group, ops.encode(op))
        except Exception as exc:  # noqa: BLE001 - as the coroutine would raise it to gather
            fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            fut.set_exception(exc)
            return fut

    # ------------------------------------------------------------------ publish path

    def _on_publish(self, name: str, subject: str, reply: str | None, hdr: bytes | None,
                    payload: bytes) -> None:
        if self.jsc is not None and not self.jsc.leads(name):
            self.jsc.forward_publish(name, subject, reply or "", hdr or b"", payload)
            return
        self._accept_publish(name, subject, reply or "", hdr or b"", payload)

    def _accept_publish(self, name: str, subject: str, reply: str, hdr: bytes, payload: bytes
                        ) -> None:
        """A publish this node (the stream's leader) proposes. Its PubAck is an apply
        effect; a refusal (or an unknown outcome) is logged by `_not_acked`. Its bytes are
        held in the stream's in-flight count (inflight.py) from here until the entry
        carrying it is applied, so the limit checks of the publishes behind it count it."""
        sm = self.streams.get(name)
        if sm is None:
            return None
        inflight = sm.inflight
        now_ns = time.time_ns()
        op = ops.StreamMsg(now_ns, subject, reply, hdr, payload)
        if reply and is_fast_batch(reply):
            self._refuse_publish(sm, op, ApiError.of("JSBatchPublishDisabledErr"))
            return None
        buffered = len(subject) + len(reply) + len(hdr) + len(payload)
        max_msgs, max_size = self.max_buffered
        if inflight.msgs >= max_msgs or inflight.buffered + buffered > max_size:
            return self._too_many(sm, op, inflight.msgs >= max_msgs)
        size = (memory_size if sm.memory else file_size)(subject, hdr, payload)
        if not self._no_byte_limit(sm) and self._over_account_limit(sm, op, size):
            return None
        if hdr and BatchCollector.is_batch(op):
            self._batch_message(sm, op)
            return None
        # Held with its op: the apply takes the op instead of decoding these bytes back.
        entry = ops.encode_msg(now_ns, subject, reply, hdr, payload)
        key = inflight.reserve(now_ns, size, buffered, entry=entry, op=op)
        if key != now_ns:  # another publish held has this clock: the next free one
            entry = ops.encode_msg(key, subject, reply, hdr, payload)
        # No task nor Future per publish (the PubAck is an apply effect): the driver
        # reports only a failure. Publishes queued between two drain passes become one
        # STREAM_MSGS entry (`merge`): one Raft entry, WAL record and apply dispatch.
        assert self.mr is not None
        try:
            self.mr.propose_quiet(sm.group, entry, self._not_acked, (sm, key),
                                  merge=ops.merge_msgs)
        except (ProposalDropped, KeyError, NotLeader) as exc:
            self._not_acked((sm, key), exc)
        return None

    def _no_byte_limit(self, sm: StreamMachine) -> bool:
        """True when `_over_account_limit` cannot refuse a publish to `sm`: its account's
        tier has no byte limit and the server's `max_mem`/`max_file` is unset. Worked out
        once per (account limits, stream config, server options): each is replaced, never
        changed in place, when it changes (a reload, an UPDATE_CONFIG, a JWT update)."""
        seen = self._byte_limits.get(sm.name)
        tiers_now = self.limits.get(seen[0]) if seen is not None else None
        options = self.server.options
        if (seen is not None and seen[1] is tiers_now and seen[2] is sm.stream.cfg
                and seen[3] is options):
            return seen[4]
        account = jsaccount.account_of(sm.name)
        tiers = self.limits.get(account)
        free = tiers is None
        if tiers is not None and not tiers.tiered:
            limits = tiers.select(1)[1]
            o = options.jetstream
            free = (limits.max_memory < 0 and limits.max_storage < 0
                    and limits.memory_max_stream_bytes <= 0
                    and limits.storage_max_stream_bytes <= 0
                    and (o.max_mem if sm.memory else o.max_file) < 0)
        self._byte_limits[sm.name] = (account, tiers, sm.stream.cfg, options, free)
        return free

    def _too_many(self, sm: StreamMachine, op: ops.StreamMsg, by_count: bool) -> None:
        """`max_buffered_msgs` / `max_buffered_size`: nats-server drops a publish its full
        ingest queue cannot take, answers 429 (10167) and warns (here once a second)."""
        now = time.monotonic()
        if now - self._dropping_logged.get(sm.name, -2.0) >= 1.0:
            self._dropping_logged[sm.name] = now
            self.log.warn("Dropping messages due to excessive stream ingest rate on "
                          f"{_acc(sm.name)!r} > {_name(sm.name)!r}: IPQ "
                          f"{'len' if by_count else 'size'} limit reached")
        self._refuse_publish(sm, op, ApiError.of("JSStreamTooManyRequests"))

    def _over_account_limit(self, sm: StreamMachine, op: ops.StreamMsg, size: int) -> bool:
        """nats-server refuses a publish that takes the stored bytes of the stream's tier
        and storage type past the tier's `max_mem` / `max_file` (10002, jsaccount.py), or
        finds no tier for the stream (10120); True: refused (and answered). Checked before
        the proposal against the bytes stored AND the bytes of the publishes proposed here
        and not yet applied (`_stream_bytes`), as nats-server's in-order checks see them."""
        err = self._account_refusal(sm, size)
        if err is None:
            return self._over_server_limit(sm, op)
        return self._refuse_publish(sm, op, err)

    def _account_refusal(self, sm: StreamMachine, size: int, warn: bool = True
                         ) -> ApiError | None:
        """The account's refusal of `size` more bytes in `sm` (see `_over_account_limit`),
        or None when they fit."""
        account = jsaccount.account_of(sm.name)
        tiers = self.limits.get(account)
        if tiers is None:
            return None
        try:
            tier, limits = tiers.select(jsaccount.replicas_of(sm.stream.cfg))
        except ApiError as exc:
            return exc
        if (limits.max_memory < 0 and limits.max_storage < 0
                and limits.memory_max_stream_bytes <= 0
                and limits.storage_max_stream_bytes <= 0):
            return None
        # the account's streams of this tier and storage type, wherever they are led
        used = sum(self._stream_bytes(k) * _weight(tier, cfg)
                   for k, cfg in self._stored_configs()
                   if jsaccount.account_of(k) == account and tiers.tier_of(cfg) == tier
                   and (cfg.get("storage") == "memory") == sm.memory)
        size *= _weight(tier, sm.stream.cfg)
        if not jsaccount.publish_exceeds(limits, sm.memory, used, size):
            return None
        if warn:
            self.log.warn(f"JetStream {'memory' if sm.memory else 'storage'} resource limits "
                          f"exceeded for account: {account!r}")
        return ApiError.of("JSAccountResourcesExceededErr")

    def sourced_fit(self, sm: StreamMachine, sizes: list[int]) -> tuple[int, str]:
        """How many of a mirror/source entry's messages (stored sizes, in order) fit in the
        node's and the account's limits, counting what is stored and held in flight:
        nats-server checks each sourced message as a publish and retries the rest later;
        and why the rest do not ("" when all fit)."""
        fit, why = len(sizes), ""
        limit, used = self._server_usage(sm)  # the node's own limit: each as a publish
        if limit >= 0:
            for i, size in enumerate(sizes):
                if jsaccount.server_full(limit, used):
                    fit, why = i, "insufficient resources (10023)"
                    break
                used += size
        if self._account_refusal(sm, sum(sizes[:fit]), warn=False) is None:
            return fit, why
        lo, hi = 0, fit - 1  # the longest prefix that fits: lo fits, hi + 1 does not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._account_refusal(sm, sum(sizes[:mid]), warn=False) is None:
                lo = mid
            else:
                hi = mid - 1
        return lo, "resource limits exceeded for account (10002)"

    def _over_server_limit(self, sm: StreamMachine, op: ops.StreamMsg, before: int = 0
                           ) -> bool:
        """The node's own stored bytes of the stream's storage type past its `max_mem` /
        `max_file` (with `before` more: an atomic batch's messages ahead of its last, each
        checked as a publish would be): nats-server answers 10023 (jsaccount.py); True:
        refused."""
        limit, used = self._server_usage(sm)
        if not jsaccount.server_full(limit, used + before):
            return False
        self.log.error(f"JetStream {'memory' if sm.memory else 'file'} resource limits "
                       "exceeded for server")
        return self._refuse_publish(sm, op, ApiError.of("JSInsufficientResourcesErr"))

    def _server_usage(self, sm: StreamMachine) -> tuple[int, int]:
        """(the node's limit for `sm`'s storage type, -1 for none; the bytes its streams
        of that type store and hold in flight)."""
        o = self.server.options.jetstream
        limit = o.max_mem if sm.memory else o.max_file
        if limit < 0:
            return limit, 0
        return limit, sum(other.counted_bytes() for other in list(self.streams.values())
                          if other.memory == sm.memory)

    def _stored_configs(self) -> list[tuple[str, dict[str, Any]]]:
        """Every stream's config as held (clustered: the catalogue's wire form), uncopied:
        the publish path reads only its storage, replicas and max_bytes."""
        if self.jsc is not None:
            return [(k, a["config"]) for k, a in list(self.jsc.catalogue().streams.items())]
        return [(k, sm.stream.cfg) for k, sm in list(self.streams.items())]

    def _stream_bytes(self, key: str) -> int:
        """A stream's stored bytes plus those its leader holds in flight: clustered, as
        reported by its leader (usage.py)."""
        if self.jsc is not None:
            return int(self.jsc.stream_bytes(key))
        sm = self.streams.get(key)
        if sm is None:
            return 0
        return sm.counted_bytes()

    def _refuse_publish(self, sm: StreamMachine, op: ops.StreamMsg, err: ApiError) -> bool:
        if op.reply:
            self._reply(sm.name, op.reply, _dumps({**err.to_dict(),
                                                   "stream": sm.stream.cfg["name"], "seq": 0}))
        return True

    def _reply(self, stream_key: str, subject: str, payload: bytes, hdr: bytes | None = None
               ) -> None:
        """A reply to a publisher of the stream, by core routing in the stream's account (a
        forwarded publish keeps the client's reply subject: it goes back over the route)."""
        self._client(stream_key).publish(subject, None, payload, hdr)

    def _not_acked(self, held: tuple[StreamMachine, int], exc: BaseException | None) -> None:
        # Not stored (or outcome unknown): no PubAck; the client's request times out and
        # it may retry (with Nats-Msg-Id, exactly once). Its reservation goes (a no-op if
        # the entry was applied after all, or the leader changed meanwhile).
        sm, key = held
        sm.inflight.release(key)
        self.log.warn(f"JetStream publish to {sm.name} not acknowledged: {exc!r}")

    def _batch_message(self, sm: StreamMachine, op: ops.StreamMsg) -> None:
        """Atomic batch publish: collected here (in arrival order, on the loop) until its
        commit, which is ONE STREAM_BATCH entry applied all-or-nothing."""
        collector = self.batches.get(sm.name)
        if collector is None or collector.allow_atomic != bool(sm.stream.cfg.get("allow_atomic")):
            collector = self.batches[sm.name] = BatchCollector(
                bool(sm.stream.cfg.get("allow_atomic")))
        got = collector.add(op)
        if got.error is not None:
            if op.reply:
                body = {**got.error.to_dict(), "stream": sm.stream.cfg["name"], "seq": 0}
                self._reply(sm.name, op.reply, _dumps(body))
        elif got.ack_empty:
            if op.reply:
                self._reply(sm.name, op.reply, b"")  # flow control: send the next one
        elif got.committed:
            self._commit_batch(sm, op, got.batch_id, got.committed)

    def _commit_batch(self, sm: StreamMachine, commit: ops.StreamMsg, batch_id: str,
                      msgs: list[ops.StreamMsg]) -> None:
        """The whole batch is checked against the account's limits (stored + held) and
        then held in flight until applied, like a publish: refused whole (10002 on the
        commit's reply) when it does not fit. nats-server 2.15.1 (R1) instead stores the
        batch's messages up to the limit and leaves the commit unanswered."""
        size_of = memory_size if sm.memory else file_size
        sizes = [size_of(m.subject, m.hdr, m.data) for m in msgs]
        size = sum(sizes)
        err = self._account_refusal(sm, size)
        if err is not None:
            self._refuse_publish(sm, commit, err)
            return
        if self._over_server_limit(sm, commit, size - sizes[-1]):
            return
        buffered = sum(len(m.subject) + len(m.reply) + len(m.hdr) + len(m.data) for m in msgs)
        key = sm.inflight.reserve(commit.now_ns, size, buffered, len(msgs))
        self._spawn(self._publish_held(sm, ops.StreamBatch(key, batch_id, tuple(msgs)), key))

    async def _publish_held(self, sm: StreamMachine, op: ops.StreamBatch, key: int) -> None:
        try:
            await self._propose(sm, op)
        except (ProposalDropped, KeyError, NotLeader) as exc:
            self._not_acked((sm, key), exc)

    async def _publish(self, sm: StreamMachine, op: ops.StreamMsg | ops.StreamBatch) -> None:
        try:
            await self._propose(sm, op)
        except (ProposalDropped, KeyError, NotLeader) as exc:
            # Not stored (or outcome unknown): no PubAck; the client's request times out
            # and it may retry (with Nats-Msg-Id, exactly once).
            self.log.warn(f"JetStream publish to {sm.name} not acknowledged: {exc!r}")

    def _effects_threadsafe(self, sm: StreamMachine, effects: list[Effect]) -> None:
        assert self.loop is not None
        if threading.get_ident() == self._loop_thread:
            # An inline apply (on the loop): same FIFO queue, without waking the selector
            # through its self-pipe (a write syscall per applied run).
            if sm.early is not None and any(type(e) is Reply for e in effects):
                # PubAcks `_early_replies` left here: a later run's must not overtake them
                # (the drain loop may apply it before this callback runs).
                self._held[sm.name] = self._held.get(sm.name, 0) + 1
                self.loop.call_soon(self._on_held_effects, sm, effects)
                return
            self.loop.call_soon(self._on_effects, sm, effects)
        else:
            # The apply worker: these run before the drain pass resumes, so before any
            # later run's early PubAcks.
            self.loop.call_soon_threadsafe(self._on_effects, sm, effects)

    def _on_held_effects(self, sm: StreamMachine, effects: list[Effect]) -> None:
        left = self._held.pop(sm.name, 1) - 1
        if left:
            self._held[sm.name] = left
        self._on_effects(sm, effects)

    def _early_replies(self, sm: StreamMachine, effects: list[Effect]) -> list[Effect]:
        """An apply on the loop (a small drain pass: lone sync publishes): send the run's
        PubAcks and flush them to their clients now, before the store commits and the
        driver's bookkeeping (what a window-1 publisher waits for; nothing else runs on
        the loop meanwhile, so no request can see the store without these entries). The
        entries are committed: fsynced in the WAL (in a cluster, on a majority, the
        leader's own fsync included: the driver counts it only after the fsync), replayed
        into the store after a crash. In a cluster only the leader builds PubAcks
        (`Stream.acks`, read once per run), so a follower's run has none here. Returns
        the effects left for `_on_effects` (after the commit, as before). Not with
        `republish` (nats-server sends the republished message before the PubAck), nor
        from the apply worker (another thread)."""
        if (self.client is None or sm.name in self._held
                or threading.get_ident() != self._loop_thread or sm.stream.cfg.get("republish")):
            return effects
        replies = [e for e in effects if type(e) is Reply]
        if not replies or len(replies) > EARLY_REPLIES_MAX:
            return effects
        sent = 0
        try:
            client = self._client(sm.name)
            for reply in replies:
                client.publish(reply.subject, None, reply.payload)
                sent += 1
            _flush_receivers(client, replies)
        except Exception as exc:  # noqa: BLE001 - the store must still commit
            self.log.error(f"JetStream {sm.name}: sending PubAcks failed: {exc!r}")
        return replies[sent:] + [e for e in effects if type(e) is not Reply]

    def _on_effects(self, sm: StreamMachine, effects: list[Effect]) -> None:
        """On the loop, in apply order: the entries are fsynced in the WAL and applied to
        the store (committed; LMDB is synced at sync points, the WAL keeps the entries until
        then), so their PubAcks may go out. In a cluster every replica applies; only the
        leader answers and republishes."""
        if self.client is None:
            return  # replayed at start-up before the client exists: nobody waits for these
        if self.cgroups and any(isinstance(e, Stored) for e in effects):
            self._kick_consumer_groups(sm.name)
        if self.jsc is not None and not self.jsc.leads(sm.name):
            return
        stored = False
        publish = None  # the account's internal client's, looked up once per run
        for effect in effects:
            kind = type(effect)  # the effect classes are final: no subclass to miss
            if kind is Stored:
                stored = True
            elif kind is Reply:
                if publish is None:
                    publish = self._client(sm.name).publish
                publish(effect.subject, None, effect.payload)
            elif isinstance(effect, Republish):
                self._client(sm.name).publish(effect.subject, None, effect.data,
                                              effect.hdr or None)
        if stored:
            self.sourcing.on_stored(sm.name)
            for cname in list(sm.stream.consumers):
                pull = self.pulls.get((sm.name, cname))
                if pull is not None and pull.wants() and \
                        (sm.name, cname) not in self._own_groups():
                    self._pump(sm.name, cname)

    # ------------------------------------------------------------------ $JS.API

    def _on_api(self, account: str, _sub: Any, subject: str, reply: str | None,
                hdr: bytes | None, body: bytes) -> None:
        if account == getattr(self.server.options.accounts, "system_account", "$SYS"):
            self._system_api(subject, reply, body)
            return
        call = api.route(subject)
        if call is None or not reply:
            return
        call = dataclasses.replace(call, account=account)
        if self.limits.get(account) is None:
            self._not_enabled(call, reply, body)
            return
        queue = ApiQueues.queue_of(call.op)
        if queue is None:
            self._spawn(self._serve(call, subject, reply, body))
            return
        if not self.api_queues.admit(queue):
            warning = self.api_queues.warning(queue, time.monotonic())
            if warning is not None:
                self.log.warn(warning)
            return
        task = self._spawn(self._serve(call, subject, reply, body))
        task.add_done_callback(lambda _t: self.api_queues.done(queue))

    def _system_api(self, subject: str, reply: str | None, body: bytes) -> None:
        """The system account has no JetStream of its own: nats-server answers every
        `$JS.API` request there (unknown ones too) with 10039 typed `system_response`,
        INFO with its account_info type; the meta operations are served there when
        clustered (checked against 2.15.1, standalone: no answer)."""
        if not reply:
            return
        account = getattr(self.server.options.accounts, "system_account", "$SYS")
        call = api.route(subject)
        if call is not None and call.op in ("META.LEADER.STEPDOWN", "SERVER.REMOVE"):
            if self.jsc is not None:
                self._spawn(self._serve(dataclasses.replace(call, account=account), subject,
                                        reply, body))
            return
        kind = "account_info_response" if call is not None and call.op == "INFO" \
            else "system_response"
        err = replies.error_reply(kind, ApiError.of("JSNotEnabledForAccountErr"))
        self.clients[account].publish(reply, None, _dumps(err))

    def _not_enabled(self, call: api.Call, reply: str, body: bytes) -> None:
        """An account without JetStream: nats-server answers an API request with 10039 and
        the reply's empty fields (checked against 2.15.1); a pull request or a direct get
        finds nobody listening; the system's meta operations are not answered."""
        client = self.clients[call.account]
        if call.op in ("CONSUMER.MSG.NEXT", "DIRECT.GET"):
            client.publish(reply, None, b"", b"NATS/1.0 503\r\n\r\n")
            return
        if call.op in ("META.LEADER.STEPDOWN", "SERVER.REMOVE"):
            return
        name = "JSNotEnabledForAccountErr"
        if call.op in ("STREAM.LEADER.STEPDOWN", "CONSUMER.LEADER.STEPDOWN",
                       "STREAM.PEER.REMOVE") and self.jsc is None:
            name = "JSClusterRequiredErr"
        try:
            if call.op in ("CONSUMER.CREATE", "CONSUMER.DURABLE.CREATE"):
                consumer_config.parse_request(body)  # a bad request is told so first
            elif call.op == "CONSUMER.PAUSE":
                pause.parse_pause(body)
            err = ApiError.of(name)
        except ApiError as bad:
            err = bad
        out = {**replies.error_reply(_kind(call.op), err), **_NOT_ENABLED_EXTRA.get(call.op, {})}
        if call.op == "CONSUMER.PAUSE":
            out = pause.pause_error(err)
        client.publish(reply, None, _dumps(out))

    async def _serve(self, call: api.Call, subject: str, reply: str, body: bytes) -> None:
        frames = await self._answer_lenient(call, subject, reply, body)
        client = self.clients[call.account]
        for hdr, data in frames:
            client.publish(reply, None, data, hdr)
        if frames and (call.op not in advisories.NOT_AUDITED
                       or (call.op == "STREAM.MSG.GET" and _is_error(frames[-1][1]))):
            # nats-server counts (and audits) a request once it has answered it, and
            # leaves message reads and pull requests out of both, but for a STREAM.MSG.GET
            # that fails (counted as an error and audited, checked 2.15.1).
            data = frames[-1][1]
            self.api_total += 1
            self.api_errors += _is_error(data)
            self.api_counts.setdefault(call.account, [0, 0])
            self.api_counts[call.account][0] += 1
            self.api_counts[call.account][1] += _is_error(data)
            self._advise(advisories.api_audit(
                self.server.server_name, self._requester(reply, call.account), subject, body,
                data, *self._stamp()), call.account)

    async def _answer_lenient(self, call: api.Call, subject: str, reply: str,
                              body: bytes) -> Frames:
        """`_answer`; with `strict: false` unknown request fields are logged, not refused
        (this task's context only: each request is served in a task of its own)."""
        if self.server.options.jetstream.strict:
            return await self._answer(call, subject, reply, body)
        skipped: list[str] = []
        gojson.LENIENT.set(skipped)
        frames = await self._answer(call, subject, reply, body)
        for text in skipped:
            self.log.warn(f"Invalid JetStream request '{call.account} > {subject}': {text}")
        return frames

    async def _answer(self, call: api.Call, subject: str, reply: str, body: bytes,
                      hops: int = 0) -> Frames:
        """The messages that answer a call: from the node that serves it (cluster.py
        forwards meta operations to the meta leader and stream ones to the stream's
        leader), else from this node's handler."""
        if self.jsc is not None:
            try:
                forwarded = await self.jsc.route_api(call, subject, reply, body, hops)
            except Exception as exc:  # noqa: BLE001 (no leader, or it did not answer)
                if not isinstance(exc, ApiError):
                    self.log.warn(f"JetStream API {subject}: forwarding failed: {exc!r}")
                if call.op == "CONSUMER.MSG.NEXT":
                    return []  # a pull request is not answered with JSON: the client retries
                if call.op == "DIRECT.GET":
                    return [(b"NATS/1.0 503\r\n\r\n", b"")]  # as when nobody listens
                err = exc if isinstance(exc, ApiError) else ApiError.of("JSClusterNotAvailErr")
                return [(None, _dumps(replies.error_reply(_kind(call.op), err)))]
            if forwarded is not None:
                return forwarded
        handler = getattr(self, "_h_" + call.op.replace(".", "_").lower())
        try:
            out = await handler(call, subject, reply, body)
        except ApiError as err:
            out = replies.error_reply(_kind(call.op), err)
        except ProposalDropped as exc:
            out = replies.error_reply(_kind(call.op), ApiError.of(
                "JSStreamGeneralErrorF", err=f"not committed: {exc}"))
        except (NotLeader, TimeoutError):  # leadership moved while serving: the client may retry
            out = replies.error_reply(_kind(call.op), ApiError.of("JSClusterNotAvailErr"))
        except CorruptRecordError as exc:  # a stored record failed its CRC: say so, stay up
            self.log.error(f"JetStream API {subject}: {exc}")
            out = replies.error_reply(_kind(call.op), ApiError.of("JSStreamGeneralErrorF",
                                                                  err=str(exc)))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # A request shape the pure checks let through: answer, log, and stay up.
            self.log.error(f"JetStream API {subject}: {exc!r}")
            out = replies.error_reply(_kind(call.op), ApiError.of("JSBadRequestErr"))
        if out is None:
            return []
        if isinstance(out, list):
            return out  # frames (DIRECT.GET)
        return [(None, _dumps(out))]

    def _requester(self, reply: str, account: str = jsaccount.GLOBAL) -> dict[str, Any]:
        """The audit's client details: the connection subscribed to the request's reply
        subject (the publisher is not handed to internal subscribers; a requester listens
        on its own inbox)."""
        own = self.clients.get(account, self.client)
        result = own.account.sublist.match(reply)
        subs = list(result.psubs) or [m for group in result.qsubs.values() for m in group]
        client = subs[0].client if subs else None
        if client is None or client is own:
            return {"acc": own.account.name, "server": self.server.server_name}
        return _client_info(client, self.server.server_name)

    def _stream(self, name: str) -> StreamMachine:
        sm = self.streams.get(name)
        if sm is None:
            raise ApiError.of("JSStreamNotFoundErr")
        return sm

    def _now(self) -> str:
        return rfc3339(time.time_ns())

    async def _h_info(self, call: api.Call, *_: Any) -> dict[str, Any]:
        tiers = self.limits.get(call.account) or jsaccount.UNLIMITED_TIERS
        usage: dict[str, dict[str, int]] = {}  # tier -> its figures
        # Consumers are counted on this node's replicas: what a follower holds back is
        # applied first (nats-server's meta leader counts them from its assignments).
        await self._apply_held_of(call.account)
        for k, sm in list(self.streams.items()):
            if _acc(k) == call.account:
                with sm.lock:
                    consumers = len(sm.stream.consumers)
                usage.setdefault(tiers.tier_of(sm.stream.cfg), _tier_usage())["consumers"] += \
                    consumers
        # clustered: the account's streams, hosted here or not; their bytes as their leaders
        # report them, once per replica (nats-server adds up every node's usage)
        for k, cfg in self._configs_all().items():
            if _acc(k) != call.account:
                continue
            u = usage.setdefault(tiers.tier_of(cfg), _tier_usage())
            u["streams"] += 1
            memory = cfg.get("storage") == "memory"
            u["memory" if memory else "storage"] += \
                self._stream_bytes(k) * jsaccount.replicas_of(cfg)
            u["reserved_memory" if memory else "reserved_storage"] += \
                jsaccount.reserved([cfg], memory)
        total = _tier_usage()
        for u in usage.values():
            for field_, value in u.items():
                total[field_] += value
        api_total, errors = self.api_counts.get(call.account, (0, 0))
        out: dict[str, Any] = {"type": replies.TYPE_PREFIX + "account_info_response",
                               **total, "limits": tiers.flat().to_info(),
                               **({"domain": self.domain} if self.domain else {}),
                               "api": {"level": api.API_LEVEL, "total": api_total,
                                       "errors": errors}}
        if tiers.tiered:
            # nats-server lists every tier with limits, and any tier still holding streams
            out["tiers"] = {t: {**usage.get(t, _tier_usage()),
                                "limits": tiers.limits.get(t, jsaccount.ZERO).to_info()}
                            for t in sorted(set(tiers.limits) | set(usage))}
        return out

    @property
    def server_limits(self) -> dict[str, int]:
        """`jetstream { limits {} }`, read at each request so that a reload applies."""
        return self.server.options.jetstream.limits

    def check_limits(self, account: str, cfg: dict[str, Any],
                     configs: dict[str, stream_config.Config], creating: bool) -> None:
        """The account's JetStream limits allow the stream `cfg` (jsaccount.py), or raise
        nats-server's error; `configs`: the account's streams by name."""
        tiers = self._limits_of(account)
        if tiers is None:
            raise ApiError.of("JSNotEnabledForAccountErr")
        others = {n: c for n, c in configs.items() if n != cfg["name"]}
        jsaccount.check_stream(tiers, cfg, others, creating)
        if self.jsc is None:
            # standalone, nats-server also holds every account's streams' reservations to
            # the server's own limits (at create and update)
            o = self.server.options.jetstream
            key = jsaccount.key(account, cfg["name"])
            jsaccount.check_server_stream(o.max_mem, o.max_file, cfg, [
                c for k, c in self._configs_all().items() if k != key])

    def _stream_reply(self, kind: str, sm: StreamMachine, did_create: bool = False
                      ) -> dict[str, Any]:
        with sm.lock:
            state = sm.stream.state(len(sm.stream.consumers))
            cfg = sm.stream.cfg
        return replies.stream_reply(kind, cfg, state, rfc3339(sm.created_ns), self._now(),
                                    did_create=did_create)

    async def _h_stream_create(self, call: api.Call, subject: str, reply: str, body: bytes
                               ) -> dict[str, Any]:
        if self.jsc is not None:
            return await self.jsc.create_stream(call.stream, body, call.account)
        cfg, pedantic = stream_config.parse_request(body)
        async with self._meta_lock:
            configs = self._configs(call.account)
            stored, created = stream_config.check_create(call.stream, cfg, pedantic, configs,
                                                         limits=self.server_limits)
            if created:
                self.check_limits(call.account, stored, configs, creating=True)
                now = time.time_ns()
                k = self._key(call)
                entry = cluster_meta.create(k, stream_config.to_wire(stored), now, [])
                del entry["peers"]  # one node: the node itself (the single-node layout)
                assert self.mr is not None
                await self.mr.propose(META_GROUP, _dumps(entry))
                await self._open_stream(k)
                self._advise(advisories.stream_action("create", stored["name"], *self._stamp()),
                             call.account)
        sm = self._stream(self._key(call))
        # nats-server says did_create also for an identical re-create (checked, 2.15.1).
        return self._stream_reply("stream_create_response", sm, did_create=True)

    async def _h_stream_update(self, call: api.Call, subject: str, reply: str, body: bytes
                               ) -> dict[str, Any]:
        if self.jsc is not None:
            out = await self.jsc.update_stream(call.stream, body, call.account)
            self._advise(advisories.stream_action("modify", call.stream, *self._stamp()),
                         call.account)
            return out
        cfg, pedantic = stream_config.parse_request(body)
        async with self._meta_lock:
            configs = self._configs(call.account)
            stored = stream_config.check_update(call.stream, cfg, pedantic, configs,
                                                limits=self.server_limits)
            self.check_limits(call.account, stored, configs, creating=False)
            sm = self._stream(self._key(call))
            await self._propose(sm, ops.UpdateConfig(
                time.time_ns(), _dumps(stream_config.to_wire(stored))))
            self._subscribe_stream(sm.name)
            self.sourcing.sync(sm.name)
            self._advise(advisories.stream_action("modify", call.stream, *self._stamp()),
                         call.account)
        # nats-server's update reply carries the live mirror / sources blocks
        return domain.with_domain(
            self.sourcing.info(self._stream_reply("stream_update_response", sm), sm),
            self.domain)

    async def _h_stream_info(self, call: api.Call, subject: str, reply: str, body: bytes
                             ) -> dict[str, Any]:
        sm = self.streams.get(self._key(call))
        if sm is None:  # nats-server's not-found INFO reply carries the paging fields too
            err = replies.error_reply(_kind(call.op), ApiError.of("JSStreamNotFoundErr"))
            return {**err, "total": 0, "offset": 0, "limit": 0}
        with sm.lock:
            out = replies.stream_info(sm.stream, body, rfc3339(sm.created_ns), self._now(),
                                      consumers=len(sm.stream.consumers))
        if "error" not in out:
            # A standalone nats-server names itself the stream's leader in INFO
            # (nats-server's order: state, cluster, mirror / sources, ts)
            cluster = {"leader": self.server.server_name} if self.jsc is None else \
                self.jsc.cluster_info(sm.group)
            at = next((k for k in ("mirror", "sources") if k in out), "ts")
            out = _insert_before(self.sourcing.info(out, sm), at, "cluster", cluster)
            out = domain.with_domain(out, self.domain)
        return out

    async def _h_stream_delete(self, call: api.Call, subject: str, reply: str, body: bytes
                               ) -> dict[str, Any]:
        requests.check_stream_delete(body)
        if self.jsc is not None:
            consumers = await self._consumer_names_anywhere(call)
            out = await self.jsc.delete_stream(self._key(call))
            if out.get("success"):
                self._advise_deleted(call, consumers)
            return out
        async with self._meta_lock:
            k = self._stream(self._key(call)).name
            consumers = self._consumer_names(k)
            assert self.mr is not None
            await self.mr.propose(META_GROUP, _dumps(cluster_meta.delete(k)))
            await self._close_stream(k)
            self._advise_deleted(call, consumers)
        return {"type": replies.TYPE_PREFIX + "stream_delete_response", "success": True}

    def _consumer_names(self, key: str) -> list[str]:
        """The consumers of a stream hosted here (none known: not hosted on this node)."""
        sm = self.streams.get(key)
        if sm is None:
            return []
        with sm.lock:
            return list(sm.stream.consumers)

    async def _consumer_names_anywhere(self, call: api.Call) -> list[str]:
        """Clustered: the consumers whose deletion a stream's delete advises. A 2.15.1
        cluster advises those of an R1 stream only (probed: an R3 stream's consumer got
        none). From the stream's leader when this node does not host it; [] when nobody
        answers."""
        cfg = self._configs(call.account).get(call.stream)
        if cfg is None or int(cfg.get("num_replicas") or 1) > 1:
            return []
        if self._key(call) in self.streams:
            return self._consumer_names(self._key(call))
        names = api.Call("CONSUMER.NAMES", call.stream, account=call.account)
        try:
            frames = await self._answer(names, f"{api.API_PREFIX}CONSUMER.NAMES.{call.stream}",
                                        "", b"")
            return list(json.loads(frames[0][1]).get("consumers") or [])
        except (IndexError, ValueError, TypeError, AttributeError):
            return []

    def _advise_deleted(self, call: api.Call, consumers: list[str]) -> None:
        """A deleted stream's advisories: each of its consumers deleted, then the stream, as
        nats-server sends them (checked, 2.15.1)."""
        for name in consumers:
            self._advise(advisories.consumer_action("delete", call.stream, name,
                                                    *self._stamp()), call.account)
        self._advise(advisories.stream_action("delete", call.stream, *self._stamp()),
                     call.account)

    async def _h_stream_purge(self, call: api.Call, subject: str, reply: str, body: bytes
                              ) -> dict[str, Any]:
        try:
            sm = self._stream(self._key(call))
            op = requests.parse_purge(body, time.time_ns())
        except ApiError as err:  # nats-server's purge errors carry "purged": 0
            return {**replies.error_reply(_kind(call.op), err), "purged": 0}
        index = await self._propose(sm, op)
        result = sm.results.pop(index, {"success": True, "purged": 0})
        return {"type": replies.TYPE_PREFIX + "stream_purge_response", **result}

    async def _h_stream_msg_delete(self, call: api.Call, subject: str, reply: str,
                                   body: bytes) -> dict[str, Any]:
        sm = self._stream(self._key(call))
        index = await self._propose(sm, requests.parse_msg_delete(body, time.time_ns()))
        result = sm.results.pop(index, {"success": True})
        return {"type": replies.TYPE_PREFIX + "stream_msg_delete_response", **result}

    async def _h_stream_names(self, call: api.Call, subject: str, reply: str, body: bytes
                              ) -> dict[str, Any]:
        return requests.names_reply(self._configs(call.account), body)

    async def _h_stream_list(self, call: api.Call, subject: str, reply: str, body: bytes
                             ) -> dict[str, Any]:
        infos = {}
        # A replica hosted here answers: what a follower holds back is applied first
        # (nats-server asks each stream's leader).
        await self._apply_held_of(call.account)
        for k, sm in list(self.streams.items()):
            if _acc(k) != call.account:
                continue
            # clustered, nats-server's list items carry no domain (2.15.1)
            full = domain.with_domain(
                self.sourcing.info(self._stream_reply("stream_info_response", sm), sm),
                self.domain if self.jsc is None else "")
            infos[_name(k)] = {f: full[f] for f in _LIST_FIELDS if f in full}
        configs = self._configs(call.account)
        if self.jsc is not None:  # the streams this node does not host: from their leaders
            for name in configs:
                if name not in infos:
                    try:
                        full = await self.jsc.stream_info_from_leader(
                            jsaccount.key(call.account, name))
                    except ApiError:
                        continue
                    infos[name] = {k: full[k] for k in _LIST_FIELDS
                                   if k in full and k != "domain"}
        return requests.list_reply(configs, body, infos)

    async def _h_stream_msg_get(self, call: api.Call, subject: str, reply: str, body: bytes
                                ) -> dict[str, Any]:
        return get.msg_get(self._stream(self._key(call)).store, body)

    async def _h_direct_get(self, call: api.Call, subject: str, reply: str, body: bytes
                            ) -> None:
        sm = self.streams.get(self._key(call))
        if sm is None or not sm.stream.cfg.get("allow_direct"):
            # a `mirror_direct` mirror of it in the same account answers for it
            sm = self.sourcing.direct_mirror(self._key(call))
        if sm is None and self.jsc is not None and reply:
            # (reply "": already forwarded) nats-server's mirror answers in the origin's
            # direct-get queue group cluster wide: a node hosting a `mirror_direct` mirror
            # of it answers.
            frames = await self.sourcing.direct_mirror_elsewhere(self._key(call), subject, body)
            if frames:
                return frames
        if sm is None:
            # nats-server only listens for streams that allow direct gets: no responders.
            return [(b"NATS/1.0 503\r\n\r\n", b"")]
        # A follower holding committed publishes back applies them first: as fresh as
        # the commit it knows.
        await self.apply_held_in([sm.group])
        with sm.lock:  # a follower's store is being applied to meanwhile
            return [(frame.hdr, frame.data)
                    for frame in get.direct_get(sm.store, _name(sm.name), body, call.rest)]

    async def _h_stream_leader_stepdown(self, call: api.Call, subject: str, reply: str,
                                        body: bytes) -> dict[str, Any]:
        if self.jsc is None:
            # A standalone nats-server has no leaders to change (checked, 2.15.1).
            raise ApiError.of("JSClusterRequiredErr")
        sm = self._stream(self._key(call))
        if call.consumer and call.consumer not in sm.stream.consumers:
            raise ApiError.of("JSConsumerNotFoundErr")
        if call.consumer and (sm.name, call.consumer) in self.cgroups:
            sm = self.cgroups[(sm.name, call.consumer)]  # its own group's leader moves
        # Other consumers are entries of their stream's group: they move with its leader.
        assert self.mr is not None
        st = self.mr.status(sm.group)
        others = [p for p in st["voters"] if p != self.node_id and self.jsc.is_up(p)]
        if not others:
            raise ApiError.of("JSClusterNoPeersErrF", err="no replacement peer connected")
        # nats-server 2.11+: an optional `placement` (preferred server, tags) picks the peer
        want = Placement.from_config(_request_json(body).get("placement"))
        if want.preferred:  # nats-server's refusals (checked on a 3-node 2.15.1 cluster)
            names = {self.jsc.member_name(p): p for p in st["voters"]}
            if names.get(want.preferred) == self.node_id:
                raise ApiError.of("JSClusterNoPeersErrF", err=f"preferred server "
                                  f"{json.dumps(want.preferred)} is already leader")
            if want.preferred not in names:
                raise ApiError.of("JSClusterNoPeersErrF", err=f"preferred server "
                                  f"{json.dumps(want.preferred)} not known")
        to = pick_leader(self.jsc.candidates(), st["voters"], self.node_id, want)
        await self.jsc.transfer(sm.group, to or others[0])
        return {"type": replies.TYPE_PREFIX + _kind(call.op), "success": True}

    _h_consumer_leader_stepdown = _h_stream_leader_stepdown

    async def _h_meta_leader_stepdown(self, call: api.Call, subject: str, reply: str,
                                      body: bytes) -> dict[str, Any]:
        if self.jsc is None:
            raise ApiError.of("JSClusterRequiredErr")
        return await self.jsc.meta_stepdown(body)

    async def _h_server_remove(self, call: api.Call, subject: str, reply: str, body: bytes
                               ) -> dict[str, Any]:
        if self.jsc is None:
            raise ApiError.of("JSClusterRequiredErr")
        return await self.jsc.server_remove(body)

    async def _h_stream_peer_remove(self, call: api.Call, subject: str, reply: str,
                                    body: bytes) -> dict[str, Any]:
        if self.jsc is None:
            raise ApiError.of("JSClusterRequiredErr")
        return await self.jsc.peer_remove(self._key(call), body)

    async def _sync_config(self, name: str, config: dict[str, Any] | None = None,
                           rev: int = 0) -> bool:
        """Clustered, on the stream's leader: the catalogue's config (the meta leader
        checked it; `config`/`rev` when the meta leader sent it along, ahead of this node's
        catalogue) becomes the group's through an UPDATE_CONFIG entry. A revision older
        than one already written here is ignored (this node's catalogue may lag).
        True: the group already had that config (nothing proposed)."""
        sm = self.streams.get(name)
        if sm is None or self.meta is None or self.jsc is None:
            return False
        if config is None:
            a = self.meta.streams.get(name)
            if a is None:
                return False
            config, rev = a["config"], int(a.get("rev", 0))
        if rev < self.jsc.synced_rev.get(sm.group, 0):
            return False
        self.jsc.synced_rev[sm.group] = rev
        with sm.lock:
            current = stream_config.to_wire(sm.stream.cfg)
        in_line = current == config
        if not in_line:
            await self._propose(sm, ops.UpdateConfig(time.time_ns(), _dumps(config)))
        self.sourcing.sync(name)  # mirror / sources as the group's config now says
        return in_line

    def _on_stream_leader(self, name: str, leader: int) -> None:
        """A stream group's leader changed: the new leader runs the consumers' pumps and
        timers; a node that lost leadership forgets its waiting requests (their clients
        ask again)."""
        assert self.loop is not None and self.jsc is not None
        sm = self.streams.get(name)
        if sm is None:
            return
        self.jsc.note_leader(sm.group, leader)
        if leader == self.node_id:
            with sm.lock:
                names = list(sm.stream.consumers)
            for cname in names:
                if (name, cname) not in self._own_groups():
                    self._pull(name, cname)
            self._start_push(name)
        else:
            for key in [k for k in self.pulls if k[0] == name and k not in self._own_groups()]:
                del self.pulls[key]
        self.sourcing.leader_changed(name, leader)
    # ------------------------------------------------------------------ consumer groups

    def _own_groups(self) -> dict[tuple[str, str], dict[str, Any]]:
        """(stream, consumer) -> its own group's assignment (clustered; cgroup.py)."""
        if self.jsc is None or self.meta is None:
            return {}
        return self.meta.catalogue.consumer_groups()

    def _csm(self, stream: str, name: str) -> Any:
        """The machine that holds a consumer's state here: its own group's, else its
        stream's (whose `stream.consumers` it is in)."""
        cm = self.cgroups.get((stream, name))
        if cm is None:
            return self.streams.get(stream)
        stub = self.streams[stream].stream.consumers.get(name)
        if stub is not None and stub.cfg is not cm.core.consumer.cfg:
            cm.reconfigure(stub.cfg)  # a CONSUMER.CREATE update, applied by the stream
        # its pending count is derived from the stream replica, which another group
        # applies: counted again when asked (not kept by the stream's hooks)
        cm.core.consumer.pending_cache = None
        return cm

    def _leads_consumer(self, stream: str, name: str) -> bool:
        """Whether this node runs the consumer's deliveries and acks."""
        if self.jsc is None:
            return True
        if self.meta is None or self.meta.catalogue.consumer_group(stream, name) is None:
            return self.jsc.leads(stream)
        cm = self.cgroups.get((stream, name))
        assert self.mr is not None
        try:
            return cm is not None and self.mr.leader(cm.group) == self.node_id
        except KeyError:
            return False

    def _sync_consumer_groups(self) -> None:
        """Host the consumer groups the catalogue assigns to this node (once their stream
        is hosted here); let go of the others."""
        own = self._own_groups()
        for key, cm in list(self.cgroups.items()):
            # a peer the group no longer names stays until its leader removed it (the
            # cluster duty lets it go, as for streams): leaving now could cost the quorum
            if key not in own or own[key]["group"] != cm.group:
                self._spawn(self._close_consumer_group(key, cm))
        want = {key: g for key, g in own.items() if self.node_id in g["peers"]}
        for key, g in want.items():
            if key not in self.cgroups and key[0] in self.streams:
                self._host_consumer_group(key, g)

    def _host_consumer_group(self, key: tuple[str, str], g: dict[str, Any]) -> None:
        assert self.mr is not None
        sm = self.streams[key[0]]
        cfg = consumer_config.from_wire(g["config"])
        cm = ConsumerMachine(sm, key[1], g["group"], cfg, int(g["start"]), int(g["lps"]),
                             int(g["created_ns"]), cgroup.memory(cfg, sm.stream.cfg),
                             self._cg_effects_threadsafe,
                             base64.b64decode(g.get("state") or ""))
        cm.leader_hook = lambda lid, _term: self._on_consumer_leader(key, lid)
        self.cgroups[key] = cm
        # the first peers bootstrap it; a peer added by a re-placement joins empty and
        # installs its leader's image (the consumer's state)
        voters = [] if g.get("scaled") else list(g["peers"])
        self.mr.add_group(g["group"], voters, state_machine=cm)
        cm.track = True

    async def _close_consumer_group(self, key: tuple[str, str], cm: ConsumerMachine) -> None:
        assert self.mr is not None
        if self.cgroups.get(key) is cm:
            del self.cgroups[key]
        self.pulls.pop(key, None)
        self.mr.remove_group(cm.group)
        await self.mr.removed(cm.group)
        cm.drop()

    async def _reconcile_consumers(self, stream: str) -> None:
        """The stream's leader, once its group is in line with a changed assignment: each
        consumer follows (nats-server 2.15, probed on 3 nodes): explicit replicas above
        the stream's are lowered to them; a consumer with a group of its own is re-placed
        when its replicas or its stream's peers changed; one whose replicas now differ from
        the stream's leaves the stream's group for a group of its own."""
        sm = self.streams.get(stream)
        if sm is None:
            return
        with sm.lock:
            names = list(sm.stream.consumers)
        for name in names:
            await self._reconcile_consumer(stream, name)

    async def _reconcile_consumer(self, stream: str, name: str) -> None:
        sm = self.streams.get(stream)
        if sm is None or self.jsc is None or self.meta is None or not self.jsc.leads(stream):
            return
        with sm.lock:
            c = sm.stream.consumers.get(name)
            if c is None:
                return
            cfg, scfg = c.cfg, sm.stream.cfg
        lowered = cgroup.capped(cfg, scfg)
        if lowered is not None:
            await self._propose(sm, ops.ConsumerUpsert(
                time.time_ns(), name, _dumps(consumer_config.to_wire(lowered)), 0, 0))
            cfg = lowered
        wire = consumer_config.to_wire(cfg)
        g = self.meta.catalogue.consumer_group(stream, name)
        if g is not None:
            peers = self.meta.catalogue.peers(stream, self.node_id)
            if g["config"] != wire or not set(g["peers"]) <= set(peers) or \
                    len(g["peers"]) != cgroup.replicas(cfg, scfg):
                await self.jsc.place_consumer(stream, name, wire, int(g["start"]),
                                              int(g["lps"]))
        elif cgroup.own_group(cfg, scfg):
            await self._move_to_own_group(stream, name, wire)

    async def _move_to_own_group(self, stream: str, name: str, wire: dict[str, Any]) -> None:
        """The consumer leaves its stream's group for a group of its own, with its state:
        deliveries stop and acks wait here; once the ones proposed are applied, the
        state record (acks, pending, redelivery counts) goes into the meta entry that
        places the group, whose members start from it; then the waiting acks go to it."""
        key = (stream, name)
        if key in self._moving:
            return
        self._moving[key] = []  # no delivery round starts (and a running pump stops)
        try:
            await self._quiesce(key)
            sm = self.streams[stream]
            with sm.lock:
                c = sm.stream.consumers.get(name)
                if c is None:
                    return
                state = c.state.encode()
            assert self.jsc is not None
            await self.jsc.place_consumer(stream, name, wire, 0, 0, state,
                                          prefer=self.node_id)
            self.pulls.pop(key, None)  # its waiting requests' clients ask again
        except ApiError as err:
            self.log.warn(f"JetStream: consumer {name} of {_name(stream)} stays in its "
                          f"stream's group: {err}")
        finally:
            for args in self._moving.pop(key, []):
                self._on_ack(*args)

    async def _quiesce(self, key: tuple[str, str]) -> None:
        """Wait until the consumer's delivery round in flight and its acks are applied."""
        pull = self.pulls.get(key)
        deadline = time.monotonic() + 5
        while pull is not None and pull.pumping and time.monotonic() < deadline:
            if pull.round is not None:
                await asyncio.wait((pull.round,), timeout=1)
            else:
                await asyncio.sleep(0.01)
        await self._acks_settled(*key)

    def _on_consumer_leader(self, key: tuple[str, str], leader: int) -> None:
        """A consumer group's leader changed: the new leader runs its pumps and timers and
        tells the stream its acks (a report lost with the old leader is made good); a node
        that lost it forgets its waiting requests (clients ask again)."""
        assert self.jsc is not None
        cm = self.cgroups.get(key)
        if cm is None:
            return
        self.jsc.note_leader(cm.group, leader)
        if leader != self.node_id:
            self.pulls.pop(key, None)
            return
        if key[1] in self.streams[key[0]].stream.consumers:
            if self._pull(*key).push:
                self._pump(*key)
        self._report_group(cm, force=True)

    async def _group_consumer_info(self, call: api.Call, name: str) -> dict[str, Any]:
        """CONSUMER.CREATE's reply for a consumer with its own group: its info as that
        group's leader (maybe another node) has it, once the group has elected one."""
        subject = f"{api.API_PREFIX}CONSUMER.INFO.{call.stream}.{name}"
        info_call = dataclasses.replace(call, op="CONSUMER.INFO", consumer=name)
        deadline = time.monotonic() + 10
        while True:
            frames = await self._answer(info_call, subject, "", b"")
            info = json.loads(frames[0][1]) if frames else {"error": {}}
            if "error" not in info or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        info["type"] = replies.TYPE_PREFIX + "consumer_create_response"
        return info

    def _kick_consumer_groups(self, stream: str) -> None:
        """New messages in the stream's replica here: the consumer groups led here look."""
        for (s, cname), pull in list(self.pulls.items()):
            if s == stream and (s, cname) in self.cgroups and pull.wants():
                self._pump(s, cname)

    def _cg_effects_threadsafe(self, cm: ConsumerMachine, effects: list[Effect]) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._report_group, cm)

    def _report_group(self, cm: ConsumerMachine, force: bool = False) -> None:
        """Interest / workqueue retention: the consumer group's leader tells the stream
        what its consumer acked (CONSUMER_GROUP_STATE, docs/jetstream.md "Consumer
        groups"); the stream removes what every interested consumer acked. One report in
        flight per group; applies meanwhile are covered by the next one."""
        if self.jsc is None or self.client is None or cm.stream_cfg()["retention"] == "limits":
            return
        key = (cm.name, cm.consumer)
        if not self._leads_consumer(*key) or not (cm.core.changed or force):
            return
        if key in self._reporting:
            self._reporting[key] = True  # look again when the one in flight is done
            return
        with cm.lock:
            entry = ops.encode(cm.core.report(time.time_ns()))
        self._reporting[key] = False

        async def run() -> None:
            try:
                await self.jsc.report_group_state(cm.name, entry)  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - the next report carries it
                self.log.warn(f"JetStream consumer group {cm.group}: report failed: {exc!r}")
                cm.core.changed = True
            finally:
                again = self._reporting.pop(key, False)
            if again or cm.core.changed:
                self._report_group(cm)

        self._spawn(run())

    # ------------------------------------------------------------------ consumers

    async def _h_consumer_create(self, call: api.Call, subject: str, reply: str, body: bytes
                                 ) -> dict[str, Any]:
        if self.sourcing.is_direct(body):  # a mirror's / source's origin consumer
            return await self.sourcing.create_direct(self._key(call), body)
        req = consumer_config.parse_request(body)
        k = self._key(call)
        sm = self.streams.get(k)
        with sm.lock if sm else _nolock():
            stream_cfg = sm.stream.cfg if sm else None
            existing = {n: c.cfg for n, c in sm.stream.consumers.items()} if sm else {}
        cfg, name, created = consumer_config.check_create(
            subject, req, stream_cfg, existing,
            name_source=lambda: "".join(secrets.choice(_NAME_CHARS) for _ in range(8)),
            clustered=self.jsc is not None, limits=self.server_limits)
        assert sm is not None
        if created:
            # the stream's max_consumers, or the account's when stricter (nats-server)
            tiers = self.limits.get(call.account) or jsaccount.UNLIMITED_TIERS
            _tier, limits = tiers.select(jsaccount.replicas_of(sm.stream.cfg))
            cap = jsaccount.consumer_cap(limits, int(sm.stream.cfg.get("max_consumers") or -1))
            if 0 < cap <= len(existing):
                raise ApiError.of("JSMaximumConsumersLimitErr")
        if created:
            await self._check_ha_assets(k, cfg, sm.stream.cfg)
        wire = consumer_config.to_wire(cfg)
        if not (created or existing.get(name) is not cfg):
            return self._consumer_info("consumer_create_response", sm, name)
        # Nothing is delivered before the reply's state is read: a push consumer's first
        # deliveries would lower the reply's num_pending, and nats-py's KV watcher then
        # ends its initial values before they arrive (nats-server replies first too).
        self.creating.add((k, name))
        try:
            with sm.lock:
                view = StreamView(sm.store, _filters(cfg))
                start, lps = initial_position(cfg, view, sm.stream.last_seq)
            own = self.jsc is not None and cgroup.own_group(cfg, sm.stream.cfg)
            if own and created:
                # replicas or storage differ from the stream's: a group of its own, placed
                # by the meta leader on some of the stream's peers, before the consumer exists
                await self.jsc.place_consumer(k, name, wire, start, lps)
            await self._propose(sm, ops.ConsumerUpsert(time.time_ns(), name, _dumps(wire),
                                                       start, lps))
            if created:
                self._advise(advisories.consumer_action("create", call.stream, name,
                                                        *self._stamp()), call.account)
            self.consumer_created.setdefault((k, name), time.time_ns())
            old = self.pulls.pop((k, name), None)
            fresh = self._pull(k, name)  # new limits (max_waiting, ...)
            if old is not None:
                fresh.queue.waiting = old.queue.waiting
                fresh.delivered_ns, fresh.acked_ns = old.delivered_ns, old.acked_ns
            if not created:
                await self._reconcile_consumer(k, name)  # its replicas may have changed
                own = own or (k, name) in self._own_groups()
            if own:
                info = await self._group_consumer_info(call, name)
            else:
                info = self._consumer_info("consumer_create_response", sm, name)
        finally:
            self.creating.discard((k, name))
        if fresh.push:
            self._pump(k, name)
        return info

    _h_consumer_durable_create = _h_consumer_create

    async def _check_ha_assets(self, key: str, cfg: dict[str, Any],
                               stream_cfg: dict[str, Any]) -> None:
        """`limits { max_ha_assets }`: a new replicated consumer needs every peer of its
        stream to take one more replicated asset; nats-server answers 10023 otherwise."""
        cap = int(self.server_limits.get("max_ha_assets") or 0)
        if cap <= 0 or self.jsc is None or not _replicated_consumer(cfg, stream_cfg):
            return
        ha = await self.jsc.ha_assets()
        peers = self.jsc.catalogue().streams.get(key, {}).get("peers", [])
        if any(placement_mod.ha_over(ha.get(p, 0), cap) for p in peers):
            self.log.warn(f"Maximum HA Assets limit reached: {cap}")
            raise ApiError.of("JSInsufficientResourcesErr")

    async def apply_held_here(self) -> None:
        """What this node's stream followers hold back (raft/multigroup.py
        FOLLOWER_DEFER_*) applied now, for a count of what is committed here."""
        await self.apply_held_in([sm.group for sm in list(self.streams.values())])

    async def apply_held_in(self, groups: list[str]) -> None:
        """What these groups' followers here hold back (raft/multigroup.py
        FOLLOWER_DEFER_*) applied now, up to the commit this node knows: for a read or a
        decision that must see it. Bounded (HELD_WAIT_S): a group whose driver failed,
        was removed or is stopping is read as it stands, never waited on for good."""
        if self.mr is None:
            return
        waits = [f for g in groups if (f := self.mr.apply_held(g)) is not None]
        if not waits:
            return
        await asyncio.wait(waits, timeout=HELD_WAIT_S)
        for f in waits:  # a group removed meanwhile (now or after the bound) is no error here
            f.add_done_callback(_retrieve)

    async def _apply_held_of(self, account: str) -> None:
        """`apply_held_in` for the account's streams hosted here."""
        await self.apply_held_in([sm.group for k, sm in list(self.streams.items())
                                  if _acc(k) == account])

    def ha_consumers_here(self) -> int:
        """The replicated durable consumers of the streams this node hosts (`max_ha_assets`
        counts each on every node of its stream, as nats-server counts its Raft groups)."""
        n = 0
        for sm in list(self.streams.values()):
            scfg = sm.stream.cfg
            if int(scfg.get("num_replicas") or 1) > 1:
                n += sum(1 for c in list(sm.stream.consumers.values())
                         if _replicated_consumer(c.cfg, scfg))
        return n

    # ------------------------------------------------------------------ snapshot / restore

    async def _h_stream_snapshot(self, call: api.Call, subject: str, reply: str, body: bytes
                                 ) -> dict[str, Any]:
        return await backup.snapshot_request(self, call, reply, body)

    async def _h_stream_restore(self, call: api.Call, subject: str, reply: str, body: bytes
                                ) -> dict[str, Any]:
        return await backup.restore_request(self, call, reply, body)

    async def _h_consumer_pause(self, call: api.Call, subject: str, reply: str, body: bytes
                                ) -> dict[str, Any]:
        """Pause until a time (or resume): a consumer config change, through the log."""
        try:
            sm = self._stream(self._key(call))
            consumer = sm.stream.consumers.get(call.consumer)
            if consumer is None:
                raise ApiError.of("JSConsumerNotFoundErr")
            until = pause.parse_pause(body)
        except ApiError as err:
            return pause.pause_error(err)
        cfg = consumer_config.with_pause(consumer.cfg, until)
        await self._propose(sm, ops.ConsumerUpsert(
            time.time_ns(), call.consumer, _dumps(consumer_config.to_wire(cfg)), 0, 0))
        pull = self.pulls.get((sm.name, call.consumer))
        if pull is not None:
            pull.pause_seen = ""  # this request's own advisory says how the pause stands
        self._pump(sm.name, call.consumer)
        out = pause.pause_reply(until, time.time_ns())
        self._advise(advisories.consumer_pause(call.stream, call.consumer, out["paused"],
                                               out["pause_until"], *self._stamp()),
                     call.account)
        return out

    async def _h_consumer_unpin(self, call: api.Call, subject: str, reply: str, body: bytes
                                ) -> dict[str, Any]:
        sm = self._stream(self._key(call))
        consumer = sm.stream.consumers.get(call.consumer)
        if consumer is None:
            raise ApiError.of("JSConsumerNotFoundErr")
        group = pause.parse_unpin(body, consumer.cfg)
        pull = self.pulls.get((sm.name, call.consumer))
        if pull is not None and pull.queue.priority.unpin(group):
            self._advise(advisories.group_unpinned(call.account, call.stream,
                                                   call.consumer, group, "admin",
                                                   *self._stamp()), call.account)
            self._pump(sm.name, call.consumer)
        return {"type": pause.UNPIN_TYPE}

    def _consumer_info(self, kind: str, sm: StreamMachine, name: str) -> dict[str, Any]:
        with sm.lock:
            consumer = sm.stream.consumers.get(name)
            if consumer is None:
                raise ApiError.of("JSConsumerNotFoundErr")
            view = StreamView(sm.store, consumer.filters())
            pull = self.pulls.get((sm.name, name))
            created = sm.stream.consumer_created.get(name) or \
                self.consumer_created.get((sm.name, name), sm.created_ns)
            wire = consumer_config.to_wire(consumer.cfg)
            out = replies.consumer_info(
                kind, _name(sm.name), name, wire, consumer, view, rfc3339(created), self._now(),
                num_waiting=len(pull.queue.waiting) if pull else 0,
                delivered_at=rfc3339(pull.delivered_ns) if pull and pull.delivered_ns else "",
                acked_at=rfc3339(pull.acked_ns) if pull and pull.acked_ns else "",
                push_bound=bool(pull and pull.push and self._has_interest(pull.push, sm.name)),
                paused_ns=pause.paused_for(consumer.cfg.get("pause_until") or "",
                                           time.time_ns()),
                pinned={g: (pin, rfc3339(ts)) for g, (pin, ts)
                        in (pull.queue.priority.state() if pull else {}).items()})
        if self.jsc is not None and isinstance(sm, ConsumerMachine):  # its own group
            out = _insert_before(out, "ts", "cluster", self.jsc.consumer_cluster_info(sm.group))
        elif self.jsc is not None:  # a consumer lives in its stream's group (its replicas)
            out = _insert_before(out, "ts", "cluster", self.jsc.cluster_info(sm.group))
        return out

    async def _h_consumer_info(self, call: api.Call, subject: str, reply: str, body: bytes
                               ) -> dict[str, Any]:
        sm = self._stream(self._key(call))
        if call.consumer in sm.stream.consumers:
            sm = self._csm(sm.name, call.consumer)
        pull = self.pulls.get((sm.name, call.consumer))
        if pull is not None and pull.round is not None:
            await asyncio.wait((pull.round,))  # a delivery round's messages leave first
        await self._acks_settled(sm.name, call.consumer)
        return self._consumer_info("consumer_info_response", sm, call.consumer)

    async def _h_consumer_delete(self, call: api.Call, subject: str, reply: str, body: bytes
                                 ) -> dict[str, Any]:
        sm = self._stream(self._key(call))
        if self.sourcing.delete_direct(self._key(call), call.consumer):
            return {"type": replies.TYPE_PREFIX + "consumer_delete_response", "success": True}
        if call.consumer not in sm.stream.consumers:
            raise ApiError.of("JSConsumerNotFoundErr")
        await self._propose(sm, ops.ConsumerDelete(time.time_ns(), call.consumer))
        if self.jsc is not None and (sm.name, call.consumer) in self._own_groups():
            await self.jsc.place_consumer(sm.name, call.consumer, None, 0, 0)  # group goes
        self.pulls.pop((sm.name, call.consumer), None)
        self.consumer_created.pop((sm.name, call.consumer), None)
        self._advise(advisories.consumer_action("delete", call.stream, call.consumer,
                                                *self._stamp()), call.account)
        return {"type": replies.TYPE_PREFIX + "consumer_delete_response", "success": True}

    def _page(self, body: bytes, names: list[str], limit: int) -> tuple[int, list[str]]:
        offset = 0
        if not requests.is_empty_request(body):
            try:
                offset = max(int(json.loads(body).get("offset", 0)), 0)
            except (ValueError, AttributeError, TypeError, RecursionError):
                offset = 0
        offset = min(offset, len(names))
        return offset, names[offset:offset + limit]

    async def _h_consumer_names(self, call: api.Call, subject: str, reply: str, body: bytes
                                ) -> dict[str, Any]:
        sm = self._stream(self._key(call))
        names = sorted(sm.stream.consumers)
        offset, page = self._page(body, names, 1024)
        return {"type": replies.TYPE_PREFIX + "consumer_names_response", "total": len(names),
                "offset": offset, "limit": 1024, "consumers": page}

    async def _h_consumer_list(self, call: api.Call, subject: str, reply: str, body: bytes
                               ) -> dict[str, Any]:
        sm = self._stream(self._key(call))
        names = sorted(sm.stream.consumers)
        offset, page = self._page(body, names, 256)
        infos = []
        for name in page:
            info = self._consumer_info("consumer_info_response", sm, name)
            info.pop("type")
            info["config"] = requests.stored_config(info["config"])
            infos.append(info)
        return {"type": replies.TYPE_PREFIX + "consumer_list_response", "total": len(names),
                "offset": offset, "limit": 256, "consumers": infos}

    # ------------------------------------------------------------------ pull consumers

    def _pull(self, stream: str, name: str) -> _Pull:
        pull = self.pulls.get((stream, name))
        if pull is None:
            sm = self.streams[stream]
            cfg = sm.stream.consumers[name].cfg
            pull = self.pulls[(stream, name)] = _Pull(cfg)
            # nats-server's burst: the stream's max_msg_size, else max_payload (pull
            # consumers pace replay original too; a rate limit is refused for them)
            burst = int(sm.stream.cfg.get("max_msg_size") or 0)
            if burst <= 0:
                burst = int(self.server.options.max_payload)
            pull.pacer = Pacer.for_consumer(cfg, burst, time.time_ns())
        return pull

    async def _h_consumer_msg_next(self, call: api.Call, subject: str, reply: str,
                                   body: bytes) -> None:
        sm = self.streams.get(self._key(call))
        if sm is None or call.consumer not in sm.stream.consumers:
            # nats-server answers a request for a missing consumer with a 404 status.
            self._send(Status(reply, b"NATS/1.0 404 No Messages\r\n\r\n"), self._key(call))
            return None
        self._next_request(sm.name, call.consumer, reply, body)
        return None

    def _next_request(self, stream: str, name: str, reply: str, body: bytes) -> None:
        """A pull request (MSG.NEXT, or the rest of a `+NXT` ack) joins the waiting queue."""
        pull = self._pull(stream, name)
        if pull.push:
            self._send(Status(reply, b"NATS/1.0 409 Consumer is push based\r\n\r\n"), stream)
            return
        for status in pull.queue.add(time.time_ns(), reply, body):
            self._send(status, stream)
        self._pump(stream, name)

    def _send(self, status: Status, stream_key: str) -> None:
        self._client(stream_key).publish(status.reply, None, b"", status.hdr)

    def _pump(self, stream: str, name: str) -> None:
        pull = self.pulls.get((stream, name))
        if pull is None:
            return
        if pull.pumping:
            pull.again = True  # the running pump looks again before it stops
            return
        if not pull.wants() or (stream, name) in self.creating or (stream, name) in self._moving:
            return  # nothing to serve (each ack lands here), or its create pumps after
        pull.pumping = True
        self._spawn(self._run_pump(stream, name, pull))

    async def _run_pump(self, stream: str, name: str, pull: _Pull) -> None:
        try:
            while True:
                pull.again = False
                while pull.wants() and (stream, name) not in self._moving and \
                        await self._deliver_batch(stream, name, pull):
                    pass
                if not pull.again:
                    return
        finally:
            pull.pumping = False

    async def _deliver_batch(self, stream: str, name: str, pull: _Pull) -> bool:
        """Plan, propose and send the deliveries the waiting requests want; False when
        there is nothing to do now. The CONSUMER_DELIVERED entries of one round are
        proposed together (one group commit); the next round plans on their applied state."""
        sm = self._csm(stream, name)
        if sm is None:
            return False
        now = time.time_ns()
        interest = functools.partial(self._has_interest, stream_key=stream)
        if pull.push and not interest(pull.push):
            return False  # nats-server delivers only while someone listens
        if pull.flow is not None and pull.flow.stalled():
            return False  # flow control: wait for the client's answer
        if not pull.push:
            pull.queue.drop_unheard(interest, now,
                                    0 if self.jsc is None else UNHEARD_GRACE_NS)
        with sm.lock:
            consumer = sm.stream.consumers.get(name)
            if consumer is None:
                return False
            if consumer.cfg.get("pause_until") and \
                    pause.paused_for(consumer.cfg["pause_until"], now):
                pull.paused = True  # the ticker pumps again once the pause is over
                return False
            pull.paused = False
            view = StreamView(sm.store, consumer.filters())
            # overflow priority groups serve a request only above its pending thresholds
            counts = [consumer.num_pending(view), consumer.num_ack_pending()] \
                if pull.queue.priority.policy == "overflow" else [0, 0]
            wanted = MAX_ROUND if pull.push else min(pull.queue.wanted(*counts), MAX_ROUND)
            if pull.pacer is not None:
                wanted = 1  # paced: one delivery at a time, each after its wait
            if not wanted and pull.queue.waiting:
                return False  # requests wait, none of them may be served now
            plans = consumer.plan_batch(now, view, wanted)
            msgs, corrupt = _load_planned(sm.store, plans)
            acks = consumer.cfg.get("ack_policy", "none") != "none"
            # what is pending when the round is planned: the ack subjects' last token counts
            # from here, as nats-server's (which sends at once) does, not from after the
            # proposals, when the stream may already hold later messages
            pending_at_plan = consumer.num_pending(view)
        if not plans:
            if pull.pacer is not None:
                pull.pacer.caught_up()
            for status in () if pull.push else pull.queue.nothing_pending():
                self._send(status, stream)
            return False
        if pull.flow is not None and pull.flow.window:
            plans = _within_window(plans, msgs, pull.flow, stream, name)
        # One CONSUMER_DELIVERED_MANY entry per run of deliveries (the whole round unless a
        # damaged record is skipped between them): one proposal, WAL record and apply
        # dispatch per round instead of per message. `runs[i]` are entry i's sends.
        entries: list[ops.Op] = []
        runs: list[list[tuple[Any, str]]] = []
        batch: list[int] = []  # sseqs of the run being built
        drops = [p for p in plans if isinstance(p, Drop)]
        if drops:
            await self._drop(sm, name, drops)
        for plan in plans:
            if isinstance(plan, Drop):
                continue
            msg = msgs.get(plan.sseq)
            if msg is None and plan.sseq in corrupt:
                # In plan order: the delivered floor moves past it with its neighbours.
                self._end_run(entries, runs, batch, name, now)
                skipped = self._skip_corrupt(sm, name, plan.sseq, corrupt, acks, now)
                entries += skipped
                runs += [[] for _ in skipped]
                continue
            if msg is None:
                continue  # removed meanwhile: the next round drops it
            if pull.push:
                target = pull.push
            else:
                req, refused = pull.queue.take(len(msg.subject) + len(msg.hdr) + len(msg.data),
                                               *counts)
                for status in refused:
                    self._send(status, stream)
                if req is None:
                    break
                target = req.reply
                if plan.deliveries == 1:
                    counts[0] -= 1
                counts[1] += 1
                self._pin(sm.name, name, pull, req, now)
            if not batch:
                runs.append([])
            batch.append(plan.sseq)
            runs[-1].append((msg, target))
        self._end_run(entries, runs, batch, name, now)
        if not entries:
            return bool(drops) or (bool(pull.queue.waiting) and not pull.push)
        first = next((r[0][0] for r in runs if r), None)
        if pull.pacer is not None and first is not None and \
                not await self._pace(stream, name, pull, first):
            return False
        # Between the apply (delivered state moved) and the send, a CONSUMER.INFO would
        # report these messages as no longer pending before the client has them (nats-py's
        # KV watcher then ends its initial values early): it waits for `pull.round`.
        self._flush_acks(stream, name)  # held acks ride in the round's drain pass
        pull.round = asyncio.get_running_loop().create_future()
        try:
            results = await asyncio.gather(*(self._propose_future(sm, e) for e in entries),
                                           return_exceptions=True)
            done: list[tuple[Any, str, Delivered | None]] = []
            for run, result in zip(runs, results, strict=True):
                if run and isinstance(result, int):
                    got = sm.take_delivered(result)
                    # one Delivered per sseq, in order; none if the consumer went meanwhile
                    done += [(m, t, d) for (m, t), d in zip(run, got, strict=False)]
            self._send_deliveries(sm, name, done, pull, pending_at_plan)
        finally:
            ended, pull.round = pull.round, None
            ended.set_result(None)
        return True

    @staticmethod
    def _end_run(entries: list[ops.Op], runs: list[list[tuple[Any, str]]], batch: list[int],
                 name: str, now: int) -> None:
        """Close the run of deliveries being built as one entry (a lone one as the
        single-delivery entry older nodes also read)."""
        if not batch:
            return
        entries.append(ops.ConsumerDelivered(now, name, batch[0]) if len(batch) == 1
                       else ops.ConsumerDeliveredMany(now, name, tuple(batch)))
        batch.clear()

    async def _pace(self, stream: str, name: str, pull: _Pull, msg: Any) -> bool:
        """Replay original, then the rate limit: wait before this delivery, as nats-server
        does. False when meanwhile the consumer went or this node stopped leading (the plan
        is stale: nothing is proposed; the next leader plans again)."""
        assert pull.pacer is not None
        wait = pull.pacer.replay_wait_ns(msg.ts_ns)
        if wait:
            await asyncio.sleep(wait / 1e9)
        ack = f"{api.ACK_PREFIX}{stream}.{name}.1.{msg.seq}.{msg.seq}.{msg.ts_ns}.0"
        size = len(msg.subject) + len(ack) + len(msg.hdr) + len(msg.data)
        wait = pull.pacer.rate_wait_ns(time.time_ns(), size)
        if wait:
            await asyncio.sleep(wait / 1e9)
        sm = self._csm(stream, name)
        return sm is not None and name in sm.stream.consumers and \
            self.pulls.get((stream, name)) is pull and self._leads_consumer(stream, name)

    def _pin(self, stream: str, name: str, pull: _Pull, req: Any, now: int) -> None:
        """A pinned_client group's delivery carries the pin id; the first one pins."""
        pin, new = pull.queue.priority.pin_for(req, now, backup.nuid)
        if not pin:
            return
        pull.pin_headers[req.reply] = pin
        if new:
            self._advise(advisories.group_pinned(_acc(stream), _name(stream), name,
                                                 req.group, pin, *self._stamp()), _acc(stream))

    def _send_deliveries(self, sm: StreamMachine, name: str,
                         done: list[tuple[Any, str, Delivered | None]], pull: _Pull,
                         pending_at_plan: int | None = None) -> None:
        """Each applied delivery (message, request reply, its Delivered effect) to its
        request, with the ack subject nats-server sends (its last token: what is still
        pending after that message)."""
        with sm.lock:
            consumer = sm.stream.consumers.get(name)
            if consumer is None:
                return
            left = consumer.num_pending(StreamView(sm.store, consumer.filters()))
        new_after = sum(1 for _, _, d in done if d is not None and d.deliveries == 1)
        if pending_at_plan is not None:
            left = min(left, max(pending_at_plan - new_after, 0))
        head = f"{api.ACK_PREFIX}{_name(sm.name)}.{name}."
        client = self._client(sm.name)  # delivered in the stream's account only
        deliver = client.account.deliver_as
        for msg, target, d in done:
            if d is None:
                continue
            new_after -= d.deliveries == 1
            ack = f"{head}{d.deliveries}.{d.sseq}.{d.cseq}.{msg.ts_ns}.{left + new_after}"
            hdr, data = msg.hdr, msg.data
            if pull.headers_only:  # the size instead of the body, as nats-server sends it
                hdr, data = _with_header(hdr, "Nats-Msg-Size", str(len(data))), b""
            pin = pull.pin_headers.get(target)
            if pin:
                hdr = _with_header(hdr, "Nats-Pin-Id", pin)
            deliver(client, target, msg.subject, ack, hdr or None, data)
            pull.delivered_ns = time.time_ns()
            if pull.flow is not None:
                size = len(msg.subject) + len(ack) + len(hdr) + len(data)
                fc = pull.flow.on_sent(size, time.time_ns(), lambda: fc_subject(
                    _name(sm.name), name, secrets.randbits(62)))
                if fc:
                    client.publish(target, fc, b"", FC_REQUEST)
        if pull.pin_headers:  # forget the pins of requests that are done
            live = {r.reply for r in pull.queue.waiting}
            pull.pin_headers = {k: v for k, v in pull.pin_headers.items() if k in live}

    def _on_ack(self, account: str, _sub: Any, subject: str, reply: str | None,
                hdr: bytes | None, body: bytes) -> None:
        info = parse_ack_subject(subject)
        if info is None:
            return
        k = jsaccount.key(account, info.stream)  # an ack reaches its own account's stream
        moving = self._moving.get((k, info.consumer))
        if moving is not None:  # to its new group once it is placed
            moving.append((account, _sub, subject, reply, hdr, body))
            return
        if self.jsc is not None and not self._leads_consumer(k, info.consumer):
            if self.meta is not None and k in self.meta.streams:
                self.jsc.forward_ack(k, subject, reply, body)
            return
        sm = self._csm(k, info.consumer)
        if sm is None or info.consumer not in sm.stream.consumers:
            return
        kind, delay, wants_next = parse_ack_body(body)
        pull = self.pulls.get((k, info.consumer))
        if pull is not None:
            pull.acked_ns = time.time_ns()
        if kind is None:  # a body nats-server does not know: nothing changes
            if reply:
                self._client(k).publish(reply, None, b"")
            return
        if kind == AckKind.ACK:
            self._ack_sample(sm, info)
            if not wants_next:
                self._queue_ack(k, info.consumer, info.sseq, reply or "")
                return
        self._flush_acks(k, info.consumer)  # this consumer's earlier acks go first
        op = ops.ConsumerAck(time.time_ns(), info.consumer, kind, info.sseq, delay)
        fut = self._propose_future(sm, op)
        self._ack_last[(k, info.consumer)] = fut
        fut.add_done_callback(
            lambda f: self._ack_applied(sm, info, op, reply, body, wants_next, f))

    def _queue_ack(self, stream: str, consumer: str, sseq: int, reply: str) -> None:
        """A plain +ACK joins its consumer's run. A run is proposed as ONE entry: right
        after the loop's current work when an ack in it waits for its confirmation (a
        double ack) or it is long; else when the consumer's next delivery round is
        proposed (the same drain pass, so the same fsync) or after ACK_HOLD_S. A client's
        acks of one fetch arrive over several socket reads: each read's acks as an entry
        of its own cost an fsync and an apply transaction each."""
        key = (stream, consumer)
        run = self._ack_runs.setdefault(key, [])
        run.append((sseq, reply))
        handle = self._ack_flush.get(key)
        if reply or len(run) >= ACK_RUN_MAX:
            if isinstance(handle, asyncio.TimerHandle):
                handle.cancel()
                handle = None
            if handle is None:
                self._ack_flush[key] = asyncio.get_running_loop().call_soon(
                    self._flush_acks, stream, consumer)
        elif handle is None:
            self._ack_flush[key] = asyncio.get_running_loop().call_later(
                ACK_HOLD_S, self._flush_acks, stream, consumer)

    def _flush_acks(self, stream: str, consumer: str) -> None:
        """Propose a consumer's queued acks as one entry (a lone one as CONSUMER_ACK)."""
        handle = self._ack_flush.pop((stream, consumer), None)
        if handle is not None:
            handle.cancel()  # flushed early (a nak, a delivery round, CONSUMER.INFO)
        run = self._ack_runs.pop((stream, consumer), None)
        sm = self._csm(stream, consumer) if stream in self.streams else None
        if not run or sm is None:
            return
        now = time.time_ns()
        op: ops.Op = ops.ConsumerAck(now, consumer, AckKind.ACK, run[0][0]) if len(run) == 1 \
            else ops.ConsumerAcks(now, consumer, tuple((AckKind.ACK, s, 0) for s, _ in run))
        fut = self._propose_future(sm, op)
        self._ack_last[(stream, consumer)] = fut
        fut.add_done_callback(lambda f: self._acks_applied(stream, consumer, run, f))

    async def _acks_settled(self, stream: str, consumer: str) -> None:
        """Propose the consumer's held acks and wait until its acks so far are applied:
        a CONSUMER.INFO after acks on the same connection reflects them, as nats-server's
        does (its acks apply in order with the request)."""
        self._flush_acks(stream, consumer)
        last = self._ack_last.get((stream, consumer))
        if last is not None:
            await asyncio.wait((last,))

    def _acks_applied(self, stream: str, consumer: str, run: list[tuple[int, str]],
                      fut: asyncio.Future[int]) -> None:
        """A run of plain acks is applied (or refused): confirm the double acks, pump."""
        key = (stream, consumer)
        if self._ack_last.get(key) is fut:
            del self._ack_last[key]
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            log = self.log.warn if isinstance(exc, (ProposalDropped, KeyError, NotLeader)) \
                else self.log.error
            log(f"JetStream acks on {stream}/{consumer} not recorded ({len(run)}): {exc!r}")
            return
        client = self._client(stream)
        for _sseq, reply in run:
            if reply:
                client.publish(reply, None, b"")  # double ack: once applied
        self._pump(stream, consumer)

    def _ack_applied(self, sm: StreamMachine, info: AckInfo, op: ops.ConsumerAck,
                     reply: str | None, body: bytes, wants_next: bool,
                     fut: asyncio.Future[int]) -> bool:
        """After the ack's entry applied (or was refused): True if it is recorded. A client
        ack runs this as its proposal's done-callback: no Task per acked message."""
        name = info.consumer
        if self._ack_last.get((sm.name, name)) is fut:
            del self._ack_last[(sm.name, name)]
        if fut.cancelled():
            return False
        exc = fut.exception()
        if isinstance(exc, (ProposalDropped, KeyError, NotLeader)):
            self.log.warn(f"JetStream ack on {sm.name}/{name} not recorded: {exc!r}")
            return False
        if exc is not None:
            self.log.error(f"JetStream ack on {sm.name}/{name} failed: {exc!r}")
            return False
        index = fut.result()
        if reply and wants_next:  # +NXT: the reply subject receives the next messages
            if name in sm.stream.consumers:
                self._next_request(sm.name, name, reply, next_request(body))
        elif reply:
            self._client(sm.name).publish(reply, None, b"")  # double ack: once applied
        for event in sm.events.pop(index, []):
            a = event.advisory
            if op.kind == AckKind.TERM:
                self._advise(advisories.terminated(_name(sm.name), name, info.cseq, a.sseq,
                                                   a.deliveries, advisories.term_reason(body),
                                                   *self._stamp()), _acc(sm.name))
            elif op.kind == AckKind.NAK:
                self._advise(advisories.naked(_name(sm.name), name, info.cseq, a.sseq,
                                              a.deliveries, *self._stamp()), _acc(sm.name))
        self._pump(sm.name, name)
        return True

    def _ack_sample(self, sm: StreamMachine, info: AckInfo) -> None:
        """`sample_freq`: publish an ack metric for that share of acks of pending messages
        (the time from the delivery to the ack, as nats-server measures it)."""
        consumer = sm.stream.consumers.get(info.consumer)
        if consumer is None or not consumer.cfg.get("sample_freq"):
            return  # the common case, read without the lock (one dict lookup per ack)
        with sm.lock:
            pct = advisories.sample_percent(consumer.cfg["sample_freq"])
            pending = consumer.state.pending.get(info.sseq)
            deliveries = consumer.state.deliveries.get(info.sseq, 1)
        if pending is None or pct <= 0 or secrets.randbelow(100) >= pct:
            return
        self._advise(advisories.consumer_ack_metric(
            _name(sm.name), info.consumer, info.cseq, info.sseq,
            time.time_ns() - pending.delivered_ns, deliveries, *self._stamp()), _acc(sm.name))

    def _skip_corrupt(self, sm: StreamMachine, name: str, sseq: int, corrupt: dict[int, str],
                      acks: bool, now: int) -> list[ops.Op]:
        """A record that failed its CRC is passed over, as nats-server's consumers pass over
        messages its store lost: recorded as delivered (and terminated, so it is not
        redelivered) without sending it, and logged. Without this the pump met the same
        error every round and the consumer stalled."""
        self.log.error(f"JetStream consumer {sm.name}/{name}: skipping message {sseq}: "
                       f"{corrupt[sseq]}")
        entries: list[ops.Op] = [ops.ConsumerDelivered(now, name, sseq)]
        if acks:  # proposed right after its delivery, so it is not redelivered
            entries.append(ops.ConsumerAck(now, name, AckKind.TERM, sseq))
        return entries

    async def _drop(self, sm: StreamMachine, name: str, drops: list[Drop]) -> None:
        """Stop tracking messages out of deliveries (or gone): CONSUMER_ACK entries of kind
        MAX_DELIVER / GONE, and the max-deliveries advisories they produce."""
        now = time.time_ns()
        results = await asyncio.gather(*(self._propose(sm, ops.ConsumerAck(
            now, name, d.kind, d.sseq)) for d in drops), return_exceptions=True)
        for index in results:
            for event in sm.events.pop(index, []) if isinstance(index, int) else ():
                a = event.advisory
                if a.kind == "MAX_DELIVERIES":
                    self._advise(advisories.max_deliveries(_name(sm.name), name, a.sseq,
                                                           a.deliveries, *self._stamp()),
                                 _acc(sm.name))

    def _on_flow_control(self, account: str, _sub: Any, subject: str, reply: str | None,
                         hdr: bytes | None, body: bytes) -> None:
        """A push consumer's client answered a flow control request: deliver again."""
        names = parse_fc_subject(subject)
        if names:
            names = (jsaccount.key(account, names[0]), names[1])
        pull = self.pulls.get(names) if names else None
        if names and pull is not None and pull.flow is not None \
                and pull.flow.on_reply(subject):
            self._pump(*names)

    def _advise(self, advisory: tuple[str, bytes], account: str = jsaccount.GLOBAL) -> None:
        """Advisories go out in the account whose stream or request they are about; with a
        domain, each names it last, as nats-server's advisory structs do."""
        subject, body = advisory
        if self.domain:
            body = domain.append_to_event(body, self.domain)
        client = self.clients.get(account)
        if client is not None:
            client.publish(subject, None, body)

    def _stamp(self) -> tuple[str, str]:
        """An advisory's id (nats-server: a 22-character nuid) and timestamp."""
        return "".join(secrets.choice(_NAME_CHARS) for _ in range(22)), self._now()

    def _has_interest(self, subject: str, stream_key: str) -> bool:
        # here, on a peer (a push consumer's subscriber may be on another node), or in an
        # account that imports the subject (or asked through a service import)
        return bool(self._client(stream_key).account.has_interest(subject))

    async def _tick_loop(self) -> None:
        """Expire pull requests (408), redeliver what fell due, feed push consumers, delete
        consumers inactive past their `inactive_threshold` (every ephemeral has one)."""
        while True:
            await asyncio.sleep(self._next_tick())
            now = time.time_ns()
            for (stream, name), pull in list(self.pulls.items()):
                self._tick_consumer(stream, name, pull, now)
            for sm in self._may_expire_now():
                if self.jsc is not None and not self.jsc.leads(sm.name):
                    continue  # time passes through the leader's EXPIRE entries
                if sm.name not in self._expiring and _expiry_due(sm, now):
                    self._expiring.add(sm.name)
                    self._spawn(self._expire(sm, now))

    def _may_expire_now(self) -> list[StreamMachine]:
        """The streams whose messages can expire (most never do). Built again only after
        the change mark moved (a stream opened, closed, updated or restored): scanning
        1,000 idle streams' configs 10 times a second cost an idle node ~1 % of a core."""
        mark = self.changes.value  # read before the scan: a change during it moves it on
        if mark != self._expirable_at:
            self._expirable = [sm for sm in list(self.streams.values()) if _may_expire(sm)]
            self._expirable_at = mark
        return self._expirable

    def _next_tick(self) -> float:
        """Seconds to the next tick: PULL_TICK_S, or sooner when a pull request expires or
        owes a heartbeat (nats-server's timers are per request)."""
        wake = min((dl for p in self.pulls.values() if (dl := p.queue.next_deadline())),
                   default=None)
        beats = [dl for p in self.pulls.values()
                 if p.flow is not None and (dl := p.flow.next_deadline())]
        if beats:
            wake = min(beats + ([wake] if wake else []))
        if wake is None:
            return PULL_TICK_S
        return min(PULL_TICK_S, max(0.001, (wake - time.time_ns()) / 1e9 + 0.0005))

    async def _expire(self, sm: StreamMachine, now: int) -> None:
        """Time passes only through entries: an EXPIRE entry carries the leader's clock, and
        the stream removes what max_age and per-message TTLs expired by then."""
        try:
            await self._propose(sm, ops.Expire(now))
        finally:
            self._expiring.discard(sm.name)

    def _tick_consumer(self, stream: str, name: str, pull: _Pull, now: int) -> None:
        sm = self._csm(stream, name)
        if sm is None:
            return
        self._timer_drops(sm, name, pull, now)
        self._pause_end(sm, name, pull, now)
        for group in pull.queue.priority.expired(now, list(pull.queue.waiting)):
            self._advise(advisories.group_unpinned(_acc(stream), _name(stream), name,
                                                   group, "timeout", *self._stamp()),
                         _acc(stream))
            self._pump(stream, name)
        active = bool(pull.queue.waiting) or \
            (bool(pull.push) and self._has_interest(pull.push, stream))
        if active or pull.pumping:
            pull.last_active = now
        elif pull.inactive_ns and now - pull.last_active > pull.inactive_ns and not pull.deleting:
            pull.deleting = True
            self._spawn(self._expire_consumer(sm, name))
            return
        if not active:
            if pull.flow is not None:
                pull.flow.heartbeat(now, 0, 0, listening=False)  # skipped, the wait restarts
            return
        with sm.lock:
            consumer = sm.stream.consumers.get(name)
            if consumer is None:
                return
            st = consumer.state
            due = consumer.next_deadline()
            statuses = pull.queue.tick(now, st.delivered_cseq, st.delivered_sseq,
                                       beat=pull.round is None)
        for status in statuses:
            self._send(status, stream)
        if pull.flow is not None:
            if pull.round is not None:
                # A delivery round is in flight: not idle. Its messages may already count as
                # delivered in the applied state before they are sent, so a heartbeat now
                # would name them ahead of them (an ordered consumer then resets itself).
                pull.flow.heartbeat(now, 0, 0, listening=False)  # skipped, the wait restarts
            else:
                beat = pull.flow.heartbeat(now, st.delivered_cseq, st.delivered_sseq, True)
                if beat is not None:
                    self._client(stream).publish(pull.push, None, b"", beat)
        if pull.push or pull.paused or (due is not None and due <= now):
            self._pump(stream, name)

    def _pause_end(self, sm: StreamMachine, name: str, pull: _Pull, now: int) -> None:
        """A pause that ran out by itself: nats-server advises it (paused false, the time)."""
        consumer = sm.stream.consumers.get(name)
        until = (consumer.cfg.get("pause_until") or "") if consumer is not None else ""
        if not until:
            return
        if pause.paused_for(until, now):
            pull.pause_seen = until
        elif pull.pause_seen == until:
            pull.pause_seen = ""
            self._advise(advisories.consumer_pause(_name(sm.name), name, False, until,
                                                   *self._stamp()), _acc(sm.name))
            self._pump(sm.name, name)

    def _timer_drops(self, sm: StreamMachine, name: str, pull: _Pull, now: int) -> None:
        """The ack timer's own decisions (no pull request needed): messages whose ack wait
        ran out after their last allowed delivery."""
        if pull.dropping:
            return
        with sm.lock:
            consumer = sm.stream.consumers.get(name)
            drops = consumer.timer_drops(now) if consumer is not None else []
        if drops:
            pull.dropping = True

            async def run() -> None:
                try:
                    await self._drop(sm, name, drops)
                finally:
                    pull.dropping = False

            self._spawn(run())

    async def _expire_consumer(self, sm: StreamMachine, name: str) -> None:
        """An inactive consumer goes as a deleted one does: through the log."""
        try:
            await self._propose(sm, ops.ConsumerDelete(time.time_ns(), name))
        except (ProposalDropped, NotLeader, KeyError) as exc:
            # Moot: another node expires it too (the stream's leader keeps a pull for a
            # consumer with a group of its own, whose leader expires it as well) and its
            # delete removed the group under this proposal; or the leadership moved.
            self.log.warn(f"JetStream consumer {sm.name} > {name}: expiry not needed: {exc!r}")
            self.pulls.pop((sm.name, name), None)
            return
        if self.jsc is not None and (sm.name, name) in self._own_groups():
            await self.jsc.place_consumer(sm.name, name, None, 0, 0)  # its group goes
        self.pulls.pop((sm.name, name), None)
        self.consumer_created.pop((sm.name, name), None)
        self._advise(advisories.consumer_action("delete", _name(sm.name), name,
                                                *self._stamp()), _acc(sm.name))


def _flush_receivers(client: Any, replies: list[Reply]) -> None:
    """Write out now what `replies` put in the buffers of this account's subscribers
    (their flush is otherwise a callback of the next loop turn, which then finds nothing)."""
    match = client.account.sublist.match
    for reply in replies:
        result = match(reply.subject)
        for sub in result.psubs:
            sub.client.flush()
        for members in result.qsubs.values():
            for sub in members:
                sub.client.flush()


def _tier_usage() -> dict[str, int]:
    """One tier's figures in `$JS.API.INFO`, in nats-server's key order."""
    return dict.fromkeys(("memory", "storage", "reserved_memory", "reserved_storage",
                          "streams", "consumers"), 0)


def _replicated_consumer(cfg: dict[str, Any], stream_cfg: dict[str, Any]) -> bool:
    """A durable consumer of more than one replica (0: its stream's): an HA asset. An
    ephemeral one is not (nats-server: R1, not counted)."""
    return bool(cfg.get("durable_name")) and cgroup.replicas(cfg, stream_cfg) > 1


def _weight(tier: str, cfg: dict[str, Any]) -> int:
    """How many times a stream's bytes count against its tier: once in a tier (nats-server
    scales the tier's limit by its replicas), once per replica in the flat tier."""
    return jsaccount.replicas_of(cfg) if tier == jsaccount.FLAT else 1


_name = jsaccount.name_of  # a stream key's stream name (what goes on the wire)
_acc = jsaccount.account_of  # a stream key's account


def _within_window(plans: list[Any], msgs: dict[int, Any], flow: PushFlow, stream: str,
                   name: str) -> list[Any]:
    """The plans that flow control lets go now: drops, and deliveries while no more than
    the window is in flight before each (sizes estimated with a typical ack subject)."""
    ack_len = len(api.ACK_PREFIX) + len(stream) + len(name) + 40
    deliveries = [p for p in plans if isinstance(p, Delivery)]
    sizes = [(len(m.subject) + len(m.hdr) + len(m.data) + ack_len) if (m := msgs.get(p.sseq))
             else 0 for p in deliveries]
    keep = set(deliveries[:flow.allowed(sizes)])
    return [p for p in plans if isinstance(p, Drop) or p in keep]


def _client_info(client: Any, server: str) -> dict[str, Any]:
    """nats-server's ClientInfo of a connection, the fields a plain client connection has."""
    info: dict[str, Any] = {"start": rfc3339(int(client.start * 1e9)), "host": client.host,
                            "id": client.cid, "acc": client.account.name}
    if client.user:
        info["user"] = client.user
    if client.opts.get("name"):
        info["name"] = client.opts["name"]
    info.update({"lang": client.opts.get("lang", ""), "ver": client.opts.get("version", ""),
                 "rtt": int(client.rtt * 1e9), "server": server, "kind": "Client",
                 "client_type": "nats"})
    return info


# A STREAM.LIST item: the stream info's fields but config (listed as stored) and cluster.
_LIST_FIELDS = ("created", "state", "domain", "mirror", "sources", "ts")


def _insert_before(out: dict[str, Any], key: str, new_key: str, value: Any) -> dict[str, Any]:
    """`out` with `new_key` placed before `key` (nats-server's field order)."""
    res: dict[str, Any] = {}
    for k, v in out.items():
        if k == key:
            res[new_key] = value
        res[k] = v
    res.setdefault(new_key, value)
    return res


class _nolock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def orphans(catalogue: dict[str, dict[str, Any]], wal_groups: list[str],
            lmdb_names: set[str]) -> tuple[list[str], list[str]]:
    """(WAL groups, LMDB store names) that belong to no stream of the catalogue."""
    live = {META_GROUP, META_STORE} | {e["group"] for e in catalogue.values()}
    live |= {g["group"] for e in catalogue.values() for g in (e.get("consumers") or {}).values()}
    return ([g for g in wal_groups if g not in live],
            sorted(n for n in lmdb_names if n not in live))


def _with_header(hdr: bytes, key: str, value: str) -> bytes:
    line = f"{key}: {value}\r\n\r\n".encode()
    if not hdr:
        return b"NATS/1.0\r\n" + line
    return hdr[:-2] + line  # a header block ends with an empty line


def _may_expire(sm: StreamMachine) -> bool:
    """Only `max_age` or per-message TTLs expire messages; TTLs need `allow_msg_ttl`, which
    an update cannot turn off (and `subject_delete_marker_ttl` turns on)."""
    cfg = sm.stream.cfg  # replaced whole on update: a consistent read without the lock
    return (cfg["max_age"] > 0 or bool(cfg.get("allow_msg_ttl"))
            or bool(cfg.get("allow_msg_schedules")))


def _expiry_due(sm: StreamMachine, now: int) -> bool:
    """Has a per-message TTL or `max_age` run out (two LMDB reads, on the loop)?"""
    with sm.lock:
        store = sm.store
        if store.due_ttls(now, 1):
            return True
        max_age = sm.stream.cfg["max_age"]
        if max_age <= 0:
            return False
        first = store.first_seq()
        msg = store.load(first) if first else None
        return msg is not None and msg.ts_ns <= now - max_age


def _node_log(wal_dir: str, archive: bool, sealer: Any) -> NodeLog:
    """The node's WAL. With `jetstream { audit_archive: true }` compaction keeps the obsolete
    segments in wal/archive (read by `jetraft audit`). JETRAFT_WAL_SEGMENT_BYTES lowers the
    segment size in tests, so that compaction retires segments after a few hundred entries."""
    size = int(os.environ.get("JETRAFT_WAL_SEGMENT_BYTES", str(64 << 20)))
    return NodeLog(wal_dir, size, archive_dir=ARCHIVE_DIR if archive else None, sealer=sealer)


def _snapshot_every() -> int:
    """Applied entries between WAL compactions. JETRAFT_JS_SNAPSHOT_EVERY lowers it in
    tests so compaction happens within a few hundred publishes."""
    return int(os.environ.get("JETRAFT_JS_SNAPSHOT_EVERY", "10000"))


def _follower_defer_s() -> float:
    """How long a stream's follower may hold committed publishes before applying them
    (raft/multigroup.py FOLLOWER_DEFER_S). JETRAFT_FOLLOWER_DEFER_S raises it in tests
    that must tell a held entry from an applied one; 0 turns the hold off."""
    return float(os.environ.get("JETRAFT_FOLLOWER_DEFER_S", str(FOLLOWER_DEFER_S)))


def _filters(cfg: dict[str, Any]) -> list[str]:
    out = list(cfg.get("filter_subjects") or [])
    if cfg.get("filter_subject"):
        out.append(cfg["filter_subject"])
    return out


def _jetstream_kind() -> Any:
    from node.client import Kind  # the client module imports no server or service
    return Kind.JETSTREAM


def _load_planned(store: Any, plans: list[Any]) -> tuple[dict[int, Any], dict[int, str]]:
    """The planned deliveries' messages, and the sequences whose record failed its CRC."""
    return store.load_many([p.sseq for p in plans if isinstance(p, Delivery)])

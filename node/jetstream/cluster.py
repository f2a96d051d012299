"""Clustered JetStream: the meta group over every JetStream node, stream groups on their
assigned peers, and forwarding from any node to the right leader (docs/architecture.md,
"JetStream in a cluster").

The service (`service.py`) keeps serving exactly as on a single node; this module decides
WHERE a request is served:

* stream CRUD, META/SERVER/PEER operations -> the meta leader, which checks, places
  (`placement.py`) and proposes a `cluster_meta` entry; every node applies the catalogue and
  hosts the stream groups it is a peer of;
* every other `$JS.API` call naming a stream -> that stream's leader (a node that does not host
  the stream asks one of its peers, which passes it on: at most `MAX_HOPS`);
* a publish to a stream subject that reaches a node not leading the stream goes to the
  leader as a one-way `js.pub` frame on the route (node/cluster `send_frame`: in order, no
  round trip of its own); the leader proposes it with the client's reply subject, and its
  PubAck reaches the client by core routing (the client's inbox interest went to the
  leader on the same route, before the publish);
* acks go to the stream leader the same way (`js.ack` frames; its own ack path runs, so a
  double ack's confirmation comes from it); deliveries and pull statuses travel to the
  client's inbox by core routing (node/cluster).

Node-to-node calls are `cluster.request(peer, kind, payload)` (node/cluster): JSON bodies,
bytes as base64.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from node.jetstream import api, cgroup, cluster_meta, jsaccount, ops, placement, replies, usage
from node.jetstream import config as stream_config
from node.jetstream.consumer import parse_ack_subject as api_ack
from node.jetstream.errors import ApiError
from node.jetstream.placement import Candidate, Placement
from node.jetstream.stream import rfc3339

META_GROUP = "$js"
MAX_HOPS = 3
FWD_TIMEOUT = 10.0
PUB_BATCH = 256
UNASSIGNED_GRACE_S = 5.0
META_OPS = frozenset({"STREAM.CREATE", "STREAM.UPDATE", "STREAM.DELETE",
                      "META.LEADER.STEPDOWN", "SERVER.REMOVE", "STREAM.PEER.REMOVE"})
LOCAL_OPS = frozenset({"INFO", "STREAM.NAMES", "STREAM.LIST"})
# Served by a consumer's own group's leader (cgroup.py) when it has one.
CONSUMER_GROUP_OPS = frozenset({"CONSUMER.INFO", "CONSUMER.MSG.NEXT",
                                "CONSUMER.LEADER.STEPDOWN"})
Frames = list[tuple[bytes | None, bytes]]


def _b64(data: bytes | None) -> str:
    return base64.b64encode(data or b"").decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def frames_to_wire(frames: Frames) -> bytes:
    return json.dumps([[_b64(h) if h is not None else None, _b64(d)] for h, d in frames]
                      ).encode()


def frames_from_wire(raw: bytes) -> Frames:
    return [(_unb64(h) if h is not None else None, _unb64(d)) for h, d in json.loads(raw)]


def short_peer(peer: int) -> str:
    """The 8-character peer name STREAM.INFO shows (nats-server shows a hash of the name)."""
    return f"{peer:016x}"[:8]


class _Forwarder:
    """Publishes for one stream waiting to go to its leader, in arrival order."""

    def __init__(self) -> None:
        self.queue: list[tuple[str, str, bytes, bytes, int]] = []  # subject, reply, hdr, data, hops
        self.running = False


class ClusterJS:
    def __init__(self, svc: Any, cluster: Any) -> None:
        self.svc = svc
        self.cluster = cluster
        self.log = svc.log
        self.self_id: int = cluster.self_id
        self.cluster_name: str = cluster.name or ""
        self.unique_tag = svc.server.options.jetstream.unique_tag or ""
        self.forwarders: dict[str, _Forwarder] = {}
        self.peers_added: dict[int, tuple[str, str]] = {}  # peer -> (cluster, raft addr)
        self.leader_since: dict[str, int] = {}
        self.meta_started = False
        self._unassigned: dict[str, float] = {}
        self._swept = False  # orphan logs/data dropped once the catalogue was current
        self.synced_rev: dict[str, int] = {}  # group -> newest config revision written
        self.in_line: dict[str, tuple[Any, ...]] = {}  # group -> assignment key found in line
        self._duty_task: asyncio.Task[Any] | None = None
        self._usage_task: asyncio.Task[Any] | None = None
        self.usage = usage.UsageBook()  # other nodes' streams' bytes (account limits)

    # ------------------------------------------------------------------ wiring

    def bind_transport(self, mr: Any) -> None:
        transport = self.cluster.raft_transport(**mr.transport_callbacks())
        mr.bind_transport(transport)

    async def start(self) -> None:
        """Handlers and peers now; the meta group in the background (a restarting node
        whose peers are down still starts, and answers 503 until the meta group is back)."""
        for kind, fn in (("js.meta.hello", self._h_hello), ("js.api", self._h_api),
                         ("js.sync", self._h_sync), ("js.cplace", self._h_cplace),
                         ("js.gstate", self._h_gstate)):
            self.cluster.handle(kind, fn)
        self.cluster.handle_frames("js.pub", self._on_pub_frame)
        self.cluster.handle_frames("js.ack", self._on_ack_frame)
        self.cluster.handle_frames("js.usage", self._on_usage_frame)
        self._sync_peers()
        self.cluster.on_members(lambda _m: self._sync_peers())
        self.svc._spawn(self._start_meta())
        self._duty_task = asyncio.ensure_future(self._duties())
        self._usage_task = asyncio.ensure_future(self._report_usage())

    async def stop(self) -> None:
        for task in (self._duty_task, self._usage_task):
            if task is not None:
                task.cancel()

    # ------------------------------------------------------------------ usage (usage.py)

    async def _report_usage(self) -> None:
        """Every INTERVAL: the bytes of the streams this node leads, to every other node
        (when they changed, and every few seconds anyway for a node that just came).
        The bytes are counted again only after the node's change mark moved (an apply, a
        reservation, a leader change, a stream opened or closed: changes.py): counting
        1,000 idle streams 4 times a second cost an idle node ~2 % of a core."""
        last: dict[str, int] = {}
        counted: dict[str, int] = {}
        seen = -1  # the change mark `counted` was counted at
        rounds = 0
        while True:
            await asyncio.sleep(usage.INTERVAL)
            if not self.meta_started:
                continue
            mark = self.svc.changes.value  # read first: a change while counting moves it on
            if mark != seen:
                counted, seen = self._led_bytes(), mark
            led = dict(counted)
            if self.svc.server_limits.get("max_ha_assets"):  # else nobody reads it
                led[usage.HA_KEY] = self.svc.ha_consumers_here()
            self.usage.forget(set(self.usage.reports) - set(self.catalogue().streams))
            rounds += 1
            if led == last and rounds % 8:
                continue
            last = led
            try:
                self._send_usage(usage.encode(led))
            except Exception as exc:  # noqa: BLE001 (the next round tries again)
                self.log.warn(f"JetStream usage report: {exc!r}")

    def _send_usage(self, payload: bytes) -> None:
        for m in self.cluster.members().values():
            if m.peer_id != self.self_id:
                self.cluster.send_frame(m.peer_id, "js.usage", "usage", None, None, payload,
                                        "")

    def _led_bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, sm in list(self.svc.streams.items()):
            if self.leads(key):
                out[key] = sm.counted_bytes()
        return out

    def _on_usage_frame(self, peer: int, _subject: str, _reply: str | None,
                        _hdr: bytes | None, data: bytes, _tag: str) -> None:
        self.usage.receive(usage.decode(data), time.monotonic(), peer)

    async def ha_assets(self) -> dict[int, int]:
        """Replicated assets per peer, the meta group not included (`max_ha_assets`): the
        R>1 streams the catalogue places there (exact, at once) plus the R>1 durable
        consumers of its streams, this node's counted now, the others' as last reported
        (usage reports, up to INTERVAL old, as nats-server's statsz)."""
        await self.svc.apply_held_here()  # a consumer this node committed is counted
        out: dict[int, int] = dict(self.usage.ha)
        out[self.self_id] = self.svc.ha_consumers_here()
        for a in self.catalogue().streams.values():
            if int(a["config"].get("num_replicas") or 1) > 1:
                for p in a.get("peers", []):
                    out[p] = out.get(p, 0) + 1
        return out

    def stream_bytes(self, key: str) -> int:
        """A stream's bytes as this node best knows them, wherever it is led."""
        sm = self.svc.streams.get(key)
        local = None
        if sm is not None:
            local = sm.counted_bytes()  # with what it holds in flight as the leader
        return self.usage.bytes_of(key, time.monotonic(),
                                   local if self.leads(key) else None, local)

    def _sync_peers(self) -> None:
        mr = self.svc.mr
        if mr is None:
            return
        for m in self.cluster.members().values():
            addrs = (m.cluster_addr, m.raft_addr)
            if (m.peer_id == self.self_id or self.peers_added.get(m.peer_id) == addrs
                    or not m.cluster_addr):
                continue
            # A member announcing a direct Raft lane is reached over it (the
            # transport keeps gRPC for one that announces none, an older node),
            # unless this node keeps Raft on gRPC (`raft_lane: grpc`).
            lane = m.raft_addr if self.cluster.raft_direct else ""
            mr.add_peer(m.peer_id, m.cluster_addr, lane or None)
            self.peers_added[m.peer_id] = addrs

    def _expected_size(self) -> int:
        """Nodes a fresh cluster waits for before it forms the meta group: the distinct
        route addresses that are not this node, plus this node."""
        return int(self.cluster.expected_size())

    async def _start_meta(self) -> None:
        mr, meta = self.svc.mr, self.svc.meta
        if META_GROUP in mr.node_log.groups():
            mr.add_group(META_GROUP, [], state_machine=meta)  # the log knows its members
        else:
            await self._bootstrap_meta()
        self.meta_started = True
        self.svc._meta_changed()

    async def _bootstrap_meta(self) -> None:
        """A fresh node: join the meta group if any member has one (its leader adds us);
        otherwise form it once the expected nodes are all visible. Nodes that form it at
        the same time see the same members, so they bootstrap the same configuration."""
        mr, meta = self.svc.mr, self.svc.meta
        expected = self._expected_size()
        while True:
            js = [m for m in self.cluster.members().values()
                  if m.jetstream and (m.up or m.peer_id == self.self_id)]
            hellos = []
            for m in js:
                if m.peer_id == self.self_id:
                    continue
                try:
                    raw = await self.cluster.request(m.peer_id, "js.meta.hello", b"", 2.0)
                    hellos.append(json.loads(raw))
                except Exception:  # noqa: BLE001 (a peer that cannot answer: ask again)
                    continue
            if any(self.self_id in h.get("seen", []) for h in hellos):
                # The catalogue says our id acknowledged meta entries (`seen`), but our Raft
                # state is gone (a wiped store whose identity file was put back): rejoining
                # could answer votes with a forgotten term and vote. Refuse; a node without
                # the identity file gets a new id and joins as a new peer. (A node listed at
                # formation that never acknowledged anything is let in.)
                self.log.fatal(
                    f"JetStream: this node's peer id {self.self_id:016x} is a member of "
                    "the meta group but its Raft state is missing; refusing to rejoin "
                    "under the old identity (remove the cluster identity file to join "
                    "as a new peer)")
                self.svc.server.shutdown(78)
                return
            if any(h.get("meta") for h in hellos):
                self.log.info("JetStream: joining the existing meta group")
                mr.add_group(META_GROUP, [], state_machine=meta)
                return
            if len(js) >= expected:
                voters = sorted(m.peer_id for m in js)
                self.log.info(f"JetStream: forming the meta group with {len(voters)} nodes")
                mr.add_group(META_GROUP, voters, state_machine=meta)
                return
            await asyncio.sleep(0.2)

    async def _h_hello(self, _peer: int, _payload: bytes) -> bytes:
        if not self.meta_started:
            return b'{"meta":false}'
        st = self.svc.mr.status(META_GROUP)
        return json.dumps({"meta": True, "voters": st["voters"],
                           "seen": self.catalogue().seen}).encode()

    # ------------------------------------------------------------------ who leads

    def meta_leader(self) -> int:
        if not self.meta_started:
            return 0
        return self.svc.mr.leader(META_GROUP)

    def is_meta_leader(self) -> bool:
        return self.meta_leader() == self.self_id

    def leads(self, name: str) -> bool:
        sm = self.svc.streams.get(name)
        return sm is not None and self.svc.mr.leader(sm.group) == self.self_id

    def catalogue(self) -> cluster_meta.Catalogue:
        return self.svc.meta.catalogue

    def member_name(self, peer: int) -> str:
        m = self.cluster.members().get(peer)
        return m.name if m is not None else short_peer(peer)

    def is_up(self, peer: int) -> bool:
        if peer == self.self_id:
            return True
        m = self.cluster.members().get(peer)
        return m is not None and m.up

    async def _wait(self, pick: Any, timeout: float = 5.0) -> int:
        """Poll `pick()` (a peer id, 0 = none yet) until it names a peer."""
        deadline = time.monotonic() + timeout
        while True:
            peer = pick()
            if peer:
                return peer
            if time.monotonic() > deadline:
                raise ApiError.of("JSClusterNotAvailErr")
            await asyncio.sleep(0.05)

    async def stream_target(self, name: str) -> int:
        """The peer to send a stream's request to: its leader when this node hosts the
        stream, else one of its peers that is up (which passes it on)."""
        def pick() -> int:
            sm = self.svc.streams.get(name)
            if sm is not None:
                try:
                    return self.svc.mr.leader(sm.group)
                except KeyError:
                    return 0
            peers = self.catalogue().peers(name, self.self_id)
            up = [p for p in peers if p != self.self_id and self.is_up(p)]
            return up[0] if up else 0
        return await self._wait(pick)

    async def _request(self, peer: int, kind: str, body: dict[str, Any]) -> bytes:
        return await self.cluster.request(peer, kind, json.dumps(body).encode(), FWD_TIMEOUT)

    # ------------------------------------------------------------------ $JS.API routing

    async def route_api(self, call: api.Call, subject: str, reply: str, body: bytes,
                        hops: int) -> Frames | None:
        """Frames for `reply` when another node serves the call; None: serve it here."""
        if hops >= MAX_HOPS or call.op in LOCAL_OPS:
            return None
        if not self.meta_started:
            raise ApiError.of("JSClusterNotAvailErr")
        if call.op in META_OPS:
            target = await self._wait(self.meta_leader)
        elif call.stream and self.svc._key(call) in self.catalogue().streams:
            if call.op == "DIRECT.GET" and self.svc._key(call) in self.svc.streams:
                return None  # every replica answers direct gets from its own store
            key = self.svc._key(call)
            if call.op in CONSUMER_GROUP_OPS and call.consumer and \
                    self.catalogue().consumer_group(key, call.consumer) is not None:
                target = await self.consumer_target(key, call.consumer)
            else:
                target = await self.stream_target(key)
        else:
            return None
        if target == self.self_id:
            return None
        raw = await self._request(target, "js.api", {
            "subject": subject, "reply": reply, "body": _b64(body), "hops": hops + 1,
            "account": call.account})
        return frames_from_wire(raw)

    async def _h_api(self, _peer: int, payload: bytes) -> bytes:
        req = json.loads(payload)
        call = api.route(req["subject"])
        if call is None:
            return frames_to_wire([])
        # the account whose `$JS.API` the request came in on (absent: a peer that predates
        # accounts, the global account)
        call = dataclasses.replace(call, account=req.get("account", jsaccount.GLOBAL))
        frames = await self.svc._answer(call, req["subject"], req["reply"],
                                        _unb64(req["body"]), hops=int(req["hops"]))
        return frames_to_wire(frames)

    # ------------------------------------------------------------------ publishes

    def forward_publish(self, name: str, subject: str, reply: str, hdr: bytes, data: bytes,
                        hops: int = 0) -> None:
        """A publish to `name` that this node does not lead goes to the stream's leader as a
        one-way route frame (`js.pub`), in arrival order; the leader proposes it with the
        client's own reply subject, so the PubAck travels back by core routing, as in
        nats-server. With no target known yet, publishes wait in order in a queue."""
        fwd = self.forwarders.get(name)
        if fwd is None or not fwd.queue:
            peer = self._pub_target(name)
            if peer and self._send_pub(peer, name, subject, reply, hdr, data, hops):
                return
        if fwd is None:
            fwd = self.forwarders[name] = _Forwarder()
        fwd.queue.append((subject, reply, hdr, data, hops))
        if not fwd.running:
            fwd.running = True
            self.svc._spawn(self._run_forwarder(name, fwd))

    def _pub_target(self, name: str) -> int:
        """Where a publish goes now without waiting: the stream's leader when this node
        hosts the stream, else a peer of the stream that is up (it passes it on); 0: none."""
        sm = self.svc.streams.get(name)
        if sm is not None:
            try:
                peer = self.svc.mr.leader(sm.group)
            except KeyError:
                return 0
            return peer if peer != self.self_id and self.is_up(peer) else 0
        up = [p for p in self.catalogue().peers(name, self.self_id)
              if p != self.self_id and self.is_up(p)]
        return up[0] if up else 0

    def _send_pub(self, peer: int, name: str, subject: str, reply: str, hdr: bytes,
                  data: bytes, hops: int) -> bool:
        return bool(self.cluster.send_frame(peer, "js.pub", subject, reply or None,
                                            hdr or None, data, f"{hops}:{name}"))

    async def _run_forwarder(self, name: str, fwd: _Forwarder) -> None:
        """Publishes that found no target: sent in order once one is known; dropped (no
        PubAck, the client retries) when none comes within the wait."""
        try:
            while fwd.queue:
                try:
                    target = await self.stream_target(name)
                except ApiError:
                    target = 0
                if target == self.self_id:  # leading now: propose them here
                    batch, fwd.queue = fwd.queue, []
                    for subject, reply, hdr, data, _hops in batch:
                        self.svc._accept_publish(name, subject, reply, hdr, data)
                    continue
                if not target:  # no leader within the wait: all of them go unacknowledged
                    self.log.warn(f"JetStream: {len(fwd.queue)} publishes to {name} dropped: "
                                  "no leader")
                    fwd.queue = []
                    break
                batch, fwd.queue = fwd.queue[:PUB_BATCH], fwd.queue[PUB_BATCH:]
                lost = 0
                for subject, reply, hdr, data, hops in batch:
                    if not self._send_pub(target, name, subject, reply, hdr, data, hops):
                        lost += 1
                if lost:
                    self.log.warn(f"JetStream: forwarding {lost} publishes to {name} failed: "
                                  "no route to its leader")
        finally:
            fwd.running = False

    def _on_pub_frame(self, _peer: int, subject: str, reply: str | None, hdr: bytes | None,
                      data: bytes, tag: str) -> None:
        """A publish forwarded by another node (`js.pub` frame): proposed here when this
        node leads the stream, else passed on (at most MAX_HOPS times)."""
        hops_text, _, name = tag.partition(":")
        try:
            hops = int(hops_text)
        except ValueError:
            return
        if self.leads(name):
            self.svc._accept_publish(name, subject, reply or "", hdr or b"", data)
        elif hops < MAX_HOPS and name in self.catalogue().streams:
            self.forward_publish(name, subject, reply or "", hdr or b"", data, hops + 1)

    # ------------------------------------------------------------------ acks

    def forward_ack(self, stream: str, subject: str, reply: str | None, body: bytes,
                    hops: int = 0) -> None:
        """An ack for a stream this node does not lead goes to its leader as a one-way
        `js.ack` frame, where the leader's own ack path runs (a double ack's confirmation
        and +NXT's messages go to `reply` by core routing). No route or leader now: a task
        waits for one (an ack lost: the message is redelivered)."""
        consumer = _ack_consumer(subject)
        if self.catalogue().consumer_group(stream, consumer) is not None:
            peer = self._consumer_pick(stream, consumer)  # its own group's leader
        else:
            peer = self._pub_target(stream)
        if peer and self.cluster.send_frame(peer, "js.ack", subject, reply or None, None, body,
                                            f"{hops}:{stream}"):
            return
        self.svc._spawn(self._send_ack(stream, subject, reply, body, hops))

    async def _send_ack(self, stream: str, subject: str, reply: str | None, body: bytes,
                        hops: int) -> None:
        consumer = _ack_consumer(subject)
        try:
            if self.catalogue().consumer_group(stream, consumer) is not None:
                target = await self.consumer_target(stream, consumer)
            else:
                target = await self.stream_target(stream)
        except ApiError:
            target = 0
        if target == self.self_id:
            self.svc._on_ack(jsaccount.account_of(stream), None, subject, reply, None, body)
        elif not target or not self.cluster.send_frame(target, "js.ack", subject, reply or None,
                                                       None, body, f"{hops}:{stream}"):
            self.log.warn(f"JetStream: forwarding an ack on {stream} failed: no route to "
                          "its leader")

    def _on_ack_frame(self, _peer: int, subject: str, reply: str | None, _hdr: bytes | None,
                      body: bytes, tag: str) -> None:
        hops_text, _, stream = tag.partition(":")
        try:
            hops = int(hops_text)
        except ValueError:
            return
        if self.svc._leads_consumer(stream, _ack_consumer(subject)):
            self.svc._on_ack(jsaccount.account_of(stream), None, subject, reply, None, body)
        elif hops < MAX_HOPS and stream in self.catalogue().streams:
            self.forward_ack(stream, subject, reply, body, hops + 1)

    # ------------------------------------------------------------------ consumer groups

    def _consumer_pick(self, stream: str, consumer: str) -> int:
        """The consumer group's leader when hosted here, else one of its peers that is up
        (which passes requests on), 0 when none."""
        cm = self.svc.cgroups.get((stream, consumer))
        if cm is not None:
            try:
                return self.svc.mr.leader(cm.group)
            except KeyError:
                return 0
        g = self.catalogue().consumer_group(stream, consumer)
        up = [p for p in (g or {}).get("peers", []) if p != self.self_id and self.is_up(p)]
        return up[0] if up else 0

    async def consumer_target(self, stream: str, consumer: str) -> int:
        return await self._wait(lambda: self._consumer_pick(stream, consumer))

    async def place_consumer(self, stream: str, consumer: str, config: dict[str, Any] | None,
                             start: int, lps: int, state: bytes = b"", prefer: int = 0
                             ) -> None:
        """The meta leader gives the consumer a group of its own (or forgets it: `config`
        None; or re-places the group it has: `config` changed, its stream's peers changed);
        returns once the meta entry is committed. `state`: the consumer's state record to
        start from (it moves out of its stream's group), `prefer`: a peer to keep it on
        (the stream leader it leaves: its replica is current)."""
        body = {"stream": stream, "consumer": consumer, "config": config, "start": start,
                "lps": lps, "state": _b64(state), "prefer": prefer}
        leader = await self._wait(self.meta_leader)
        if leader == self.self_id:
            await self._place_consumer(body)
            return
        answer = json.loads(await self._request(leader, "js.cplace", body))
        if "error" in answer:
            e = answer["error"]
            raise ApiError("placement", e["code"], e["err_code"], e["description"])
        placed = config is not None
        # this node's catalogue follows: callers read the assignment next
        await self._wait(lambda: int((self.catalogue().consumer_group(stream, consumer)
                                      is not None) == placed))

    async def _h_cplace(self, _peer: int, payload: bytes) -> bytes:
        try:
            await self._place_consumer(json.loads(payload))
        except ApiError as err:
            return err.to_json()
        return b"{}"

    async def _place_consumer(self, req: dict[str, Any]) -> None:
        if not self.is_meta_leader():
            raise ApiError.of("JSClusterNotAvailErr")
        stream, consumer = req["stream"], req["consumer"]
        cat = self.catalogue()
        a = cat.streams.get(stream)
        if a is None:
            raise ApiError.of("JSStreamNotFoundErr")
        if req["config"] is None:
            if cat.consumer_group(stream, consumer) is not None:
                await self.propose_meta(cluster_meta.consumer_delete(stream, consumer))
            return
        # never more than the stream has peers (a PEER.REMOVE with no spare node shrank it):
        # nats-server then maps the consumer onto the stream's peers too
        want = min(cgroup.replicas(req["config"], a["config"]), len(a["peers"]))
        g = cat.consumer_group(stream, consumer)
        if g is not None:
            await self._replace_consumer(stream, consumer, a, g, req["config"], want)
            return
        prefer = [p for p in [int(req.get("prefer") or 0)] if p in a["peers"] and self.is_up(p)]
        peers = cgroup.replace(prefer, list(a["peers"]), want, self.is_up, cat.consumer_load())
        if not peers:
            raise ApiError.of("JSClusterNoPeersErrF", err="no suitable peers for placement")
        now = time.time_ns()
        await self.propose_meta(cluster_meta.consumer(
            stream, consumer, cgroup.group_name(stream, consumer, now), peers, req["config"],
            int(req["start"]), int(req["lps"]), now, req.get("state") or ""))

    async def _replace_consumer(self, stream: str, consumer: str, a: dict[str, Any],
                                g: dict[str, Any], config: dict[str, Any], want: int) -> None:
        """An assigned consumer group follows its replicas and its stream's peers (a
        retried create with the same config and peers changes nothing)."""
        try:
            leader = self.svc.mr.leader(g["group"])
        except KeyError:
            leader = 0  # not hosted here: the assignment's order decides
        peers = cgroup.replace(g["peers"], list(a["peers"]), want, self.is_up,
                               self.catalogue().consumer_load(), leader)
        if not peers:
            raise ApiError.of("JSClusterNoPeersErrF", err="no suitable peers for placement")
        if peers != g["peers"] or config != g["config"]:
            await self.propose_meta(cluster_meta.consumer_update(stream, consumer, peers,
                                                                 config))

    async def report_group_state(self, stream: str, entry: bytes) -> None:
        """A consumer group's CONSUMER_GROUP_STATE entry for its stream's group, proposed
        by the stream's leader (asked over the cluster when that is another node)."""
        target = await self.stream_target(stream)
        if target == self.self_id:
            await self._propose_gstate(stream, entry)
            return
        await self._request(target, "js.gstate", {"stream": stream, "entry": _b64(entry)})

    async def _h_gstate(self, _peer: int, payload: bytes) -> bytes:
        req = json.loads(payload)
        await self._propose_gstate(req["stream"], _unb64(req["entry"]))
        return b"{}"

    async def _propose_gstate(self, stream: str, entry: bytes) -> None:
        if not isinstance(ops.decode(entry), ops.ConsumerGroupState):
            return  # this path carries nothing else into a stream's log
        sm = self.svc.streams.get(stream)
        if sm is not None and self.leads(stream):
            await self.svc.mr.propose(sm.group, entry)

    # ------------------------------------------------------------------ the meta leader

    def candidates(self, ha: dict[int, int] | None = None) -> list[Candidate]:
        """The nodes placement may pick; `ha`: their replicated assets (`max_ha_assets`)."""
        load = self.catalogue().load()
        removed = set(self.catalogue().removed)
        ha = ha or {}
        out = []
        for m in self.cluster.members().values():
            if not m.jetstream or m.peer_id in removed:
                continue
            free = m.store_max - m.store_used if m.store_max > 0 else None
            out.append(Candidate(m.peer_id, m.name, self.cluster_name, tuple(m.tags),
                                 self.is_up(m.peer_id), free, load.get(m.peer_id, 0),
                                 ha.get(m.peer_id, 0)))
        return out

    async def place(self, cfg: dict[str, Any], keep: Sequence[int] = (),
                    exclude: Sequence[int] = ()) -> list[int]:
        replicas = int(cfg.get("num_replicas") or 1)
        if replicas > 5:
            raise ApiError.of("JSStreamReplicasNotSupportedErr")
        ha = await self.ha_assets() if self.svc.server_limits.get("max_ha_assets") else {}
        return placement.select_peers(
            self.candidates(ha), replicas, Placement.from_config(cfg.get("placement")),
            our_cluster=self.cluster_name, unique_tag=self.unique_tag, keep=keep,
            exclude=exclude, max_bytes=max(int(cfg.get("max_bytes") or 0), 0),
            max_ha_assets=int(self.svc.server_limits.get("max_ha_assets") or 0))

    async def propose_meta(self, entry: dict[str, Any]) -> int:
        return await self.svc.mr.propose(META_GROUP, cluster_meta.encode(entry))

    def configs(self) -> dict[str, stream_config.Config]:
        return {n: stream_config.from_wire(a["config"])
                for n, a in self.catalogue().streams.items()}

    async def create_stream(self, name: str, body: bytes, account: str = jsaccount.GLOBAL
                            ) -> dict[str, Any]:
        cfg, pedantic = stream_config.parse_request(body)
        async with self.svc._meta_lock:
            configs = self.svc._configs(account)  # names, overlaps, limits: per account
            stored, created = stream_config.check_create(name, cfg, pedantic, configs,
                                                         clustered=True,
                                                         limits=self.svc.server_limits)
            key = jsaccount.key(account, stored["name"])
            if created:
                self.svc.check_limits(account, stored, configs, creating=True)
                wire = stream_config.to_wire(stored)
                peers = await self.place(wire)
                entry = cluster_meta.create(key, wire, time.time_ns(), peers)
                await self.propose_meta(entry)
                self.svc._stream_created(key)
        out = _as_reply(await self.stream_info_from_leader(key))
        out["type"] = replies.TYPE_PREFIX + "stream_create_response"
        out.pop("domain", None)  # a create reply has none (nats-server 2.15.1)
        out["did_create"] = True  # also for an identical re-create, as nats-server says
        return out

    async def update_stream(self, stream: str, body: bytes, account: str = jsaccount.GLOBAL
                            ) -> dict[str, Any]:
        cfg, pedantic = stream_config.parse_request(body)
        async with self.svc._meta_lock:
            configs = self.svc._configs(account)
            stored = stream_config.check_update(stream, cfg, pedantic, configs,
                                                clustered=True, limits=self.svc.server_limits)
            self.svc.check_limits(account, stored, configs, creating=False)
            name = jsaccount.key(account, stream)
            a = self.catalogue().streams[name]
            wire = stream_config.to_wire(stored)
            peers = list(a["peers"])
            if wire.get("placement") != a["config"].get("placement"):
                # New placement: the replicas that still qualify stay, the others move
                # (the stream leader adds the new peers, then removes the old ones).
                peers = await self.place(wire, keep=peers)
            elif int(wire.get("num_replicas") or 1) != len(peers):
                live = [p for p in peers if self.is_up(p)]
                want = int(wire.get("num_replicas") or 1)
                peers = (await self.place(wire, keep=live))[:want] if want > len(peers) else \
                    _shrink(peers, want, self.stream_leader_hint(name))
            await self.propose_meta(cluster_meta.update(name, wire, peers))
        await self.sync_stream(name)
        out = _as_reply(await self.stream_info_from_leader(name))
        out["type"] = replies.TYPE_PREFIX + "stream_update_response"
        out.pop("domain", None)  # clustered, nats-server's update reply has none (2.15.1)
        return out

    def stream_leader_hint(self, name: str) -> int:
        sm = self.svc.streams.get(name)
        try:
            return self.svc.mr.leader(sm.group) if sm is not None else 0
        except KeyError:
            return 0

    async def sync_stream(self, name: str) -> None:
        """Ask the stream's leader to write the config the meta leader just committed into
        its group now (its own catalogue may not have applied it yet)."""
        a = self.catalogue().streams.get(name)
        if a is None:
            return
        req = {"stream": name, "config": a["config"], "rev": int(a.get("rev", 0)), "hops": 0}
        deadline = time.monotonic() + FWD_TIMEOUT
        while time.monotonic() < deadline:
            try:
                target = await self.stream_target(name)
                if target == self.self_id:
                    await self.svc._sync_config(name, a["config"], req["rev"])
                    return
                if await self._request(target, "js.sync", req) == b"1":
                    return
            except Exception as exc:  # noqa: BLE001 (leader moving: ask again)
                self.log.debug(f"JetStream: config sync of {name}: {exc!r}")
            await asyncio.sleep(0.1)

    async def _h_sync(self, _peer: int, payload: bytes) -> bytes:
        req = json.loads(payload)
        if not self.leads(req["stream"]):
            if req["hops"] >= MAX_HOPS:
                return b"0"
            req["hops"] += 1
            return await self._request(await self.stream_target(req["stream"]), "js.sync", req)
        await self.svc._sync_config(req["stream"], req["config"], int(req["rev"]))
        return b"1"

    async def stream_info_from_leader(self, name: str) -> dict[str, Any]:
        """STREAM.INFO as the stream's leader answers it, once the group has one."""
        deadline = time.monotonic() + FWD_TIMEOUT
        while True:
            try:
                target = await self.stream_target(name)
                account, stream = jsaccount.split(name)
                subject = f"{api.API_PREFIX}STREAM.INFO.{stream}"
                call = api.Call("STREAM.INFO", stream, account=account)
                if target == self.self_id:
                    frames = await self.svc._answer(call, subject, "", b"", hops=MAX_HOPS)
                else:
                    frames = frames_from_wire(await self._request(
                        target, "js.api", {"subject": subject, "reply": "", "body": "",
                                           "hops": 1, "account": account}))
                out = json.loads(frames[0][1])
                if "error" not in out:
                    return out
            except (ApiError, KeyError, IndexError, TimeoutError):
                pass
            except Exception as exc:  # noqa: BLE001 (a peer not reachable yet)
                self.log.debug(f"JetStream: waiting for {name}'s leader: {exc!r}")
            if time.monotonic() > deadline:
                raise ApiError.of("JSClusterNotAvailErr")
            await asyncio.sleep(0.05)

    async def delete_stream(self, name: str) -> dict[str, Any]:
        async with self.svc._meta_lock:
            if name not in self.catalogue().streams:
                raise ApiError.of("JSStreamNotFoundErr")
            await self.propose_meta(cluster_meta.delete(name))
        return {"type": replies.TYPE_PREFIX + "stream_delete_response", "success": True}

    async def meta_stepdown(self, body: bytes) -> dict[str, Any]:
        req = _request_json(body)
        want = Placement.from_config(req.get("placement"))
        voters = self.svc.mr.status(META_GROUP)["voters"]
        to = placement.pick_leader(self.candidates(), voters, self.self_id, want)
        if not to:
            up = [v for v in voters if v != self.self_id and self.is_up(v)]
            if not up:
                raise ApiError.of("JSClusterNoPeersErrF", err="no replacement peer connected")
            to = up[0]
        await self.transfer(META_GROUP, to)
        return {"type": replies.TYPE_PREFIX + "meta_leader_stepdown_response", "success": True}

    async def transfer(self, group: str, to: int, timeout: float = 5.0) -> None:
        """Hand `group`'s leadership to `to`. One bounded attempt at a time: the driver's
        own wait can outlive its timeout when the group sits quiesced."""
        mr = self.svc.mr
        deadline = time.monotonic() + timeout
        while mr.leader(group) != to:
            if time.monotonic() > deadline:
                raise ApiError.of("JSClusterNotAvailErr")
            task = asyncio.ensure_future(mr.transfer_leader(group, to, timeout=1.0))
            done, _ = await asyncio.wait({task}, timeout=1.5)
            if not done:
                task.cancel()
            elif not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                if not isinstance(exc, TimeoutError):
                    raise exc  # type: ignore[misc]

    def _peer_by_name(self, name: str) -> int:
        for m in self.cluster.members().values():
            if name in (m.name, short_peer(m.peer_id), str(m.peer_id)):
                return m.peer_id
        return 0

    async def server_remove(self, body: bytes) -> dict[str, Any]:
        req = _request_json(body)
        peer = self._peer_by_name(str(req.get("peer") or req.get("peer_id") or ""))
        voters = self.svc.mr.status(META_GROUP)["voters"]
        if not peer or peer not in voters:
            raise ApiError.of("JSClusterServerNotMemberErr")
        async with self.svc._meta_lock:
            await self.propose_meta(cluster_meta.remove_server(peer))
            for name, a in sorted(self.catalogue().streams.items()):
                if peer in a["peers"]:
                    await self._replace_peer(name, a, peer)
            await self.svc.mr.remove_member(META_GROUP, peer)
        return {"type": replies.TYPE_PREFIX + "meta_server_remove_response", "success": True}

    async def _replace_peer(self, name: str, a: dict[str, Any], peer: int,
                            shrink: bool = True) -> bool:
        """Move `name`'s replica off `peer` (placement picks the new one). With no peer to
        move it to: shrink the replica set (`shrink`), or leave it and say False."""
        keep = [p for p in a["peers"] if p != peer]
        try:
            peers = await self.place(a["config"], keep=keep, exclude=[peer])
        except ApiError:
            if not shrink:
                return False
            peers = keep or a["peers"]  # nowhere to move it: shrink rather than refuse
        await self.propose_meta(cluster_meta.update(name, a["config"], peers))
        return True

    async def peer_remove(self, name: str, body: bytes) -> dict[str, Any]:
        req = _request_json(body)
        peer = self._peer_by_name(str(req.get("peer") or ""))
        async with self.svc._meta_lock:
            a = self.catalogue().streams.get(name)
            if a is None:
                raise ApiError.of("JSStreamNotFoundErr")
            if not peer or peer not in a["peers"]:
                raise ApiError.of("JSClusterPeerNotMemberErr")
            await self._replace_peer(name, a, peer)
        return {"type": replies.TYPE_PREFIX + "stream_remove_peer_response", "success": True}

    # ------------------------------------------------------------------ duties

    async def _duties(self) -> None:
        """Twice a second: the meta leader adds new JetStream nodes to the meta group;
        each stream leader brings its group's config and members in line with the
        catalogue; a node drops the groups no longer assigned to it."""
        while True:
            await asyncio.sleep(0.5)
            try:
                await self._duty_round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (next round tries again)
                self.log.warn(f"JetStream cluster duty: {exc!r}")

    async def _duty_round(self) -> None:
        if not self.meta_started:
            return
        mr = self.svc.mr
        if not self._swept and self._meta_current():
            # Streams deleted while this node was down left their logs and data here:
            # once the catalogue is current, what it does not name goes.
            self.svc._drop_orphans()
            self._swept = True
        if self.is_meta_leader():
            await self._forget_replaced()
            st = mr.status(META_GROUP)
            for p, match in st["match"].items():
                # match > 1: past the bootstrap snapshot, so p holds Raft state (see `seen`).
                if match > 1 and p not in self.catalogue().seen:
                    await self.propose_meta(cluster_meta.seen(p))
            voters = set(mr.status(META_GROUP)["voters"])
            removed = set(self.catalogue().removed)
            for m in self.cluster.members().values():
                if m.jetstream and m.up and m.peer_id not in voters | removed:
                    self.log.info(f"JetStream: adding {m.name} to the meta group")
                    await mr.add_member(META_GROUP, m.peer_id)
                    break
        for name, sm in list(self.svc.streams.items()):
            a = self.catalogue().streams.get(name)
            if a is None or mr.leader(sm.group) != self.self_id:
                continue
            # A group found in line with its assignment stays so until the assignment
            # changes or leadership moves (both change the key): with 1,000 streams the
            # config comparison and status of every led group twice a second cost more
            # than an idle node may spend.
            key = (int(a.get("rev", 0)), tuple(a["peers"]), self.leader_since.get(sm.group, 0))
            if self.in_line.get(sm.group) == key:
                continue
            same_config = await self.svc._sync_config(name)
            try:
                done = await asyncio.wait_for(
                    self._sync_members(sm.group, list(a["peers"])), 10.0)
            except TimeoutError:
                self.log.warn(f"JetStream: membership change of {sm.group} not committed "
                              f"within 10 s: {mr.status(sm.group)}")
                continue
            if same_config and done:
                await self.svc._reconcile_consumers(name)  # they follow the stream
                self.in_line[sm.group] = key
        await self._consumer_group_duties()
        now = time.monotonic()
        for name in list(self.svc.streams):
            a = self.catalogue().streams.get(name)
            if a is None or self.self_id in a["peers"]:
                self._unassigned.pop(name, None)
                continue
            # No longer assigned here. Its leader removes this node from the group (one
            # member at a time, keeping a quorum); a removed member may never hear that
            # its removal committed, so it lets go once it sees it or after a grace period.
            since = self._unassigned.setdefault(name, now)
            sm = self.svc.streams[name]
            st = mr.status(sm.group)
            if self.self_id not in st["voters"] or now - since > UNASSIGNED_GRACE_S:
                self._unassigned.pop(name, None)
                await self.svc._close_stream(name)

    async def _consumer_group_duties(self) -> None:
        """Each consumer group led here takes the peers its assignment names (one change a
        round; a new member installs the leader's image: its acks and redelivery counts);
        a node no longer assigned a group it hosts lets it go once removed (or after the
        grace period), as for streams."""
        mr = self.svc.mr
        cat = self.catalogue()
        now = time.monotonic()
        for key, cm in list(self.svc.cgroups.items()):
            g = cat.consumer_group(*key)
            if g is None or g["group"] != cm.group:
                continue  # `_sync_consumer_groups` closes it
            leads = mr.leader(cm.group) == self.self_id
            if self.self_id not in g["peers"] and not leads:
                since = self._unassigned.setdefault(cm.group, now)
                if self.self_id not in mr.status(cm.group)["voters"] or \
                        now - since > UNASSIGNED_GRACE_S:
                    self._unassigned.pop(cm.group, None)
                    await self.svc._close_consumer_group(key, cm)
                continue
            self._unassigned.pop(cm.group, None)
            if not leads:
                continue  # a leader no longer assigned hands over first (_sync_members)
            in_line = (int(g.get("rev", 0)), self.leader_since.get(cm.group, 0))
            if self.in_line.get(cm.group) == in_line:
                continue
            try:
                done = await asyncio.wait_for(self._sync_members(cm.group, list(g["peers"])),
                                              10.0)
            except TimeoutError:
                continue
            if done:
                self.in_line[cm.group] = in_line

    async def _forget_replaced(self) -> None:
        """A node whose store was wiped came back with a new id at the same address
        (node/cluster marks the old id gone): the old id leaves the meta group and every
        stream it held a replica of gets a replacement, as SERVER.REMOVE would do."""
        gone = set(getattr(getattr(self.cluster, "table", None), "gone", set()))
        if not gone:
            return
        mr = self.svc.mr
        voters = set(mr.status(META_GROUP)["voters"])
        held = {p for a in self.catalogue().streams.values() for p in a["peers"]}
        for peer in sorted(gone & (voters | held)):
            self.log.info(f"JetStream: peer {short_peer(peer)} was replaced (wiped store): "
                          "removing it")
            async with self.svc._meta_lock:
                # Its replicas move first, each only once a new peer (normally the node
                # that replaced it, as soon as it is up) can take it: never shrink here.
                for name, a in sorted(self.catalogue().streams.items()):
                    if peer in a["peers"] and not await self._replace_peer(
                            name, a, peer, shrink=False):
                        return  # next round
                if peer not in self.catalogue().removed:
                    await self.propose_meta(cluster_meta.remove_server(peer))
                if peer in voters:
                    await mr.remove_member(META_GROUP, peer)
            return

    async def _sync_members(self, group: str, peers: list[int]) -> bool:
        """One membership change towards `peers`; True when there was none to make."""
        mr = self.svc.mr
        st = mr.status(group)
        voters = set(st["voters"])
        # A leaving member that is down goes FIRST: it adds nothing to the quorum, and adding
        # a member before would raise the quorum with one more node that may never answer
        # (a replaced node wiped twice would leave the group without a quorum).
        for p in sorted(voters - set(peers)):
            if p != self.self_id and not self.is_up(p):
                self.log.info(f"JetStream: removing down peer {short_peer(p)} from {group}")
                await mr.remove_member(group, p)
                return False
        for p in peers:
            if p not in voters:
                self.log.info(f"JetStream: adding peer {short_peer(p)} to {group}")
                await mr.add_member(group, p)
                return False
        for p in sorted(voters - set(peers)):
            if p == self.self_id:
                others = [q for q in peers if self.is_up(q)]
                if others:
                    await self.transfer(group, others[0])
                return False
            # Only once the remaining members are caught up: a removal never leaves
            # the group without a quorum of current replicas.
            self.log.info(f"JetStream: removing peer {short_peer(p)} from {group}")
            await mr.remove_member(group, p)
            return False
        return True

    # ------------------------------------------------------------------ INFO

    def consumer_cluster_info(self, group: str) -> dict[str, Any]:
        """CONSUMER.INFO's `cluster` for a consumer with its own group: nats-server 2.15.1
        runs an R1 consumer without a Raft node and shows only the cluster's name and the
        server (probed on a 3-node cluster: `{"name","leader"}`); ours has a one-member
        group, shown the same way. Larger groups: as any group."""
        st = self.svc.mr.status(group)
        if len(st["voters"]) == 1:
            return {"name": self.cluster_name, "leader": self.member_name(st["voters"][0])}
        return self.cluster_info(group)

    def note_leader(self, group: str, leader: int) -> None:
        """When this node's leadership of `group` began: kept for as long as it leads. The
        Raft core leads before the leader hook runs (at the drain pass's end), and a reply
        built in between (a consumer create's) already shows the leader and its time."""
        if leader == self.self_id:
            self.leader_since.setdefault(group, time.time_ns())
        else:
            self.leader_since.pop(group, None)

    def cluster_info(self, group: str) -> dict[str, Any]:
        """STREAM.INFO's / CONSUMER.INFO's `cluster` object, as nats-server shows it."""
        mr = self.svc.mr
        st = mr.status(group)
        leader = st["leader"]
        out: dict[str, Any] = {"name": self.cluster_name, "raft_group": group}
        if leader:
            out["leader"] = self.member_name(leader)
            if leader == self.self_id:
                self.note_leader(group, leader)
            since = self.leader_since.get(group)
            if since:
                out["leader_since"] = rfc3339(since)
        out["system_account"] = True
        out["traffic_account"] = "$SYS"
        reps = []
        now = asyncio.get_running_loop().time()
        transport = mr.transport
        for p in st["voters"]:
            if p == leader:
                continue
            rep: dict[str, Any] = {"name": self.member_name(p)}
            match = st["match"].get(p)
            lag = max(st["last_index"] - match, 0) if match is not None else 0
            up = self.is_up(p)
            rep["current"] = up and lag == 0
            try:
                seen = transport.last_seen(p) if p != self.self_id else now
            except (KeyError, AttributeError):
                seen = 0.0
            rep["active"] = int(max(now - seen, 0) * 1e9) if seen else 0
            if not up:
                rep["offline"] = True
            if lag:
                rep["lag"] = lag
            rep["peer"] = short_peer(p)
            reps.append(rep)
        if reps:
            out["replicas"] = reps
        return out

    def jsz_meta(self) -> dict[str, Any]:
        """/jsz's `meta_cluster` (nats-server's shape), for node/monitor.py."""
        if not self.meta_started:
            return {"name": self.cluster_name, "cluster_size": 0}
        info = self.cluster_info(META_GROUP)
        st = self.svc.mr.status(META_GROUP)
        return {"name": self.cluster_name, "leader": info.get("leader", ""),
                "peer": short_peer(self.self_id), "replicas": info.get("replicas", []),
                "cluster_size": len(st["voters"]), "pending": 0}

    def _meta_current(self) -> bool:
        try:
            st = self.svc.mr.status(META_GROUP)
        except KeyError:
            return False
        return bool(st["leader"]) and st["applied"] >= st["commit"] > 0

    def healthy(self) -> bool:
        """Caught up with the meta group and a leader known for every assigned group."""
        if not self.meta_started:
            return False
        mr = self.svc.mr
        try:
            st = mr.status(META_GROUP)
        except KeyError:
            return False
        if not st["leader"] or st["applied"] < st["commit"]:
            return False
        for name in self.catalogue().assigned_to(self.self_id):
            sm = self.svc.streams.get(name)
            if sm is None:
                return False
            g = mr.status(sm.group)
            if not g["leader"] or (g["applied"] < g["commit"] and not g["holding"]):
                return False
        return True


def _request_json(body: bytes) -> dict[str, Any]:
    """A META/SERVER/PEER request body: empty, or a JSON object (else nats-server's error)."""
    if not body.strip():
        return {}
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError.of("JSInvalidJSONErr", err=str(exc)) from None
    if not isinstance(req, dict):
        raise ApiError.of("JSInvalidJSONErr", err="expected a JSON object")
    return req


def _as_reply(info: dict[str, Any]) -> dict[str, Any]:
    """A STREAM.INFO reply as the body of a create/update reply (no subject paging)."""
    return {k: v for k, v in info.items() if k not in ("total", "offset", "limit")}


def _ack_consumer(subject: str) -> str:
    info = api_ack(subject)
    return info.consumer if info is not None else ""


def _shrink(peers: list[int], want: int, leader: int) -> list[int]:
    """Scaling down keeps the leader and the first peers of the assignment."""
    ordered = ([leader] if leader in peers else []) + [p for p in peers if p != leader]
    return ordered[:want]

"""Mirrors and sources in the node: the async edge around `sourcing.py`.

Two halves, joined only by NATS subjects, so that origin and target may later live on
different nodes (the cluster forwards the `$JS.API` request to the origin's leader):

* **Target side** (`SourceLink`, one per mirror / source of a stream): sends
  `$JS.API.CONSUMER.CREATE.<origin>.<name>` with a `direct` push consumer config starting at
  the target's durable progress + 1, receives the deliveries on its deliver subject, and
  proposes them to the TARGET's Raft group as SOURCE_MSGS entries (fsynced and replicated like
  a publish; the progress moves in the same apply). It answers the origin's flow-control
  requests only after the entry carrying what came before committed, so at most one window is
  in flight. A gap in the delivery sequence, a heartbeat that says more was sent, silence for
  three heartbeats or a failed proposal ends the session: the next one starts again at the
  durable progress + 1. Errors (the origin missing, ...) show in STREAM.INFO's block.
* **Origin side** (`DirectReader`, one per direct consumer): a leader-local reader of the
  origin's store, as nats-server's direct consumers are (not replicated, not listed, not
  counted): it pushes matching messages in order with v1 ack subjects (origin seq, delivery
  seq, timestamp, pending), asks for flow control every FC_EVERY messages, sends idle
  heartbeats, and ends when nobody listens on its deliver subject for its inactive
  threshold, on CONSUMER.DELETE, or when the origin goes.

Accounts: without `external`, origin and target are in the same account (the config's origin
name is looked up in the target's account). With it, the link's requests use the external API
prefix and its deliveries the deliver prefix, and the target account's imports (the origin
account's exports) carry them across, as nats-server's users configure them. Streams are
named by their registry key (jsaccount.py) here; subjects carry bare names. Each account has
its own sourcing client, so requests, deliveries and flow control start in the account.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from typing import Any

from node.jetstream import jsaccount, ops, sourcing
from node.jetstream.consumer import StreamView
from node.jetstream.errors import ApiError
from node.jetstream.replies import TYPE_PREFIX
from node.jetstream.store.base import file_size, memory_size
from node.subject import is_literal
from raft.multigroup import NotLeader, ProposalDropped

HEARTBEAT_NS = 1_000_000_000      # the origin's idle heartbeat (nats-server: 1s)
STALL_BEATS = 3                   # silence for this many heartbeats restarts the session
RETRY_S = 1.0                     # between failed consumer creates (the origin missing, ...)
FC_EVERY = 512                    # deliveries between flow-control requests
READ_BATCH = 256                  # messages read from the origin store under one lock
ENTRY_MAX = 512                   # sourced messages per SOURCE_MSGS entry
REQUEST_TIMEOUT_S = 5.0
# Jetraft's own field of a sourcing consumer's create reply: the origin's incarnation, for a
# target that cannot read it from its catalogue (an origin in another account or domain).
ORIGIN_IDENTITY = "origin_identity"
_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_FC_REQUEST = b"NATS/1.0 100 FlowControl Request\r\n\r\n"
_GONE = b"NATS/1.0 409 Consumer Deleted\r\n\r\n"


def _token(n: int = 8) -> str:
    return "".join(secrets.choice(_CHARS) for _ in range(n))


def _status(hdr: bytes | None) -> bytes:
    """The status line of a control message (`100 Idle Heartbeat`, ...), else b""."""
    if not hdr or not hdr.startswith(b"NATS/1.0 "):
        return b""
    return hdr.split(b"\r\n", 1)[0][9:]


def _header(hdr: bytes, key: str) -> str | None:
    needle = key.lower().encode() + b":"
    for line in hdr.split(b"\r\n")[1:]:
        if line.lower().startswith(needle):
            return line[len(needle):].strip().decode()
    return None


class _Restart(Exception):
    """End this session; the next one resumes at the durable progress."""


class SourceLink:
    """One mirror or source of a target stream, for as long as the config names it."""

    def __init__(self, wire: SourcingWire, target: str, key: str, src: dict[str, Any]) -> None:
        self.wire = wire
        self.target = target
        self.key = key
        self.src = src
        self.mirror = key == sourcing.MIRROR_KEY
        self.account = jsaccount.account_of(target)
        external = src.get("external") or {}
        # An origin in another account (or domain) is reached through the target account's
        # imports: its API under `api`, its deliveries under the `deliver` prefix.
        self.api = external.get("api") or "$JS.API"
        self.deliver_prefix = external.get("deliver") or ("$JS.M" if self.mirror else "$JS.S")
        # The origin's registry key when it is in the target's account. An external one is
        # not in this node's catalogue: its incarnation comes with the consumer it creates.
        self.origin = "" if external.get("api") else jsaccount.key(self.account, src["name"])
        self.external_ident = ""
        self.lag = 0
        self.last_heard = 0       # time.monotonic_ns() of the last delivery or heartbeat
        self.error: dict[str, Any] | None = None
        self.task: asyncio.Task[Any] | None = None
        self.consumer = ""
        self.kick = asyncio.Event()  # set when this node became the target's leader

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def active_ns(self) -> int:
        return time.monotonic_ns() - self.last_heard if self.last_heard else -1

    async def _run(self) -> None:
        log = self.wire.svc.log
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except _Restart:
                pass
            except Exception as exc:  # never let a source die: log, retry
                log.warn(f"JetStream sourcing {self.target} <- {self.src['name']}: {exc!r}")
            # A follower waits for its turn; a leader retries after RETRY_S. Becoming the
            # leader ends the wait at once (no second without a sourcing session).
            self.kick.clear()
            try:
                await asyncio.wait_for(self.kick.wait(), RETRY_S)
            except TimeoutError:
                pass

    async def _session(self) -> None:
        svc = self.wire.svc
        sm = svc.streams.get(self.target)
        if sm is None:
            raise _Restart
        if not self.wire.leads(sm):
            raise _Restart  # only the target's leader sources; a follower waits its turn
        with sm.lock:
            done = sourcing.resume_after(sm.store, self.key, self._ident())
        name = ("JS_MIRROR_" if self.mirror else "JS_SRC_") + _token()
        kind = "M" if self.mirror else "S"
        deliver = f"{self.deliver_prefix}.{kind}.{_token()}".replace("..", ".")
        inbox: asyncio.Queue[tuple[str, str | None, bytes | None, bytes]] = asyncio.Queue()
        client = self.wire.client_for(self.account)

        def on_msg(_sub: Any, subject: str, reply: str | None, hdr: bytes | None,
                   data: bytes) -> None:
            inbox.put_nowait((subject, reply, hdr, data))

        sub = client.subscribe_internal(deliver, on_msg)
        try:
            body = sourcing.consumer_request(self.src, name, deliver, done, self.mirror,
                                             HEARTBEAT_NS)
            reply = await self.wire.request(client, self._create_subject(body, name),
                                            json.dumps(body).encode())
            if "error" in reply:
                self.error = reply["error"]
                raise _Restart
            if not self.origin:
                self._learn_identity(sm, reply.get(ORIGIN_IDENTITY, ""), done, name)
            self.error = None
            self.consumer = name
            self.last_heard = time.monotonic_ns()
            await self._consume(inbox)
        finally:
            client.remove_sub(sub)
            if self.consumer:
                # With a reply subject (the API ignores requests without one); the answer
                # is not awaited: a reader nobody listens to ends on its own anyway.
                client.publish(f"{self.api}.CONSUMER.DELETE.{self.src['name']}.{self.consumer}",
                               self.wire.reply_inbox(), b"")
                self.consumer = ""

    def _learn_identity(self, sm: Any, ident: str, done: int, consumer: str) -> None:
        """An external origin says which incarnation it is: a re-created one (the stored
        progress names another) means starting over, with a new consumer."""
        self.external_ident = ident
        with sm.lock:
            again = sourcing.resume_after(sm.store, self.key, ident)
        if again != done:
            self.consumer = consumer  # deleted on the way out
            raise _Restart

    def _ident(self) -> str:
        return self.wire.identity(self.origin) if self.origin else self.external_ident

    def _create_subject(self, body: dict[str, Any], name: str) -> str:
        """nats-server's subject for a source consumer: its users export exactly these
        (`CONSUMER.CREATE.<origin>`, or with the name and the one filter subject)."""
        subject = f"{self.api}.CONSUMER.CREATE.{self.src['name']}"
        one = body["config"].get("filter_subject")
        return (f"{subject}.{name}.{one}" if one else subject).replace("..", ".")

    async def _consume(self, inbox: asyncio.Queue[Any]) -> None:
        svc = self.wire.svc
        expected = 1  # the next delivery sequence
        ident = self._ident()
        stall_s = STALL_BEATS * HEARTBEAT_NS / 1e9
        while True:
            try:
                first = await asyncio.wait_for(inbox.get(), stall_s)
            except TimeoutError:
                raise _Restart from None
            items = [first]
            while not inbox.empty() and len(items) < ENTRY_MAX:
                items.append(inbox.get_nowait())
            msgs: list[ops.SourcedMsg] = []
            answers: list[str] = []
            for subject, reply, hdr, data in items:
                self.last_heard = time.monotonic_ns()
                status = _status(hdr)
                if status:
                    if status.startswith(b"100 FlowControl") and reply:
                        answers.append(reply)
                    elif status.startswith(b"100"):
                        sent = _header(hdr or b"", "Nats-Last-Consumer")
                        if sent is not None and sent.isdigit() and int(sent) >= expected:
                            raise _Restart  # a delivery never arrived
                    elif status.startswith(b"409") or status.startswith(b"404"):
                        raise _Restart  # the consumer went (origin deleted, ...)
                    continue
                got = sourcing.parse_delivery(reply or "")
                if got is None:
                    continue
                sseq, dseq, ts, pending = got
                if dseq != expected:
                    raise _Restart
                expected += 1
                self.lag = pending
                msgs.append(ops.SourcedMsg(sseq, ts, subject, hdr or b"", data))
            sm = svc.streams.get(self.target)
            if sm is None or not self.wire.leads(sm):
                raise _Restart  # leadership moved: the new leader resumes at the progress
            if sm.stream.cfg["sealed"]:
                msgs = []  # sealed: the origin is still heard, nothing is stored
            size = 0
            if msgs:
                msgs, size = self._within_limits(sm, msgs, ident)
            if msgs:
                entry = ops.SourceMsgs(time.time_ns(), self.key, ident, tuple(msgs))
                key = sm.inflight.reserve(entry.now_ns, size, size, len(msgs))
                entry = ops.SourceMsgs(key, self.key, ident, entry.msgs)
                try:
                    await svc.mr.propose(sm.group, ops.encode(entry))
                except (ProposalDropped, NotLeader, KeyError) as exc:
                    sm.inflight.release(key)
                    raise _Restart from exc
                with sm.lock:
                    stored_to = sourcing.progress(sm.store, self.key)
                if stored_to < msgs[-1].origin_seq:
                    raise _Restart  # refused (a full `discard: new` target): retry later
            for answer in answers:  # what came before is committed: the origin may go on
                self.wire.client_for(self.account).publish(answer, None, b"")


    def _stored_size(self, sm: Any, msg: ops.SourcedMsg, ident: str,
                     src: dict[str, Any] | None) -> int:
        """What the store will count for `msg`: its subject as the source's transforms
        map it; a source adds its Nats-Stream-Source header (name, seq, filters,
        destinations, subject, ident; bounded from above)."""
        hdr_len = len(msg.hdr)
        if self.key != sourcing.MIRROR_KEY:
            hdr_len += (len(sourcing.STREAM_SOURCE) + len(self.key) + len(msg.subject)
                        + len(ident) + 40 + (0 if msg.hdr else 12))
        size_of = memory_size if sm.memory else file_size
        subject = msg.subject if src is None else sourcing.map_subject(src, msg.subject)
        return size_of(subject, b"\0" * hdr_len, msg.data)

    def _within_limits(self, sm: Any, msgs: list[ops.SourcedMsg], ident: str
                       ) -> tuple[list[ops.SourcedMsg], int]:
        """The leading messages the node's and the account's limits take now (the rest are
        read again after a restart of the link), with nats-server's warning when some do
        not fit; and their stored size."""
        src = sourcing.find_source(sm.stream.cfg, self.key)
        sizes = [self._stored_size(sm, m, ident, src) for m in msgs]
        fit, why = self.wire.svc.sourced_fit(sm, sizes)
        if fit < len(msgs):
            self.lag += len(msgs) - fit  # read but not stored: still to come
            what = ("mirror message" if self.key == sourcing.MIRROR_KEY
                    else f'source "{self.key}"')
            where = f"{jsaccount.account_of(sm.name)!r} > {jsaccount.name_of(sm.name)!r}"
            self.wire.svc.log.warn(f"Error processing inbound {what} for {where}: {why}")
        return msgs[:fit], sum(sizes[:fit])


class DirectReader:
    """A direct consumer of an origin stream (leader-local, unreplicated)."""

    def __init__(self, wire: SourcingWire, origin: str, name: str, cfg: dict[str, Any]) -> None:
        self.wire = wire
        self.origin = origin  # the registry key
        self.client = wire.client_for(jsaccount.account_of(origin))
        self.wire_name = jsaccount.name_of(origin)  # what subjects carry
        self.name = name
        self.deliver: str = cfg["deliver_subject"]
        subjects = list(cfg.get("filter_subjects") or [])
        if cfg.get("filter_subject"):
            subjects.append(cfg["filter_subject"])
        self.filters = subjects
        self.cfg = cfg
        self.heartbeat_ns = int(cfg.get("idle_heartbeat") or HEARTBEAT_NS)
        self.inactive_ns = int(cfg.get("inactive_threshold") or 10 * HEARTBEAT_NS)
        self.next_seq = 0
        self.dseq = 0
        self.last_sseq = 0
        self.wake = asyncio.Event()
        self.fc_reply = ""          # the flow-control answer subject awaited, if any
        self.fc_answered = asyncio.Event()
        self.since_fc = 0
        self.task: asyncio.Task[Any] | None = None
        self.fc_sub: Any = None

    def start(self, sm: Any) -> None:
        with sm.lock:
            self.next_seq = sourcing.start_seq(self.cfg, StreamView(sm.store, self.filters))
            if self.next_seq == 0:
                self.next_seq = sm.stream.last_seq + 1
        prefix = f"$JS.FC.{self.wire_name}.{self.name}."
        self.fc_sub = self.client.subscribe_internal(prefix + "*", self._on_fc)
        self.task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.fc_sub is not None:
            self.client.remove_sub(self.fc_sub)
            self.fc_sub = None

    def _on_fc(self, _sub: Any, subject: str, *_: Any) -> None:
        if subject == self.fc_reply:
            self.fc_reply = ""
            self.fc_answered.set()

    async def _run(self) -> None:
        try:
            await self._loop()
        finally:
            if self.wire.readers.get(self.name) is self:  # not a successor of the same name
                self.wire.readers.pop(self.name)
            if self.fc_sub is not None:
                self.client.remove_sub(self.fc_sub)
                self.fc_sub = None

    async def _loop(self) -> None:
        svc = self.wire.svc
        last_sent = quiet_since = time.monotonic_ns()
        while True:
            sm = svc.streams.get(self.origin)
            if sm is None:
                return  # the origin was deleted: so is its consumer
            if not self.wire.leads(sm):
                # The origin's leadership moved: a direct consumer lives on the leader
                # (nats-server's too). Tell the link now, rather than after its stall
                # timeout; it creates the consumer again, which reaches the new leader.
                self.client.publish(self.deliver, None, b"", _GONE)
                return
            now = time.monotonic_ns()
            if not self.client.account.has_interest(self.deliver):
                if now - quiet_since > self.inactive_ns:
                    return
                await asyncio.sleep(0.1)
                continue
            quiet_since = now
            if self.fc_reply:
                await self._wait(self.fc_answered, self.heartbeat_ns)
                if self.fc_reply and time.monotonic_ns() - last_sent >= self.heartbeat_ns:
                    self._heartbeat()
                    last_sent = time.monotonic_ns()
                continue
            batch, last, more = self._read(sm)
            if batch:
                self._send(batch, last, more)
                last_sent = time.monotonic_ns()
                continue
            self.wake.clear()
            if not await self._wait(self.wake, self.heartbeat_ns - (now - last_sent)):
                self._heartbeat()
                last_sent = time.monotonic_ns()

    @staticmethod
    async def _wait(event: asyncio.Event, ns: int) -> bool:
        try:
            await asyncio.wait_for(event.wait(), max(ns, 1_000_000) / 1e9)
            return True
        except TimeoutError:
            return False

    def _read(self, sm: Any) -> tuple[list[Any], int, bool]:
        """Up to READ_BATCH matching messages from `next_seq`, the stream's last seq, and
        whether more match after them."""
        out = []
        with sm.lock:
            view = StreamView(sm.store, self.filters)
            if len(self.filters) == 1 and is_literal(self.filters[0]):
                seq = self.next_seq
                while len(out) < READ_BATCH:
                    seq = sm.store.first_for_subject(self.filters[0], seq)
                    if not seq:
                        break
                    msg = sm.store.load(seq)
                    if msg is not None:
                        out.append(msg)
                    seq += 1
            else:  # one walk over the stored seqs (next_matching per message walks anew)
                for seq in sm.store.seqs(self.next_seq):
                    msg = sm.store.load(seq)
                    if msg is not None and view.matches(msg.subject):
                        out.append(msg)
                        if len(out) >= READ_BATCH:
                            break
            more = bool(out) and bool(view.next_matching(out[-1].seq + 1))
            return out, sm.stream.last_seq, more

    def _send(self, batch: list[Any], last: int, more: bool) -> None:
        client = self.client
        for i, msg in enumerate(batch):
            self.dseq += 1
            self.last_sseq = msg.seq
            self.next_seq = msg.seq + 1
            # `pending` becomes the target's lag: 0 once caught up; counted without
            # interior deletes (unfiltered) or by what this read saw (filtered).
            pending = max(0, last - msg.seq) if not self.filters else \
                len(batch) - i - 1 + (1 if more else 0)
            ack = (f"$JS.ACK.{self.wire_name}.{self.name}.1.{msg.seq}.{self.dseq}."
                   f"{msg.ts_ns}.{pending}")
            client.account.deliver_as(client, self.deliver, msg.subject, ack, msg.hdr or None,
                                      msg.data)
            self.since_fc += 1
            if self.since_fc >= FC_EVERY and self.cfg.get("flow_control"):
                self.since_fc = 0
                self.fc_reply = f"$JS.FC.{self.wire_name}.{self.name}.{_token(10)}"
                self.fc_answered.clear()
                client.publish(self.deliver, self.fc_reply, b"", _FC_REQUEST)
                return  # the rest is read again once the target answered

    def _heartbeat(self) -> None:
        hdr = (f"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: {self.dseq}\r\n"
               f"Nats-Last-Stream: {self.last_sseq}\r\n\r\n").encode()
        self.client.publish(self.deliver, None, b"", hdr)


class SourcingWire:
    """Owns every SourceLink (targets on this node) and DirectReader (origins here)."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc
        self.client: Any = None  # the global account's; others in `clients`, made on use
        self.clients: dict[str, Any] = {}
        self.links: dict[str, dict[str, SourceLink]] = {}
        self.readers: dict[str, DirectReader] = {}
        self._replies: dict[str, asyncio.Future[bytes]] = {}
        self._reply_prefix = f"$JSC.R.{_token(12)}."

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        from node.jetstream.service import _jetstream_kind

        self._kind = _jetstream_kind()
        self.client = self.client_for(jsaccount.GLOBAL)
        for name in list(self.svc.streams):
            self.sync(name)

    def client_for(self, account: str) -> Any:
        """The sourcing client of `account` (made on first use): origin and target of a
        mirror or source are in one account, and so are its requests and deliveries."""
        client = self.clients.get(account)
        if client is None:
            client = self.svc.server.internal_client(self._kind, "jetstream-sourcing", account)
            # Unlike the API client, its subscriptions (a link's deliver subject, a reader's
            # flow-control subjects, request inboxes) must be heard cluster-wide: an origin's
            # leader and a target's leader may be different nodes. All are unique tokens.
            client.local_only = False
            client.subscribe_internal(self._reply_prefix + "*", self._on_reply)
            self.clients[account] = client
        return client

    def stop(self) -> None:
        for links in self.links.values():
            for link in links.values():
                link.stop()
        self.links.clear()
        for reader in list(self.readers.values()):
            reader.stop()
        self.readers.clear()

    def sync(self, target: str) -> None:
        """Start and stop links to match the target's config (create, update, promotion)."""
        if self.client is None:
            return
        sm = self.svc.streams.get(target)
        wanted: dict[str, dict[str, Any]] = {}
        if sm is not None:
            cfg = sm.stream.cfg
            if cfg.get("mirror"):
                wanted[sourcing.MIRROR_KEY] = cfg["mirror"]
            for src in cfg.get("sources") or []:
                wanted[sourcing.source_key(src)] = src
        links = self.links.setdefault(target, {})
        for key in [k for k in links if k not in wanted or links[k].src != wanted[k]]:
            links.pop(key).stop()
        for key, src in wanted.items():
            if key not in links:
                links[key] = SourceLink(self, target, key, src)
                links[key].start()
        if not links:
            self.links.pop(target, None)

    def closed(self, name: str) -> None:
        """A stream went: its links stop, and so do direct consumers reading it."""
        for link in self.links.pop(name, {}).values():
            link.stop()
        for reader in [r for r in self.readers.values() if r.origin == name]:
            reader.stop()
            self.readers.pop(reader.name, None)

    def on_stored(self, origin: str) -> None:
        for reader in self.readers.values():
            if reader.origin == origin:
                reader.wake.set()

    # -- requests ---------------------------------------------------------------------------

    def _on_reply(self, _sub: Any, subject: str, _reply: str | None, _hdr: bytes | None,
                  data: bytes) -> None:
        fut = self._replies.pop(subject, None)
        if fut is not None and not fut.done():
            fut.set_result(data)

    async def request(self, client: Any, subject: str, body: bytes) -> dict[str, Any]:
        """A `$JS.API` request in `client`'s account."""
        inbox = self._reply_prefix + _token(10)
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._replies[inbox] = fut
        try:
            # Unmapped: nats-server applies no account mapping (the domain's `$JS.<domain>.
            # API` included) to JetStream's own requests; imports still carry them.
            client.account.publish(client, subject, inbox, None, body, premapped=True)
            raw = await asyncio.wait_for(fut, REQUEST_TIMEOUT_S)
        except TimeoutError:
            raise _Restart from None
        finally:
            self._replies.pop(inbox, None)
        return json.loads(raw)

    def leads(self, sm: Any) -> bool:
        """This node leads `sm`'s group (one node: always, once elected)."""
        try:
            return bool(self.svc.mr.leader(sm.group) == self.svc.node_id)
        except KeyError:
            return False

    def identity(self, origin: str) -> str:
        """The origin's incarnation, from the replicated catalogue (the origin need not be
        hosted on this node); `origin` is its registry key, as the catalogue's."""
        meta = self.svc.meta
        entry = meta.streams.get(origin) if meta is not None else None
        if entry is not None and entry.get("group"):
            return sourcing.identity(entry["group"])
        sm = self.svc.streams.get(origin)
        return sourcing.identity(sm.group) if sm is not None else ""

    def reply_inbox(self) -> str:
        return self._reply_prefix + _token(10)

    def leader_changed(self, name: str, leader: int) -> None:
        """A stream hosted here changed leader: this node's links for it start sourcing
        now if it leads (the others stop at their next step), and direct readers of it
        stop if it no longer leads."""
        self.sync(name)
        if leader == self.svc.node_id:
            for link in self.links.get(name, {}).values():
                link.kick.set()
        else:
            for reader in [r for r in self.readers.values() if r.origin == name]:
                reader.wake.set()  # its loop sees the lost leadership and ends

    # -- origin side: direct consumers ------------------------------------------------------

    @staticmethod
    def is_direct(body: bytes) -> bool:
        """A CONSUMER.CREATE for a sourcing consumer (`direct` and `sourcing`, push)?"""
        if b'"direct"' not in body:
            return False
        try:
            req = json.loads(body)
        except ValueError:
            return False
        cfg = req.get("config") if isinstance(req, dict) else None
        # only a mirror's / source's own request: other direct configs get the usual checks
        return isinstance(cfg, dict) and cfg.get("direct") is True and \
            cfg.get("sourcing") is True and bool(cfg.get("deliver_subject"))

    async def create_direct(self, origin: str, body: bytes) -> dict[str, Any]:
        cfg = json.loads(body)["config"]  # is_direct parsed it: a dict
        sm = self.svc.streams.get(origin)
        if sm is None:
            raise ApiError.of("JSStreamNotFoundErr")
        sourcing.check_direct(cfg)
        if not self.leads(sm):  # a stale route to a former leader: the link asks again
            raise ApiError.of("JSClusterNotAvailErr")
        name = cfg["name"]
        old = self.readers.pop(name, None)
        if old is not None:
            old.stop()
        reader = DirectReader(self, origin, name, cfg)
        reader.start(sm)
        self.readers[name] = reader
        return {"type": TYPE_PREFIX + "consumer_create_response",
                "stream_name": jsaccount.name_of(origin),
                "name": name, "config": cfg,
                "delivered": {"consumer_seq": 0, "stream_seq": reader.next_seq - 1},
                ORIGIN_IDENTITY: self.identity(origin)}

    def delete_direct(self, origin: str, name: str) -> bool:
        reader = self.readers.get(name)
        if reader is None or reader.origin != origin:
            return False
        reader.stop()
        self.readers.pop(name, None)
        return True

    def direct_mirror(self, origin: str) -> Any:
        """A mirror of `origin` (a registry key) with `mirror_direct`, in its account: it
        answers DIRECT.GET for its origin, as nats-server's mirrors join the origin's
        direct-get queue group (so gets keep working while the origin is gone)."""
        account, name = jsaccount.split(origin)
        for sm in self.svc.streams.values():
            cfg = sm.stream.cfg
            if cfg.get("mirror_direct") and (cfg.get("mirror") or {}).get("name") == name \
                    and jsaccount.account_of(sm.name) == account:
                return sm
        return None

    async def direct_mirror_elsewhere(self, origin: str, subject: str, body: bytes
                                      ) -> list[tuple[bytes | None, bytes]]:
        """Clustered: DIRECT.GET for `origin` answered by a node hosting a `mirror_direct`
        mirror of it (that node serves it locally: `direct_mirror`). [] when none is up."""
        jsc = self.svc.jsc
        meta = self.svc.meta
        if jsc is None or meta is None:
            return []
        from node.jetstream.cluster import MAX_HOPS, frames_from_wire

        account, name = jsaccount.split(origin)
        for a in meta.streams.values():
            cfg = a["config"]
            if not cfg.get("mirror_direct") or (cfg.get("mirror") or {}).get("name") != name \
                    or a.get("account", jsaccount.GLOBAL) != account:
                continue
            for peer in a.get("peers") or []:
                if peer == self.svc.node_id or not jsc.is_up(peer):
                    continue
                try:
                    raw = await jsc.cluster.request(peer, "js.api", json.dumps({
                        "subject": subject, "reply": "", "hops": MAX_HOPS, "account": account,
                        "body": base64.b64encode(body).decode()}).encode(), REQUEST_TIMEOUT_S)
                except Exception:  # noqa: BLE001 (that peer cannot answer: try another)
                    continue
                frames = frames_from_wire(raw)
                if frames and not (frames[0][0] or b"").startswith(b"NATS/1.0 503"):
                    return frames
        return []

    # -- STREAM.INFO ------------------------------------------------------------------------

    def info(self, out: dict[str, Any], sm: Any, mirror: bool = True) -> dict[str, Any]:
        """Replace the config-only `mirror` / `sources` blocks with live ones."""
        links = self.links.get(sm.name, {})
        cfg = sm.stream.cfg
        with sm.lock:
            if mirror and cfg.get("mirror") and "mirror" in out:
                out["mirror"] = self._block(sm, sourcing.MIRROR_KEY, cfg["mirror"], links)
            if cfg.get("sources") and "sources" in out:
                out["sources"] = [self._block(sm, sourcing.source_key(s), s, links)
                                  for s in cfg["sources"]]
        return out

    @staticmethod
    def _block(sm: Any, key: str, src: dict[str, Any], links: dict[str, SourceLink]
               ) -> dict[str, Any]:
        link = links.get(key)
        done = sourcing.progress(sm.store, key)
        if link is None:
            return sourcing.info_block(src, 0, -1, None, done, key == sourcing.MIRROR_KEY)
        return sourcing.info_block(src, link.lag, link.active_ns(), link.error, done,
                                   link.mirror)

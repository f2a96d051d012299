"""One client of any kind: parser events in, its account's messages out.

`Client` has a `kind` (nats-server's names): CLIENT for a network connection,
SYSTEM, JETSTREAM and ACCOUNT for clients inside the server, later ROUTE.
A network client is an `asyncio.Protocol` that only uses the small transport
surface a WebSocket adapter can also offer (write, close, is_closing,
get_write_buffer_size, get_extra_info), so TCP, TLS and WebSocket
connections share this code. An internal client has no transport: what it
receives waits in its own bounded queue and its callbacks run from the
event loop, never on the publisher's stack.

Hot path (a PUB): the parser's `on_pub` callback is made by the client's
account (`Account.fast_publisher`): it counts the PUB and matches the
account's sublist; with exactly one plain subscriber, `deliver_direct()`
appends the MSG straight to that client's output bytearray; otherwise the
account frames one shared `Message` and each subscriber's `deliver()`
appends three pre-built pieces of it.  Each output buffer is flushed once
per event-loop turn, so a burst of messages becomes one `transport.write`.
A subscriber whose pending output exceeds `max_pending` is closed as a slow
consumer; nobody ever waits for it.

The client knows the server only through `ClientHost` (below), so this
module imports neither the server nor the monitor.
"""

from __future__ import annotations

import asyncio
import enum
import json
import time
from collections import deque
from typing import Any, Protocol

from node import msgtrace, tls
from node.account import GLOBAL_ACCOUNT, Account
from node.auth import (
    AUTH_TIMEOUT,
    AUTH_VIOLATION,
    CONN_STANDARD,
    Identity,
    SlowCheck,
    pub_violation,
    sub_violation,
)
from node.authqueue import source_of
from node.message import (
    CRLF,
    InternalCallback,
    Message,
    Subscription,
    heads,
    msg_head,
    size_line,
    size_lines,
)
from node.protocol import ProtocolError, ServerParser, writer
from node.protocol.events import Connect, HPub, Ping, Pong, Pub, Sub, Unsub
from node.protocol.parser import ERR_MAX_CONTROL_LINE
from node.subject import subject_matches, valid_literal_subject, valid_queue_name, valid_subject

STALE_CONNECTION = "Stale Connection"
MAX_CONNECTIONS = "maximum connections exceeded"
MAX_ACCOUNT_CONNECTIONS = "maximum account active connections exceeded"
MAX_SUBSCRIPTIONS = "maximum subscriptions exceeded"
AUTH_EXPIRED = "User Authentication Expired"
AUTH_REVOKED = "User Authentication Revoked"
INVALID_SUBJECT = "Invalid Subject"
INVALID_PUB_SUBJECT = "Invalid Publish Subject"
INVALID_QUEUE = "Invalid Queue Name"
NO_RESPONDERS_NEEDS_HEADERS = "no responders requires headers support"

_CRLF, _OK, _PONG, _PING = CRLF, writer.OK, writer.PONG, writer.PING  # module globals: fast
_heads, _msg_head, _size_lines, _size_line = heads, msg_head, size_lines, size_line
# What an internal client may hold undelivered; past it, messages to it are dropped
# (and counted), as a slow consumer's would be.
INTERNAL_QUEUE_MAX = 65536
_INTERNAL_BATCH = 256  # callbacks per loop turn, so one busy client cannot hog the loop


def _connect_too_long(err: ProtocolError) -> bool:
    """A CONNECT line over max_control_line: nats-server answers -ERR 'maximum control
    line exceeded' even under auth (any other op first is an authorization violation)."""
    return err.message == ERR_MAX_CONTROL_LINE and \
        err.detail.upper().replace('"', "'").find("PROTO=B'CONNECT") >= 0


class Kind(enum.Enum):
    """What a client is, with nats-server's names (shown by /connz)."""

    CLIENT = "Client"
    ROUTER = "Router"
    SYSTEM = "System"
    JETSTREAM = "JetStream"
    ACCOUNT = "Account"


class ClientHost(Protocol):
    """What a client needs from the server that runs it."""

    options: Any
    log: Any
    auth: Any
    auth_throttle: Any
    auth_workers: Any
    auth_checks: dict[bytes, Any]  # bcrypt checks queued or running, by digest
    tls_ctx: Any
    tls_first: bool
    slow_consumers: int
    system: Any  # node.sysaccount.SystemService, or None: $SYS events
    stale_connections: int

    def next_cid(self) -> int: ...
    def register(self, client: Client) -> bool: ...
    def unregister(self, client: Client, reason: str) -> None: ...
    def info_for(self, client: Client) -> dict[str, Any]: ...
    def lookup_account(self, name: str) -> Account: ...
# The no-responders status nats-server sends back on the request's reply subject.
_NO_RESPONDERS_HDR = b"NATS/1.0 503\r\n"
# CONNECT defaults of a client that never said otherwise, as nats-server has them.
_DEFAULT_OPTS = {"verbose": True, "pedantic": True, "echo": True}


_TRACE_PAYLOAD_MAX = 128  # payload bytes shown by -V
# What clients read past a CONNECT whose bcrypt check runs off the loop is held, parsed,
# until it ends: bounded per client and for the whole server, so connections piling data
# behind checks (or behind one shared check) cannot grow memory before authenticating.
HELD_MAX = 1 << 20          # bytes one client may hold (a max_payload PUB fits)
HELD_SERVER_MAX = 32 << 20  # bytes all clients together may hold
_HELD_ITEM = 160            # a held item's own cost (tuple, str, bytes objects)


def _redacted(options: dict[str, Any]) -> dict[str, Any]:
    """CONNECT options fit for a log: secrets hidden, as nats-server does."""
    return {k: ("[REDACTED]" if k in ("pass", "auth_token", "sig", "jwt") else v)
            for k, v in options.items()}


_valid_pub_cache: dict[str, bool] = {}
_VALID_PUB_CACHE_MAX = 4096


def _valid_pub_subject(subject: str) -> bool:
    """valid_literal_subject, memoised: pedantic clients re-validate every PUB."""
    ok = _valid_pub_cache.get(subject)
    if ok is None:
        ok = valid_literal_subject(subject)
        if len(_valid_pub_cache) >= _VALID_PUB_CACHE_MAX:
            _valid_pub_cache.clear()
        _valid_pub_cache[subject] = ok
    return ok


class Client(asyncio.Protocol):
    """One client: a NATS connection, or a client inside the server."""

    from_route = False  # see node/cluster/service.py RoutePublisher

    def __init__(self, server: ClientHost, kind: Kind = Kind.CLIENT,
                 conn_type: str = CONN_STANDARD, account: Account | None = None) -> None:
        self.server = server
        self.kind = kind
        self.conn_type = conn_type  # STANDARD or WEBSOCKET (allowed_connection_types)
        # Network clients only: the fast path may write into this client's buffer.
        self.direct_ok = kind is Kind.CLIENT
        # Subscriptions that peers must not learn of (node/cluster/): JetStream's
        # own, since each node's JetStream serves its local clients.
        self.local_only = kind is Kind.JETSTREAM
        self.cid = server.next_cid()
        self.transport: Any = None
        self.loop = asyncio.get_running_loop()
        opts = server.options
        self.parser = ServerParser(opts.max_payload, opts.max_control_line, headers=True)
        self.max_pending = opts.max_pending
        self.subs: dict[str, Subscription] = {}
        self.out = bytearray()
        self.tpending = 0  # transport buffer size seen at the last flush
        self.closed = False
        self.close_reason = ""
        self.connected = False  # CONNECT received
        self.announced = False  # the system account saw its CONNECT event
        self.opts: dict[str, Any] = dict(_DEFAULT_OPTS)
        self.verbose = True
        self.pedantic = True
        self.echo = True
        self.headers = False
        self.no_responders = False
        self.perms: Any = None
        self.user: str | None = None
        self.identity: Identity | None = None
        self.nonce: str | None = None
        # Events read while a bcrypt check runs off the loop (reading is paused meanwhile).
        self._held: list[Any] | None = None
        self._held_bytes = 0
        self.tracing = server.log.trace_enabled
        # Deliveries to this client need checks (permissions, tracing): the fast
        # path's direct write then goes through deliver().
        self.delivery_checks = self.tracing
        self.in_msgs = self.in_bytes = self.out_msgs = self.out_bytes = 0
        self.start = time.time()
        self.last_activity = self.start
        self.pings_out = 0
        self.rtt = 0.0
        self._ping_sent_at = 0.0
        self._active = False  # inbound traffic since the last ping tick
        self._ping_timer: asyncio.TimerHandle | None = None
        self._auth_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None  # armed while the socket is full
        self.host, self.port = "", 0
        self.upgrading = False
        self._first_read_done = False  # the first op is checked (_first_op_allowed)
        # The account whose fast path may take this client's PUBs (see _update_fast);
        # None while per-message checks apply.
        self.fast_account: Account | None = None
        # Until authentication says otherwise, the global account (nothing can be
        # published or subscribed before that when auth is configured).
        self.account = account or server.lookup_account(GLOBAL_ACCOUNT)
        # Counted in account.connections (only after authentication moved it there).
        self.connected_to_account = False
        # nats-server applies the account's (and a JWT user's) max_subscriptions and
        # max_payload to each connection; -1 = none.
        self.max_subs = opts.max_subscriptions if kind is Kind.CLIENT else -1
        self._expiry_timer: asyncio.TimerHandle | None = None
        # Made once per account: the parser calls these for every frame.
        self._pub_cb = self.account.fast_publisher(self)
        self._event_cb = self._on_event
        self._inbox: deque[tuple[Subscription, Message]] | None = None
        self.dropped = 0  # internal clients: messages dropped on a full inbox

    # ------------------------------------------------------------------ internal clients

    @classmethod
    def internal(cls, server: ClientHost, kind: Kind, name: str,
                 account: Account | None = None) -> Client:
        """A client inside the server (system services, JetStream, account
        imports): no transport, always connected, echo on."""
        assert kind is not Kind.CLIENT, "internal clients have an internal kind"
        client = cls(server, kind, account=account)
        client.opts = {**client.opts, "name": name, "verbose": False, "pedantic": False}
        client.verbose = client.pedantic = False
        client.connected = True
        client._inbox = deque()
        client.deliver = client._deliver_internal  # type: ignore[method-assign]
        return client

    def subscribe_internal(self, subject: str, callback: InternalCallback,
                           queue: str | None = None, inline: bool = False) -> Subscription:
        """`callback(sub, subject, reply, headers, payload)` runs from the event
        loop after the publisher's turn; it must not block. `inline`: a network
        client's headerless PUB that this subscription alone matches may run it
        at once, in the publisher's turn (`deliver_inline`); the callback must then
        also be safe to run from inside the parser (it only queues work)."""
        assert self._inbox is not None, "only internal clients subscribe with a callback"
        sub = Subscription(subject, queue, f"i{self.server.next_cid()}", self, callback)
        sub.inline = inline
        self.subs[sub.sid] = sub
        self.account.subscribe(sub)
        return sub

    def publish(self, subject: str, reply: str | None, payload: bytes,
                headers: bytes | None = None) -> int:
        """Publish as this client, into its account; returns deliveries."""
        self.in_msgs += 1
        self.in_bytes += len(payload)
        return self.account.publish(self, subject, reply, headers, payload)

    def _deliver_internal(self, sub: Subscription, msg: Message) -> bool:
        inbox = self._inbox
        if self.closed or inbox is None:
            return False
        if len(inbox) >= INTERNAL_QUEUE_MAX:
            self.dropped += 1
            return False
        if not inbox:
            self.loop.call_soon(self._drain_inbox)
        inbox.append((sub, msg))
        self.out_msgs += 1
        self.out_bytes += msg.size
        sub.delivered += 1
        if sub.max_msgs and sub.delivered >= sub.max_msgs:
            self.account.expire(sub)
        return True

    def deliver_inline(self, sub: Subscription, subject: str, reply: str | None,
                       payload: bytes) -> bool:
        """`_deliver_internal` of a headerless message, its callback run now: no Message
        framed, no inbox turn (a JetStream stream's capture: the publish is proposed in the
        publisher's turn). Only while nothing waits in the inbox, so the callbacks still
        see this client's messages in arrival order; else queued behind them."""
        inbox = self._inbox
        callback = sub.callback
        if inbox or inbox is None or callback is None or self.closed:
            return self._deliver_internal(sub, Message(subject, reply, None, payload))
        self.out_msgs += 1
        self.out_bytes += len(payload)
        sub.delivered += 1
        if sub.max_msgs and sub.delivered >= sub.max_msgs:
            self.account.expire(sub)
            self.account.reap()
        try:
            callback(sub, subject, reply, None, payload)
        except Exception as err:  # noqa: BLE001 - as in _drain_inbox
            self.server.log.error(f"internal client {self.opts.get('name')!r}: "
                                  f"handler for {sub.subject!r} failed: {err!r}")
        return True

    def _drain_inbox(self) -> None:
        inbox = self._inbox
        if inbox is None:
            return
        for _ in range(min(len(inbox), _INTERNAL_BATCH)):
            sub, msg = inbox.popleft()
            if sub.callback is None or self.closed:
                continue
            try:
                sub.callback(sub, msg.subject, msg.reply, msg.headers, msg.payload)
            except Exception as err:  # noqa: BLE001 - one bad handler must not stop the rest
                self.server.log.error(f"internal client {self.opts.get('name')!r}: "
                                      f"handler for {sub.subject!r} failed: {err!r}")
        if inbox:
            self.loop.call_soon(self._drain_inbox)

    def close_internal(self) -> None:
        """Stop an internal client: its subscriptions leave the account."""
        self._teardown("Server Shutdown")

    # ------------------------------------------------------------------ transport

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.host, self.port = peer[0], peer[1]
        server = self.server
        if not server.register(self):
            self._send_info()
            self.send_err(MAX_CONNECTIONS, close=True)
            return
        if server.tls_first and self.conn_type == CONN_STANDARD and not self._key_pinned(transport):
            return
        auth = server.auth
        if auth is not None:
            # no_auth_user leaves auth optional, but nkey users still need the nonce to sign.
            self.nonce = auth.new_nonce()
        if self.conn_type == CONN_STANDARD and server.tls_ctx is not None and not server.tls_first:
            self.upgrading = True  # output waits for the handshake
            transport.pause_reading()
            # INFO goes out next loop turn, once the pause surely holds (uvloop ignores one
            # made in connection_made): a client's ClientHello can only follow INFO.
            self.loop.call_soon(self._start_tls)
        else:
            self._send_info()
            self._arm_auth_timer()
        self._schedule_ping(min(server.options.ping_interval, 2.0))

    def _start_tls(self) -> None:
        if self.closed:
            return
        server = self.server
        self.transport.pause_reading()
        self._send_info()
        timeout = server.options.tls.timeout if server.options.tls else 2.0
        tls.start_upgrade(self.transport, self, server.tls_ctx, timeout, self._tls_done)

    def _arm_auth_timer(self) -> None:
        """The client has auth_timeout to authenticate, counted once TLS is up
        (the handshake has its own timeout), as in nats-server."""
        auth = self.server.auth
        if auth is not None and auth.configured and not self.closed:
            self._auth_timer = self.loop.call_later(auth.auth_timeout, self._auth_timeout)

    def _send_info(self) -> None:
        info = self.server.info_for(self)
        if self.nonce:
            info["nonce"] = self.nonce
        self.transport.write(writer.info(info))

    def _tls_done(self, transport: Any) -> None:
        self.upgrading = False
        if transport is None:
            self.server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                                  "TLS handshake error")
            self._teardown("TLS Handshake Failure")
            return
        self.transport = transport
        if not self._key_pinned(transport):
            return
        self._arm_auth_timer()
        self.flush()

    def recheck_pin(self) -> None:
        """A reload changed tls { pinned_certs }: a client-port client whose key
        the new list leaves out is closed, as nats-server does."""
        if self.conn_type == CONN_STANDARD and not self.upgrading and not self.closed:
            self._key_pinned(self.transport)

    def _key_pinned(self, transport: Any) -> bool:
        """tls { pinned_certs }: a client whose key is not listed is closed."""
        tls_opts = self.server.options.tls
        if tls_opts is None or tls.pinned_ok(transport, tls_opts.pinned_certs):
            return True
        self.server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                              "TLS handshake error: client certificate not pinned")
        self.out.clear()
        self._abort("TLS Handshake Failure")
        return False

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self.upgrading:
            # Bytes that reached us before the TLS handshake took the socket: never
            # parse them as NATS (that would be plain text on a TLS-only port).
            self.server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                                  "TLS handshake error: data before the handshake")
            self._abort("TLS Handshake Failure")
            return
        if not self._first_read_done and not self._first_op_allowed(data):
            return
        self._active = True
        self.last_activity = time.time()
        try:
            self.parser.feed_into(data, self._pub_cb, self._event_cb)
        except ProtocolError as err:
            if self.closed:
                return
            self.server.log.debug(f"{self.host}:{self.port} - cid:{self.cid} - "
                                  f"protocol error: {err}")
            if self._awaiting_connect() and "state=JSON_ARG" not in err.detail \
                    and not _connect_too_long(err) and self._no_auth_identity() is None:
                # nats-server refuses anything but CONNECT first under auth (HPUB included).
                self.send_err(AUTH_VIOLATION, close=True)
            elif getattr(err, "send_err", True):
                self.send_err(err.message, close=err.fatal)
            elif err.fatal:
                self.close("Protocol Violation")

    def _first_op_allowed(self, data: bytes) -> bool:
        """Under auth, the first operation must be CONNECT: refused at its first byte,
        as nats-server does, so an unauthenticated client cannot make the parser buffer
        a PUB's payload (up to max_payload) until the auth timer fires."""
        if not data:
            return True
        self._first_read_done = True
        if data[:1] in (b"C", b"c") or not self._awaiting_connect() \
                or self._no_auth_identity() is not None:
            return True
        self.send_err(AUTH_VIOLATION, close=True)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._teardown(self.close_reason or "Client Closed")

    def pause_writing(self) -> None:
        # We never wait for a client (max_pending bounds its buffer), but one whose socket
        # stays full past write_deadline is cut off as a slow consumer, as in nats-server.
        if self._write_timer is None and not self.closed:
            deadline = self.server.options.write_deadline
            self._write_timer = self.loop.call_later(deadline, self._write_deadline_passed)

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_deadline_passed(self) -> None:
        self._write_timer = None
        deadline = self.server.options.write_deadline
        self.slow_consumer(f"WriteDeadline of {deadline:g}s Exceeded",
                           "Slow Consumer (Write Deadline)")

    # ------------------------------------------------------------------ events

    def on_pub_checked(self, subject: str, reply: str | None, headers: bytes | None,
                       payload: bytes) -> None:
        """A PUB the account's fast path hands back: per-message checks apply."""
        if not self.closed:
            self._on_pub(subject, reply, headers, payload)

    def _on_event(self, ev: Any) -> None:
        if self.closed:
            return  # the rest of a chunk after a close is ignored
        if self._held is not None:
            self._hold(ev, len(getattr(ev, "payload", b"") or b""))
            return
        if self.tracing:
            self._trace_in(ev)
        t = type(ev)
        if t is Pub:
            self._on_pub(ev.subject, ev.reply, None, ev.payload)
        elif t is HPub:
            self._on_pub(ev.subject, ev.reply, ev.headers, ev.payload)
        elif t is not Connect and not self.connected and not self._admit_before_connect():
            return
        elif t is Sub:
            self._on_sub(ev)
        elif t is Unsub:
            self._on_unsub(ev)
        elif t is Ping:
            self.write(_PONG)
        elif t is Pong:
            self._on_pong()
        elif t is Connect:
            self._on_connect(ev.options)

    def _update_fast(self) -> None:
        """PUBs skip every per-message check only when none can apply, and only
        in the account the client is in now (a CONNECT may move it mid-read).
        Never while a CONNECT's check runs off the loop (`_held`): what follows
        that CONNECT in the read must wait for its outcome, and the fast path
        would publish it at once under the previous login."""
        fast = (self.connected and not self.closed and not self.verbose
                and not self.pedantic and self.perms is None and not self.tracing
                and self._held is None)
        self.fast_account = self.account if fast else None

    # ------------------------------------------------------------------ authentication

    def _awaiting_connect(self) -> bool:
        """Authentication is configured and this client has not passed it yet.
        Apart from INFO's auth_required, which no_auth_user turns off."""
        auth = self.server.auth
        return not self.connected and auth is not None and auth.configured

    def _no_auth_identity(self) -> Identity | None:
        auth = self.server.auth
        return auth.no_auth_identity(self.conn_type) if auth is not None else None

    def _admit_before_connect(self) -> bool:
        """An operation other than CONNECT came first. Without auth it just runs;
        with no_auth_user it runs as that user, with that user's permissions (as
        nats-server does); otherwise the client is refused."""
        if not self._awaiting_connect():
            return True
        identity = self._no_auth_identity()
        if identity is None:
            self.send_err(AUTH_VIOLATION, close=True)
            return False
        if not self._set_identity(identity):
            return False
        self.connected = True
        self._update_fast()
        return True

    def _set_identity(self, identity: Identity) -> bool:
        """Log in as `identity`; False (and closed) when its account is full."""
        account = self.server.lookup_account(identity.account)
        if account is not self.account and self.kind is Kind.CLIENT:
            limit = account.max_connections
            if 0 <= limit <= account.connections + account.remote_connections:
                self.server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                                      f"{MAX_ACCOUNT_CONNECTIONS}")
                self.send_err(MAX_ACCOUNT_CONNECTIONS, close=True)
                return False
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        self.identity = identity
        self.user = identity.user
        self.perms = identity.permissions
        self.delivery_checks = self.perms is not None or self.tracing
        if account is not self.account:
            self._move_to(account)
        self._apply_user_limits(identity)
        return True

    def account_changed(self, account: Account) -> None:
        """Operator mode: `account`'s JWT changed (or a router appeared). The
        fast path is re-decided; a user of it whose login no longer passes goes."""
        if self.closed:
            return
        self._update_fast()
        identity = self.identity
        if self.account is not account or identity is None or identity.recheck is None:
            return
        if not identity.recheck():
            self.server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                                  f"{AUTH_REVOKED}")
            self.send_err(AUTH_REVOKED, close=True)
            return
        self._apply_user_limits(identity)

    def peer_cert(self) -> dict | None:
        return tls.peer_cert(self.transport) if self.server.tls_ctx is not None else None

    def limits_reloaded(self) -> None:
        """Config reload: a changed max_payload (the server's or the account's) applies
        to this connection at once, as nats-server applies it to connected clients."""
        identity = self.identity
        own = self.account.max_payload if identity is None \
            else _tighter(self.account.max_payload, identity.max_payload)
        self.parser.max_payload = _tighter(self.server.options.max_payload, own)

    def set_tracing(self, on: bool) -> None:
        """Config reload: -V / trace on or off for this connection."""
        self.tracing = on
        self.delivery_checks = self.perms is not None or on
        self._update_fast()

    def hold(self, perms: Any) -> None:
        """Config reload: nothing in or out until `reauthorized` decides."""
        self.perms = perms
        self.delivery_checks = True
        self._update_fast()

    def over_account_limit(self) -> None:
        """The account's connection limit was lowered below its connections."""
        self.server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                              f"{MAX_ACCOUNT_CONNECTIONS}")
        self.send_err(MAX_ACCOUNT_CONNECTIONS, close=True)

    def removed_by_reload(self) -> None:
        """Config reload: this client's user is gone (or moved to another account)."""
        self.server.log.debug(f"{self.host}:{self.port} - cid:{self.cid} - "
                              "user removed by a config reload")
        self.close("Authentication Failure")

    def reauthorized(self, identity: Identity | None) -> None:
        """Config reload: this client's CONNECT checked against the new config.
        None closes it with -ERR 'Authorization Violation', a user now in another
        account without a word (as nats-server does); otherwise the new
        permissions apply at once and each subscription they deny is removed."""
        if self.closed:
            return
        if identity is None:
            self.send_err(AUTH_VIOLATION, close=True)
            return
        if identity.account != self.account.name:
            self.removed_by_reload()
            return
        self.identity = identity
        self.user = identity.user
        self.perms = identity.permissions
        self.delivery_checks = self.perms is not None or self.tracing
        self._apply_user_limits(identity)
        self._update_fast()
        perms = self.perms
        if perms is None:
            return
        for sub in list(self.subs.values()):
            if not perms.can_subscribe(sub.subject, sub.queue):
                self.remove_sub(sub)
                self.server.log.info(f'Removed sub "{sub.subject}" (sid "{sub.sid}") for '
                                     f'User "{self.user or ""}" - not authorized')
                self.send_err(f'{sub_violation(sub.subject, sub.queue)} (sid "{sub.sid}")')

    def _apply_user_limits(self, identity: Identity) -> None:
        """A JWT user's own limits, on top of its account's; its expiry closes it."""
        own = _tighter(self.account.max_subscriptions, identity.max_subscriptions)
        server_max = self.server.options.max_subscriptions if self.kind is Kind.CLIENT else -1
        self.max_subs = _tighter(server_max, own)
        max_payload = _tighter(self.account.max_payload, identity.max_payload)
        self.parser.max_payload = _tighter(self.server.options.max_payload, max_payload)
        if self._expiry_timer is not None:  # an earlier login's expiry no longer applies
            self._expiry_timer.cancel()
            self._expiry_timer = None
        if identity.expires and self.kind is Kind.CLIENT:
            delay = max(0.0, identity.expires - time.time())
            self._expiry_timer = self.loop.call_later(delay, self._auth_expired)

    def _auth_expired(self) -> None:
        if not self.closed:
            self.server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                                  f"{AUTH_EXPIRED}")
            self.send_err(AUTH_EXPIRED, close=True)

    def _move_to(self, account: Account) -> None:
        """Bind to `account` (a later CONNECT may log in as another user)."""
        subs = list(self.subs.values())
        self.account.unsubscribe_all(subs)
        if self.kind is Kind.CLIENT and self.connected_to_account:
            self.account.connections -= 1
        self.account = account
        if self.kind is Kind.CLIENT:
            account.connections += 1
            self.connected_to_account = True
        self._pub_cb = account.fast_publisher(self)
        self._update_fast()
        for sub in subs:
            account.subscribe(sub)

    def _on_connect(self, options: dict[str, Any]) -> None:
        if options.get("no_responders") and not options.get("headers"):
            self.send_err(NO_RESPONDERS_NEEDS_HEADERS, close=True)
            return
        auth = self.server.auth
        if auth is None:
            self._apply_connect(options)
            return
        # Every CONNECT is authenticated, a second one too, as in nats-server.
        cert = tls.peer_cert(self.transport) if self.server.tls_ctx is not None else None
        result = auth.begin(options, self.nonce, cert, self.conn_type, self.host or None)
        if type(result) is SlowCheck:
            self._check_off_loop(result, options)
        else:
            self._auth_done(options, result)  # type: ignore[arg-type]

    def _auth_done(self, options: dict[str, Any], identity: Identity | None) -> None:
        if identity is None:
            self.server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                                  f'"{options.get("user") or ""}" - authentication error')
            self.opts = {**self.opts, **options}  # what the AUTH.ERR event reports
            self.send_err(AUTH_VIOLATION, close=True)
            return
        if self._set_identity(identity):
            self._apply_connect(options)

    def _apply_connect(self, options: dict[str, Any]) -> None:
        """Options a CONNECT leaves out keep their value (defaults at first)."""
        first = not self.connected
        self.connected = True
        self.opts = {**self.opts, **options}
        o = self.opts
        self.verbose = bool(o.get("verbose"))
        self.pedantic = bool(o.get("pedantic"))
        self.echo = bool(o.get("echo", True))
        self.headers = bool(o.get("headers"))
        self.no_responders = bool(o.get("no_responders"))
        self._update_fast()
        if self.verbose:
            self.write(_OK)
        system = self.server.system
        if first and system is not None and self.kind is Kind.CLIENT:
            self.announced = True
            system.client_connected(self)

    def _check_off_loop(self, check: SlowCheck, options: dict[str, Any]) -> None:
        """Queue a bcrypt check for the server's auth workers, or wait for the
        same check another client queued (a reconnect storm hashes once). Until
        it ends, reading pauses and what was already read waits in `_held`, in order."""
        server = self.server
        pending = server.auth_checks.get(check.digest)
        if pending is not None:
            pending.waiters.append(self)
        else:
            pending = self._start_check(check)
        if pending is None:
            server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                             "too many authentication attempts")
            self._auth_done(options, None)
            return
        self._held = []
        self._update_fast()  # the rest of this read goes to _on_pub, which holds it
        pause = getattr(self.transport, "pause_reading", None)
        if pause is not None:
            pause()
        pending.future.add_done_callback(
            lambda f: self._check_done(check, options, f, pending.auth))

    def _start_check(self, check: SlowCheck) -> _PendingCheck | None:
        """A new check, if the throttle queues one for this client's address.
        Its future ends with the outcome, or None when the check was dropped
        unhashed to make room for a client with a better record."""
        server = self.server
        pending = _PendingCheck(check, self.loop.create_future(), self)
        admission = server.auth_throttle.submit(source_of(self.host or ""), pending,
                                                time.monotonic())
        for dropped in admission.evicted:
            dropped.settle(server, None)
        if not admission.admitted:
            return None
        server.auth_checks[check.digest] = pending
        _run_ready_checks(server, self.loop)
        return pending

    def _hold(self, item: Any, size: int) -> None:
        """Keep `item` for after the check, within the per-client and server budgets."""
        assert self._held is not None
        if self.closed:
            return  # (stays holding, empty: the rest of the read is dropped here)
        size += _HELD_ITEM
        server = self.server
        if self._held_bytes + size > HELD_MAX or \
                server.auth_held_bytes + size > HELD_SERVER_MAX:
            server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                             "too much data before authentication")
            self._held.clear()
            server.auth_held_bytes -= self._held_bytes
            self._held_bytes = 0
            self.send_err(AUTH_VIOLATION, close=True)
            return
        self._held.append(item)
        self._held_bytes += size
        server.auth_held_bytes += size

    def _release_held(self) -> list[Any]:
        held, self._held = self._held or [], None
        self.server.auth_held_bytes -= self._held_bytes
        self._held_bytes = 0
        return held

    def _check_done(self, check: SlowCheck, options: dict[str, Any],
                    future: asyncio.Future[bool | None], auth: Any) -> None:
        server = self.server
        outcome = None if future.cancelled() or future.exception() else future.result()
        held = self._release_held()
        if self.closed:
            return
        if server.auth is not auth:
            # A reload replaced the users while the check waited or ran: its outcome
            # vouches for the old ones (a removed user, a changed password or permissions),
            # and the reload's re-check saw no identity here yet. Authenticate again.
            self._on_connect(options)
            self._replay(held)
            return
        if outcome is None:  # dropped unhashed: refuse, remember nothing
            server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                             "too many authentication attempts")
            self._auth_done(options, None)
            return
        self._auth_done(options, server.auth.finish(check, outcome))
        self._replay(held)

    def _replay(self, held: list[Any]) -> None:
        for i, item in enumerate(held):
            if self.closed:
                return
            if self._held is not None:  # a held CONNECT went off the loop again
                self._held.extend(held[i:])
                return
            if type(item) is tuple:
                self._on_pub(*item)
            else:
                self._on_event(item)
        resume = getattr(self.transport, "resume_reading", None)
        if resume is not None and not self.closed:
            resume()

    # ------------------------------------------------------------------ publish

    def _on_pub(self, subject: str, reply: str | None, headers: bytes | None,
                payload: bytes) -> None:
        if self._held is not None:
            self._hold((subject, reply, headers, payload),
                       len(subject) + len(reply or "") + len(headers or b"") + len(payload))
            return
        if not self.connected and not self._admit_before_connect():
            return
        if self.tracing:
            self._trace_pub(subject, reply, headers, payload)
        self.in_msgs += 1
        self.in_bytes += len(payload) + (len(headers) if headers else 0)
        if self.pedantic and not _valid_pub_subject(subject):
            self.send_err(INVALID_PUB_SUBJECT)  # nats-server still routes it
        perms = self.perms
        if headers is not None and (msgtrace.TRACE_DEST_MARK in headers
                                    or self.account.msg_trace is not None):
            mt = msgtrace.start(headers, len(payload), self.account.msg_trace)
            if mt is not None:
                if msgtrace.TRACE_ORIGIN_MARK not in headers:
                    self._on_traced_pub(mt, subject, reply, headers, payload)
                    return
                # Only a route names the trace's account: from a publisher, nats-server
                # traces nothing and disables the destination (trace-only: delivers nothing).
                if mt.only:
                    return
                headers = msgtrace.origin_disabled(headers)
        premapped = False
        if perms is not None:
            router = self.account.router
            if router is not None and router.mappings_of(self.account):
                # nats-server checks the subject the account's mapping makes.
                subject = router.mapped(self.account, subject)
                premapped = True
            checked = self._domain_mapped(subject)
            if not perms.can_publish(checked, time.monotonic()):
                self.send_err(pub_violation(checked))
                return
        if self.verbose:
            self.write(_OK)
        self.account.publish(self, subject, reply, headers, payload, premapped)

    def _domain_mapped(self, subject: str) -> str:
        """The subject a JetStream domain alias (`$JS.<domain>.API.>`) stands for, in an
        account whose only mapping is the domain's (it has no router, so the account
        mapping step above left the alias as it is). Permissions apply to it, as nats-server
        checks them after mapping: `deny: $JS.API.>` must also hold under the alias.
        The publish itself still goes through the domain router (a fixed mapping)."""
        account = self.account
        prefix = account.domain_prefix
        if prefix is None or not subject.startswith(prefix):
            return subject
        return account.domain_router.mapped(account, subject)

    def _on_traced_pub(self, mt: msgtrace.MsgTrace, subject: str, reply: str | None,
                       headers: bytes, payload: bytes) -> None:
        """A publish with `Nats-Trace-Dest`: routed with the trace active, then the
        events go to the trace destination. A destination the publisher may not
        publish to refuses the whole message (nats-server's -ERR names the
        destination), and no events are sent."""
        perms = self.perms
        now = time.monotonic()
        if perms is not None and not perms.can_publish(mt.dest, now):
            self.send_err(pub_violation(mt.dest))
            return
        name = self.opts.get("name") or ""
        mapped, premapped = subject, False
        router = self.account.router
        if perms is not None and router is not None and router.mappings_of(self.account):
            # As on the untraced path: the permission applies to the subject the
            # account's mapping makes (drawn once); the `in` event names the published one.
            mapped, premapped = router.mapped(self.account, subject), True
        if perms is not None and (aliased := self._domain_mapped(mapped)) != mapped:
            mapped, premapped = aliased, True
        if perms is not None and not perms.can_publish(mapped, now):
            mt.ingress(self.kind.value, self.cid, name, self.account.name, subject,
                       f'Permissions Violation for Publish to "{mapped}"')
            if mapped != subject:
                mt.mapping(mapped)
            self._send_trace(mt)
            self.send_err(pub_violation(mapped))
            return
        if self.verbose:
            self.write(_OK)
        mt.ingress(self.kind.value, self.cid, name, self.account.name, subject)
        if mapped != subject:
            mt.mapping(mapped)
        msgtrace.active = mt
        try:
            self.account.publish(self, mapped, reply, headers, payload, premapped)
        finally:
            msgtrace.active = None
        self._send_trace(mt)

    def _send_trace(self, mt: msgtrace.MsgTrace) -> None:
        """The trace document, published by the server in the publisher's account."""
        system = getattr(self.server, "system", None)
        server = system.server_info() if system is not None else {}
        body = json.dumps(mt.document(server)).encode()
        self.account.publish(None, mt.dest, None, None, body)

    def send_no_responders(self, subject: str, reply: str) -> None:
        """503 status to the requester's own subscription on the reply subject."""
        for sub in self.subs.values():
            if subject_matches(sub.subject, reply):
                hdr = _NO_RESPONDERS_HDR + b"Nats-Subject: " + subject.encode() + b"\r\n\r\n"
                self.deliver(sub, Message(reply, None, hdr, b""))
                if self.account.expired:
                    self.account.reap()
                return

    def _on_sub(self, ev: Sub) -> None:
        subject, queue, sid = ev.subject, ev.queue, ev.sid
        if not valid_subject(subject):
            self.send_err(INVALID_SUBJECT)
            return
        if queue is not None and not valid_queue_name(queue):
            self.send_err(INVALID_QUEUE)
            return
        max_tokens = self.server.options.max_sub_tokens
        if max_tokens > 0 and subject.count(".") >= max_tokens and self.kind is Kind.CLIENT:
            self.server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - Subscription "
                                  f'Violation Too Many Tokens - Subject "{subject}", SID {sid}')
            self.send_err(f'Permissions Violation for Subscription to "{subject}", '
                          "too many tokens")
            return
        perms = self.perms
        if perms is not None and not perms.can_subscribe(subject, queue):
            self.send_err(sub_violation(subject, queue))
            return
        limit = self.max_subs
        if 0 <= limit <= len(self.subs) and sid not in self.subs:
            self.server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                                  f"{MAX_SUBSCRIPTIONS}")
            self.send_err(MAX_SUBSCRIPTIONS)
            return
        if sid not in self.subs:  # a duplicate sid keeps the first subscription
            sub = Subscription(subject, queue or None, sid, self)
            self.subs[sid] = sub
            self.account.subscribe(sub)
        if self.verbose:
            self.write(_OK)

    def _on_unsub(self, ev: Unsub) -> None:
        sub = self.subs.get(ev.sid)
        if sub is not None:
            if ev.max_msgs and ev.max_msgs > sub.delivered:
                sub.max_msgs = ev.max_msgs
            else:
                self.remove_sub(sub)
        if self.verbose:
            self.write(_OK)

    def _on_pong(self) -> None:
        if self.pings_out and self._ping_sent_at:
            self.rtt = time.monotonic() - self._ping_sent_at
        self.pings_out = 0

    def remove_sub(self, sub: Subscription) -> None:
        if sub.dead:
            return
        sub.dead = True
        self.subs.pop(sub.sid, None)
        self.account.unsubscribe(sub)

    # ------------------------------------------------------------------ output

    def deliver(self, sub: Subscription, msg: Message) -> bool:
        """Queue `msg` for `sub`; False when this client may not receive it.
        Called on the publisher's path: never blocks."""
        if self.closed:
            return False
        perms = self.perms
        if perms is not None and not self._may_receive(perms, msg):
            return False
        if self.tracing:
            self._trace_msg(sub, msg)
        out = self.out
        if not out:
            self.loop.call_soon(self.flush)
        if msg.headers is None or self.headers:
            out += msg.head
            out += sub.sid_sp
            out += msg.tail
        else:  # clients that did not ask for headers get the payload only
            out += msg.plain_head
            out += sub.sid_sp
            out += msg.plain_tail
        self.out_msgs += 1
        self.out_bytes += msg.size
        sub.delivered += 1
        if sub.max_msgs and sub.delivered >= sub.max_msgs:
            self.account.expire(sub)
        if len(out) + self.tpending > self.max_pending:
            self.slow_consumer()
        return True

    def deliver_direct(self, sub: Subscription, subject: str, reply: str | None,
                       payload: bytes) -> bool:
        """deliver() of a header-less message without framing a shared Message.

        Only for a single delivery outside any loop over subscriptions: an expired
        auto-unsubscribe is reaped at once.
        """
        if self.closed:
            return False
        if self.delivery_checks:
            ok = self.deliver(sub, Message(subject, reply, None, payload))
            if self.account.expired:
                self.account.reap()
            return ok
        out = self.out
        if not out:
            self.loop.call_soon(self.flush)
        n = len(payload)
        if reply:
            out += _heads.get(subject) or _msg_head(subject)
            out += sub.sid_sp
            out += reply.encode()
            out += b" "
            out += _size_lines.get(n) or _size_line(n)
        else:
            # A stream of same-size messages on one subject has a constant MSG line.
            line = sub.last_line
            if n != sub.last_size or subject != sub.last_subject:
                # (two concatenations cost less than a %-format)
                line = sub.last_line = ((_heads.get(subject) or _msg_head(subject))
                                        + sub.sid_sp + (_size_lines.get(n) or _size_line(n)))
                sub.last_subject = subject
                sub.last_size = n
            out += line
        out += payload
        out += _CRLF
        self.out_msgs += 1
        self.out_bytes += n
        sub.delivered += 1
        if sub.max_msgs and sub.delivered >= sub.max_msgs:
            self.account.expire(sub)
            self.account.reap()
        if len(out) + self.tpending > self.max_pending:
            self.slow_consumer()
        return True

    def _may_receive(self, perms: Any, msg: Message) -> bool:
        if not perms.can_deliver(msg.subject):
            return False
        if msg.reply and perms.tracks_replies:
            perms.note_reply(msg.reply, time.monotonic())
        return True

    def write(self, data: bytes) -> None:
        """Queue protocol bytes; flushed with everything else this loop turn."""
        if self.closed:
            return
        if self.tracing:
            self._trace(f"->> [{bytes(data).rstrip().decode(errors='replace').lstrip('+')}]")
        out = self.out
        if not out:
            self.loop.call_soon(self.flush)
        out += data

    def flush(self) -> None:
        out = self.out
        if not out or self.transport is None or self.upgrading:
            return
        transport = self.transport
        if transport.is_closing():
            out.clear()
            return
        transport.write(bytes(out))
        out.clear()
        self.tpending = transport.get_write_buffer_size()
        if self.tpending > self.max_pending:
            self.slow_consumer()

    def send_err(self, text: str, close: bool = False) -> None:
        self.write(writer.err(text))
        if close:
            self.close(text)

    def slow_consumer(self, why: str = "", reason: str = "Slow Consumer (Pending Bytes)") -> None:
        if self.closed:
            return
        self.server.slow_consumers += 1
        why = why or f"MaxPending of {self.max_pending} Exceeded"
        self.server.log.info(f"{self.host}:{self.port} - cid:{self.cid} - "
                             f"Slow Consumer Detected: {why}")
        self.out.clear()
        self._abort(reason)

    # ------------------------------------------------------------------ lifecycle

    def close(self, reason: str) -> None:
        """Flush what is queued, then close."""
        if self.closed:
            return
        self.flush()
        self.close_reason = reason
        self._teardown(reason)
        if self.transport is not None:
            self.transport.close()

    def _abort(self, reason: str) -> None:
        """Close without flushing: the peer is not reading anyway."""
        self.close_reason = reason
        self._teardown(reason)
        t = self.transport
        if t is not None:
            getattr(t, "abort", t.close)()

    def _teardown(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.fast_account = None
        for timer in (self._ping_timer, self._auth_timer, self._write_timer,
                      self._expiry_timer):
            if timer is not None:
                timer.cancel()
        if self.connected_to_account:
            self.connected_to_account = False
            self.account.connections -= 1
        subs = list(self.subs.values())
        for sub in subs:
            sub.dead = True
        self.subs.clear()
        if subs:
            self.account.unsubscribe_all(subs)
        if self._inbox is not None:
            self._inbox.clear()
        else:
            self.server.unregister(self, reason)

    def _auth_timeout(self) -> None:
        if not self.connected and not self.closed:
            self.send_err(AUTH_TIMEOUT, close=True)

    def _schedule_ping(self, delay: float) -> None:
        if not self.closed and delay > 0:
            self._ping_timer = self.loop.call_later(delay, self._ping_tick)

    def _ping_tick(self) -> None:
        """Keep-alive: PING on idle links, close after ping_max unanswered."""
        if self.closed:
            return
        opts = self.server.options
        if self.pings_out + 1 > opts.ping_max:
            self.server.stale_connections += 1
            self.server.log.debug(f"{self.host}:{self.port} - cid:{self.cid} - "
                                  "Stale Client Connection - Closing")
            self.send_err(STALE_CONNECTION, close=True)
            return
        if not (self._active and self.pings_out == 0 and self.rtt):
            self.pings_out += 1
            self._ping_sent_at = time.monotonic()
            self.write(_PING)
        self._active = False
        self._schedule_ping(opts.ping_interval)

    def send_info_update(self) -> None:
        """An async INFO (new connect_urls) to a client that understands it."""
        if self.closed or not self.connected or int(self.opts.get("protocol") or 0) < 1:
            return
        self.write(writer.info(self.server.info_for(self)))

    def send_lame_duck_info(self) -> None:
        """Tell clients that understand async INFO to go elsewhere."""
        if self.closed or int(self.opts.get("protocol") or 0) < 1:
            return
        info = self.server.info_for(self)
        info["ldm"] = True
        self.write(writer.info(info))

    # ------------------------------------------------------------------ tracing (-V)

    def _trace(self, text: str) -> None:
        self.server.log.trace(f"{self.host}:{self.port} - cid:{self.cid} - {text}")

    def _trace_in(self, ev: Any) -> None:
        """`<<- [OP args]` in nats-server's trace format."""
        t = type(ev)
        if t is Pub or t is HPub:
            return  # traced by _on_pub, which also sees fast-path publishes
        if t is Sub:
            line = " ".join(x for x in ("SUB", ev.subject, ev.queue, ev.sid) if x)
        elif t is Unsub:
            line = f"UNSUB {ev.sid}" + (f" {ev.max_msgs}" if ev.max_msgs else "")
        elif t is Connect:
            line = "CONNECT " + json.dumps(_redacted(ev.options), separators=(",", ":"))
        else:
            line = t.__name__.upper()
        self._trace(f"<<- [{line}]")

    def _trace_pub(self, subject: str, reply: str | None, headers: bytes | None,
                   payload: bytes) -> None:
        args = " ".join(x for x in (subject, reply) if x)
        if headers is None:
            self._trace(f"<<- [PUB {args} {len(payload)}]")
        else:
            self._trace(f"<<- [HPUB {args} {len(headers)} {len(headers) + len(payload)}]")
        self._trace(f"<<- MSG_PAYLOAD: [{payload[:_TRACE_PAYLOAD_MAX]!r}]")

    def _trace_msg(self, sub: Subscription, msg: Message) -> None:
        args = " ".join(x for x in (msg.subject, sub.sid, msg.reply) if x)
        self._trace(f"->> [MSG {args} {len(msg.payload)}]")

    def describe(self) -> dict[str, Any]:
        """Fields for /connz (nats-server names)."""
        return {"name": self.opts.get("name") or "", "lang": self.opts.get("lang") or "",
                "version": self.opts.get("version") or ""}


def _tighter(a: int, b: int) -> int:
    """The stricter of two limits where a negative one means none."""
    if a < 0:
        return b
    return a if b < 0 else min(a, b)


def _check_ok(future: asyncio.Future[bool]) -> bool:
    return not future.cancelled() and future.exception() is None and bool(future.result())


class _PendingCheck:
    """A bcrypt check in the server's AuthThrottle, with the clients waiting
    for it (the one that asked, then any with the same credentials)."""

    __slots__ = ("auth", "check", "future", "waiters")

    def __init__(self, check: SlowCheck, future: asyncio.Future[bool | None],
                 asker: Client) -> None:
        self.check, self.future = check, future
        self.waiters = [asker]
        self.auth = asker.server.auth  # the users the check was begun for

    def wanted(self) -> bool:
        """A check whose clients all went away needs no hashing."""
        return any(not c.closed for c in self.waiters)

    def settle(self, server: Any, outcome: bool | None) -> None:
        if server.auth_checks.get(self.check.digest) is self:
            del server.auth_checks[self.check.digest]
        if not self.future.done():
            self.future.set_result(outcome)


def _run_ready_checks(server: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Hand the checks the throttle lets run now to the auth workers."""
    for host, pending in server.auth_throttle.ready(time.monotonic()):
        if not pending.wanted():
            pending.settle(server, None)
            server.auth_throttle.done(host, None, time.monotonic())
            continue
        try:
            work = loop.run_in_executor(server.auth_workers, pending.check.run)
        except RuntimeError:  # the workers stopped: the server is shutting down
            work = loop.create_future()
            work.set_result(False)
        work.add_done_callback(
            lambda w, host=host, pending=pending: _check_ran(server, loop, host, pending, w))


def _check_ran(server: Any, loop: asyncio.AbstractEventLoop, host: str,
               pending: _PendingCheck, work: asyncio.Future[bool]) -> None:
    ok = _check_ok(work)
    server.auth_throttle.done(host, ok, time.monotonic())
    pending.settle(server, ok)
    _run_ready_checks(server, loop)


# The name the rest of the node used before clients had kinds.
ClientConnection = Client

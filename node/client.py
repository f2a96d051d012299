"""One client connection: parser events in, routed messages out.

`ClientConnection` is an `asyncio.Protocol` that only uses the small
transport surface a WebSocket adapter can also offer (write, close,
is_closing, get_write_buffer_size, get_extra_info), so TCP, TLS and
WebSocket connections share this code.

Hot path (a PUB): the parser's `on_pub` callback (`_on_pub_plain`) -> the
server's sublist match (cached inside the sublist) -> with exactly one plain
subscriber, `deliver_direct()` appends the MSG straight to that client's
output bytearray; otherwise `route()` frames one shared `Message` and each
subscriber's `deliver()` appends three pre-built pieces of it.  Each output
buffer is flushed once per event-loop turn, so a burst of messages becomes
one `transport.write`.  A subscriber whose pending output exceeds
`max_pending` is closed as a slow consumer; nobody ever waits for it.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import TYPE_CHECKING, Any

from node import tls
from node.auth import (
    AUTH_TIMEOUT,
    AUTH_VIOLATION,
    CONN_STANDARD,
    CONN_WEBSOCKET,
    Identity,
    SlowCheck,
    pub_violation,
    sub_violation,
)
from node.protocol import writer
from node.protocol.events import Connect, HPub, Ping, Pong, Pub, Sub, Unsub
from node.protocol.parser import Parser, ProtocolError
from node.subject import subject_matches, valid_literal_subject, valid_queue_name, valid_subject

if TYPE_CHECKING:
    from node.server import Server

STALE_CONNECTION = "Stale Connection"
MAX_CONNECTIONS = "maximum connections exceeded"
INVALID_SUBJECT = "Invalid Subject"
INVALID_PUB_SUBJECT = "Invalid Publish Subject"
INVALID_QUEUE = "Invalid Queue Name"
NO_RESPONDERS_NEEDS_HEADERS = "no responders requires headers support"

_CRLF, _OK, _PONG, _PING = writer.CRLF, writer.OK, writer.PONG, writer.PING  # module globals: fast
# The no-responders status nats-server sends back on the request's reply subject.
_NO_RESPONDERS_HDR = b"NATS/1.0 503\r\n"
# CONNECT defaults of a client that never said otherwise, as nats-server has them.
_DEFAULT_OPTS = {"verbose": True, "pedantic": True, "echo": True}


_TRACE_PAYLOAD_MAX = 128  # payload bytes shown by -V


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


class Subscription:
    """A SUB of one client (or an internal one); stored in the sublist."""

    __slots__ = ("subject", "queue", "sid", "client", "sid_sp", "max_msgs", "delivered", "dead",
                 "direct", "last_subject", "last_size", "last_line")

    def __init__(self, subject: str, queue: str | None, sid: str, client: Any) -> None:
        self.subject = subject
        self.queue = queue
        self.sid = sid
        self.client = client
        self.sid_sp = sid.encode() + b" "  # pre-encoded for every MSG line
        self.max_msgs = 0  # 0: no auto-unsubscribe
        self.delivered = 0
        self.dead = False
        # A plain TCP/TLS/WebSocket client: the single-subscriber fast path may write
        # straight into its buffer (see ClientConnection._on_pub_plain).
        self.direct = type(client) is ClientConnection
        # deliver_direct's last "MSG <subject> <sid> <size>\r\n", reused while it fits.
        self.last_subject = ""
        self.last_size = -1
        self.last_line = b""


_heads: dict[str, bytes] = {}  # subject -> b"MSG <subject> ", reused across messages
_HEADS_MAX = 4096


def _msg_head(subject: str) -> bytes:
    head = _heads.get(subject)
    if head is None:
        if len(_heads) >= _HEADS_MAX:
            _heads.clear()
        head = _heads[subject] = b"MSG %b " % subject.encode()
    return head


_size_lines: dict[int, bytes] = {}  # payload size -> b"<size>\r\n"


def _size_line(n: int) -> bytes:
    line = _size_lines.get(n)
    if line is None:
        if len(_size_lines) >= _HEADS_MAX:
            _size_lines.clear()
        line = _size_lines[n] = b"%d\r\n" % n
    return line


class Message:
    """One published message, framed once and shared by all its deliveries.

    MSG  <subject> <sid> [reply] <len>\\r\\n<payload>\\r\\n
    HMSG <subject> <sid> [reply] <hdr len> <total len>\\r\\n<hdr><payload>\\r\\n
    `head` is everything before the sid, `tail` everything after it.
    """

    __slots__ = ("subject", "reply", "headers", "payload", "head", "tail", "plain_head",
                 "plain_tail", "size")

    def __init__(self, subject: str, reply: str | None, headers: bytes | None,
                 payload: bytes) -> None:
        self.subject = subject
        self.reply = reply
        self.headers = headers
        self.payload = payload
        n = len(payload)
        # Cached pieces and plain concatenation: cheaper than a %-format per frame.
        size = _size_lines.get(n) or _size_line(n)
        if reply:
            tail = reply.encode() + b" " + size + payload + _CRLF
        else:
            tail = size + payload + _CRLF
        head = self.plain_head = _msg_head(subject)
        self.plain_tail = tail
        if headers is None:
            self.head, self.tail, self.size = head, tail, n
        else:
            h = len(headers)
            rep = reply.encode() + b" " if reply else b""
            self.head = b"H" + head
            self.tail = b"%b%d %d\r\n%b%b\r\n" % (rep, h, h + n, headers, payload)
            self.size = h + n


def route(server: Server, publisher: Any, subject: str, reply: str | None,
          headers: bytes | None, payload: bytes) -> int:
    """Deliver a message to every interested subscription; returns deliveries.
    The message is framed only once, and only if someone wants it."""
    result = server.sublist.match(subject)
    psubs, qsubs = result.psubs, result.qsubs
    if not psubs and not qsubs:
        return 0
    msg = Message(subject, reply, headers, payload)
    skip = publisher if (publisher is not None and not publisher.echo) else None
    count = 0
    for sub in psubs:
        if sub.dead or sub.client is skip:
            continue
        if sub.client.deliver(sub, msg):
            count += 1
    if qsubs:
        for members in qsubs.values():
            if _deliver_queue(members, skip, msg):
                count += 1
    if server.expired:
        server.reap()
    return count


def _deliver_queue(members: list, skip: Any, msg: Message) -> bool:
    """One member per queue group gets the message, chosen at random; a member
    that may not receive it (closed, or its permissions deny the subject) passes
    it on to the next, as in nats-server."""
    n = len(members)
    start = random.randrange(n) if n > 1 else 0
    for i in range(n):
        sub = members[(start + i) % n]
        if sub.dead or sub.client is skip:
            continue
        if sub.client.deliver(sub, msg):
            return True
    return False


class ClientConnection(asyncio.Protocol):
    """Protocol state of one NATS client connection."""

    def __init__(self, server: Server, kind: str = "CLIENT") -> None:
        self.server = server
        self.kind = kind
        self.cid = server.next_cid()
        self.transport: Any = None
        self.loop = asyncio.get_running_loop()
        opts = server.options
        self.parser = Parser(opts.max_payload, opts.max_control_line, headers=True)
        self.max_pending = opts.max_pending
        self.subs: dict[str, Subscription] = {}
        self.out = bytearray()
        self.tpending = 0  # transport buffer size seen at the last flush
        self.closed = False
        self.close_reason = ""
        self.connected = False  # CONNECT received
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
        self.tracing = server.log.trace_enabled
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
        self._fast = False  # see _update_fast
        self._match = server.sublist.match
        # Bound once: the parser calls these for every frame.
        self._pub_cb = self._on_pub_plain
        self._event_cb = self._on_event

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
        auth = server.auth
        if auth is not None:
            # no_auth_user leaves auth optional, but nkey users still need the nonce to sign.
            self.nonce = auth.new_nonce()
        self._send_info()
        if self.kind == "CLIENT" and server.tls_ctx is not None and not server.tls_first:
            self.upgrading = True  # output waits for the handshake
            timeout = server.options.tls.timeout if server.options.tls else 2.0
            tls.start_upgrade(transport, self, server.tls_ctx, timeout, self._tls_done)
        else:
            self._arm_auth_timer()
        self._schedule_ping(min(server.options.ping_interval, 2.0))

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
        self._arm_auth_timer()
        self.flush()

    def data_received(self, data: bytes) -> None:
        if self.closed:
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
                    and self._no_auth_identity() is None:
                # nats-server refuses anything but CONNECT first under auth (HPUB included).
                self.send_err(AUTH_VIOLATION, close=True)
            elif getattr(err, "send_err", True):
                self.send_err(err.message, close=err.fatal)
            elif err.fatal:
                self.close("Protocol Violation")

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

    def _on_pub_plain(self, subject: str, reply: str | None, payload: bytes) -> None:
        """The parser's PUB callback; the hottest code in the node.

        With no per-message checks to make (`_update_fast`) and exactly one plain
        subscriber, the MSG is appended straight to that client's buffer: no Message
        object, no route() frame. Everything else goes through route().
        """
        if not self._fast:
            if not self.closed:
                self._on_pub(subject, reply, None, payload)
            return
        self.in_msgs += 1
        self.in_bytes += len(payload)
        result = self._match(subject)
        psubs = result.psubs
        if not result.qsubs:
            if len(psubs) == 1:
                sub = psubs[0]
                if sub.direct and not sub.dead and (self.echo or sub.client is not self):
                    if not sub.client.deliver_direct(sub, subject, reply, payload) and reply \
                            and self.no_responders:
                        self._send_no_responders(subject, reply)
                    return
            elif not psubs:
                if reply and self.no_responders:
                    self._send_no_responders(subject, reply)
                return
        if route(self.server, self, subject, reply, None, payload) == 0 and reply \
                and self.no_responders:
            self._send_no_responders(subject, reply)

    def _on_event(self, ev: Any) -> None:
        if self.closed:
            return  # the rest of a chunk after a close is ignored
        if self._held is not None:
            self._held.append(ev)
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
        """PUBs skip every per-message check only when none can apply."""
        self._fast = (self.connected and not self.closed and not self.verbose
                      and not self.pedantic and self.perms is None and not self.tracing)

    # ------------------------------------------------------------------ authentication

    def _conn_type(self) -> str:
        return CONN_WEBSOCKET if self.kind == "WEBSOCKET" else CONN_STANDARD

    def _awaiting_connect(self) -> bool:
        """Authentication is configured and this client has not passed it yet.
        Apart from INFO's auth_required, which no_auth_user turns off."""
        auth = self.server.auth
        return not self.connected and auth is not None and auth.configured

    def _no_auth_identity(self) -> Identity | None:
        auth = self.server.auth
        return auth.no_auth_identity(self._conn_type()) if auth is not None else None

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
        self._set_identity(identity)
        self.connected = True
        self._update_fast()
        return True

    def _set_identity(self, identity: Identity) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        self.identity = identity
        self.user = identity.user
        self.perms = identity.permissions

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
        result = auth.begin(options, self.nonce, cert, self._conn_type())
        if type(result) is SlowCheck:
            self._check_off_loop(result, options)
        else:
            self._auth_done(options, result)  # type: ignore[arg-type]

    def _auth_done(self, options: dict[str, Any], identity: Identity | None) -> None:
        if identity is None:
            self.server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                                  f'"{options.get("user") or ""}" - authentication error')
            self.send_err(AUTH_VIOLATION, close=True)
            return
        self._set_identity(identity)
        self._apply_connect(options)

    def _apply_connect(self, options: dict[str, Any]) -> None:
        """Options a CONNECT leaves out keep their value (defaults at first)."""
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

    def _check_off_loop(self, check: SlowCheck, options: dict[str, Any]) -> None:
        """Run a bcrypt check in the server's auth workers. Until it ends, reading
        pauses and what was already read waits in `_held`, in order."""
        server = self.server
        if not server.auth_throttle.admit(self.host, time.monotonic()):
            server.log.error(f"{self.host}:{self.port} - cid:{self.cid} - "
                             "too many authentication attempts")
            self._auth_done(options, None)
            return
        self._held = []
        pause = getattr(self.transport, "pause_reading", None)
        if pause is not None:
            pause()
        future = self.loop.run_in_executor(server.auth_workers, check.run)
        future.add_done_callback(lambda f: self._check_done(check, options, f))

    def _check_done(self, check: SlowCheck, options: dict[str, Any],
                    future: asyncio.Future[bool]) -> None:
        ok = not future.cancelled() and future.exception() is None and bool(future.result())
        server = self.server
        server.auth_throttle.done(self.host, ok, time.monotonic())
        identity = server.auth.finish(check, ok)
        held, self._held = self._held or [], None
        if self.closed:
            return
        self._auth_done(options, identity)
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
            self._held.append((subject, reply, headers, payload))
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
        if perms is not None and not perms.can_publish(subject, time.monotonic()):
            self.send_err(pub_violation(subject))
            return
        if self.verbose:
            self.write(_OK)
        if route(self.server, self, subject, reply, headers, payload) == 0 and reply \
                and self.no_responders:
            self._send_no_responders(subject, reply)

    def _send_no_responders(self, subject: str, reply: str) -> None:
        """503 status to the requester's own subscription on the reply subject."""
        for sub in self.subs.values():
            if subject_matches(sub.subject, reply):
                hdr = _NO_RESPONDERS_HDR + b"Nats-Subject: " + subject.encode() + b"\r\n\r\n"
                self.deliver(sub, Message(reply, None, hdr, b""))
                if self.server.expired:
                    self.server.reap()
                return

    def _on_sub(self, ev: Sub) -> None:
        subject, queue, sid = ev.subject, ev.queue, ev.sid
        if not valid_subject(subject):
            self.send_err(INVALID_SUBJECT)
            return
        if queue is not None and not valid_queue_name(queue):
            self.send_err(INVALID_QUEUE)
            return
        perms = self.perms
        if perms is not None and not perms.can_subscribe(subject, queue):
            self.send_err(sub_violation(subject, queue))
            return
        if sid not in self.subs:  # a duplicate sid keeps the first subscription
            sub = Subscription(subject, queue or None, sid, self)
            self.subs[sid] = sub
            self.server.add_sub(sub)
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
        self.server.remove_sub(sub)

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
            self.server.expire(sub)
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
        if self.perms is not None or self.tracing:
            ok = self.deliver(sub, Message(subject, reply, None, payload))
            if self.server.expired:
                self.server.reap()
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
                line = sub.last_line = b"%b%b%d\r\n" % (
                    _heads.get(subject) or _msg_head(subject), sub.sid_sp, n)
                sub.last_subject = subject
                sub.last_size = n
            out += line
        out += payload
        out += _CRLF
        self.out_msgs += 1
        self.out_bytes += n
        sub.delivered += 1
        if sub.max_msgs and sub.delivered >= sub.max_msgs:
            self.server.expire(sub)
            self.server.reap()
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
        self._fast = False
        for timer in (self._ping_timer, self._auth_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        subs = list(self.subs.values())
        for sub in subs:
            sub.dead = True
        self.subs.clear()
        self.server.unregister(self, subs, reason)

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

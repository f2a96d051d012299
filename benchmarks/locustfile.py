"""Locust load for a NATS / JetStream server (jetraft or nats-server): publishes with PubAcks
and consumption through a pull consumer, each operation reported to locust.

    NATS_URLS=nats://127.0.0.1:4222 locust -f benchmarks/locustfile.py --headless \
        -u 20 -r 10 -t 30s --csv /tmp/locust

Environment:
  NATS_URLS     comma list; user i connects to URL i mod n ("any node" of a cluster)
  JS_STREAM     stream name (LOCUST); created if missing, subjects "<stream>.>"
  JS_REPLICAS   replicas when the stream is created (1)
  JS_CONSUMER   durable pull consumer shared by all users (WORKERS), explicit ack
  MSG_SIZE      payload bytes (128)
  FETCH_BATCH   messages per pull request (50)
  OP_TIMEOUT    seconds to wait for a PubAck or a fetch (5)
  FETCH_EXPIRES seconds a pull request waits for a full batch before its 408 (0.5)

Locust runs users as gevent greenlets, so this file speaks the NATS protocol itself over a
(gevent-patched) socket instead of driving nats-py's asyncio client: one reader greenlet per
connection, replies matched by inbox subject. Events: `publish` (PUB to PubAck; failure on
an error reply or a timeout), `fetch` (pull request to the last message of the batch, or to
the 404/408 status that ends it; response_length = messages), `ack` (the +ACK with a reply,
i.e. a double ack: time until the server confirms it).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
import uuid
from typing import Any
from urllib.parse import urlparse

import gevent
from gevent.event import AsyncResult
from gevent.queue import Empty, Queue
from locust import User, between, events, task

URLS = [u for u in os.environ.get("NATS_URLS", "nats://127.0.0.1:4222").split(",") if u]
STREAM = os.environ.get("JS_STREAM", "LOCUST")
REPLICAS = int(os.environ.get("JS_REPLICAS", "1"))
CONSUMER = os.environ.get("JS_CONSUMER", "WORKERS")
SIZE = int(os.environ.get("MSG_SIZE", "128"))
BATCH = int(os.environ.get("FETCH_BATCH", "50"))
TIMEOUT = float(os.environ.get("OP_TIMEOUT", "5"))
EXPIRES = float(os.environ.get("FETCH_EXPIRES", "0.5"))
_user_ids = itertools.count()


class NatsError(Exception):
    pass


class Conn:
    """A minimal NATS client connection: PUB, one wildcard inbox SUB, MSG/HMSG dispatch."""

    def __init__(self, url: str) -> None:
        u = urlparse(url)
        self.sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 4222))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.inbox = f"_INBOX.{uuid.uuid4().hex}"
        self.waiters: dict[str, Any] = {}  # reply subject -> AsyncResult or Queue
        self.seq = itertools.count()
        self.sids = itertools.count(2)  # sid 1: the wildcard inbox of requests
        if not self._line().startswith(b"INFO "):
            raise NatsError("no INFO from server")
        opts = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True,
                "protocol": 1, "lang": "locust", "version": "0"}
        self.sock.sendall(b"CONNECT " + json.dumps(opts).encode() + b"\r\nPING\r\n")
        line = self._line()
        if not line.startswith(b"PONG"):
            raise NatsError(line.decode(errors="replace"))
        self.sock.sendall(f"SUB {self.inbox}.* 1\r\n".encode())
        self.reader = gevent.spawn(self._read_loop)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise NatsError("connection closed")
        self.buf += chunk

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def _read_loop(self) -> None:
        try:
            while True:
                line = self._line()
                if line.startswith(b"MSG ") or line.startswith(b"HMSG "):
                    parts = line.split()
                    hdr_len = int(parts[-2]) if parts[0] == b"HMSG" else 0
                    body = self._exact(int(parts[-1]))
                    reply = parts[3].decode() if len(parts) == (6 if hdr_len else 5) else ""
                    self._dispatch(parts[1].decode(), parts[2].decode(), reply,
                                   body[:hdr_len], body[hdr_len:])
                elif line.startswith(b"PING"):
                    self.sock.sendall(b"PONG\r\n")
                elif line.startswith(b"-ERR"):
                    for w in list(self.waiters.values()):
                        _fail(w, NatsError(line.decode(errors="replace")))
        except (OSError, NatsError) as exc:
            for w in list(self.waiters.values()):
                _fail(w, exc)

    def _dispatch(self, subject: str, sid: str, reply: str, hdr: bytes, data: bytes) -> None:
        # A pull consumer's messages keep their own subject: they are found by the
        # subscription (sid) of the pull request's reply subject instead.
        w = self.waiters.get(subject) if sid == "1" else self.waiters.get("sid:" + sid)
        if isinstance(w, AsyncResult):
            w.set((hdr, data))
        elif isinstance(w, Queue):
            w.put((reply, hdr, data))

    def _reply_subject(self) -> str:
        return f"{self.inbox}.{next(self.seq)}"

    def pub(self, subject: str, data: bytes, reply: str = "") -> None:
        head = f"PUB {subject} {reply} {len(data)}\r\n" if reply else \
            f"PUB {subject} {len(data)}\r\n"
        self.sock.sendall(head.encode() + data + b"\r\n")

    def request(self, subject: str, data: bytes, timeout: float = TIMEOUT) -> tuple[bytes, bytes]:
        reply = self._reply_subject()
        self.waiters[reply] = res = AsyncResult()
        try:
            self.pub(subject, data, reply)
            return res.get(timeout=timeout)
        except gevent.Timeout as exc:
            raise NatsError(f"no reply on {subject} in {timeout}s") from exc
        finally:
            self.waiters.pop(reply, None)

    def fetch(self, stream: str, consumer: str, batch: int,
              timeout: float = TIMEOUT) -> list[tuple[str, bytes]]:
        """One pull request; the (ack subject, data) of what arrived before the batch was
        full or a status (404 no messages / 408 expired) ended it."""
        reply = self._reply_subject()
        sid = str(next(self.sids))
        key = "sid:" + sid
        self.waiters[key] = q = Queue()
        body = json.dumps({"batch": batch, "expires": int(min(EXPIRES, timeout) * 1e9)}).encode()
        out: list[tuple[str, bytes]] = []
        try:
            self.sock.sendall(f"SUB {reply} {sid}\r\n".encode())
            self.pub(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}", body, reply)
            deadline = time.monotonic() + timeout
            while len(out) < batch:
                try:
                    ack, hdr, data = q.get(timeout=max(0.0, deadline - time.monotonic()))
                except Empty:
                    break
                if isinstance(ack, Exception):
                    raise ack
                if hdr.startswith(b"NATS/1.0 4") and not data:
                    break  # 404 / 408 / 409: the request is over
                out.append((ack, data))
        finally:
            self.waiters.pop(key, None)
            self.sock.sendall(f"UNSUB {sid}\r\n".encode())
        return out

    def close(self) -> None:
        self.reader.kill()
        self.sock.close()


def _fail(w: Any, exc: BaseException) -> None:
    if isinstance(w, AsyncResult):
        w.set_exception(exc)
    elif isinstance(w, Queue):
        w.put((exc, b"", b""))


def _api(conn: Conn, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    _hdr, data = conn.request("$JS.API." + subject, json.dumps(body).encode())
    return json.loads(data) if data else {}


def _fire(name: str, start: float, length: int, exc: BaseException | None = None) -> None:
    events.request.fire(request_type="nats", name=name,
                        response_time=(time.perf_counter() - start) * 1000,
                        response_length=length, exception=exc, context={})


class JetStreamUser(User):
    """Publishes with acks and consumes through the shared pull consumer (3:1)."""

    wait_time = between(0, 0.01)

    def on_start(self) -> None:
        self.conn = Conn(URLS[next(_user_ids) % len(URLS)])
        self.payload = os.urandom(SIZE // 2).hex().encode()[:SIZE]
        got = _api(self.conn, f"STREAM.CREATE.{STREAM}",
                   {"name": STREAM, "subjects": [f"{STREAM}.>"], "num_replicas": REPLICAS})
        if "error" in got and got["error"].get("err_code") != 10058:  # 10058: exists
            raise NatsError(f"stream create: {got['error']}")
        got = _api(self.conn, f"CONSUMER.CREATE.{STREAM}.{CONSUMER}",
                   {"stream_name": STREAM, "config": {"durable_name": CONSUMER,
                                                      "ack_policy": "explicit",
                                                      "max_ack_pending": 100000}})
        if "error" in got and got["error"].get("err_code") != 10148:
            raise NatsError(f"consumer create: {got['error']}")

    def on_stop(self) -> None:
        self.conn.close()

    @task(3)
    def publish(self) -> None:
        start = time.perf_counter()
        try:
            _hdr, data = self.conn.request(f"{STREAM}.load", self.payload)
            reply = json.loads(data)
            if "error" in reply:
                raise NatsError(str(reply["error"]))
            _fire("publish", start, len(data))
        except (NatsError, ValueError, OSError) as exc:
            _fire("publish", start, 0, exc)

    @task(1)
    def consume(self) -> None:
        start = time.perf_counter()
        try:
            msgs = self.conn.fetch(STREAM, CONSUMER, BATCH)
            _fire("fetch", start, len(msgs))
        except (NatsError, OSError) as exc:
            _fire("fetch", start, 0, exc)
            return
        for i, (ack, _data) in enumerate(msgs):
            if not ack:
                continue
            if i == len(msgs) - 1:  # the last one double-acked: times the ack path
                t0 = time.perf_counter()
                try:
                    self.conn.request(ack, b"+ACK")
                    _fire("ack", t0, 0)
                except NatsError as exc:
                    _fire("ack", t0, 0, exc)
            else:
                self.conn.pub(ack, b"+ACK")

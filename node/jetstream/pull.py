"""Pull requests (CONSUMER.MSG.NEXT): the waiting queue of one consumer, pure.

The consumer leader keeps the queue; it is not replicated (a new leader starts empty and
clients re-issue their requests, as with nats-server). Time comes in as `now_ns`.

    queue = PullQueue(consumer_cfg)
    statuses = queue.add(now, reply, body)        # 409s refuse a request at once
    target = queue.take(size)                     # which request gets the next message
    statuses = queue.nothing_pending(now)         # 404 for no_wait requests that wait in vain
    statuses = queue.tick(now, last_cseq, last_sseq)  # 408 on expiry, 100 heartbeats

A status is a `Status(reply, header block)` the node publishes to the request's reply subject.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from node.jetstream import gojson
from node.jetstream.headers import format_go_duration
from node.jetstream.priority import PriorityGroups

# nats-server decodes a MSG.NEXT body into an anonymous struct (errors name ".batch").
_INT = gojson.scalar("int")
NEXT_REQUEST = gojson.struct("", {
    "batch": _INT, "expires": gojson.scalar("int64"), "no_wait": gojson.BOOL,
    "max_bytes": _INT, "idle_heartbeat": gojson.scalar("int64"), "heartbeat": _INT,
    "group": gojson.STRING, "id": gojson.STRING, "min_pending": gojson.scalar("int64"),
    "min_ack_pending": gojson.scalar("int64"), "priority": _INT,
})


class BadNext(ValueError):
    """A MSG.NEXT body nats-server answers with `400 Bad Request - <why>`."""


@dataclass(frozen=True, slots=True)
class Status:
    reply: str
    hdr: bytes


def status(reply: str, code: int, text: str, pairs: list[tuple[str, str]] | None = None
           ) -> Status:
    extra = "".join(f"{k}: {v}\r\n" for k, v in pairs or [])
    return Status(reply, f"NATS/1.0 {code} {text}\r\n{extra}\r\n".encode())


@dataclass(slots=True)
class PullRequest:
    reply: str
    remaining: int           # messages still wanted
    bytes_left: int          # 0: no byte limit
    deadline_ns: int         # 0: no expiry
    no_wait: bool
    heartbeat_ns: int
    next_heartbeat_ns: int
    max_bytes: int
    group: str = ""          # priority group (priority.py)
    pin_id: str = ""         # the pinned client's id it carries (or was given)
    min_pending: int = 0     # overflow: served only while this many are pending
    min_ack_pending: int = 0
    added_ns: int = 0        # when it arrived (drop_unheard's grace)


def parse_next(body: bytes) -> dict[str, Any]:
    """A MSG.NEXT body: a JSON object, a bare batch count, or anything else (one message).
    A JSON object that does not decode raises BadNext with Go's reason."""
    text = body.strip()
    if not text:
        return {"batch": 1}
    if text.isdigit():
        return {"batch": int(text)}
    if not text.startswith(b"{"):
        return {"batch": 1}
    try:
        return gojson.decode(text, NEXT_REQUEST)
    except gojson.GoJsonError as exc:
        why = str(exc)
        # json.Unmarshal's words for a truncated document (the decoder says "unexpected EOF")
        raise BadNext("unexpected end of JSON input" if why == "unexpected EOF" else why) \
            from exc


class PullQueue:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.max_waiting = cfg.get("max_waiting") or 512
        self.max_batch = cfg.get("max_batch", 0)
        self.max_expires = cfg.get("max_expires", 0)
        self.max_bytes = cfg.get("max_bytes", 0)
        self.waiting: deque[PullRequest] = deque()
        self.priority = PriorityGroups(cfg)

    def add(self, now_ns: int, reply: str, body: bytes) -> list[Status]:
        try:
            req = parse_next(body)
        except BadNext as exc:
            return [status(reply, 400, f"Bad Request - {exc}")]
        batch = max(int(req.get("batch") or 1), 1)
        expires = int(req.get("expires") or 0)
        max_bytes = int(req.get("max_bytes") or 0)
        refusal = self._refusal(batch, expires, max_bytes)
        if refusal:
            return [status(reply, 409, refusal)]
        refused = self.priority.refuse(req, now_ns)
        if refused is not None:
            pairs = [("Nats-Pending-Messages", str(batch)), ("Nats-Pending-Bytes", "0")] \
                if refused.pending_headers else None
            return [status(reply, refused.code, refused.text, pairs)]
        heartbeat = int(req.get("idle_heartbeat") or 0)
        self.waiting.append(PullRequest(
            reply, batch, max_bytes, now_ns + expires if expires else 0,
            bool(req.get("no_wait")), heartbeat, now_ns + heartbeat if heartbeat else 0,
            max_bytes, req.get("group") or "", req.get("id") or "",
            int(req.get("min_pending") or 0), int(req.get("min_ack_pending") or 0), now_ns))
        return []

    def wanted(self, num_pending: int = 0, num_ack_pending: int = 0) -> int:
        """Messages the requests that may be served now still want."""
        return sum(r.remaining for r in self.waiting
                   if self.priority.eligible(r, num_pending, num_ack_pending))

    def _refusal(self, batch: int, expires: int, max_bytes: int) -> str:
        if self.max_batch > 0 and batch > self.max_batch:
            return f"Exceeded MaxRequestBatch of {self.max_batch}"
        if self.max_expires > 0 and expires > self.max_expires:
            return f"Exceeded MaxRequestExpires of {format_go_duration(self.max_expires)}"
        if self.max_bytes > 0 and max_bytes > self.max_bytes:
            return f"Exceeded MaxRequestMaxBytes of {self.max_bytes}"
        if len(self.waiting) >= self.max_waiting:
            return "Exceeded MaxWaiting"
        return ""

    def take(self, size: int, num_pending: int = 0, num_ack_pending: int = 0
             ) -> tuple[PullRequest | None, list[Status]]:
        """The request that receives a message of `size` bytes (None: nobody waits who may
        be served), and the statuses of requests that cannot take it (their max_bytes is
        too small). Requests a priority group holds back keep their place."""
        refused: list[Status] = []
        for req in list(self.waiting):
            if not self.priority.eligible(req, num_pending, num_ack_pending):
                continue
            if req.max_bytes and size > req.bytes_left:
                self.waiting.remove(req)
                refused.append(status(req.reply, 409, "Message Size Exceeds MaxBytes"))
                continue
            req.remaining -= 1
            if req.max_bytes:
                req.bytes_left -= size
            if req.remaining <= 0:
                self.waiting.remove(req)  # fully served: nats-server sends no status
            return req, refused
        return None, refused

    def drop_unheard(self, has_interest: Callable[[str], bool], now_ns: int = 0,
                     grace_ns: int = 0) -> int:
        """Forget requests whose reply subject nobody listens on any more (a client that
        stopped its consume() or gave up on a fetch), as nats-server does before it
        delivers: a message sent there would sit unacked until ack_wait. No status is sent.
        A request younger than `grace_ns` is kept: in a cluster it may come from another node
        before that node's interest in its inbox has reached this one."""
        keep = deque(r for r in self.waiting
                     if now_ns - r.added_ns < grace_ns or has_interest(r.reply))
        dropped = len(self.waiting) - len(keep)
        self.waiting = keep
        return dropped

    def nothing_pending(self) -> list[Status]:
        """The consumer has nothing to deliver now: every no_wait request ends with 404."""
        done = [r for r in self.waiting if r.no_wait]
        self.waiting = deque(r for r in self.waiting if not r.no_wait)
        return [status(r.reply, 404, "No Messages") for r in done]

    def tick(self, now_ns: int, last_cseq: int, last_sseq: int, beat: bool = True
             ) -> list[Status]:
        """Request timeouts and idle heartbeats due. `beat` False: a delivery round is in
        flight (not idle, and the sequences may count messages not sent yet): the
        heartbeats due are skipped and their wait restarts."""
        out: list[Status] = []
        keep: deque[PullRequest] = deque()
        for req in self.waiting:
            if req.deadline_ns and now_ns >= req.deadline_ns:
                out.append(status(req.reply, 408, "Request Timeout", [
                    ("Nats-Pending-Messages", str(req.remaining)),
                    ("Nats-Pending-Bytes", str(req.bytes_left if req.max_bytes else 0))]))
                continue
            if req.heartbeat_ns and now_ns >= req.next_heartbeat_ns:
                if beat:
                    out.append(status(req.reply, 100, "Idle Heartbeat", [
                        ("Nats-Last-Consumer", str(last_cseq)),
                        ("Nats-Last-Stream", str(last_sseq))]))
                req.next_heartbeat_ns = now_ns + req.heartbeat_ns
            keep.append(req)
        self.waiting = keep
        return out

    def next_deadline(self) -> int | None:
        """When tick() next has something to do."""
        times = [t for r in self.waiting for t in (r.deadline_ns, r.next_heartbeat_ns) if t]
        return min(times, default=None)

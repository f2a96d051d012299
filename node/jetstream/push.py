"""Push consumer pacing: flow control and idle heartbeats, pure (time comes in as `now_ns`).

A push consumer's leader keeps one `PushFlow`; it is not replicated (nats-server keeps the
same bookkeeping in memory on the consumer leader, and a new leader starts afresh).

Flow control (`flow_control: true`), as nats-server 2.15 paces a push consumer:
* every delivered message adds its size (subject + ack reply + headers + data) to the bytes
  in flight;
* once more than half of the window is in flight and no request is out, a
  `100 FlowControl Request` goes to the deliver subject with a fresh `$JS.FC.` reply subject;
* no message is sent while more than the window is in flight;
* the client's (empty) reply to the latest request takes the bytes in flight at the time of
  the request off the count and doubles the window, from 2 MiB up to 32 MiB.

Idle heartbeats (`idle_heartbeat`): when nothing went to the deliver subject for that long and
someone listens there, a `100 Idle Heartbeat` carries the last consumer and stream sequences
(and `Nats-Consumer-Stalled: <reply>` while a flow control request is unanswered).

    flow = PushFlow(cfg)
    n = flow.allowed(sizes)                     # how many of the planned messages may go now
    fc = flow.on_sent(size, now, reply_source)  # after each message: a request to send, or None
    flow.on_reply(subject)                      # the client answered: True -> deliver again
    hdr = flow.heartbeat(now, last_cseq, last_sseq)  # a heartbeat header block, or None
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

FC_PREFIX = "$JS.FC."
WINDOW_LIMIT = 32 * 1024 * 1024  # nats-server's JsFlowControlMaxPending
FIRST_WINDOW = WINDOW_LIMIT // 16
FC_REQUEST = b"NATS/1.0 100 FlowControl Request\r\n\r\n"
_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def fc_subject(stream: str, consumer: str, rand: int) -> str:
    """`$JS.FC.<stream>.<consumer>.<4 base-62 digits of rand>`, nats-server's layout."""
    tail = []
    for _ in range(4):
        tail.append(_DIGITS[rand % 62])
        rand //= 62
    return f"{FC_PREFIX}{stream}.{consumer}.{''.join(tail)}"


def parse_fc_subject(subject: str) -> tuple[str, str] | None:
    """(stream, consumer) of a flow control reply subject; None when it is not one."""
    if not subject.startswith(FC_PREFIX):
        return None
    tokens = subject[len(FC_PREFIX):].split(".")
    if len(tokens) != 3 or not all(tokens):
        return None
    return tokens[0], tokens[1]


def heartbeat_header(last_cseq: int, last_sseq: int, stalled: str = "") -> bytes:
    extra = f"Nats-Consumer-Stalled: {stalled}\r\n" if stalled else ""
    return (f"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: {last_cseq}\r\n"
            f"Nats-Last-Stream: {last_sseq}\r\n{extra}\r\n").encode()


class PushFlow:
    def __init__(self, cfg: dict[str, Any], now_ns: int = 0) -> None:
        self.flow_control = bool(cfg.get("flow_control"))
        self.heartbeat_ns: int = int(cfg.get("idle_heartbeat") or 0)
        self.window = FIRST_WINDOW if self.flow_control else 0
        self.in_flight = 0
        self.fc_reply = ""      # the outstanding request's reply subject ("" : none)
        self.fc_bytes = 0       # bytes in flight when that request went out
        self.next_heartbeat_ns = now_ns + self.heartbeat_ns if self.heartbeat_ns else 0

    def stalled(self) -> bool:
        """More than the window is in flight: nothing may be sent until the client answers."""
        return self.window > 0 and self.in_flight > self.window

    def allowed(self, sizes: Iterable[int]) -> int:
        """How many of the next messages (their sizes, in order) may go now: each one is sent
        only while no more than the window is in flight before it."""
        if not self.window:
            return sum(1 for _ in sizes)
        n, flight = 0, self.in_flight
        for size in sizes:
            if flight > self.window:
                break
            flight += size
            n += 1
        return n

    def on_sent(self, size: int, now_ns: int, reply_source: Callable[[], str]) -> str | None:
        """A message went out: count it, restart the heartbeat wait, and say whether a flow
        control request (with this reply subject) must follow it."""
        if self.heartbeat_ns:
            self.next_heartbeat_ns = now_ns + self.heartbeat_ns
        if not self.window:
            return None
        self.in_flight += size
        if not self.fc_reply and self.in_flight > self.window // 2:
            self.fc_reply = reply_source()
            self.fc_bytes = self.in_flight
            return self.fc_reply
        if self.fc_reply and self.in_flight - self.fc_bytes >= self.window:
            self.fc_bytes += size
        return None

    def on_reply(self, subject: str) -> bool:
        """The client answered a flow control request; only the latest one counts."""
        if not self.fc_reply or subject != self.fc_reply:
            return False
        self.window = min(self.window * 2, WINDOW_LIMIT)
        self.in_flight = max(self.in_flight - self.fc_bytes, 0)
        self.fc_reply, self.fc_bytes = "", 0
        return True

    def heartbeat_due(self, now_ns: int) -> bool:
        return bool(self.heartbeat_ns) and now_ns >= self.next_heartbeat_ns

    def heartbeat(self, now_ns: int, last_cseq: int, last_sseq: int, listening: bool
                  ) -> bytes | None:
        """The heartbeat to send now, if one is due; the wait restarts either way (nats-server
        skips a heartbeat nobody listens to and waits a full period again)."""
        if not self.heartbeat_due(now_ns):
            return None
        self.next_heartbeat_ns = now_ns + self.heartbeat_ns
        if not listening:
            return None
        return heartbeat_header(last_cseq, last_sseq, self.fc_reply)

    def next_deadline(self) -> int | None:
        return self.next_heartbeat_ns or None

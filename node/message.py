"""A published message, framed once, and the subscriptions it is delivered to.

Shared by `node/account.py` (which frames a message once per publish) and
`node/client.py` (which appends the frame's pieces to each subscriber's
output buffer). No I/O here, and no import of the client or the server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from node.protocol import writer

CRLF = writer.CRLF

# An internal subscriber's callback: (sub, subject, reply, headers, payload).
InternalCallback = Callable[[Any, str, "str | None", "bytes | None", bytes], None]


class Subscription:
    """A SUB of one client (or an internal one); stored in the sublist."""

    __slots__ = ("subject", "queue", "sid", "client", "sid_sp", "max_msgs", "delivered", "dead",
                 "direct", "last_subject", "last_size", "last_line", "callback", "inline")

    def __init__(self, subject: str, queue: str | None, sid: str, client: Any,
                 callback: InternalCallback | None = None) -> None:
        self.subject = subject
        self.queue = queue
        self.sid = sid
        self.client = client
        self.sid_sp = sid.encode() + b" "  # pre-encoded for every MSG line
        self.max_msgs = 0  # 0: no auto-unsubscribe
        self.delivered = 0
        self.dead = False
        # A network client: the single-subscriber fast path may write straight into
        # its buffer (see Account.publish_fast).
        self.direct = bool(getattr(client, "direct_ok", False))
        # deliver_direct's last "MSG <subject> <sid> <size>\r\n", reused while it fits.
        self.last_subject = ""
        self.last_size = -1
        self.last_line = b""
        self.callback = callback  # internal subscribers only
        # An internal subscriber whose callback may run at once, inside the publisher's
        # turn, for a headerless PUB it alone matches (Client.deliver_inline).
        self.inline = False


heads: dict[str, bytes] = {}  # subject -> b"MSG <subject> ", reused across messages
_HEADS_MAX = 4096


def msg_head(subject: str) -> bytes:
    head = heads.get(subject)
    if head is None:
        if len(heads) >= _HEADS_MAX:
            heads.clear()
        head = heads[subject] = b"MSG %b " % subject.encode()
    return head


size_lines: dict[int, bytes] = {}  # payload size -> b"<size>\r\n"


def size_line(n: int) -> bytes:
    line = size_lines.get(n)
    if line is None:
        if len(size_lines) >= _HEADS_MAX:
            size_lines.clear()
        line = size_lines[n] = b"%d\r\n" % n
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
        size = size_lines.get(n) or size_line(n)
        if reply:
            tail = reply.encode() + b" " + size + payload + CRLF
        else:
            tail = size + payload + CRLF
        head = self.plain_head = msg_head(subject)
        self.plain_tail = tail
        if headers is None:
            self.head, self.tail, self.size = head, tail, n
        else:
            h = len(headers)
            rep = reply.encode() + b" " if reply else b""
            self.head = b"H" + head
            self.tail = b"%b%d %d\r\n%b%b\r\n" % (rep, h, h + n, headers, payload)
            self.size = h + n

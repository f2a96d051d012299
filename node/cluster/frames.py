"""Core messages on a route, framed compactly. Pure.

A protobuf object per message costs more than the rest of the route path
together, so messages travel as frames packed into one `RouteBatch.frames`
bytes field:

    header  <HHHHBII: account, subject, reply, match_subject lengths,
            queue count, header length + 1 (0: no headers), payload length
    then    account, subject, reply, match_subject (UTF-8), each queue as
            <H length + name, the header block, the payload.

`decode` checks every length against the buffer and raises FrameError on a
malformed batch; the caller drops it whole.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

_HEAD = struct.Struct("<HHHHBII")
_QLEN = struct.Struct("<H")
MAX_QUEUES = 255

Frame = tuple[str, str, "str | None", "bytes | None", bytes, list[str], "str | None"]


class FrameError(ValueError):
    pass


def encode(account: str, subject: str, reply: str | None, headers: bytes | None,
           payload: bytes, queues: list[str], match_subject: str | None) -> bytes:
    a = account.encode()
    s = subject.encode()
    r = reply.encode() if reply else b""
    m = match_subject.encode() if match_subject else b""
    hl = 0 if headers is None else len(headers) + 1
    parts = [_HEAD.pack(len(a), len(s), len(r), len(m), len(queues), hl, len(payload)), a, s, r, m]
    for q in queues:
        qb = q.encode()
        parts.append(_QLEN.pack(len(qb)))
        parts.append(qb)
    if headers:
        parts.append(headers)
    parts.append(payload)
    return b"".join(parts)


def decode(data: bytes) -> Iterator[Frame]:
    if not isinstance(data, bytes):
        data = bytes(data)
    n = len(data)
    pos = 0
    unpack = _HEAD.unpack_from
    qlen = _QLEN.unpack_from
    hsize = _HEAD.size
    try:
        while pos < n:
            if pos + hsize > n:
                raise FrameError("truncated frame header")
            al, sl, rl, ml, nq, hl, pl = unpack(data, pos)
            pos += hsize
            end = pos + al + sl + rl + ml
            if end > n:
                raise FrameError("truncated frame")
            # Slices of the bytes object itself: one copy each (a memoryview slice would
            # be an object more per field, once per message on every route).
            cut = pos + al
            account = data[pos:cut].decode()
            pos, cut = cut, cut + sl
            subject = data[pos:cut].decode()
            pos, cut = cut, cut + rl
            reply = data[pos:cut].decode() if rl else None
            pos, cut = cut, cut + ml
            match = data[pos:cut].decode() if ml else None
            pos = cut
            queues = []
            for _ in range(nq):
                if pos + 2 > n:
                    raise FrameError("truncated queue name")
                (ql,) = qlen(data, pos)
                pos += 2
                if pos + ql > n:
                    raise FrameError("truncated queue name")
                queues.append(data[pos:pos + ql].decode())
                pos += ql
            headers = None
            if hl:
                if pos + hl - 1 > n:
                    raise FrameError("truncated headers")
                headers = data[pos:pos + hl - 1]
                pos += hl - 1
            if pos + pl > n:
                raise FrameError("truncated payload")
            payload = data[pos:pos + pl]
            pos += pl
            yield account, subject, reply, headers, payload, queues, match
    except UnicodeDecodeError as err:
        raise FrameError(f"invalid UTF-8 in a frame: {err}") from None

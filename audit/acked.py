"""The acknowledged-writes file: what clients were told was durable. Pure.

JSON lines, one object per acknowledgement a client received (a chaos run
appends one line per ack):

    {"group": "g0", "data": "w17", "index": 42}
    {"group": "g0", "digest": "9f86d0...", "retried": true}

- `group` (required): the Raft group the write went to.
- `data` (UTF-8 payload, hashed here) or `digest` (hex sha256 of the payload,
  at least the first 32 hex digits): which write.
- `index` (optional): the log index the client was told.
- `retried` (optional): the client resent this write after an unknown outcome,
  so it may legitimately be in the log more than once.

The check: every line's write is in the committed log of its group exactly
once (at least once when `retried`).

JetStream PubAcks name a stream instead of a group (a chaos run or a fault test
writes them):

    {"stream": "ORDERS", "seq": 42, "data": "p0-00017"}

- `stream` (required) and `seq` (optional: the sequence the PubAck gave),
  `data` or `digest` of the message's payload, `retried` as above.
- The stream's group comes from the committed meta log (the last `create` of
  that name); the stream replay hook (audit/hook_jsstream.py) checks that the
  payload was stored exactly once, at `seq`, while it replays the group.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from audit.model import DIGEST_BYTES

_MIN_HEX = 2 * DIGEST_BYTES


class AckFileError(Exception):
    """A line of the acknowledged-writes file that cannot be used."""


@dataclass(frozen=True)
class Ack:
    line: int
    group: str
    digest: bytes  # DIGEST_BYTES of sha256(payload)
    index: int | None
    retried: bool


def digest_of(payload: bytes) -> bytes:
    return hashlib.sha256(payload).digest()[:DIGEST_BYTES]


@dataclass(frozen=True)
class StreamAck:
    """A JetStream PubAck: checked by the stream replay hook, not by the Spark join."""
    line: int
    stream: str
    digest: bytes
    seq: int | None
    retried: bool


def parse_any(text: str, line: int) -> Ack | StreamAck:
    """A line naming a Raft group (Ack) or a JetStream stream (StreamAck)."""
    obj = _load(text, line)
    if isinstance(obj.get("stream"), str) and "group" not in obj:
        seq = _positive(obj, "seq", line)
        return StreamAck(line, obj["stream"], _digest(obj, line), seq,
                         bool(obj.get("retried", False)))
    return parse_line(text, line)


def _load(text: str, line: int) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise AckFileError(f"line {line}: not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise AckFileError(f"line {line}: not a JSON object")
    return obj


def _positive(obj: dict, key: str, line: int) -> int | None:
    value = obj.get(key)
    if value is not None and (not isinstance(value, int) or value < 1):
        raise AckFileError(f"line {line}: {key} must be a positive integer")
    return value


def _digest(obj: dict, line: int) -> bytes:
    if isinstance(obj.get("data"), str):
        return digest_of(obj["data"].encode())
    if isinstance(obj.get("digest"), str) and len(obj["digest"]) >= _MIN_HEX:
        try:
            return bytes.fromhex(obj["digest"][:_MIN_HEX])
        except ValueError:
            raise AckFileError(f"line {line}: digest is not hex") from None
    raise AckFileError(f"line {line}: needs \"data\" or a hex sha256 \"digest\"")


def parse_line(text: str, line: int) -> Ack:
    obj = _load(text, line)
    if not isinstance(obj.get("group"), str):
        raise AckFileError(f"line {line}: needs a \"group\" string (or a \"stream\")")
    digest = _digest(obj, line)
    index = _positive(obj, "index", line)
    return Ack(line, obj["group"], digest, index, bool(obj.get("retried", False)))


def check_file(path: str) -> int:
    """Validate every line, streaming (the executors parse it again); returns the count."""
    n = 0
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, 1):
            if text.strip():
                parse_any(text, line)
                n += 1
    return n


def stream_acks(path: str) -> list[StreamAck]:
    """The JetStream lines of the file, read on the driver (the Spark join takes the rest)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, 1):
            if text.strip():
                a = parse_any(text, line)
                if isinstance(a, StreamAck):
                    out.append(a)
    return out


def parse_numbered(item: tuple[str, int]) -> tuple | None:
    """(text, 0-based line) from Spark's zipWithIndex -> an ack row, None for blank lines."""
    text, zero_based = item
    if not text.strip():
        return None
    a = parse_any(text, zero_based + 1)
    if isinstance(a, StreamAck):
        return None  # the stream replay hook checks it
    return (a.line, a.group, a.digest, a.index, a.retried)

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

JetStream acks (`stream`, `seq`, `msg_id`) map to a group through the stream
replay hook (audit/hooks.py); until it exists a line without `group` is refused.
The check: every line's write is in the committed log of its group exactly
once (at least once when `retried`).
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


def parse_line(text: str, line: int) -> Ack:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise AckFileError(f"line {line}: not JSON: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("group"), str):
        raise AckFileError(f"line {line}: needs a \"group\" string")
    if isinstance(obj.get("data"), str):
        digest = digest_of(obj["data"].encode())
    elif isinstance(obj.get("digest"), str) and len(obj["digest"]) >= _MIN_HEX:
        try:
            digest = bytes.fromhex(obj["digest"][:_MIN_HEX])
        except ValueError:
            raise AckFileError(f"line {line}: digest is not hex") from None
    else:
        raise AckFileError(f"line {line}: needs \"data\" or a hex sha256 \"digest\"")
    index = obj.get("index")
    if index is not None and (not isinstance(index, int) or index < 1):
        raise AckFileError(f"line {line}: index must be a positive integer")
    return Ack(line, obj["group"], digest, index, bool(obj.get("retried", False)))


def check_file(path: str) -> int:
    """Validate every line, streaming (the executors parse it again); returns the count."""
    n = 0
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, 1):
            if text.strip():
                parse_line(text, line)
                n += 1
    return n


def parse_numbered(item: tuple[str, int]) -> tuple | None:
    """(text, 0-based line) from Spark's zipWithIndex -> an ack row, None for blank lines."""
    text, zero_based = item
    if not text.strip():
        return None
    a = parse_line(text, zero_based + 1)
    return (a.line, a.group, a.digest, a.index, a.retried)

"""Events the pure NATS protocol parser emits, one per client operation.

The contract between `node/protocol/parser.py` and `node/client.py`.
Payloads and headers are `bytes` (copies owned by the event), subjects
and sids are `str`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Connect:
    options: dict[str, Any]  # the CONNECT JSON, already decoded and type-checked


@dataclass(frozen=True, slots=True)
class Pub:
    subject: str
    reply: str | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class HPub:
    subject: str
    reply: str | None
    headers: bytes  # the raw header block, from "NATS/1.0" through the blank line
    payload: bytes


@dataclass(frozen=True, slots=True)
class Sub:
    subject: str
    queue: str | None
    sid: str


@dataclass(frozen=True, slots=True)
class Unsub:
    sid: str
    max_msgs: int | None


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Pong:
    pass


Event = Connect | Pub | HPub | Sub | Unsub | Ping | Pong

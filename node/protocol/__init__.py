"""The NATS client protocol, pure: `parser` (client -> server bytes to events) and
`writer` (server -> client encoders). No I/O here."""

from . import writer
from .events import Connect, Event, HPub, Ping, Pong, Pub, Sub, Unsub
from .parser import (
    ERR_MAX_CONTROL_LINE,
    ERR_MAX_PAYLOAD,
    ERR_UNKNOWN_OP,
    Parser,
    ProtocolError,
)

__all__ = [
    "ERR_MAX_CONTROL_LINE",
    "ERR_MAX_PAYLOAD",
    "ERR_UNKNOWN_OP",
    "Connect",
    "Event",
    "HPub",
    "Parser",
    "Ping",
    "Pong",
    "ProtocolError",
    "Pub",
    "Sub",
    "Unsub",
    "writer",
]

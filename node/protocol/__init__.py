"""The NATS client protocol, pure: `parser` (client -> server bytes to events) and
`writer` (server -> client encoders). No I/O here.

`ServerParser` is the Parser the server runs: parser.py compiled by mypyc when that
build exists and matches the source (node/protocol/native.py), else parser.py itself."""

from . import writer
from .errors import ProtocolError
from .events import Connect, Event, HPub, Ping, Pong, Pub, Sub, Unsub
from .native import compiled_parser
from .parser import (
    ERR_MAX_CONTROL_LINE,
    ERR_MAX_PAYLOAD,
    ERR_UNKNOWN_OP,
    Parser,
)

ServerParser: type[Parser] = compiled_parser() or Parser

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
    "ServerParser",
    "Pub",
    "Sub",
    "Unsub",
    "writer",
]

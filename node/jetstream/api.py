"""`$JS.API` subjects -> what they ask for. Pure: no I/O, no node.

    call = route("$JS.API.STREAM.INFO.ORDERS")   # Call("STREAM.INFO", stream="ORDERS")
    route("$JS.API.NOPE")                        # None: no handler (nats-server sends nothing)

The service (`service.py`) keeps one coroutine per `Call.op`; this module only says which one
a subject names and which stream / consumer tokens it carries, so the table can be tested
without a running node and read in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

API_PREFIX = "$JS.API."
ACK_PREFIX = "$JS.ACK."
API_LEVEL = 5  # nats-server 2.15.1's `api_lvl` (INFO) and `api.level` (account info)


@dataclass(frozen=True, slots=True)
class Call:
    op: str              # e.g. "STREAM.CREATE", "CONSUMER.MSG.NEXT"
    stream: str = ""
    consumer: str = ""
    rest: str = ""       # DIRECT.GET's last-by-subject suffix
    account: str = "$G"  # the account whose `$JS.API` it came in on (node/jetstream/jsaccount.py)


# (op, number of name tokens after the op: streams, then consumer). A trailing "+" means
# "and optionally more tokens" (rest).
_TABLE: dict[str, tuple[int, bool]] = {
    "INFO": (0, False),
    "STREAM.CREATE": (1, False),
    "STREAM.UPDATE": (1, False),
    "STREAM.INFO": (1, False),
    "STREAM.DELETE": (1, False),
    "STREAM.PURGE": (1, False),
    "STREAM.NAMES": (0, False),
    "STREAM.LIST": (0, False),
    "STREAM.MSG.GET": (1, False),
    "STREAM.MSG.DELETE": (1, False),
    "STREAM.SNAPSHOT": (1, False),
    "STREAM.RESTORE": (1, False),
    "DIRECT.GET": (1, True),
    "CONSUMER.DURABLE.CREATE": (2, False),
    "CONSUMER.INFO": (2, False),
    "CONSUMER.DELETE": (2, False),
    "CONSUMER.NAMES": (1, False),
    "CONSUMER.LIST": (1, False),
    "CONSUMER.MSG.NEXT": (2, False),
    "CONSUMER.PAUSE": (2, False),
    "CONSUMER.UNPIN": (2, False),
    "STREAM.LEADER.STEPDOWN": (1, False),
    "CONSUMER.LEADER.STEPDOWN": (2, False),
    "META.LEADER.STEPDOWN": (0, False),  # clustered only (node/jetstream/cluster.py)
    "SERVER.REMOVE": (0, False),
    "STREAM.PEER.REMOVE": (1, False),
}


def route(subject: str) -> Call | None:
    """The handler a `$JS.API.` subject names, with its stream/consumer tokens."""
    if not subject.startswith(API_PREFIX):
        return None
    tokens = subject[len(API_PREFIX):].split(".")
    if tokens[:2] == ["CONSUMER", "CREATE"]:
        return _consumer_create(tokens)
    for width in (3, 2, 1):  # longest op first: STREAM.MSG.GET before STREAM.*
        op = ".".join(tokens[:width])
        spec = _TABLE.get(op)
        if spec is None:
            continue
        names, open_ended = spec
        args = tokens[width:]
        if len(args) < names or (len(args) > names and not open_ended):
            return None
        if any(not a for a in args[:names]):
            return None
        stream = args[0] if names >= 1 else ""
        consumer = args[1] if names >= 2 else ""
        return Call(op, stream, consumer, ".".join(args[names:]))
    return None


def _consumer_create(tokens: list[str]) -> Call | None:
    """CONSUMER.CREATE.<stream>[.<consumer>[.<filter...>]]: the filter may hold dots."""
    args = tokens[2:]
    if not args or any(not a for a in args[:2]):
        return None
    return Call("CONSUMER.CREATE", args[0], args[1] if len(args) > 1 else "",
                ".".join(args[2:]))

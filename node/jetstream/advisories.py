"""JetStream advisories (`$JS.EVENT.ADVISORY.>`): subjects and JSON bodies, pure.

The leader publishes them; ids and timestamps are passed in (the node makes them), so a body
is a function of its arguments. API audit advisories carry the client's connection details and
are built by the node from its client record, not here.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "$JS.EVENT.ADVISORY."
TYPE = "io.nats.jetstream.advisory.v1."


def _body(kind: str, event_id: str, timestamp: str, **fields: Any) -> bytes:
    return json.dumps({"type": TYPE + kind, "id": event_id, "timestamp": timestamp, **fields},
                      separators=(",", ":")).encode()


def stream_action(action: str, stream: str, event_id: str, timestamp: str
                  ) -> tuple[str, bytes]:
    """`action`: create, modify or delete."""
    verb = {"create": "CREATED", "modify": "UPDATED", "delete": "DELETED"}[action]
    return (f"{PREFIX}STREAM.{verb}.{stream}",
            _body("stream_action", event_id, timestamp, stream=stream, action=action))


def consumer_action(action: str, stream: str, consumer: str, event_id: str, timestamp: str
                    ) -> tuple[str, bytes]:
    verb = {"create": "CREATED", "delete": "DELETED"}[action]
    return (f"{PREFIX}CONSUMER.{verb}.{stream}.{consumer}",
            _body("consumer_action", event_id, timestamp, stream=stream, consumer=consumer,
                  action=action))


def terminated(stream: str, consumer: str, cseq: int, sseq: int, deliveries: int, reason: str,
               event_id: str, timestamp: str) -> tuple[str, bytes]:
    fields: dict[str, Any] = {"stream": stream, "consumer": consumer, "consumer_seq": cseq,
                              "stream_seq": sseq, "deliveries": deliveries}
    if reason:
        fields["reason"] = reason
    return (f"{PREFIX}CONSUMER.MSG_TERMINATED.{stream}.{consumer}",
            _body("terminated", event_id, timestamp, **fields))


def naked(stream: str, consumer: str, cseq: int, sseq: int, deliveries: int, event_id: str,
          timestamp: str) -> tuple[str, bytes]:
    return (f"{PREFIX}CONSUMER.MSG_NAKED.{stream}.{consumer}",
            _body("nak", event_id, timestamp, stream=stream, consumer=consumer,
                  consumer_seq=cseq, stream_seq=sseq, deliveries=deliveries))


def max_deliveries(stream: str, consumer: str, sseq: int, deliveries: int, event_id: str,
                   timestamp: str) -> tuple[str, bytes]:
    return (f"{PREFIX}CONSUMER.MAX_DELIVERIES.{stream}.{consumer}",
            _body("max_deliver", event_id, timestamp, stream=stream, consumer=consumer,
                  stream_seq=sseq, deliveries=deliveries))


def term_reason(body: bytes) -> str:
    """The reason after `+TERM`, as nats-server forwards it."""
    text = body.strip()
    return text[5:].strip().decode(errors="replace") if text.startswith(b"+TERM") else ""

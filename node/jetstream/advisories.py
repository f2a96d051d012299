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


# Replies nats-server does not audit: message reads and pull requests (checked, 2.15.1).
NOT_AUDITED = frozenset({"STREAM.MSG.GET", "DIRECT.GET", "CONSUMER.MSG.NEXT"})


def api_audit(server: str, client: dict[str, Any], subject: str, request: bytes,
              response: bytes, event_id: str, timestamp: str) -> tuple[str, bytes]:
    """`$JS.EVENT.ADVISORY.API`: one API request and the reply it got, with the requesting
    client's connection details (`client`, in nats-server's ClientInfo shape)."""
    fields: dict[str, Any] = {"server": server, "client": client, "subject": subject}
    if request:  # omitted when empty, as nats-server's omitempty does
        fields["request"] = request.decode(errors="replace")
    fields["response"] = response.decode(errors="replace")
    return f"{PREFIX}API", _body("api_audit", event_id, timestamp, **fields)


def consumer_ack_metric(stream: str, consumer: str, cseq: int, sseq: int, ack_time_ns: int,
                        deliveries: int, event_id: str, timestamp: str) -> tuple[str, bytes]:
    """`$JS.EVENT.METRIC.CONSUMER.ACK.<stream>.<consumer>`, sampled by `sample_freq`."""
    body = json.dumps({"type": "io.nats.jetstream.metric.v1.consumer_ack", "id": event_id,
                       "timestamp": timestamp, "stream": stream, "consumer": consumer,
                       "consumer_seq": cseq, "stream_seq": sseq, "ack_time": ack_time_ns,
                       "deliveries": deliveries}, separators=(",", ":")).encode()
    return f"$JS.EVENT.METRIC.CONSUMER.ACK.{stream}.{consumer}", body


def sample_percent(freq: str) -> int:
    """`sample_freq` ("100%", "30", "") as a percentage 0..100, as nats-server reads it."""
    text = freq.strip().rstrip("%").strip()
    try:
        value = int(text)
    except ValueError:
        return 0
    return max(0, min(value, 100))


def group_pinned(account: str, stream: str, consumer: str, group: str, pin_id: str,
                 event_id: str, timestamp: str) -> tuple[str, bytes]:
    return (f"{PREFIX}CONSUMER.PINNED.{stream}.{consumer}",
            _body("consumer_group_pinned", event_id, timestamp, account=account, stream=stream,
                  consumer=consumer, group=group, pinned_id=pin_id))


def group_unpinned(account: str, stream: str, consumer: str, group: str, reason: str,
                   event_id: str, timestamp: str) -> tuple[str, bytes]:
    """`reason`: "admin" (CONSUMER.UNPIN) or "timeout" (priority_timeout ran out)."""
    return (f"{PREFIX}CONSUMER.UNPINNED.{stream}.{consumer}",
            _body("consumer_group_unpinned", event_id, timestamp, account=account,
                  stream=stream, consumer=consumer, group=group, reason=reason))


def consumer_pause(stream: str, consumer: str, paused: bool, pause_until: str, event_id: str,
                   timestamp: str) -> tuple[str, bytes]:
    """CONSUMER.PAUSE's advisory (`pause_until` the zero time on a resume)."""
    return (f"{PREFIX}CONSUMER.PAUSE.{stream}.{consumer}",
            _body("consumer_pause", event_id, timestamp, stream=stream, consumer=consumer,
                  paused=paused, pause_until=pause_until))


def snapshot_event(kind: str, stream: str, event_id: str, timestamp: str, **fields: Any
                   ) -> tuple[str, bytes]:
    """`kind`: snapshot_create (state), snapshot_complete (start, end), restore_create,
    restore_complete (start, end, bytes); every one carries the requesting `client`."""
    return (f"{PREFIX}STREAM.{kind.upper()}.{stream}",
            _body(kind, event_id, timestamp, stream=stream, **fields))

"""Atomic batch publish (`allow_atomic`): collecting a batch before it is proposed, pure.

A client publishes messages with `Nats-Batch-Id` and `Nats-Batch-Sequence` 1, 2, ...; the last
one carries `Nats-Batch-Commit: 1` (stored too) or `eob` (not stored). The stream leader
collects them here; nothing is proposed until the commit, which becomes ONE `STREAM_BATCH`
Raft entry that the stream applies all-or-nothing (stream.py). Intermediate messages are
answered with an empty reply (flow control), as nats-server does.

    collector = BatchCollector(allow_atomic=True)
    out = collector.add(op)   # -> Reply(s) to send now, and/or a committed list of ops
"""

from __future__ import annotations

from dataclasses import dataclass, field

from node.jetstream import headers as h
from node.jetstream import ops
from node.jetstream.errors import ApiError

BATCH_ID = "Nats-Batch-Id"
BATCH_SEQ = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
MAX_BATCH_ID_LEN = 64
MAX_BATCH_SIZE = 1000
MAX_OPEN_BATCHES = 50  # bounded: an abandoned batch must not hold memory forever
UNSUPPORTED = (h.EXPECTED_LAST_MSG_ID,)
FAST_BATCH_SUFFIX = ".$FI"


def is_fast_batch(reply: str) -> bool:
    """A fast-batch publish (ADR-50 "fast ingest", what nats.js's Object Store sends with
    `allowBatched`): its batch id, flow, gap mode, sequence and operation ride in a reply
    subject ending in `.$FI`. nats-server refuses one to a stream without `allow_batched`
    (10205, nothing stored). Jetraft implements no fast batches, so it refuses them on every
    stream: stored as plain publishes, they left the client waiting for a batch ack that
    never came, with the messages already stored (an object's meta without its chunks)."""
    return reply.endswith(FAST_BATCH_SUFFIX)


@dataclass
class Collected:
    """What the leader does with one published message of a batch."""
    error: ApiError | None = None      # reply with this error (the batch is dropped)
    ack_empty: bool = False            # reply with an empty payload (keep sending)
    committed: list[ops.StreamMsg] = field(default_factory=list)  # propose STREAM_BATCH
    batch_id: str = ""


class BatchCollector:
    def __init__(self, allow_atomic: bool) -> None:
        self.allow_atomic = allow_atomic
        self.open: dict[str, list[ops.StreamMsg]] = {}

    @staticmethod
    def is_batch(op: ops.StreamMsg) -> bool:
        return h.get(op.hdr, BATCH_ID) is not None

    def add(self, op: ops.StreamMsg) -> Collected:
        batch_id = h.get(op.hdr, BATCH_ID) or ""
        try:
            return self._add(batch_id, op)
        except ApiError as err:
            self.open.pop(batch_id, None)
            return Collected(error=err, batch_id=batch_id)

    def _add(self, batch_id: str, op: ops.StreamMsg) -> Collected:
        if not self.allow_atomic:
            raise ApiError.of("JSAtomicPublishDisabledErr")
        if not batch_id or len(batch_id) > MAX_BATCH_ID_LEN:
            raise ApiError.of("JSAtomicPublishInvalidBatchIDErr")
        seq_text = h.get(op.hdr, BATCH_SEQ)
        if seq_text is None:
            raise ApiError.of("JSAtomicPublishMissingSeqErr")
        seq = int(seq_text) if seq_text.strip().isdigit() else 0
        pending = self.open.get(batch_id, [])
        if seq != len(pending) + 1:
            raise ApiError.of("JSAtomicPublishIncompleteBatchErr")
        for name in UNSUPPORTED:
            if h.get(op.hdr, name) is not None:
                raise ApiError.of("JSAtomicPublishUnsupportedHeaderBatchErr", header=name)
        commit = h.get(op.hdr, BATCH_COMMIT)
        if commit is None:
            return self._keep(batch_id, pending, op)
        if commit not in ("1", "eob"):
            raise ApiError.of("JSAtomicPublishInvalidBatchCommitErr")
        self.open.pop(batch_id, None)
        if commit == "1":
            return Collected(committed=pending + [op], batch_id=batch_id)
        if not pending:
            raise ApiError.of("JSAtomicPublishIncompleteBatchErr")
        # `eob`: the commit message is not stored; nats-server marks the batch's last stored
        # message as the commit instead, and answers on the eob message's reply subject.
        last = pending[-1]
        marked = ops.StreamMsg(last.now_ns, last.subject, op.reply,
                               _add_header(last.hdr, BATCH_COMMIT, "1"), last.data)
        return Collected(committed=pending[:-1] + [marked], batch_id=batch_id)

    def _keep(self, batch_id: str, pending: list[ops.StreamMsg], op: ops.StreamMsg
              ) -> Collected:
        if len(pending) + 1 >= MAX_BATCH_SIZE:
            raise ApiError.of("JSAtomicPublishTooLargeBatchErrF", size=MAX_BATCH_SIZE)
        if batch_id not in self.open and len(self.open) >= MAX_OPEN_BATCHES:
            raise ApiError.of("JSAtomicPublishIncompleteBatchErr")
        self.open[batch_id] = pending + [op]
        return Collected(ack_empty=True, batch_id=batch_id)


def _add_header(hdr: bytes, key: str, value: str) -> bytes:
    line = f"{key}: {value}\r\n".encode()
    if not hdr:
        return b"NATS/1.0\r\n" + line + b"\r\n"
    return hdr[:-2] + line + b"\r\n"  # before the blank line that ends the block

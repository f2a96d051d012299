"""`jetstream { request_queue_limit }`: the bound on JetStream API requests being served.

nats-server queues API requests for a pool of workers, info-type requests (account, stream
and consumer info, names and lists) on a queue of their own; once a push brings a queue to
`request_queue_limit` (default 10,000; the info queue's defaults to it), the queue is
drained: every request waiting there is dropped without an answer, and it warns
`JetStream API [info ]queue limit reached, dropping N requests` (checked against 2.15.1).
Jetraft serves each request in a task of its own, so nothing waits for a worker: the
requests being served are the queue, and one that would bring them to the limit is dropped
unanswered (the ones already running finish). Pull requests and direct gets are not API
dispatch in nats-server either: not counted. Pure: the caller passes the clock.
"""

from __future__ import annotations

DEFAULT_LIMIT = 10_000
INFO_OPS = frozenset({"INFO", "STREAM.INFO", "CONSUMER.INFO", "STREAM.NAMES", "STREAM.LIST",
                      "CONSUMER.NAMES", "CONSUMER.LIST"})
NOT_QUEUED = frozenset({"CONSUMER.MSG.NEXT", "DIRECT.GET"})
_NAMES = {False: "JetStream API queue", True: "JetStream API info queue"}


class ApiQueues:
    """Requests being served, per queue (general, info), against the limit."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit if limit > 0 else DEFAULT_LIMIT
        self.pending = {False: 0, True: 0}
        self.dropped = {False: 0, True: 0}  # since the last warning
        self._warned = float("-inf")

    @staticmethod
    def queue_of(op: str) -> bool | None:
        """The queue an API op goes to: True info, False general, None not queued."""
        if op in NOT_QUEUED:
            return None
        return op in INFO_OPS

    def admit(self, info: bool) -> bool:
        """Whether a request may be served now (then `done(info)` when it is)."""
        if self.pending[info] + 1 >= self.limit:
            self.dropped[info] += 1
            return False
        self.pending[info] += 1
        return True

    def done(self, info: bool) -> None:
        self.pending[info] -= 1

    def warning(self, info: bool, now: float) -> str | None:
        """nats-server's warning for the drops so far, at most once a second: nats-server
        rate-limits it by its format, which both queues share (a burst on the info queue
        then one on the other within the window warns once, as 2.15.1 does)."""
        if not self.dropped[info] or now - self._warned < 1.0:
            return None
        self._warned = now
        n, self.dropped[info] = self.dropped[info], 0
        return f"{_NAMES[info]} limit reached, dropping {n} requests"

"""The JetStream API request bound (node/jetstream/apiqueue.py), pure."""

from __future__ import annotations

from node.jetstream.apiqueue import DEFAULT_LIMIT, ApiQueues


def test_queues_limits_and_warnings() -> None:
    assert ApiQueues().limit == DEFAULT_LIMIT == ApiQueues(-3).limit
    assert ApiQueues.queue_of("STREAM.INFO") is True
    assert ApiQueues.queue_of("STREAM.CREATE") is False
    assert ApiQueues.queue_of("CONSUMER.MSG.NEXT") is None
    q = ApiQueues(3)
    # as nats-server: the request that brings a queue to the limit is dropped
    assert [q.admit(False) for _ in range(4)] == [True, True, False, False]
    assert q.admit(True) and q.admit(True) and not q.admit(True)  # the info queue apart
    assert q.warning(False, 10.0) == "JetStream API queue limit reached, dropping 2 requests"
    assert q.warning(True, 10.5) is None  # one warning a second, whichever queue
    assert q.warning(True, 11.0) == "JetStream API info queue limit reached, dropping 1 requests"
    assert q.warning(True, 13.0) is None  # nothing dropped since
    q.done(False)
    assert q.admit(False)

"""PullQueue.drop_unheard: waiting pull requests whose inbox has no subscriber any more are
forgotten before a delivery (nats-server does the same), except within the cluster's grace."""

from __future__ import annotations

from node.jetstream.pull import PullQueue


def _queue(*replies: str, at: int = 0) -> PullQueue:
    q = PullQueue({})
    for reply in replies:
        assert q.add(at, reply, b'{"batch": 5, "expires": 30000000000}') == []
    return q


def test_requests_without_a_listener_are_dropped_silently() -> None:
    q = _queue("_INBOX.gone", "_INBOX.here")
    assert q.drop_unheard(lambda s: s == "_INBOX.here") == 1
    assert [r.reply for r in q.waiting] == ["_INBOX.here"]
    # the next message goes to the request someone still reads
    req, refused = q.take(10)
    assert req is not None and req.reply == "_INBOX.here" and refused == []


def test_young_requests_are_kept_within_the_grace() -> None:
    q = _queue("_INBOX.remote", at=1_000)
    assert q.drop_unheard(lambda s: False, now_ns=1_500, grace_ns=1_000) == 0
    assert q.drop_unheard(lambda s: False, now_ns=2_000, grace_ns=1_000) == 1
    assert not q.waiting

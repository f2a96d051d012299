"""The pure pacing rules of push consumers (node/jetstream/pacing.py): replay original and the
rate limit's token bucket. The wire behaviour next to nats-server:
tests/integration/test_jetstream_replay.py."""

from __future__ import annotations

from node.jetstream.pacing import Pacer

MS = 1_000_000


def test_unpaced_consumers_get_no_pacer() -> None:
    assert Pacer.for_consumer({"replay_policy": "instant"}, 1000, 0) is None
    assert Pacer.for_consumer({}, 1000, 0) is None
    assert Pacer.for_consumer({"replay_policy": "original"}, 1000, 0) is not None
    assert Pacer.for_consumer({"rate_limit_bps": 8}, 1000, 0) is not None


def test_replay_original_waits_the_stored_gaps_until_caught_up() -> None:
    p = Pacer.for_consumer({"replay_policy": "original"}, 1000, 0)
    assert p is not None
    assert p.replay_wait_ns(1_000 * MS) == 0          # the first goes at once
    assert p.replay_wait_ns(1_300 * MS) == 300 * MS   # then as they were published
    assert p.replay_wait_ns(1_301 * MS) == 0          # a millisecond or less: not kept
    assert p.replay_wait_ns(1_200 * MS) == 0          # an older one (a redelivery): none
    p.caught_up()
    assert p.replay_wait_ns(5_000 * MS) == 0          # live after catching up


def test_rate_limit_is_a_token_bucket_with_a_burst() -> None:
    p = Pacer.for_consumer({"rate_limit_bps": 8000}, 1000, 0)  # 1,000 bytes/s
    assert p is not None
    assert p.rate_wait_ns(0, 400) == 0
    assert p.rate_wait_ns(0, 400) == 0                # 800 of the 1,000-byte burst
    assert p.rate_wait_ns(0, 400) == 200 * MS         # 200 bytes short: 0.2 s
    assert p.rate_wait_ns(200 * MS, 400) == 400 * MS  # refilled 200, now 400 short
    assert p.rate_wait_ns(10_000 * MS, 5000) == 0     # bigger than the bucket: one bucket
    assert p.rate_wait_ns(10_000 * MS, 1) > 0

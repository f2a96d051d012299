"""Delivery pacing of a push consumer: `replay_policy: original` and `rate_limit_bps`.

Pure (the caller passes the clock), so the rules are testable without a node:

* **replay original** waits, before each delivery, for the time that separated the message
  from the one delivered before it (its stored timestamps; waits of 1 ms or less are not
  kept), as nats-server does. Once the consumer has caught up with the stream the replay is
  over: later messages go out as they arrive. A new leader (or a new consumer) replays again.
* **rate_limit_bps** is a token bucket of `bps / 8` bytes per second that holds `burst`
  bytes (nats-server: the stream's `max_msg_size`, else the max payload), charged for each
  delivery's subject, ack subject, headers and data; a delivery that finds the bucket short
  waits until it is refilled (the bucket may go negative: the wait is the debt over the rate).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_REPLAY_WAIT_NS = 1_000_000  # nats-server skips replay waits of a millisecond or less


@dataclass
class Pacer:
    replay: bool
    rate_bps: int
    burst: int
    now_ns: int
    last_ts: int = 0
    tokens: float = field(init=False)
    refilled_ns: int = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)
        self.refilled_ns = self.now_ns

    @classmethod
    def for_consumer(cls, cfg: dict[str, object], burst: int, now_ns: int) -> Pacer | None:
        """A pacer when the consumer is paced at all (else None: deliver at once)."""
        replay = cfg.get("replay_policy") == "original"
        rate = int(cfg.get("rate_limit_bps") or 0)  # type: ignore[call-overload]
        if not replay and rate <= 0:
            return None
        return cls(replay, max(rate, 0), max(burst, 1), now_ns)

    def replay_wait_ns(self, ts_ns: int) -> int:
        """The wait before delivering a message stored at `ts_ns` (the last one's time is
        tracked whether or not the replay is still on)."""
        wait = ts_ns - self.last_ts if self.replay and self.last_ts else 0
        self.last_ts = ts_ns
        return wait if wait > MIN_REPLAY_WAIT_NS else 0

    def rate_wait_ns(self, now_ns: int, size: int) -> int:
        """Charge `size` bytes at `now_ns`; the wait before sending them."""
        if self.rate_bps <= 0:
            return 0
        per_s = self.rate_bps / 8
        elapsed = max(now_ns - self.refilled_ns, 0)
        self.tokens = min(float(self.burst), self.tokens + elapsed * per_s / 1e9)
        self.refilled_ns = now_ns
        self.tokens -= min(size, self.burst)  # more than the bucket holds: one full bucket
        return 0 if self.tokens >= 0 else int(-self.tokens / per_s * 1e9)

    def caught_up(self) -> None:
        """Nothing left to deliver: the replay is over (nats-server clears it here too)."""
        self.replay = False

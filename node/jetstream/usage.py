"""Cluster-wide stream usage for the account limits (pure).

A publish is checked against its account's limits by the stream's leader, but the account's
other streams may be led, or only hosted, elsewhere. So every node tells the others, a few
times a second, the bytes of each stream it leads (`encode` / `decode`: a JSON object of
registry key -> bytes); each node keeps the newest figure per stream (`UsageBook`). The
figure for a stream is then: the node's own when it leads it, else the newest report, else
the node's own replica's, else 0 (a stream nobody has reported yet). Like nats-server's
usage updates, a report is up to one interval old: bytes stored in that window elsewhere
are not yet counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

INTERVAL = 0.25  # seconds between reports (nats-server's minimum usage update window)
STALE = 10.0  # a report older than this no longer stands for its stream
# The report's key for the node's replicated consumers (`max_ha_assets`): no stream key is
# empty, and a decoder that predates it takes it for a stream nobody has, then forgets it.
HA_KEY = ""


def encode(streams: Mapping[str, int], ha_consumers: int | None = None) -> bytes:
    body = dict(streams)
    if ha_consumers is not None:
        body[HA_KEY] = ha_consumers
    return json.dumps(body, separators=(",", ":")).encode()


def decode(payload: bytes) -> dict[str, int]:
    """A report; a malformed one reads as empty (a peer's bug must not stop publishes)."""
    try:
        raw = json.loads(payload)
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items()
            if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0}


@dataclass
class UsageBook:
    """The newest reported bytes of each stream: key -> (time received, bytes)."""

    reports: dict[str, tuple[float, int]] = field(default_factory=dict)
    ha: dict[int, int] = field(default_factory=dict)  # peer -> its replicated consumers

    def receive(self, streams: Mapping[str, int], now: float, peer: int = 0) -> None:
        for key, size in streams.items():
            if key == HA_KEY:
                self.ha[peer] = size
                continue
            self.reports[key] = (now, size)

    def forget(self, keys: set[str]) -> None:
        """Streams that no longer exist."""
        for key in keys & self.reports.keys():
            del self.reports[key]

    def bytes_of(self, key: str, now: float, led_here: int | None, hosted_here: int | None
                 ) -> int:
        """The stream's bytes as best this node knows: `led_here` (this node leads it)
        first, then a report not older than STALE, then this node's replica."""
        if led_here is not None:
            return led_here
        report = self.reports.get(key)
        if report is not None and now - report[0] <= STALE:
            return report[1]
        return hosted_here or 0

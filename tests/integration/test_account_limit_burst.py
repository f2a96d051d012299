"""An account's `max_file` under a burst of concurrent publishes (outside review, session 6).

nats-server 2.15 (R1) checks each publish against the bytes already stored, in order: 400
concurrent 1,000-byte publishes to an account with `max_file: 100K` leave 98,976 bytes
stored and the rest refused with 10002. Jetraft checks before the proposal against the
APPLIED bytes only (`service._over_account_limit`: "entries in flight are not counted"), so
every publish of the burst passes the check before the first one applies: measured 400 of
400 acknowledged, 412,400 bytes stored, 4x the limit (load 21). In a cluster the same gap
widens by the 0.25 s usage-report window of the other leaders (docs/notes/review.md).

Marked xfail(strict): it turns into a failure (to be unmarked) the day the bytes proposed
and not yet applied are counted.
"""

from __future__ import annotations

import asyncio

import nats
import pytest

from tests.integration.conftest import Servers

CONF = """
jetstream: enabled
accounts {
  A { users: [{user: a, password: p}], jetstream: { max_file: 100K } }
}
"""
LIMIT = 100 * 1024


@pytest.mark.xfail(strict=True, reason="publishes in flight are not counted against the "
                                       "account's max_file (docs/notes/review.md)")
async def test_a_burst_of_publishes_stays_within_the_accounts_max_file(
        servers: Servers) -> None:
    proc = servers.jetraft(CONF)
    nc = await nats.connect(proc.url, user="a", password="p")
    try:
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s"])
        await asyncio.gather(*[js.publish("s", b"x" * 1000, timeout=20) for _ in range(400)],
                             return_exceptions=True)
        info = await js.stream_info("S")
        assert info.state.bytes <= LIMIT, \
            f"{info.state.bytes} bytes stored, the account's max_file is {LIMIT}"
    finally:
        await nc.close()

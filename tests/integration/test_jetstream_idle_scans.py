"""Streams whose messages can expire are found again after a change, although the 10 Hz
scan of `JetStreamService._tick_loop` now rebuilds its list only when the node's change
mark moved (node/jetstream/changes.py; before, it read every stream's config 10 times a
second, ~1 % of a core with 1,000 idle streams).

The stream is created with no `max_age`, takes its messages, then an update sets a
`max_age` they are younger than, and nothing else happens: on nats-server and here the
messages are gone within a few seconds. Mutation (docs/notes/scale14.md): without the move
after an apply (`StreamMachine.apply_batch`), the update leaves the list as it was and
nothing expires."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import nats

CONF = 'jetstream { store_dir: "%s" }\n'


async def _expires_after_update(url: str) -> float:
    nc = await nats.connect(url)

    async def api(op: str, body: Any = None) -> Any:
        msg = await nc.request(f"$JS.API.{op}", json.dumps(body or {}).encode(), timeout=5)
        return json.loads(msg.data)

    try:
        made = await api("STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"]})
        assert "error" not in made, made
        for i in range(3):
            ack = await nc.request(f"s.{i}", b"x", timeout=5)
            assert b'"seq"' in ack.data, ack.data
        # Younger than the max_age set now: the update's own apply removes nothing, so
        # only a later expiry (the leader's scan, then an EXPIRE entry) can.
        upd = await api("STREAM.UPDATE.S", {"name": "S", "subjects": ["s.>"],
                                            "max_age": 1_500_000_000})
        assert "error" not in upd, upd
        t0 = time.monotonic()
        while time.monotonic() - t0 < 8:
            info = await api("STREAM.INFO.S")
            if time.monotonic() - t0 < 0.5:
                assert info["state"]["messages"] == 3, info  # not yet
            if info["state"]["messages"] == 0:
                return time.monotonic() - t0
            await asyncio.sleep(0.1)
        raise AssertionError(f"nothing expired after the update: {info['state']}")
    finally:
        await nc.close()


def test_max_age_set_by_an_update_expires_with_no_publish_after(servers: Any,
                                                                  tmp_path: Path) -> None:
    theirs = servers.nats_server(CONF % (tmp_path / "theirs"))
    ours = servers.jetraft(CONF % (tmp_path / "ours"))
    assert asyncio.run(_expires_after_update(theirs.url)) < 8
    assert asyncio.run(_expires_after_update(ours.url)) < 8

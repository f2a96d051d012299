"""A consumer whose next message's record fails its CRC passes over it (logged) and keeps
delivering the intact ones; before, its pump met the error every round and fetches timed
out. Damage as in test_store_integrity (bytes flipped in data.mdb while the node is down)."""

from __future__ import annotations

import signal
from pathlib import Path

import nats
import pytest

from tests.durability.test_store_integrity import BAD, N, _fill, _flip, _payload, _start
from tests.integration.conftest import Servers


# A wildcard filter reads each message's subject: the damaged one reads as gone. No filter
# (and a literal one) plans it from the indexes: the load fails and the pump skips it, logged.
@pytest.mark.parametrize(("ack_policy", "filt"),
                         [("explicit", "i.*"), ("explicit", ""), ("none", "")])
async def test_a_consumer_skips_a_damaged_record_and_delivers_the_rest(
        servers: Servers, tmp_path: Path, ack_policy: str, filt: str) -> None:
    store = tmp_path / "store"
    node = _start(servers, store)
    await _fill(node.url)
    assert node.stop(signal.SIGTERM) == 0
    assert _flip(store / "lmdb" / "data.mdb", _payload(BAD)[:9], 5) >= 1

    node = _start(servers, store)
    nc = await nats.connect(node.url)
    js = nc.jetstream()
    try:
        await js.add_consumer("I", nats.js.api.ConsumerConfig(
            durable_name="c", ack_policy=ack_policy, filter_subject=filt or None))
        psub = await js.pull_subscribe_bind("c", stream="I")
        got: list[int] = []
        while len(got) < N - 1:
            batch = await psub.fetch(N, timeout=5)
            for m in batch:
                assert m.data == _payload(m.metadata.sequence.stream)
                got.append(m.metadata.sequence.stream)
                if ack_policy == "explicit":
                    await m.ack_sync()
        assert got == [s for s in range(1, N + 1) if s != BAD]
        info = await js.consumer_info("I", "c")
        assert info.num_pending == 0 and info.num_ack_pending == 0, info
        assert (await js.publish("i.new", b"after")).seq == N + 1
        assert (await psub.fetch(1, timeout=5))[0].data == b"after"
    finally:
        await nc.close()
    assert node.alive()
    log = node.log_text()
    assert "task failed" not in log, log[-3000:]
    assert (f"skipping message {BAD}" in log) == (not filt), log[-3000:]

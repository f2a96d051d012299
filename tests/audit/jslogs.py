"""Real JetStream data directories for the audit tests: one `jetraft serve -js` run.

The run creates two streams and deletes a third (create + delete in the meta log), publishes
with headers and message ids (a duplicate among them), deletes a message, purges a subject,
updates a stream's limits (UPDATE_CONFIG, which removes old messages), and runs a pull
consumer that fetches and acks part of what it got (ack floor, pending). Then the node stops
(SIGTERM) and the audit reads its store_dir: `raft/wal` and `lmdb/`.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import nats

from tests.integration.conftest import Servers


async def make_js_logs(root: Path, key: str | None = None,
                       cipher: str = "chacha") -> dict[str, Any]:
    """`key`: the node runs with `jetstream { key, cipher }` (encrypted at rest)."""
    servers = Servers(root)
    store = root / "n1"
    try:
        if key is None:
            node = servers.jetraft(args=["-js", "-sd", str(store)])
        else:
            node = servers.jetraft(config=f"jetstream {{ store_dir: {json.dumps(str(store))}, "
                                   f"key: {json.dumps(key)}, cipher: {cipher} }}\n")
        nc = await nats.connect(node.url)
        js = nc.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.*"])
        await js.add_stream(name="GONE", subjects=["gone"])
        await js.publish("gone", b"x")
        await js.delete_stream("GONE")
        await js.add_stream(name="EVENTS", subjects=["ev.>"], max_msgs_per_subject=5)
        for i in range(60):
            await js.publish(f"orders.{i % 4}", f"order {i}".encode(),
                             headers={"Nats-Msg-Id": f"id-{i}", "X-Kind": "test"})
        await js.publish("orders.0", b"dup", headers={"Nats-Msg-Id": "id-3"})  # duplicate
        for i in range(30):
            await js.publish(f"ev.{i % 3}.x", f"event {i}".encode())
        await js.delete_msg("ORDERS", 10)
        await js.purge_stream("EVENTS", subject="ev.2.x")
        await js.update_stream(name="EVENTS", subjects=["ev.>"], max_msgs_per_subject=2)
        psub = await js.pull_subscribe("orders.*", "worker", stream="ORDERS")
        got = await psub.fetch(25, timeout=5)
        for m in got[:20]:
            await m.ack_sync()
        await nc.close()
        assert node.stop(signal.SIGTERM) == 0
    finally:
        servers.stop_all()
    return {"dirs": [store]}

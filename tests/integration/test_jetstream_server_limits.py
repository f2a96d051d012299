"""`jetstream { limits {} }` against nats-server 2.15: the server-wide duplicate window,
consumer max_ack_pending and max_request_batch, as defaults and as caps (and
`max_ha_assets`, which a standalone server never reaches), with the same
nats-py script on both and each reply compared whole (issue 8, the `jetstream {}` block)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats

CONF = """
jetstream {
  store_dir: "%s"
  limits { max_ack_pending: 100, max_request_batch: 50, duplicate_window: 30s,
           max_ha_assets: 1 }
}
"""
# fields that differ by nature (times, generated names)
_VOLATILE = {"created", "ts", "time", "name", "cluster", "delivered", "ack_floor"}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in _VOLATILE}
    return value


async def _script(url: str) -> list[Any]:
    nc = await nats.connect(url)

    async def api(op: str, body: Any) -> Any:
        msg = await nc.request(f"$JS.API.{op}", json.dumps(body).encode(), timeout=5)
        return _strip(json.loads(msg.data))

    def consumer(name: str, **cfg: Any) -> Any:
        return api(f"CONSUMER.CREATE.A.{name}",
                   {"stream_name": "A", "config": {"durable_name": name, **cfg}})

    try:
        out = [
            await api("STREAM.CREATE.A", {"name": "A", "subjects": ["a"]}),
            await api("STREAM.CREATE.B", {"name": "B", "subjects": ["b"],
                                          "duplicate_window": 60_000_000_000}),
            await api("STREAM.CREATE.C", {"name": "C", "subjects": ["c"],
                                          "duplicate_window": 10_000_000_000}),
            await api("STREAM.CREATE.D", {"name": "D", "subjects": ["d"],
                                          "max_age": 5_000_000_000}),
            await api("STREAM.UPDATE.C", {"name": "C", "subjects": ["c"],
                                          "duplicate_window": 40_000_000_000}),
            await api("STREAM.CREATE.A", {"name": "A", "subjects": ["a"]}),  # the same again
            # max_ha_assets: standalone, nothing is replicated (nor counted)
            await api("STREAM.CREATE.R", {"name": "R", "subjects": ["r"], "num_replicas": 3}),
            await api("STREAM.CREATE.R2", {"name": "R2", "subjects": ["r2"]}),
            await consumer("c1", ack_policy="explicit"),
            await consumer("c2", ack_policy="explicit", max_ack_pending=500),
            await consumer("c3", ack_policy="explicit", max_batch=500),
            await consumer("c4", ack_policy="explicit", max_ack_pending=-1),
            await consumer("c5", ack_policy="none"),
            await consumer("c6", ack_policy="explicit", max_ack_pending=80, max_batch=20),
            await consumer("c1", ack_policy="explicit"),  # the same again
        ]
        nxt = await nc.request("$JS.API.CONSUMER.MSG.NEXT.A.c1",
                               json.dumps({"batch": 100, "no_wait": True}).encode(), timeout=5)
        out.append({"status": (nxt.headers or {}).get("Status"),
                    "description": (nxt.headers or {}).get("Description")})
        return out
    finally:
        await nc.close()


def test_server_limits_as_nats_server(servers: Any, tmp_path: Path) -> None:
    theirs = servers.nats_server(CONF % (tmp_path / "theirs"))
    ours = servers.jetraft(CONF % (tmp_path / "ours"))
    want = asyncio.run(_script(theirs.url))
    got = asyncio.run(_script(ours.url))
    for step, (mine, oracle) in enumerate(zip(got, want, strict=True)):
        assert mine == oracle, f"step {step}"
    # the script exercises each limit: a default lowered and a request refused
    assert want[0]["config"]["duplicate_window"] == 30_000_000_000
    assert want[1]["error"]["err_code"] == 10052
    assert want[8]["config"]["max_ack_pending"] == 100
    assert want[8]["config"]["max_batch"] == 50
    assert want[9]["error"]["err_code"] == 10121 and want[10]["error"]["err_code"] == 10125
    assert want[6]["error"]["err_code"] == 10074 and "error" not in want[7]

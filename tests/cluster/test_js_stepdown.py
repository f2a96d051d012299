"""STREAM.LEADER.STEPDOWN with a `placement.preferred` body (nats-server 2.11+), next to a
3-node nats-server 2.15.1 cluster: the same script, the same replies (the bad-JSON text is
Go's own parser message: only its codes are compared)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.cluster.jshelp import JsCluster, api, until
from tests.cluster.test_js_diff import nats3  # noqa: F401 (the nats-server cluster fixture)


@pytest.fixture
def ours(tmp_path: Path) -> Iterator[list[str]]:
    c = JsCluster(tmp_path / "c", 3)
    try:
        c.start()
        c.wait_js()
        yield [n.url for n in c.nodes]
    finally:
        c.stop()


async def _script(url: str) -> list[Any]:
    nc = await nats.connect(url)
    try:
        deadline = time.monotonic() + 30
        while True:  # until the cluster has its meta leader
            try:
                r = await api(nc, "STREAM.CREATE.D", {"name": "D", "subjects": ["d"],
                                                      "num_replicas": 3}, timeout=3)
                if "error" not in r:
                    break
            except Exception:  # noqa: BLE001 (no responders / timeout while forming)
                pass
            assert time.monotonic() < deadline, "no meta leader"
            await asyncio.sleep(0.3)

        async def current() -> Any:
            r = await api(nc, "STREAM.INFO.D")
            reps = r.get("cluster", {}).get("replicas") or []
            return r if len(reps) == 2 and all(x["current"] for x in reps) else None

        info = await until(current, timeout=30)
        other = sorted(x["name"] for x in info["cluster"]["replicas"])[0]
        out: list[Any] = []
        out.append(await api(nc, "STREAM.LEADER.STEPDOWN.D", {"placement": {"preferred": other}}))
        await until(lambda: _leads(nc, other), timeout=30)
        out.append(await api(nc, "STREAM.LEADER.STEPDOWN.D", {"placement": {"preferred": "nope"}}))
        out.append(await api(nc, "STREAM.LEADER.STEPDOWN.D", {"placement": {"preferred": other}}))
        msg = await nc.request("$JS.API.STREAM.LEADER.STEPDOWN.D", b"{bad", timeout=10)
        bad = json.loads(msg.data)
        out.append({"code": bad["error"]["code"], "err_code": bad["error"]["err_code"]})
        # the peer chosen differs between the clusters (their first leaders differ)
        return json.loads(json.dumps(out).replace(f'\\"{other}\\"', '\\"<other>\\"'))
    finally:
        await nc.close()


async def _leads(nc: nats.NATS, name: str) -> bool:
    r = await api(nc, "STREAM.INFO.D")
    return bool(r.get("cluster", {}).get("leader") == name)


async def test_stream_stepdown_to_a_preferred_peer_as_nats_server(
        nats3: list[str], ours: list[str]) -> None:  # noqa: F811
    theirs = await _script(nats3[0])
    mine = await _script(ours[0])
    assert mine == theirs

"""STREAM.INFO / CONSUMER.INFO of an R3 stream on a 3-node jetraft cluster next to a 3-node
nats-server 2.15.1 cluster (routes, same script): the key sets of the replies, of their
`cluster` object and of each replica must match (values differ: names, times, ids). An R1
consumer on that stream shows only `{name, leader}` on both (nats-server runs it without a
Raft node; Jetraft gives it a one-member group of its own, node/jetstream/cgroup.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.jshelp import JsCluster, api, first_create, nats_server_cluster3


@pytest.fixture
def nats3(tmp_path: Path) -> Iterator[list[str]]:
    with nats_server_cluster3(tmp_path) as urls:
        yield urls


async def _script(url: str) -> dict[str, Any]:
    import nats

    nc = await nats.connect(url)
    r = await first_create(nc, "STREAM.CREATE.D", {"name": "D", "subjects": ["d"],
                                                   "num_replicas": 3})
    await nc.request("d", b"x", timeout=5)
    out = {"create": r}
    out["consumer"] = await api(nc, "CONSUMER.CREATE.D.c", {
        "stream_name": "D", "config": {"durable_name": "c", "ack_policy": "explicit"}})
    # an R1 consumer on the R3 stream: a group of its own (cgroup.py), as nats-server's
    out["consumer1"] = await api(nc, "CONSUMER.CREATE.D.one", {
        "stream_name": "D", "config": {"durable_name": "one", "ack_policy": "explicit",
                                       "num_replicas": 1}})
    await asyncio.sleep(1.0)  # replicas report current
    out["info"] = await api(nc, "STREAM.INFO.D")
    out["cinfo"] = await api(nc, "CONSUMER.INFO.D.c")
    out["cinfo1"] = await api(nc, "CONSUMER.INFO.D.one")
    await nc.close()
    return out


def _shape(reply: dict[str, Any]) -> dict[str, Any]:
    cluster = reply.get("cluster", {})
    return {"keys": sorted(reply), "cluster": sorted(cluster),
            "replica": sorted({k for r in cluster.get("replicas", []) for k in r}),
            "replicas": len(cluster.get("replicas", []))}


async def test_info_cluster_shapes_match_nats_server(nats3: list[str], tmp_path: Path) -> None:
    theirs = await _script(nats3[0])
    c = JsCluster(tmp_path / "jr", 3)
    try:
        c.start()
        c.wait_js()
        ours = await _script(c.nodes[0].url)
    finally:
        c.stop()
    for side in (theirs, ours):  # an R1 consumer: no Raft group shown, only its server
        assert sorted(side["cinfo1"]["cluster"]) == ["leader", "name"], side["cinfo1"]
        assert side["consumer1"]["cluster"] == side["cinfo1"]["cluster"]
    for key in ("create", "info", "cinfo", "consumer", "consumer1", "cinfo1"):
        print(key, json.dumps(theirs[key].get("cluster")), json.dumps(ours[key].get("cluster")))
        t, o = _shape(theirs[key]), _shape(ours[key])
        # "lag" and "offline" appear only when non-zero / true.
        t["replica"] = [k for k in t["replica"] if k not in ("lag", "offline")]
        o["replica"] = [k for k in o["replica"] if k not in ("lag", "offline")]
        assert o == t, key

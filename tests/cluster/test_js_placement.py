"""Placement with `unique_tag` on real nodes (tags az:a, az:b, az:b; `jetstream{unique_tag:
az}`): R3 is refused as nats-server refuses it (checked on a nats-server cluster tagged the
same way), every R2 stream spans both zones, and streams spread over the az:b nodes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.jshelp import JsCluster, api, connect


@pytest.fixture
def zoned(tmp_path: Any) -> Iterator[JsCluster]:
    c = JsCluster(tmp_path / "c", 3, unique_tag="az", tags=[["az:a"], ["az:b"], ["az:b"]])
    try:
        c.start()
        c.wait_js()
        yield c
    finally:
        c.stop()


async def test_unique_tag_spreads_and_refuses(zoned: JsCluster) -> None:
    nc = await connect(zoned.nodes[2])
    try:
        r = await api(nc, "STREAM.CREATE.U3", {"name": "U3", "num_replicas": 3})
        assert r["error"] == {"code": 400, "err_code": 10005, "description":
                              "no suitable peers for placement, server tag not unique"}
        hosts: dict[str, int] = {}
        for i in range(6):
            r = await api(nc, f"STREAM.CREATE.U{i}", {"name": f"U{i}", "num_replicas": 2})
            assert "error" not in r, r
            names = {r["cluster"]["leader"], *(x["name"] for x in r["cluster"]["replicas"])}
            assert "n1" in names and len(names) == 2, names  # one replica per zone
            for n in names:
                hosts[n] = hosts.get(n, 0) + 1
        assert hosts == {"n1": 6, "n2": 3, "n3": 3}  # az:b's two nodes share the load
        jsz = zoned.nodes[0].get("/jsz")
        assert jsz["config"]["unique_tag"] == "az"
        assert zoned.nodes[1].get("/varz")["jetstream"]["config"]["unique_tag"] == "az"
    finally:
        await nc.close()

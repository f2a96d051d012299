"""Fail-stop when a stream's store lost acknowledged data: a snapshot marker says LMDB held
index N, LMDB (an older copy here) holds less. Opening the stream group raises
StoreLostError; the node must stop ([FTL], non-zero exit), not serve on without the stream."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import nats

from tests.integration.conftest import Servers


async def _fill(port: int) -> None:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    for i in range(120):
        await js.publish("s.x", f"m{i}".encode())
    await nc.close()


async def _create(port: int) -> None:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    await nc.request("$JS.API.STREAM.CREATE.S",
                     json.dumps({"name": "S", "subjects": ["s.>"]}).encode(), 5)
    await nc.close()


def test_a_stream_whose_store_lost_data_stops_the_node(
        servers: Servers, tmp_path: Path) -> None:
    os.environ["JETRAFT_JS_SNAPSHOT_EVERY"] = "20"  # inherited by the node: markers early
    try:
        store = tmp_path / "store"
        node = servers.jetraft(args=["-js", "-sd", str(store)])
        asyncio.run(_create(node.port))
        assert node.stop() == 0
        shutil.copytree(store / "lmdb", tmp_path / "lmdb-old")  # the stream, no messages
        node = servers.jetraft(args=["-js", "-sd", str(store)], port=node.port)
        asyncio.run(_fill(node.port))
        assert node.stop() == 0
        shutil.rmtree(store / "lmdb")
        shutil.copytree(tmp_path / "lmdb-old", store / "lmdb")
        argv = servers.jetraft_argv(servers.free_port(), ["-js", "-sd", str(store)])
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        del os.environ["JETRAFT_JS_SNAPSHOT_EVERY"]
    out = proc.stdout + proc.stderr
    # 1 when the open fails inside start() ("could not start"), 70 when a spawned open
    # fails later (_task_done -> _on_fatal): either way the node is gone.
    assert proc.returncode in (1, 70), out[-3000:]
    assert "[FTL]" in out and "StoreLostError" in out, out[-3000:]

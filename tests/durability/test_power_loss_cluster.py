"""Power loss on every node of a cluster at once, with clustered compaction and catch-up.

A clustered LMDB stream compacts its Raft log behind a marker (the store is the state,
synced first), and a member that lags behind a compaction installs an image the leader
exports for it (docs/notes/clsnap.md). Three `jetraft serve` nodes, each with its store on
its own power-loss disk (tests/durability/powerfs.py: only what was fsynced survives a cut).
Each cycle: a follower is killed and its disk cut; the leader compacts past it (a compaction
every 40 entries); the follower comes back and catches up from an exported image while
publishes go on; then the power goes on ALL nodes at once (even cycles: once the follower
has installed the image; odd cycles: at a random moment, often during the transfer). After
the restart every replica must hold every acknowledged message at the sequence its PubAck
named, and nothing twice: an acknowledged entry is in a quorum's fsynced WAL, or in a store
that was synced before the WAL below it was compacted, or in an image file fsynced before
the record that names it.

    JETRAFT_LONG=1 pytest tests/durability/test_power_loss_cluster.py  # 4 cycles
    JETRAFT_CLUSTER_POWER=1 pytest tests/durability/test_power_loss_cluster.py  # 1 cycle

Long tier: one cycle takes 30-50 s (three node starts twice, at load 18), and CI is at its
time limit. Mutants it kills (docs/notes/review.md): lmdb-nosync-early-truncate, and the
received snapshot file not fsynced (snapfile.Receiver.finish).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from node.cluster.local import LocalNode
from node.jetstream.store.lmdbstore import IMAGE_MAGIC
from tests.cluster.jshelp import JsCluster, connect, until
from tests.cluster.test_js_faults import last_seq_here, replica_contents
from tests.durability.disk import PowerDisk

LONG = os.environ.get("JETRAFT_LONG") == "1"
CYCLES = int(os.environ.get("JETRAFT_POWER_CUTS", "4" if LONG else "1"))
pytestmark = pytest.mark.skipif(
    not (LONG or os.environ.get("JETRAFT_CLUSTER_POWER")),
    reason="long tier: JETRAFT_LONG=1 or JETRAFT_CLUSTER_POWER=1")


class PowerCluster(JsCluster):
    """A JetStream cluster whose node i keeps its store on `disks[i]`."""

    def __init__(self, directory: Path, disks: list[PowerDisk]) -> None:
        super().__init__(directory, len(disks))
        self.disks = disks

    def config_for(self, node: LocalNode) -> str:
        disk = self.disks[self.nodes.index(node)]
        return super().config_for(node).replace(json.dumps(str(node.dir / "data")),
                                                json.dumps(str(disk.path / "store")))

    def cut(self, nodes: list[LocalNode]) -> None:
        """kill -9 the nodes, then cut the power of their disks and mount them again."""
        for node in nodes:
            self.stop_node(node, sig=signal.SIGKILL)
        for node in nodes:
            disk = self.disks[self.nodes.index(node)]
            disk.cut()
            disk.mount()


async def _publish(js: Any, tag: str, n: int, acked: dict[int, str]) -> None:
    for i in range(n):
        payload = f"{tag}:{i:05d}"
        ack = await js.publish("k", payload.encode(), timeout=10)
        acked[ack.seq] = payload


async def _publish_until_cut(js: Any, tag: str, acked: dict[int, str]) -> None:
    i = 0
    while True:
        payload = f"{tag}:{i:05d}"
        try:
            ack = await js.publish("k", payload.encode(), timeout=3)
        except Exception:  # noqa: BLE001 - the power went
            return
        acked[ack.seq] = payload
        i += 1


async def _check(c: PowerCluster, acked: dict[int, str], where: str) -> None:
    """Every replica, read locally (DIRECT.GET), holds every acked payload at its seq and
    no payload twice."""
    top = max(acked)
    for node in c.nodes:
        await until(lambda n=node: _holds(n, top), timeout=60)
        held = await replica_contents(node, top)
        lost = [(s, p) for s, p in sorted(acked.items()) if held[s - 1] != p]
        assert not lost, f"{where}: {node.name} lost {len(lost)} acknowledged messages, " \
                         f"first {lost[:3]}"
        assert len(set(held)) == len(held), f"{where}: {node.name} stores a message twice"


async def _holds(node: LocalNode, seq: int) -> bool:
    try:
        return await last_seq_here(node) >= seq
    except (nats.errors.Error, OSError):
        return False


def _holds_image(snap_dir: Path) -> bool:
    """A snapshot file of the directory is a stream image (the node installed an export;
    its own compactions write markers)."""
    for path in snap_dir.glob("*.data") if snap_dir.is_dir() else []:
        try:
            with open(path, "rb") as f:
                if f.read(len(IMAGE_MAGIC)) == IMAGE_MAGIC:
                    return True
        except OSError:
            continue
    return False


def _restart(c: PowerCluster) -> None:
    for node in c.nodes:
        c.start_node(node, wait=False)
    for node in c.nodes:
        c.wait_ready(node)
    c.wait_js(timeout=90)


@pytest.mark.timeout(900 if LONG else 300)
async def test_power_loss_on_every_node_after_compaction_and_catch_up(
        tmp_path: Path, power_disk: Callable[..., PowerDisk],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETRAFT_JS_SNAPSHOT_EVERY", "40")
    rng = random.Random(7)
    c = PowerCluster(tmp_path / "c", [power_disk() for _ in range(3)])
    acked: dict[int, str] = {}
    try:
        c.start()
        c.wait_js()
        nc = await connect(c.nodes[0])
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="K", subjects=["k"], num_replicas=3, allow_direct=True)
        for cycle in range(CYCLES):
            info = await js.stream_info("K")
            lagging = next(n for n in c.nodes[1:] if n.name != info.cluster.leader)
            c.cut([lagging])  # its WAL and store keep only what was fsynced
            await _publish(js, f"{cycle}a", 120, acked)  # the leader compacts past it
            c.start_node(lagging)
            pub = asyncio.ensure_future(_publish_until_cut(js, f"{cycle}b", acked))
            if cycle % 2 == 0:
                snap = c.disks[c.nodes.index(lagging)].path / "store" / "raft" / "snap"
                await until(lambda d=snap: _holds_image(d), timeout=60)  # export installed
                await asyncio.sleep(rng.uniform(0.0, 1.0))  # its store synced or not yet
            else:
                await asyncio.sleep(rng.uniform(0.0, 2.0))  # during the transfer, maybe
            c.cut(c.nodes)  # the power goes everywhere at once
            await asyncio.wait_for(pub, 30)
            await nc.close()
            _restart(c)
            nc = await connect(c.nodes[0])
            js = nc.jetstream(timeout=10)
            await _check(c, acked, f"after cycle {cycle}")
        await nc.close()
        for node in c.nodes:
            assert "[FTL]" not in node.log_text(), node.log_text()[-3000:]
    finally:
        c.stop()

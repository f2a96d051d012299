"""chaos/net.py: a real node inside a network namespace is reachable, silent while cut
off, and reachable again after the heal; nothing is left behind. Needs root (`ip netns`)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import nats
import pytest

from chaos import net
from chaos.nodes import Cluster

OK, WHY = net.available()


@pytest.mark.skipif(not OK, reason=f"network namespaces unavailable: {WHY}")
async def test_partition_cuts_and_heals_a_real_node(tmp_path: Path) -> None:
    ns = net.Netns(1)
    ns.setup()
    cluster = Cluster(tmp_path, 1, ns)
    try:
        await asyncio.to_thread(cluster.start)
        url = cluster.nodes[0].url
        assert url.startswith(f"nats://{ns.subnet}.")

        node = cluster.nodes[0]

        async def reachable(budget: float = 10.0) -> bool:
            """The node's INFO line within `budget` s for the connect and again for the
            line (a loaded machine can take seconds; a cut-off node never answers)."""
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(node.host, node.ports.client), budget)
            except (OSError, TimeoutError):
                return False
            try:
                line = await asyncio.wait_for(reader.readline(), budget)
            except (OSError, TimeoutError):
                return False
            finally:
                writer.close()
            return line.startswith(b"INFO ")

        assert await reachable()
        nc = await nats.connect(url, allow_reconnect=False)  # a real client through the bridge
        await nc.close()
        ns.isolate(0)
        assert not await reachable(1.0)
        assert cluster.nodes[0].alive()  # cut off, not dead
        ns.heal()
        assert await reachable()
    finally:
        await asyncio.to_thread(cluster.stop)
        ns.teardown()
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert ns.ns(0) not in listing
    links = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert ns.bridge not in links and ns.veth(0) not in links

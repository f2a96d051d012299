"""The peer id survives a restart and a wiped data directory gives a new one,
which replaces the old member everywhere (real JetStream node processes)."""

from __future__ import annotations

import re
import shutil
import signal
import time
from pathlib import Path

from node.cluster.local import LocalCluster, LocalNode


def _peer_id(node: LocalNode) -> str:
    ids = re.findall(r"peer id ([0-9a-f]{16})", node.log_text())
    assert ids, node.log_text()
    return ids[-1]


def _wait_log(node: LocalNode, text: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in node.log_text():
        assert time.monotonic() < deadline, node.log_text()[-2000:]
        time.sleep(0.1)


def test_restart_keeps_the_id_and_a_wiped_node_is_a_new_member(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, 2, name="ident", jetstream=True)
    n1, n2 = c.nodes
    try:
        c.start()
        first = _peer_id(n2)
        c.stop_node(n2)
        c.start_node(n2)
        c.wait_routes()
        assert _peer_id(n2) == first  # persisted in <store_dir>/cluster/identity
        c.stop_node(n2, signal.SIGKILL)
        shutil.rmtree(n2.dir / "data")
        c.start_node(n2)
        c.wait_routes()
        second = _peer_id(n2)
        assert second != first
        _wait_log(n1, f"({first}) was replaced by n2 ({second})")
        routes = n1.get("/routez")["routes"]
        assert [r["remote_name"] for r in routes] == ["n2"]
    finally:
        c.stop()

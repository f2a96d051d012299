"""Clusters of real `jetraft` node processes on loopback (node/cluster/local.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from node.cluster.local import LocalCluster

ACCOUNTS = """
accounts {
  A { users: [{user: a, password: a}] }
  B { users: [{user: b, password: b}] }
}
"""


@pytest.fixture(scope="module")
def core3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes, core NATS only, accounts A and B (plus $G is not reachable:
    with accounts every user logs into one)."""
    c = LocalCluster(tmp_path_factory.mktemp("core3"), 3, name="core", jetstream=False,
                     extra_config=ACCOUNTS)
    try:
        c.start()
        yield c
    finally:
        c.stop()

"""Clusters of real `jetraft` node processes on loopback (node/cluster/local.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from node.cluster.local import LocalCluster
from tests.cluster.audithelp import spark_or_none, stop_active
from tests.cluster.jshelp import JsCluster

ACCOUNTS = """
accounts {
  A { users: [{user: a, password: a}], imports: [{service: {account: E, subject: "svc.>"}}]
      mappings: { "m.old": "m.new" } }
  B { users: [{user: b, password: b}], imports: [{stream: {account: E, subject: "ev.>"}}] }
  E { users: [{user: e, password: e}], exports: [{service: "svc.>"}, {stream: "ev.>"}] }
  L { users: [{user: l, password: l}], limits: {max_connections: 2} }
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


@pytest.fixture
def js3(tmp_path: Path) -> Iterator[JsCluster]:
    """Three JetStream nodes, a fresh cluster per test (the fault tests break it)."""
    c = JsCluster(tmp_path / "c", 3)
    try:
        c.start()
        c.wait_js()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def audit_spark() -> Iterator[object]:
    """One Spark session (local mode) for the audits the cluster tests run at their end;
    None without pyspark/Java (those tests then skip only the audit step)."""
    s = spark_or_none()
    yield s
    if s is not None:
        stop_active()

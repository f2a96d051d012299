"""Shared fixtures: ONE Spark session (for test_audit_spark.py) and ONE set of real
cluster logs per test run (JVM start-up and a 4-process Raft run are the slow parts)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest


def need_spark() -> None:
    pytest.importorskip("pyspark")
    pytest.importorskip("matplotlib")
    if shutil.which("java") is None:
        pytest.skip("no Java runtime (see .ci/run)")


@pytest.fixture(scope="module")  # one module uses it: its JVM goes away with that module
def spark():
    need_spark()
    from audit.job import session

    s = session("local[2]")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def cluster_logs(tmp_path_factory) -> dict:
    from tests.audit.logs import make_logs

    return asyncio.run(make_logs(tmp_path_factory.mktemp("audit-cluster")))


@pytest.fixture
def logs(cluster_logs, tmp_path) -> dict:
    """A private copy of the cluster's data directories, free to damage."""
    dirs = []
    for d in cluster_logs["dirs"]:
        dst = tmp_path / d.name
        shutil.copytree(d, dst)
        dirs.append(dst)
    acked = tmp_path / "acked.jsonl"
    shutil.copy(cluster_logs["acked"], acked)
    return {"dirs": dirs, "acked": acked, "tmp": tmp_path}


def segment(node_dir: Path) -> Path:
    segs = sorted((node_dir / "wal").glob("wal-*.log"))
    assert len(segs) == 1, segs
    return segs[0]

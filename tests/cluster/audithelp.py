"""The audit (`audit/`, issue 10) over the data directories of a test's real 3-node cluster.

- `ArchiveCluster`: a JsCluster whose nodes run in the audit retention mode
  (`jetstream { audit_archive: true }`): compaction moves old WAL segments to wal/archive.
- `small_segments()`: while node processes start, 64 KiB WAL segments and a snapshot every
  100 entries, so that a short test compacts and archives several times.
- `write_acked()`: the PubAcks the test's clients received, in the audit's acknowledged-writes
  format (`{"stream", "seq", "data"}` lines, audit/acked.py).
- `audit_cluster()`: stop the nodes (SIGTERM: the audit reads stores at rest), run the audit
  job in the given Spark session, return report.json's dict.
- `spark_or_none()`: a Spark session when pyspark and Java are installed, else None (the
  fault tests then skip only their audit step).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.cluster.jshelp import JsCluster

SEGMENT_BYTES = 64 << 10
SNAPSHOT_EVERY = 100


class ArchiveCluster(JsCluster):
    """Nodes with `audit_archive: true` in their jetstream block."""

    def config_for(self, node: Any) -> str:
        conf = super().config_for(node)
        store = json.dumps(str(node.dir / "data"))
        return conf.replace(f"jetstream {{ store_dir: {store}",
                            f"jetstream {{ audit_archive: true, store_dir: {store}")


@contextmanager
def small_segments(segment_bytes: int = SEGMENT_BYTES,
                   snapshot_every: int = SNAPSHOT_EVERY) -> Iterator[None]:
    """Node processes started inside inherit these (LocalCluster copies os.environ)."""
    saved = {k: os.environ.get(k) for k in ("JETRAFT_WAL_SEGMENT_BYTES",
                                            "JETRAFT_JS_SNAPSHOT_EVERY")}
    os.environ["JETRAFT_WAL_SEGMENT_BYTES"] = str(segment_bytes)
    os.environ["JETRAFT_JS_SNAPSHOT_EVERY"] = str(snapshot_every)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def write_acked(path: Path, acked: Iterable[tuple[str, str, int]]) -> Path:
    """(stream, payload, seq) per PubAck -> the audit's acknowledged-writes file."""
    with open(path, "w", encoding="utf-8") as f:
        for stream, data, seq in acked:
            f.write(json.dumps({"stream": stream, "seq": seq, "data": data}) + "\n")
    return path


def spark_or_none() -> Any:
    if os.environ.get("JETRAFT_NO_AUDIT"):  # opt out (e.g. to measure what the audits cost)
        return None
    try:
        import matplotlib  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        return None
    if shutil.which("java") is None:
        return None
    from audit.job import session

    return session("local[2]")


def live(spark: Any) -> Any:
    """The session, or a new one if another test module stopped the shared one (getOrCreate
    hands every module the same session, and tests/audit's fixture stops it at its end)."""
    if spark is not None and spark.sparkContext._jsc is None:
        from audit.job import session

        return session("local[2]")
    return spark


def stop_active() -> None:
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


def node_dirs(cluster: JsCluster) -> list[Path]:
    """Each node's directory: the audit names the node after it (n1, n2, n3)."""
    return [n.dir for n in cluster.nodes]


def run_audit(spark: Any, dirs: list[Path], acked: Path | None = None) -> dict[str, Any]:
    from audit.job import run
    from audit.report import build

    return build(run(live(spark), [str(d) for d in dirs], str(acked) if acked else None))


def audit_cluster(spark: Any, cluster: JsCluster, acked: Path | None = None) -> dict[str, Any]:
    cluster.stop()
    return run_audit(spark, node_dirs(cluster), acked)


def violations(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["severity"] == "violation"]


def assert_clean(report: dict[str, Any]) -> None:
    """No violation; notes allowed only for a torn tail (none expected after SIGTERM)."""
    assert violations(report) == [], json.dumps(report["findings"], indent=1)[:6000]
    assert report["verdict"]["ok"], report["verdict"]

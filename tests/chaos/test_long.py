"""The long chaos tier, by hand: `JETRAFT_LONG=1 pytest tests/chaos/test_long.py -o timeout=1800`.

Every fault the node count allows, 60 s each, against real node processes, with the KV
CAS clients (chaos/kv_workload.py) beside the stream workload; partitions
need root (network namespaces). With no cluster in the checkout only the 1-node runs apply.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from chaos import net
from chaos.faults import FAULTS, applicable
from chaos.run import RunConfig, execute
from chaos.workload import Spec

LONG = os.environ.get("JETRAFT_LONG") == "1"
CLUSTER = importlib.util.find_spec("node.cluster") is not None
NETNS = net.available()[0] if LONG else False

CASES = [(1, f) for f in ("kill-leader", "restart-leader", "pause-leader", "kill-all")]
CASES += [(3, f) for f in FAULTS if f != "none"] + [(5, "kill-minority"), (5, "mixed")]


@pytest.mark.skipif(not LONG, reason="long chaos tier: JETRAFT_LONG=1")
@pytest.mark.parametrize(("nodes", "fault"), CASES, ids=[f"{n}-{f}" for n, f in CASES])
async def test_fault_run(tmp_path: Path, nodes: int, fault: str) -> None:
    if nodes > 1 and not CLUSTER:
        pytest.skip("no node/cluster in this checkout")
    use_net = fault in ("partition-leader", "mixed") and NETNS
    why = applicable(fault, nodes, use_net)
    if why:
        pytest.skip(why)
    from chaos.audit import available

    # Each run ends with the audit over every node's data when pyspark and Java are here.
    report = await execute(RunConfig(workdir=tmp_path, nodes=nodes, fault=fault,
                                     duration=60.0, net="netns" if use_net else "loopback",
                                     spec=Spec(replicas=min(3, nodes), kv_clients=2),
                                     audit=available()[0]))
    assert report["ok"], (tmp_path / "report.md").read_text()

"""The short cluster chaos tier: three real node processes, an R3 stream and an R3 KV
bucket, the stream leader killed -9 and paused (SIGSTOP) while publishers, a consumer and
two KV clients racing compare-and-set on two keys run. The run must pass; the same run's
final state with one acknowledged CAS removed, or a refused CAS planted, must fail.

The long runs are by hand (docs/notes/chaos14.md), e.g.
`python -m chaos run --nodes 3 --fault mixed --net netns --duration 150 --seed 3`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from chaos import state
from chaos.checker import check
from chaos.history import read
from chaos.kv_workload import STREAM
from chaos.run import RunConfig, execute
from chaos.workload import Spec

CLUSTER = importlib.util.find_spec("node.cluster") is not None


@pytest.mark.skipif(not CLUSTER, reason="no node/cluster in this checkout")
async def test_three_node_kv_and_stream_faults_pass_and_planted_damage_fails(
        tmp_path: Path) -> None:
    spec = Spec(replicas=3, publishers=1, consumers=1, ack_wait=2.0, creators=0,
                kv_clients=2, kv_keys=2)
    cfg = RunConfig(workdir=tmp_path, nodes=3, fault="kill-leader,pause-leader",
                    duration=14.0, interval=5.0, hold=1.5, settle=1.0, spec=spec)
    report = await execute(cfg)
    assert report["ok"], (tmp_path / "report.md").read_text()
    events = read(tmp_path / "history.jsonl")
    injected = [e["f"] for e in events if e["proc"] == "nemesis" and e["phase"] == "inject"]
    assert "kill-leader" in injected and "pause-leader" in injected, injected
    stats = report["stats"]
    assert stats["kv_cas_ok"] > 10 and stats["kv_cas_failed"] > 0, stats
    assert stats["kv_reads_checked_realtime"] > 5, stats

    # Damage the final state the checker saw: an acknowledged CAS vanishes ...
    views = state.load(tmp_path / "state.json")
    acked = [e for e in events if e["f"] == "kv-cas" and e["type"] == "ok"]
    victim = acked[len(acked) // 2]
    for w in views:
        w.streams[STREAM].pop(victim["rev"], None)
    kinds = check(events, views).kinds()
    assert kinds.get("kv-lost") == 1, kinds

    # ... or a CAS the leader refused shows up at the end of the stream.
    views = state.load(tmp_path / "state.json")
    refused = next(e for e in events if e["f"] == "kv-cas" and e["type"] == "fail")
    for w in views:
        msgs = w.streams[STREAM]
        msgs[max(msgs) + 1] = refused["value"]
    kinds = check(events, views).kinds()
    assert kinds.get("kv-failed-stored") == len(views), kinds

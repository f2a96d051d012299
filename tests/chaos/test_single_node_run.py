"""The short chaos tier: a real single-node run (kill -9 and SIGSTOP/SIGCONT while
publishing and consuming) must pass, and the same run's data with one acked message
deleted, or one duplicated, straight in the node's LMDB, must fail.

The full runs are by hand (docs/notes/ops.md), e.g.
`python -m chaos run --nodes 1 --fault kill-leader,pause-leader --duration 120`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from chaos import state
from chaos.checker import View, check
from chaos.history import read
from chaos.nodes import Cluster, Loopback
from chaos.run import RunConfig, execute
from chaos.workload import Spec
from node.jetstream.store.base import StoredMsg
from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv, stored_names


def _stream_group(env: NodeEnv, stream: str) -> str:
    (group,) = [g for g in stored_names(env) if g.startswith(f"js.{stream}.")]
    return group


async def _views_after_restart(workdir: Path, stream: str) -> list[View]:
    """Start the node again on its (tampered) store, read it as a client, stop, read LMDB."""
    cluster = Cluster(workdir, 1, Loopback())
    await asyncio.to_thread(cluster.start)
    try:
        client = await state.client_view(cluster.nodes[0].url, [stream], "client@n0")
    finally:
        await asyncio.to_thread(cluster.stop)
    return [client, state.lmdb_view(cluster.nodes[0].store_dir, "lmdb@n0")]


async def test_single_node_faults_pass_and_planted_damage_fails(tmp_path: Path) -> None:
    spec = Spec(replicas=1, publishers=2, consumers=1, ack_wait=2.0)
    cfg = RunConfig(workdir=tmp_path, nodes=1, fault="kill-leader,pause-leader",
                    duration=9.0, interval=3.0, hold=1.0, settle=1.0, spec=spec)
    report = await execute(cfg)
    assert report["ok"], report
    events = read(tmp_path / "history.jsonl")
    injected = [e["f"] for e in events if e["proc"] == "nemesis" and e["phase"] == "inject"]
    assert "kill-leader" in injected and "pause-leader" in injected, injected
    acked = [e for e in events if e["f"] == "publish" and e["type"] == "ok"]
    assert len(acked) > 50, report["stats"]
    assert report["stats"]["stored@lmdb@n0"] == report["stats"]["stored@client@n0"] \
        == len({e["payload"] for e in acked})

    # Plant a loss: an acked message disappears from the node's store.
    victim = acked[len(acked) // 2]
    env = NodeEnv(str(tmp_path / "n0" / "store" / "lmdb"))
    try:
        store = LmdbStore(env, _stream_group(env, spec.stream))
        gone = store.remove(victim["seq"])
        assert gone is not None and gone.data.decode() == victim["payload"]
    finally:
        env.close()
    verdict = check(events, await _views_after_restart(tmp_path, spec.stream))
    lost = [a for a in verdict.anomalies if a.kind == "lost"]
    assert {a.detail["source"] for a in lost} == {"client@n0", "lmdb@n0"}
    assert all(a.detail["payload"] == victim["payload"] for a in lost)

    # Plant a duplicate: another acked message stored a second time at a new seq.
    twin = acked[-1]
    env = NodeEnv(str(tmp_path / "n0" / "store" / "lmdb"))
    try:
        store = LmdbStore(env, _stream_group(env, spec.stream))
        original = store.load(twin["seq"])
        assert original is not None
        last = max(store.seqs())
        store.store(StoredMsg(last + 1, original.subject, original.hdr, original.data,
                              original.ts_ns))
    finally:
        env.close()
    views = [state.lmdb_view(tmp_path / "n0" / "store", "lmdb@n0")]
    kinds = check(events, views).kinds()
    assert kinds.get("duplicate") == 1 and kinds.get("lost") == 1, kinds

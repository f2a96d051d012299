"""The simulation with one node and a one-voter group (a standalone JetStream node's
groups: the node's own fsync is the whole quorum). Same harness, checkers, crash points,
torn writes and EIO as tests/sim/test_sim_real.py; no peers, so no membership changes.

    SIM_SINGLE_SEEDS=2000 PYTHONPATH=$PWD python -m pytest tests/sim/test_sim_single.py

Every seed must keep every invariant (acknowledged entries survive every crash, the state
machine never applies an entry the log does not hold durably, applies in order) and the
campaign must reach the crashes that matter: in segment rolls and compactions.
"""

from __future__ import annotations

import os

import pytest

from tests.sim import cluster

SEEDS = int(os.environ.get("SIM_SINGLE_SEEDS", "200"))


@pytest.mark.timeout(600)
def test_a_single_voter_keeps_every_invariant_under_crashes() -> None:
    results = [cluster.run_single(seed) for seed in range(SEEDS)]
    bad = [(r.seed, r.violation, r.error) for r in results if r.violation or r.error]
    assert not bad, f"seeds failing (replay: cluster.run_single(SEED)): {bad[:5]}"
    n = len(results)
    coverage = {
        "acked>=100": sum(r.acked >= 100 for r in results) / n,
        "crash in roll/compaction": sum(
            bool(r.crash_contexts & {"roll", "compaction"}) for r in results) / n,
        "disk crash": sum(r.disk_crashes > 0 for r in results) / n,
    }
    print(coverage)
    assert coverage["acked>=100"] >= 0.5, coverage
    assert coverage["crash in roll/compaction"] >= 0.3, coverage
    assert coverage["disk crash"] >= 0.8, coverage

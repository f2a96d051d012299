"""The simulation of the real driver, WAL and snapshot files (tests/sim/cluster.py).

CI runs SIM_SEEDS (default 200) seeds; the full run by hand:

    SIM_SEEDS=1000 PYTHONPATH=$PWD python -m pytest tests/sim/test_sim_real.py -s

Every seed must keep every invariant of tests/sim/checkers.py after every
step and converge after healing. The campaign must also reach the code that
matters, or a green run proves little; it reports and asserts:

* >= 50% of the schedules acknowledge >= 100 entries;
* >= 20% install a snapshot received from a leader;
* >= 20% change the membership;
* >= 20% crash inside a segment roll, a compaction or a snapshot install;
* every storage call site that ran in the campaign was a crash point in
  some schedule;
* >= 50% probe a crash image after a durable WAL segment deletion (the
  moment before the next fsync, which random crash points hit about once
  in a hundred seeds: `d2-delete-before-compact-synced` needed the probe).

A failing seed replays alone: `cluster.run(SEED)` (same result every time).
"""

from __future__ import annotations

import multiprocessing
import os
import random

import pytest

from tests.sim import cluster
from tests.sim.simdisk import CrashPlan, SimCrash, SimDisk
from tests.sim.sweep import torn_roll_recovery_sweep

SEEDS = int(os.environ.get("SIM_SEEDS", "200"))
FIRST = int(os.environ.get("SIM_FIRST_SEED", "0"))
# Seeds are independent and each replays alone (`cluster.run(SEED)`, the same result under
# any PYTHONHASHSEED): they run in worker processes, one per core (CI has two). Spawned, not
# forked: a fork copies whatever locks the other threads of this process hold (Spark's).
WORKERS = int(os.environ.get("SIM_WORKERS", str(min(2, os.cpu_count() or 1))))


def _run_seeds(seeds: range) -> list[cluster.RunResult]:
    if WORKERS <= 1:
        return [cluster.run(seed) for seed in seeds]
    with multiprocessing.get_context("spawn").Pool(WORKERS) as pool:
        return pool.map(cluster.run, seeds, chunksize=4)


def _coverage(results: list[cluster.RunResult]) -> dict[str, float]:
    n = len(results)
    return {
        "acked>=100": sum(r.acked >= 100 for r in results) / n,
        "snapshot installed": sum(r.snapshots_installed > 0 for r in results) / n,
        "membership changed": sum(r.conf_changes > 0 for r in results) / n,
        "crash in roll/compaction/install": sum(
            bool(r.crash_contexts & {"roll", "compaction", "install"}) for r in results) / n,
        "crash image probed": sum(r.probes > 0 for r in results) / n,
    }


@pytest.mark.timeout(120 + 6 * SEEDS)  # about 0.4 s a seed alone, much more on a loaded machine
def test_seeded_schedules_of_the_real_code_keep_every_invariant() -> None:
    results = _run_seeds(range(FIRST, FIRST + SEEDS))
    assert [r.seed for r in results] == list(range(FIRST, FIRST + SEEDS))
    failed = [f"seed {r.seed}: {r.violation or r.error}" for r in results
              if r.violation is not None or r.error is not None]
    cov = _coverage(results)
    # The torn-roll recovery is reached rarely at random: a sweep crashes it at every step.
    sweep_seen, sweep_crashed = torn_roll_recovery_sweep()
    seen = set().union(sweep_seen, *(r.sites_seen for r in results))
    crashed = set().union(sweep_crashed, *(r.crash_sites for r in results))
    never = sorted(seen - crashed)
    print(f"\nsimulation of the real code, {SEEDS} seeds, {len(failed)} failed: "
          + ", ".join(f"{k} {v:.1%}" for k, v in cov.items())
          + f"; storage call sites {len(seen)}, crashed at {len(seen & crashed)}; "
          f"acked total {sum(r.acked for r in results)}, "
          f"disk crashes {sum(r.disk_crashes for r in results)}, "
          f"power cuts {sum(r.crashes - r.disk_crashes for r in results)}, "
          f"fail-stops after EIO {sum(r.fail_stops for r in results)}, "
          f"snapshots installed {sum(r.snapshots_installed for r in results)}; "
          f"call sites never crashed at: {never}")
    assert not failed, f"{len(failed)} of {SEEDS} seeds failed:\n" + "\n".join(failed)
    assert cov["acked>=100"] >= 0.5, cov
    assert cov["snapshot installed"] >= 0.2, cov
    assert cov["membership changed"] >= 0.2, cov
    assert cov["crash in roll/compaction/install"] >= 0.2, cov
    assert cov["crash image probed"] >= 0.5, cov
    assert not never, f"storage call sites never crashed at: {never}"


def test_every_operation_of_a_torn_roll_recovery_is_a_crash_point() -> None:
    seen, crashed = torn_roll_recovery_sweep()
    assert "unlink@raft.storage._drop_segments" in seen, seen
    assert seen <= crashed, sorted(seen - crashed)


def test_a_seed_replays_exactly() -> None:
    a, b = cluster.run(7), cluster.run(7)
    assert a.fingerprint() == b.fingerprint()
    assert a.acked > 0


# ---- the simulated disk itself --------------------------------------------------------------


def _disk(**kw: float) -> SimDisk:
    d = SimDisk(random.Random(1), **kw)
    d.makedirs("/n1/d")
    return d


def test_crash_loses_unsynced_writes_and_unsynced_directory_entries() -> None:
    d = _disk(tear=0.0)
    fd = d.open("/n1/d/a", create=True)
    d.pwrite(fd, b"durable", 0)
    d.fsync(fd)
    d.fsync_dir("/n1/d")
    d.pwrite(fd, b"-lost", 7)
    fd2 = d.open("/n1/d/b", create=True)  # its entry is never fsynced
    d.pwrite(fd2, b"x", 0)
    d.fsync(fd2)
    d.crash(1)
    d.revive(1)
    assert d.read_file("/n1/d/a") == b"durable"
    assert not d.exists("/n1/d/b")


def test_crash_undoes_unsynced_rename_and_unlink() -> None:
    d = _disk()
    for name in ("a", "b"):
        fd = d.open(f"/n1/d/{name}", create=True)
        d.pwrite(fd, name.encode(), 0)
        d.fsync(fd)
        d.close(fd)
    d.fsync_dir("/n1/d")
    d.rename("/n1/d/a", "/n1/d/b")
    d.unlink("/n1/d/b")
    assert d.listdir("/n1/d") == []
    d.crash(1)
    d.revive(1)
    assert d.listdir("/n1/d") == ["a", "b"]
    assert d.read_file("/n1/d/b") == b"b"


def test_torn_tail_keeps_a_prefix_of_the_unsynced_writes() -> None:
    kept = set()
    for seed in range(50):
        d = SimDisk(random.Random(seed), tear=1.0, flip=0.0)
        d.makedirs("/n1/d")
        fd = d.open("/n1/d/a", create=True)
        d.fsync_dir("/n1/d")
        d.pwrite(fd, b"0123", 0)
        d.fsync(fd)
        d.pwrite(fd, b"4567", 4)
        d.pwrite(fd, b"89", 8)
        d.crash(1)
        d.revive(1)
        got = d.read_file("/n1/d/a")
        assert b"0123456789".startswith(got) and got.startswith(b"0123"), got
        kept.add(len(got))
    assert len(kept) > 3  # tears land at different bytes


def test_bit_flips_only_in_the_unsynced_tail() -> None:
    flipped = 0
    for seed in range(50):
        d = SimDisk(random.Random(seed), tear=1.0, flip=1.0)
        d.makedirs("/n1/d")
        fd = d.open("/n1/d/a", create=True)
        d.fsync_dir("/n1/d")
        d.pwrite(fd, b"synced", 0)
        d.fsync(fd)
        d.pwrite(fd, b"tail-bytes", 6)
        d.pwrite(fd, b"more", 16)
        d.crash(1)
        d.revive(1)
        got = d.read_file("/n1/d/a")
        assert got[:6] == b"synced"
        flipped += got[6:] != b"tail-bytesmore"[: len(got) - 6]
    assert flipped > 0


def test_a_crash_plan_fires_at_its_operation_and_the_node_stays_dead() -> None:
    d = _disk()
    d.plans[1] = CrashPlan(countdown=3)
    fd = d.open("/n1/d/a", create=True)  # 1: create
    d.pwrite(fd, b"a", 0)  # 2: write
    with pytest.raises(SimCrash):
        d.fsync(fd)  # 3: crash
    with pytest.raises(SimCrash):
        d.open("/n1/d/a")
    assert [c.site for c in d.crashes] == ["fsync@sim"]


def test_the_durable_image_is_what_a_crash_keeps_and_probes_fire_on_durable_unlinks() -> None:
    d = _disk(tear=1.0, flip=1.0)
    fired: list[tuple[int, str]] = []
    d.on_durable_unlink = lambda node, path: fired.append((node, path))
    for name in ("a", "b"):
        fd = d.open(f"/n1/d/{name}", create=True)
        d.pwrite(fd, b"synced", 0)
        d.fsync(fd)
        d.pwrite(fd, b"-tail", 6)
    d.fsync_dir("/n1/d")
    d.unlink("/n1/d/a")
    img = d.durable_image(1)
    assert img.listdir("/n1/d") == ["a", "b"]  # the unlink is not durable yet
    assert img.read_file("/n1/d/b") == b"synced"
    assert fired == []
    d.fsync_dir("/n1/d")
    assert fired == [(1, "/n1/d")]
    assert d.durable_image(1).listdir("/n1/d") == ["b"]
    assert d.read_file("/n1/d/b") == b"synced-tail"  # the original is untouched

"""A crash at every operation of a torn-roll recovery, one at a time.

The campaign reaches the recovery of a batch torn across a segment roll
(truncate the older segment, drop the empty newer ones) only rarely, and a
crash point inside that recovery more rarely still. This sweep builds that
disk state on purpose with the real `NodeLog` on a `SimDisk`, then restarts
it once per operation of the recovery, crashing at that operation, and
checks that the next restart succeeds and keeps every fsynced entry.
"""

from __future__ import annotations

import logging
import random

from raft.storage import NodeLog
from raft.types import Entry, EntryType
from tests.sim.checkers import RECOVERY, Violation
from tests.sim.simdisk import CrashPlan, SimCrash, SimDisk

DIR = "/n1/wal"
SYNCED = 30  # entries fsynced before the torn batch


def _torn_roll(seed: int) -> SimDisk:
    """A WAL whose last batch crossed a roll and was torn before its fsync."""
    disk = SimDisk(random.Random(seed), tear=1.0, flip=0.0)
    log = NodeLog(DIR, 600, disk=disk)
    for i in range(1, SYNCED + 1):
        log.append("g", [Entry(1, i, EntryType.NORMAL, b"%03d" % i + b"x" * 37)])
        if i % 5 == 0:
            log.sync()
    log.append("g", [Entry(1, i, EntryType.NORMAL, b"y" * 40) for i in range(SYNCED + 1, 60)])
    disk.plans[1] = CrashPlan(site="fsync@raft.storage._write")
    try:
        log.sync()
    except SimCrash:
        pass
    else:
        disk.crash(1)
    disk.revive(1)
    return disk


def _recovered(disk: SimDisk) -> NodeLog:
    try:
        log = NodeLog(DIR, 600, disk=disk)
    except SimCrash:
        raise
    except Exception as e:  # noqa: BLE001 (any failure to start is the finding)
        raise Violation(RECOVERY, f"torn-roll recovery cannot restart: {e!r}") from e
    g = log.group("g")
    if g.last_index() < SYNCED:
        raise Violation(RECOVERY, f"torn-roll recovery lost fsynced entries: last "
                                  f"{g.last_index()} < {SYNCED}")
    return log


def torn_roll_recovery_sweep(seeds: range = range(4)) -> tuple[set[str], set[str]]:
    """(sites seen, sites crashed at) over a crash at each recovery operation."""
    logging.getLogger("raft").setLevel(logging.ERROR)  # the recovery warns by design
    seen: set[str] = set()
    crashed: set[str] = set()
    for seed in seeds:
        for k in range(1, 40):
            disk = _torn_roll(seed)
            before = set(disk.site_counts)
            disk.plans[1] = CrashPlan(countdown=k)
            try:
                _recovered(disk)
            except SimCrash as c:
                crashed.add(c.site)
                disk.revive(1)
                _recovered(disk)
            else:
                disk.plans.clear()
                seen |= set(disk.site_counts) - before
                break
            seen |= set(disk.site_counts) - before
    return seen, crashed

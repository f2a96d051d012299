"""Mutation testing: each named mutation must be killed by a named invariant.

A mutation is one textual replacement in one file of the `raft` package. The
runner copies the package to a temporary directory, applies the replacement
there (the worktree is never touched), and runs simulations in a child
process whose `sys.path` puts the copy first. The mutant is killed only when
a check of `tests/sim/checkers.py` (or of the pure-core simulation's checker)
fails, and the seed is recorded; a harness error, a liveness failure or a
timeout does not count.

Two simulations: `real` runs the real driver, WAL and snapshot files
(`tests/sim/cluster.py`); `core` runs the pure core over an in-memory
network (`tests/sim/test_raft_sim.py`), finer-grained for core-only bugs.

    PYTHONPATH=$PWD python -m tests.sim.mutants            # all, table to stdout
    PYTHONPATH=$PWD python -m tests.sim.mutants --fast     # the CI subset
    PYTHONPATH=$PWD python -m tests.sim.mutants --only figure8 --seeds 2000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    file: str  # inside the package, e.g. "core.py"
    old: str
    new: str
    sim: str = "real"
    fast: bool = False
    seeds: int = 600  # how many seeds to try before the mutant survives
    more: tuple[tuple[str, str, str], ...] = ()  # further (file, old, new) edits
    hint: int = 0  # the seed that killed it in the full run: CI starts there

    def edits(self) -> list[tuple[str, str, str]]:
        return [(self.file, self.old, self.new), *self.more]


MUTANTS: list[Mutant] = [
    Mutant(
        "figure8", "commit an entry of an earlier term by counting replicas (Raft Figure 8)",
        "log.py",
        "if max_index > self.committed and self.term_or_zero(max_index) == term:",
        "if max_index > self.committed and self.term_or_zero(max_index) > 0:",
        sim="core", fast=True),
    Mutant(
        "vote-before-fsync", "a vote response leaves before the vote is fsynced",
        "multigroup.py",
        "            early.extend(self._take_early(g, rd))\n",
        "            early.extend(self._take_early(g, rd))\n"
        "            early.extend(m for m in rd.messages if m.type is MsgType.VOTE_RESP)\n"
        "            rd.messages = [m for m in rd.messages if m.type is not MsgType.VOTE_RESP]\n",
        fast=True, hint=14),
    Mutant(
        "readindex-no-heartbeat", "ReadIndex answered from the leader's commit, no heartbeat round",
        "core.py",
        "        self.reads[m.context] = _ReadRequest(self.log.committed, frm, {self.id})\n"
        "        self._bcast_heartbeat(m.context)\n",
        "        self._answer_read(_ReadRequest(self.log.committed, frm, set()), m.context)\n",
        sim="core", fast=True),
    Mutant(
        "conf-in-flight-guard", "a second membership change accepted while one is unapplied",
        "core.py",
        "                if self.pending_conf_index > self.log.applied:\n"
        "                    return None  # one membership change at a time\n",
        "                pass\n", sim="core"),
    Mutant(
        "campaign-unapplied-conf", "a member campaigns with committed, unapplied conf changes",
        "core.py",
        "        if self._has_unapplied_conf_changes():\n"
        "            return  # our configuration may be stale\n",
        "", sim="core"),
    Mutant(
        "leader-counts-unsynced", "the leader counts its own entries toward commit before fsync",
        "core.py",
        "        self.log.append(ents)\n        return True\n",
        "        self.log.append(ents)\n"
        "        self.prs[self.id].maybe_update(self.log.last_index())\n"
        "        return True\n",
        sim="core", fast=True),
    Mutant(
        "driver-leader-counts-unsynced", "the driver steps the leader's own append response "
        "(its match) into the core before the pass's fsync, not after",
        "multigroup.py",
        "            need_sync |= self._persist(g, rd, installs)\n",
        "            need_sync |= self._persist(g, rd, installs)\n"
        "            if (r := storage_append_resp(rd)) is not None"
        " and g.core.state is StateType.LEADER:\n"
        "                g.core.step(r)\n", hint=73),
    Mutant(
        "answers-before-fsync", "a pass's answers (APP_RESP, votes) leave when its write+fsync "
        "starts, not when it ends (`NodeLog.sync_async(then=)`)", "storage.py",
        "            batch = self._take()\n            try:\n"
        "                n = await (run or asyncio.to_thread)(self._write, batch)\n",
        "            batch = self._take()\n"
        "            if then is not None:\n                then()\n                then = None\n"
        "            try:\n"
        "                n = await (run or asyncio.to_thread)(self._write, batch)\n",
        fast=True, hint=14),
    # ---- one per defect fixed in issue 6 (lines given by raft-storage / raft-driver) ----
    Mutant(
        "d1-stale-conf-after-snapshot", "a membership change at or below a snapshot restored "
        "since its Ready is applied anyway", "core.py",
        "                    if e.index > floor:\n",
        "                    if True:\n",
        more=(("multigroup.py", "if e.index > floor and (e.data or", "if (e.data or"),),
        sim="core"),
    Mutant(
        "d2-delete-before-compact-synced", "a segment deleted before its COMPACT record is fsynced",
        "storage.py", "doomed, self._doomed = self._doomed, []",
        "doomed, self._doomed = self._obsolete(), []", fast=True, hint=2),
    Mutant(
        "d3a-roll-fsync-at-end", "a batch across a segment roll fsyncs every segment at the end",
        "storage.py",
        "if i + 1 == len(batch) or batch[i + 1].seg != ch.seg:\n"
        "                    # fdatasync makes the bytes and a changed size durable: all a\n"
        "                    # reader of the records needs (mtime may lag).\n"
        "                    self.disk.fdatasync(self._fds[ch.seg])\n"
        "                    self.stats.fsyncs += 1",
        "pass\n            for seg in dict.fromkeys(c.seg for c in batch):\n"
        "                self.disk.fdatasync(self._fds[seg])\n"
        "                self.stats.fsyncs += 1", hint=7),
    Mutant(
        "d3b-torn-tail-before-empty-segment", "a torn tail followed by empty segments is "
        "called corruption", "storage.py",
        "if later and not repair and not self._all_empty(later):",
        "if later and not repair:", hint=262),
    Mutant(
        "d4a-staged-snapshot-trusted", "recovery promotes a staged snapshot its log does not "
        "describe", "snapfile.py",
        "if index <= log_index and (current", "if (current"),
    Mutant(
        "d7-no-fail-stop", "a node whose ready loop died (failed WAL write or fsync) limps on",
        "multigroup.py",
        "        if exc is None or self.failed is not None:\n            return\n",
        "        if exc is not None:\n            return\n", hint=0, fast=True),
    Mutant(
        "bug-a-snapshot-below-replay-hole", "replay keeps a hole open across a received "
        "snapshot below it (found by this simulation)", "storage.py",
        "        self.hole = 0  # whatever its index: nothing before the snapshot is needed "
        "any more",
        "        if meta.index >= self.hole:\n            self.hole = 0", hint=520),
    Mutant(
        "bug-b-no-snap-dir", "a node with a WAL but no snapshot directory cannot start "
        "(found by this simulation)", "snapfile.py",
        "    if not disk.exists(dir):\n        return  # nothing was ever written there\n", "",
        hint=32),
]

_CORE_NAMES = {
    "election safety": "election safety", "leader completeness": "leader completeness",
    "log matching": "log matching", "state machine safety": "state machine safety",
    "node ": "state machine safety", "leader ": "leader completeness",
    "read linearizability": "read linearizability", "membership": "membership",
}


# ---- the child process ---------------------------------------------------------------


def _worker(sim: str, first: int, count: int, budget_s: float) -> dict:
    deadline = time.monotonic() + budget_s
    errors = 0
    ran = 0
    if sim.startswith("scenario:"):
        killed = _scenarios(sim.split(":", 1)[1])
        if killed is None:
            return {"killed": False, "seeds": 0, "errors": 0}
        return {"killed": True, "invariant": killed[1], "seed": killed[0], "seeds": 0}
    if sim == "core":
        killed = _scenarios()
        if killed is not None:
            name, invariant, detail = killed
            return {"killed": True, "invariant": invariant, "seed": f"scenario {name}",
                    "detail": detail[:300], "seeds": 0, "errors": 0}
    for seed in range(first, first + count):
        if time.monotonic() > deadline:
            break
        ran += 1
        if sim == "real":
            from tests.sim import cluster

            r = cluster.run(seed)
            if r.violation is not None:
                return {"killed": True, "invariant": r.violation.invariant, "seed": seed,
                        "detail": r.violation.detail[:300], "seeds": ran, "errors": errors}
            errors += r.error is not None
        else:
            name, detail = _core_run(seed)
            if name is not None:
                return {"killed": True, "invariant": name, "seed": seed, "detail": detail[:300],
                        "seeds": ran, "errors": errors}
            errors += detail is not None
    return {"killed": False, "seeds": ran, "errors": errors}


def _scenarios(only: str | None = None) -> tuple[str, str, str] | None:
    """The written-out adversarial schedules of tests/sim/scenarios.py."""
    from tests.raft.network import Violation
    from tests.sim.scenarios import SCENARIOS

    for name, fn in SCENARIOS.items():
        if only is not None and name != only:
            continue
        try:
            fn()
        except Violation as v:
            return name, _core_name(str(v)), str(v)
        except Exception:  # noqa: BLE001, S112 (a schedule that no longer fits: not a kill)
            continue
    return None


def _core_name(msg: str) -> str:
    for prefix, name in _CORE_NAMES.items():
        if msg.startswith(prefix):
            return name
    return "state machine safety"


def _core_run(seed: int) -> tuple[str | None, str | None]:
    from tests.raft.network import Violation
    from tests.sim.test_raft_sim import Sim, schedule

    try:
        sim = Sim(seed)
        for kind, arg in schedule(seed):
            sim.run(kind, arg)
        sim.converge()
    except Violation as v:
        return _core_name(str(v)), str(v)
    except Exception as e:  # noqa: BLE001 (liveness or harness: not a kill)
        return None, repr(e)
    return None, None


# ---- the parent ------------------------------------------------------------------------


def make_copy(m: Mutant | None, dest: Path, rev: str | None = None) -> None:
    pkg = dest / "raft"
    if rev is None:
        shutil.copytree(ROOT / "raft", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        pkg.mkdir(parents=True)
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "raft"],
                             check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    if m is None:
        return
    for file, old, new in m.edits():
        path = pkg / file
        text = path.read_text()
        if text.count(old) != 1:
            raise ValueError(f"mutant {m.name}: the text to replace occurs {text.count(old)} "
                             f"times in raft/{file} (stale mutant)")
        path.write_text(text.replace(old, new))


def _child(src: str, sim: str, first: int, count: int, budget_s: float) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{ROOT}", PYTHONHASHSEED="0")
    args = [sys.executable, "-m", "tests.sim.mutants", "--worker", sim, str(first), str(count),
            str(budget_s)]
    try:
        out = subprocess.run(args, env=env, cwd=src, capture_output=True, text=True,
                             timeout=budget_s + 120)
    except subprocess.TimeoutExpired:
        return {"killed": False, "timeout": True}
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"killed": False, "crash": out.stderr[-2000:]}
    return json.loads(lines[-1])


def run_mutant(m: Mutant | None, seeds: int | None = None, budget_s: float = 240.0,
               rev: str | None = None, sim: str | None = None, first: int = 0) -> dict:
    """Run one mutant in a child process; returns the verdict.

    A kill counts only if the same seed passes on the unmutated code: a
    failure the original shares is the original's bug, not the mutant's."""
    sim = sim or (m.sim if m else "real")
    n = seeds if seeds is not None else (m.seeds if m else 50)
    t0 = time.monotonic()
    shared: list[object] = []
    with tempfile.TemporaryDirectory(prefix="raft-mutant-") as tmp, \
            tempfile.TemporaryDirectory(prefix="raft-base-") as base:
        try:
            make_copy(m, Path(tmp), rev)
            make_copy(None, Path(base), rev)
        except ValueError as e:
            return {"killed": False, "stale": str(e)}
        seed, end = first, first + n
        while True:
            left = budget_s - (time.monotonic() - t0)
            v = _child(tmp, sim, seed, end - seed, max(left, 1.0))
            if not v.get("killed") or m is None:
                break
            if isinstance(v["seed"], str):  # a written-out scenario
                ok = _child(base, "scenario:" + v["seed"].split()[-1], 0, 1, 60.0)
            else:
                ok = _child(base, sim, v["seed"], 1, 120.0)
            if not ok.get("killed"):
                break
            shared.append(v["seed"])  # the original fails this seed too: keep looking
            if isinstance(v["seed"], str) or v["seed"] + 1 >= end:
                v = {"killed": False, "seeds": n}
                break
            seed = v["seed"] + 1
    v["elapsed_s"] = round(time.monotonic() - t0, 1)
    if shared:
        v["also_fails_unmutated"] = shared
    return v


def table(rows: list[tuple[Mutant, dict]]) -> str:
    out = ["| mutant | what | killed by | seed | seeds run |", "|---|---|---|---|---|"]
    for m, v in rows:
        if v.get("killed"):
            res, seed = v["invariant"], str(v["seed"])
        else:
            res = "stale" if "stale" in v else "timeout" if v.get("timeout") else \
                "harness crash" if "crash" in v else "SURVIVED"
            seed = "-"
        out.append(f"| `{m.name}` | {m.what} ({m.sim} sim) | {res} | {seed} | "
                   f"{v.get('seeds', '-')} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=4, metavar=("SIM", "FIRST", "COUNT", "BUDGET"))
    ap.add_argument("--fast", action="store_true", help="the CI subset only")
    ap.add_argument("--only", action="append", help="mutant name (repeatable)")
    ap.add_argument("--seeds", type=int, help="seeds per mutant (default: the mutant's)")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds per mutant")
    ap.add_argument("--rev", help="mutate this git revision instead of the worktree")
    ap.add_argument("--from-hints", action="store_true",
                    help="start at each mutant's recorded killing seed (CI)")
    a = ap.parse_args()
    if a.worker:
        sim, first, count, budget = a.worker
        print(json.dumps(_worker(sim, int(first), int(count), float(budget))))
        return
    chosen = [m for m in MUTANTS if (not a.fast or m.fast) and (not a.only or m.name in a.only)]
    rows = []
    for m in chosen:
        v = run_mutant(m, a.seeds, a.budget, a.rev, first=m.hint if a.from_hints else 0)
        print(f"{m.name}: {json.dumps(v)}", file=sys.stderr, flush=True)
        rows.append((m, v))
    print(table(rows))
    if not all(v.get("killed") for _, v in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()

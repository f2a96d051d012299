"""`jetraft audit` at scale: N entries replicated on 3 nodes, Spark local mode.

Writes three identical node WALs with the node's own record encoder (4 groups,
128-byte payloads, a term change every 100k entries, a hard state every 1,000
entries, 64 MiB segments), then runs `jetraft audit` on them as a user would
(a subprocess) and samples the memory of its whole process tree (Python
driver, JVM, Python workers) every 0.2 s.

    python benchmarks/audit_bench.py                      # 100k and 1M entries
    python benchmarks/audit_bench.py --entries 100000     # one size

Raw JSON goes to benchmarks/results/audit.json (not committed); the summary is audit.md.

Prints one line per size and a JSON document (also written to --json).
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
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raft import wal  # noqa: E402
from raft.types import HardState  # noqa: E402

GROUPS = ("g0", "g1", "g2", "g3")
SEGMENT_BYTES = 64 << 20
PAYLOAD = 128


def write_node(wal_dir: Path, entries: int) -> None:
    """One node's WAL: entries spread round-robin over the groups."""
    wal_dir.mkdir(parents=True)
    seq, size = 1, 0
    f = open(wal_dir / f"wal-{seq:016d}.log", "wb")
    per_group = {g: 0 for g in GROUPS}
    for k in range(entries):
        g = GROUPS[k % len(GROUPS)]
        per_group[g] += 1
        i = per_group[g]
        term = 1 + k // 100_000
        rec = wal.encode(wal.RecordType.ENTRY, g.encode(), term, i, 0,
                         f"{g}-{i:08d}".encode().ljust(PAYLOAD, b"."))
        if i % 1000 == 0:
            rec += wal.encode_hard_state(g.encode(), HardState(term, 1, i))
        if size + len(rec) > SEGMENT_BYTES:
            f.close()
            seq, size = seq + 1, 0
            f = open(wal_dir / f"wal-{seq:016d}.log", "wb")
        f.write(rec)
        size += len(rec)
    for g in GROUPS:  # the final commit covers everything
        f.write(wal.encode_hard_state(g.encode(), HardState(term, 1, per_group[g])))
    f.close()


def make_nodes(base: Path, entries: int) -> list[Path]:
    nodes = [base / f"n{k}" for k in (1, 2, 3)]
    write_node(nodes[0] / "wal", entries)
    for n in nodes[1:]:
        shutil.copytree(nodes[0], n)
    return nodes


def tree_rss(proc: psutil.Process) -> tuple[int, int]:
    """(JVM, Python) resident bytes of the audit's process tree."""
    jvm = py = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            rss = p.memory_info().rss
            if "java" in p.name():
                jvm += rss
            else:
                py += rss
        except psutil.NoSuchProcess:
            pass
    return jvm, py


def audit(nodes: list[Path], out: Path, driver_memory: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "node.cli", "audit", *map(str, nodes), "--out", str(out),
           "--conf", f"spark.driver.memory={driver_memory}"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    ps, peak, peak_jvm, peak_py = psutil.Process(proc.pid), 0, 0, 0
    while proc.poll() is None:
        jvm, py = tree_rss(ps)
        peak, peak_jvm, peak_py = max(peak, jvm + py), max(peak_jvm, jvm), max(peak_py, py)
        time.sleep(0.2)
    wall = time.monotonic() - t0
    report = json.loads((out / "report.json").read_text())
    return {"rc": proc.returncode, "wall_s": round(wall, 1), "peak_rss_mb": peak >> 20,
            "peak_jvm_mb": peak_jvm >> 20, "peak_python_mb": peak_py >> 20,
            "records": report["stats"]["records"], "verdict": report["verdict"]["text"],
            "phase_s": report["stats"].get("phase_s", {}),
            "stdout": proc.stdout.read().strip()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, action="append")
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "audit.json"))
    args = ap.parse_args()
    results = []
    for n in args.entries or [100_000, 1_000_000]:
        base = Path(tempfile.mkdtemp(prefix="audit-bench-"))
        try:
            t0 = time.monotonic()
            nodes = make_nodes(base, n)
            made = time.monotonic() - t0
            wal_mb = sum(f.stat().st_size for f in base.rglob("wal-*.log")) >> 20
            res = {"entries": n, "nodes": 3, "wal_mb_total": wal_mb,
                   "generate_s": round(made, 1), **audit(nodes, base / "report",
                                                          args.driver_memory)}
        finally:
            shutil.rmtree(base, ignore_errors=True)
        print(f"{n:>9} entries x 3 nodes ({res['wal_mb_total']} MB): audit {res['wall_s']} s, "
              f"peak RSS {res['peak_rss_mb']} MB (JVM {res['peak_jvm_mb']}, Python "
              f"{res['peak_python_mb']}), {res['verdict']}",
              flush=True)
        results.append(res)
    doc = {"machine": f"{os.cpu_count()} cores", "results": results}
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()

"""Markdown summary of a core_bench.sh run: the harness table plus jetraft/ref ratios.

  python benchmarks/core_ratios.py RESULT.json [BENCH_DIR]

Ratios are taken between medians of the SAME invocation (targets interleaved), which
is the only comparison that is fair on a shared machine. Goals (issue): throughput
>= 0.25x nats-server, request/reply p50 <= 2x nats-server's.
"""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import sys
from typing import Any

REF, MINE = "ref", "jetraft"


def _medians(runs: list[dict[str, Any]], bench: Any) -> dict[tuple[str, str, str], dict]:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        if "error" not in r:
            groups.setdefault((r["scenario"], r["client"], r["target"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        prim = bench.BY_NAME[key[0]].primary
        p50s = [r["lat_p50_us"] for r in rs if r.get("lat_p50_us")]
        us = [r["server_cpu_us_per_op"] for r in rs if r.get("server_cpu_us_per_op")]
        out[key] = {"rate": statistics.median(r[prim] for r in rs),
                    "p50": statistics.median(p50s) if p50s else None,
                    "us_op": statistics.median(us) if us else None}
    return out


def _ratio_rows(med: dict[tuple[str, str, str], dict]) -> list[str]:
    rows = ["| scenario | client | rate ratio (goal >= 0.25) | p50 ratio (goal <= 2) "
            "| srv us/op ratio |", "|---|---|---|---|---|"]
    for sc, cl in sorted({(k[0], k[1]) for k in med}):
        ref, mine = med.get((sc, cl, REF)), med.get((sc, cl, MINE))
        if not ref or not mine:
            rows.append(f"| {sc} | {cl} | n/a | n/a | n/a |")
            continue
        rate = f"{mine['rate'] / ref['rate']:.2f}x" if ref["rate"] else "n/a"
        p50 = f"{mine['p50'] / ref['p50']:.2f}x" if mine["p50"] and ref["p50"] else ""
        us = f"{mine['us_op'] / ref['us_op']:.1f}x" if mine["us_op"] and ref["us_op"] else ""
        rows.append(f"| {sc} | {cl} | {rate} | {p50} | {us} |")
    return rows


def main(path: str, bench_dir: str) -> None:
    sys.path.insert(0, bench_dir)
    import bench  # the shared harness: scenario table (primary figure per scenario)
    import report

    data = json.load(open(path))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        report.main([path])
    meta = data.get("meta", {})
    print(f"# core bench: jetraft vs nats-server ({path.rsplit('/', 1)[-1]})\n")
    print(f"ncpu={meta.get('ncpu')}; ratios are jetraft / nats-server medians of one run.\n")
    print("\n".join(_ratio_rows(_medians(data["runs"], bench))))
    print("\n## harness table\n")
    print(buf.getvalue())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "/work/shared/bench")

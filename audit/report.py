"""report.json: the machine-readable findings, counts and covered ranges."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

from audit.model import NOTE, VIOLATION

SEVERITY_ORDER = {VIOLATION: 0, NOTE: 1}


def leaders(votes: list[tuple[str, str, int, int]]) -> dict[str, dict[int, int]]:
    """Per group and term, the candidate most nodes voted for (the term's leader
    if it won; elections lost on a split vote show here too)."""
    tally: dict[tuple[str, int], Counter[int]] = {}
    for _node, grp, term, vote in votes:
        tally.setdefault((grp, term), Counter())[vote] += 1
    out: dict[str, dict[int, int]] = {}
    for (grp, term), c in sorted(tally.items()):
        out.setdefault(grp, {})[term] = c.most_common(1)[0][0]
    return out


def verdict(findings: list[Any]) -> dict[str, Any]:
    v = sum(f.severity == VIOLATION for f in findings)
    n = len(findings) - v
    text = (f"FAIL: {v} violation{'s' * (v != 1)}, {n} note{'s' * (n != 1)}" if v
            else f"PASS: 0 violations, {n} note{'s' * (n != 1)}")
    return {"ok": v == 0, "violations": v, "notes": n, "text": text}


def build(out: Any) -> dict[str, Any]:
    from audit.job import uncovered

    findings = sorted(out.findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.kind,
                                                   f.group or "", f.index or 0, f.node or ""))
    counts = Counter(f"{f.severity}:{f.kind}" for f in findings)
    blind = uncovered(out)
    lead = leaders(out.votes)
    groups = {}
    for grp, logs in sorted(out.coverage.items()):
        infos = {c["node"]: out.summaries[(c["node"], grp)] for c in logs}
        groups[grp] = {
            "logs": [{**c, **{k: infos[c["node"]][k] for k in
                             ("survivors", "superseded", "copies", "conf_changes", "hs_term",
                              "conf")}}
                     for c in sorted(logs, key=lambda c: c["node"])],
            "uncovered": blind.get(grp, []),
            "leaders": {str(t): v for t, v in lead.get(grp, {}).items()},
            "term_starts": sorted({(i, t) for _n, g, i, t in out.term_starts if g == grp}),
            "entries_per_term": [[t, n] for g, t, n in out.per_term if g == grp],
        }
    return {"verdict": verdict(findings), "counts": dict(sorted(counts.items())),
            "stats": out.stats, "groups": groups, "findings": [f.to_json() for f in findings]}


def write_reports(out: Any, dir: str) -> dict[str, Any]:
    from audit.page import render

    report = build(out)
    os.makedirs(dir, exist_ok=True)
    with open(os.path.join(dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1, default=list)
    with open(os.path.join(dir, "report.html"), "w") as f:
        f.write(render(report))
    return report["verdict"]

"""Driver-side verdicts from the small outputs of the log pass. Pure.

Per (node, group) the log pass reports its summary, the holes between
surviving entries and where each term starts. From those, and from whether
the node still has its first segment (`NodeDirs.complete`), this module
decides what each node could be checked for (coverage) and which missing
entries are violations:

- a hole at or below the node's own commit index: a committed entry is gone;
- the log ending below the commit index (not covered by a snapshot): same;
- a missing start of the log: if every segment is here (or archived) it is
  lost data; if old segments were deleted without an archive, it is a range
  the audit could not check (a note), unless no COMPACT covers it, which the
  node itself would refuse to start with (`PREFIX_MISSING`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from audit.model import (
    COMMITTED_MISSING,
    HISTORY_TRUNCATED,
    NOTE,
    PREFIX_MISSING,
    TWO_LEADERS,
    VIOLATION,
    Finding,
)

Range = tuple[int, int]


@dataclass
class LogCoverage:
    node: str
    group: str
    commit: int
    first: int | None
    last: int | None
    checked: list[Range] = field(default_factory=list)
    snapshot: Range | None = None  # covered by a snapshot: no entries to replay
    unavailable: Range | None = None  # in deleted segments (no archive)

    def to_json(self) -> dict[str, Any]:
        def pair(r: Range | None) -> list[int] | None:
            return None if r is None else [r[0], r[1]]
        return {"node": self.node, "commit": self.commit, "first": self.first,
                "last": self.last, "checked": [[a, b] for a, b in self.checked],
                "snapshot": pair(self.snapshot), "unavailable": pair(self.unavailable)}


def checked_runs(first: int | None, last: int | None, gaps: list[Range]) -> list[Range]:
    if first is None or last is None:
        return []
    runs, lo = [], first
    for g_lo, g_hi in sorted(gaps):
        if g_lo > lo:
            runs.append((lo, g_lo - 1))
        lo = g_hi + 1
    if lo <= last:
        runs.append((lo, last))
    return runs


def _missing(node: str, grp: str, lo: int, hi: int, commit: int, why: str) -> list[Finding]:
    hi = min(hi, commit)
    if lo > hi:
        return []
    return [Finding(COMMITTED_MISSING, VIOLATION, f"entries {lo}..{hi} missing ({why}); "
                    f"the node's commit index is {commit}", node=node, group=grp, index=lo,
                    index_hi=hi if hi != lo else None)]


def judge_log(node: str, grp: str, info: dict[str, Any], gaps: list[Range],
              complete: bool) -> tuple[LogCoverage, list[Finding]]:
    commit, first, last = info["commit"], info["first"], info["last"]
    floor = info["installed_at"] or 0
    cov = LogCoverage(node, grp, commit, first, last, checked_runs(first, last, gaps))
    if floor:
        cov.snapshot = (1, floor)
    out: list[Finding] = []
    for lo, hi in gaps:
        out += _missing(node, grp, lo, hi, commit, "a hole between entries")
    start = first if first is not None else max(floor, info["max_compact"]) + 1
    if start > floor + 1:
        out += _front(node, grp, info, floor, start, complete, cov)
    covered = max(floor, info["max_compact"] if not complete else 0, last or 0)
    out += _missing(node, grp, covered + 1, commit, commit, "the log ends before its commit")
    return cov, out


def _front(node: str, grp: str, info: dict[str, Any], floor: int, start: int,
           complete: bool, cov: LogCoverage) -> list[Finding]:
    commit = info["commit"]
    if complete:
        return _missing(node, grp, floor + 1, start - 1, commit, "the start of the log")
    cov.unavailable = (floor + 1, start - 1)
    out = [Finding(HISTORY_TRUNCATED, NOTE,
                   f"entries {floor + 1}..{start - 1} were in deleted segments (no archive): "
                   "not checked", node=node, group=grp, index=floor + 1, index_hi=start - 1)]
    if info["max_compact"] < start - 1:
        lo = max(floor, info["max_compact"]) + 1
        out.append(Finding(PREFIX_MISSING, VIOLATION,
                           f"entries {lo}..{start - 1} are neither on disk nor compacted",
                           node=node, group=grp, index=lo, index_hi=start - 1))
    return out


def two_leaders(starts: list[tuple[str, str, int, int]]) -> list[Finding]:
    """A term begins where its leader appended its first entry: one index per term.

    `starts`: (node, group, index, term) where a node's log moves to `term`.
    """
    by_term: dict[tuple[str, int], dict[int, list[str]]] = {}
    for node, grp, idx, term in starts:
        by_term.setdefault((grp, term), {}).setdefault(idx, []).append(node)
    out = []
    for (grp, term), at in sorted(by_term.items()):
        if len(at) < 2:
            continue
        for idx, nodes in sorted(at.items()):
            others = sorted(n for i, ns in at.items() if i != idx for n in ns)
            for node in sorted(nodes):
                out.append(Finding(TWO_LEADERS, VIOLATION,
                                   f"term {term} starts at index {idx} here but at "
                                   f"{sorted(i for i in at if i != idx)} on {others}: "
                                   "two leaders appended in one term",
                                   node=node, group=grp, index=idx, term=term, nodes=others))
    return out


def minority(variants: list[tuple[Any, list[str]]]) -> tuple[list[str], list[str]]:
    """Nodes holding a value fewer nodes hold, and the majority's nodes; a tie names all."""
    sizes = sorted((len(ns) for _, ns in variants), reverse=True)
    if sizes[0] == sizes[1]:
        return sorted(n for _, ns in variants for n in ns), []
    top = max(variants, key=lambda v: len(v[1]))
    return sorted(n for v in variants if v is not top for n in v[1]), sorted(top[1])

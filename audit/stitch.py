"""Check that the tasks of one segment tiled it, and grade the damage found. Pure.

Every byte of a segment must belong to a decoded record or to a reported
damaged range. Bytes no task accounted for (a record that failed exactly at
a task boundary) become damage here; a task that started inside bytes another
task decoded as a record means a false record boundary, reported too.

Grading follows the node's own recovery rule (docs/raft.md): damage that runs
to the end of the node's newest segment is a torn write after the last fsync
(a note); damage with valid records after it, or in an older segment, was
fsynced and is lost (a violation).
"""

from __future__ import annotations

from audit.model import CORRUPT_RECORD, NOTE, TORN_TAIL, VIOLATION, Finding
from audit.segread import SplitEdges


def segment_name(seq: int) -> str:
    return f"wal-{seq:016d}.log"


def damage_ranges(edges: list[SplitEdges], size: int) -> tuple[list[tuple[int, int, str]],
                                                                 list[str]]:
    """Merged damaged ranges [p, q) with a reason, and tiling inconsistencies."""
    found: list[tuple[int, int, str]] = []
    problems: list[str] = []
    cursor = 0
    for e in sorted(edges, key=lambda x: x.start):
        if e.first is None:
            continue
        if e.first > cursor:
            found.append((cursor, e.first, "no valid record"))
        elif e.first < cursor:
            problems.append(f"a task found a record at {e.first}, inside bytes decoded up to "
                            f"{cursor}")
        found.extend(e.damage)
        if e.last_end is not None:
            cursor = max(cursor, e.last_end)
    if cursor < size:
        found.append((cursor, size, "no valid record"))
    return _merge(found), problems


def _merge(ranges: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    for p, q, why in sorted(ranges):
        if out and p <= out[-1][1]:
            lp, lq, lwhy = out[-1]
            out[-1] = (lp, max(lq, q), lwhy)
        else:
            out.append((p, q, why))
    return out


def grade(node: str, seq: int, size: int, newest: bool,
          edges: list[SplitEdges]) -> list[Finding]:
    ranges, problems = damage_ranges(edges, size)
    out = []
    for p, q, why in ranges:
        where = f"{segment_name(seq)} bytes [{p}, {q}) of {size}: {why}"
        if q == size and newest:
            out.append(Finding(TORN_TAIL, NOTE, f"torn tail after the last fsync: {where}",
                               node=node))
        else:
            out.append(Finding(CORRUPT_RECORD, VIOLATION,
                               f"unreadable fsynced records: {where}", node=node))
    for e in edges:
        for off, why in e.unopened:
            out.append(Finding(CORRUPT_RECORD, VIOLATION, f"{segment_name(seq)} record at "
                               f"{off}: its checksum is valid but its payload does not "
                               f"decrypt ({why})", node=node))
    for text in problems:
        out.append(Finding(CORRUPT_RECORD, VIOLATION, f"{segment_name(seq)}: {text}",
                           node=node))
    return out

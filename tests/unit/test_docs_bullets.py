"""docs/jetstream.md maps every bullet of issue 8 to the tests that cover it; this check fails
when a bullet has no test and does not say so.

The table under HEADING has rows `| id | bullet | tests |`. A tests cell passes when it names
at least one existing file (a backticked `path`, relative to the repository root) and every
`path::name` in it is a function or class defined at the top of that module; or when it says
**not built**, which keeps the gap visible instead of hiding it. The ids must be exactly
BULLETS, so a bullet cannot silently drop out of the table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "jetstream.md"
HEADING = "## Issue 8: every bullet and the tests that cover it (checked in CI)"
NOT_BUILT = "**not built**"

# One id per bullet of issue 8 ("The shape", "What to build", "What it must show"), in order.
BULLETS = [
    "shape-raft", "shape-consumer-raft", "shape-pure", "shape-lmdb", "shape-batch-crash",
    "shape-memory-bounded", "shape-memory-storage", "shape-consumer-groups", "shape-compaction",
    "shape-accounts", "info-api-lvl", "api-json", "api-info", "api-stream", "api-get",
    "api-consumer-create", "api-consumer-rest", "api-stepdown", "api-snapshot",
    "stream-every-option", "stream-atomic", "stream-counter", "stream-schedules",
    "stream-consumer-limits", "stream-expected-subject", "stream-promotion", "stream-storage",
    "stream-retention", "stream-discard", "stream-limits", "stream-dedup", "stream-expected",
    "stream-deny", "stream-republish-direct", "stream-transform-meta", "stream-ttl",
    "stream-misc", "stream-sourcing", "stream-puback", "consumer-every-option",
    "consumer-kinds", "consumer-acking", "consumer-options", "consumer-pause-priority",
    "consumer-push", "consumer-pull", "consumer-acks", "consumer-ack-subject",
    "consumer-ordered", "kv-basics", "kv-watch", "obj", "config-block", "config-sync-interval",
    "config-encryption", "advisories", "metrics", "bad-input-errors", "bad-input-harmless",
    "bad-input-fuzz", "show-nats-py", "show-docs-map", "show-nats-js", "durability-kill9",
    "durability-consumer-state", "durability-while-changing", "power-fuse", "power-cuts",
    "power-mutant", "store-integrity", "benchmarks", "docs",
]

# `tests/x.py`, `tests/x.py::name` or `tests/x.py::name[param]` (benchmarks/ too)
REF = re.compile(r"`((?:tests|benchmarks)/[^`\s]+?\.py)"
                 r"(?:::([A-Za-z_][A-Za-z0-9_]*))?(?:\[[^`]*\])?`")


def table_rows(text: str) -> list[tuple[str, str, str]]:
    """The (id, bullet, tests) rows of the table under HEADING."""
    start = text.index(HEADING)
    rows: list[tuple[str, str, str]] = []
    in_table = False
    for line in text[start:].splitlines()[1:]:
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        in_table = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("id", "") or set(cells[0]) <= {"-"}:
            continue
        assert len(cells) == 3, f"a row needs 3 cells (a `|` inside a cell?): {line}"
        rows.append((cells[0], cells[1], cells[2]))
    return rows


def top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {n.name for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def problems(rows: list[tuple[str, str, str]], root: Path) -> list[str]:
    """What is wrong with the rows: a missing test, a missing function, a bare gap."""
    out: list[str] = []
    for ident, _bullet, tests in rows:
        refs = REF.findall(tests)
        if not refs and NOT_BUILT not in tests:
            out.append(f"{ident}: names no test and does not say {NOT_BUILT}")
        for path, name in refs:
            file = root / path
            if not file.is_file():
                out.append(f"{ident}: {path} does not exist")
            elif name and name not in top_level_names(file):
                out.append(f"{ident}: {path} has no {name}")
    return out


def test_every_issue_8_bullet_names_tests_or_says_not_built() -> None:
    rows = table_rows(DOC.read_text())
    ids = [r[0] for r in rows]
    assert ids == BULLETS, f"the table's ids are not the issue's bullets: {ids}"
    assert problems(rows, ROOT) == []


@pytest.mark.parametrize("cell,expected", [
    ("", "names no test"),
    ("nothing yet", "names no test"),
    ("`tests/unit/no_such_file.py`", "does not exist"),
    ("`tests/unit/test_docs_bullets.py::no_such_function`", "has no no_such_function"),
])
def test_the_check_catches_a_bullet_without_a_real_test(cell: str, expected: str) -> None:
    found = problems([("x", "a bullet", cell)], ROOT)
    assert found and expected in found[0]


def test_the_check_accepts_real_tests_and_marked_gaps() -> None:
    rows = [("a", "b", "`tests/unit/test_docs_bullets.py::table_rows`"),
            ("c", "d", "`tests/unit/test_docs_bullets.py`"),
            ("e", "f", f"{NOT_BUILT}: nobody wrote it")]
    assert problems(rows, ROOT) == []

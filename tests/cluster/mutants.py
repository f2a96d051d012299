"""Mutants of the node that the clustered fault tests must catch.

    python -m tests.cluster.mutants [NAME...]      (from the worktree root)

Each mutant: copy the tree to a temporary directory, apply exact text replacements (each
must match once), run its guarding tests there (the audit step off unless the mutant is the
audit's business: the checker must catch it on its own), print passed/FAILED and the first
assertion line. Outcomes are recorded in docs/notes/claudit.md. Never edits the worktree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "node/jetstream/service.py"

# name -> (edits, tests, whether the tests need the audit on)
MUTANTS: dict[str, tuple[list[tuple[str, str, str]], list[str], bool]] = {
    # The stream leader answers a PubAck as soon as it PROPOSES the entry, with a guessed
    # seq, instead of when the entry commits and applies: an entry a cut-off leader
    # proposes never commits, yet its client was told it was stored.
    "ack-before-commit": ([(
        SERVICE,
        "            self._not_acked((sm, key), exc)\n        return None\n",
        "            self._not_acked((sm, key), exc)\n"
        "        if reply:  # MUTANT\n"
        "            self._guess = max(getattr(self, '_guess', 0), sm.stream.last_seq) + 1\n"
        "            self._reply(name, reply, json.dumps(\n"
        "                {'stream': sm.stream.cfg['name'], 'seq': self._guess}).encode())\n"
        "        return None\n")],
        ["tests/cluster/test_js_partition.py"], False),
    # The audit retention mode ignored: compaction deletes the old segments, so the audit
    # can no longer check the whole history (history_truncated notes, nothing archived).
    "archive-ignored": ([(
        SERVICE, "archive_dir=ARCHIVE_DIR if archive else None", "archive_dir=None")],
        ["tests/cluster/test_js_audit.py::test_healthy_three_node_history_has_no_finding"],
        True),
}


def apply(tree: Path, edits: list[tuple[str, str, str]]) -> None:
    for rel, old, new in edits:
        path = tree / rel
        text = path.read_text()
        assert text.count(old) == 1, f"{rel}: the mutated text must occur once"
        path.write_text(text.replace(old, new))


def run(name: str) -> bool:
    edits, tests, audit = MUTANTS[name]
    tmp = Path(tempfile.mkdtemp(prefix=f"claudit-mutant-{name}-"))
    tree = tmp / "tree"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", "__pycache__",
                                                               "node_modules", ".ruff_cache"))
    try:
        apply(tree, edits)
        env = {**os.environ, "PYTHONPATH": str(tree)}
        if not audit:
            env["JETRAFT_NO_AUDIT"] = "1"
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p",
                               "no:cacheprovider", *tests], cwd=tree, env=env,
                              capture_output=True, text=True)
        out = proc.stdout + proc.stderr
        first = " | ".join(line[1:].strip() for line in out.splitlines()
                           if re.match(r"E\s+\S", line))[:600]
        caught = proc.returncode != 0
        print(f"{name}: {'FAILED (caught)' if caught else 'passed (NOT caught)'} {first}")
        return caught
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    names = argv or list(MUTANTS)
    return 0 if all([run(n) for n in names]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

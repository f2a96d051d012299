"""Mutants of the durability rules that the power-cut test must catch and kill -9 must not.

    python -m tests.durability.mutants [NAME...]     (from the worktree root; ~2 min each)

For each mutant: copy the tree, apply the exact text replacements (each must match once),
then run in the copy the power-cut test (strict and torn disk models) and the same cycles
with kill -9 only. Prints one line per run: the mutant, the model, passed/FAILED, and the
assertion that failed. The expected outcome is recorded in docs/notes/durab.md.
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
LMDB = "node/jetstream/store/lmdbstore.py"
MACH = "node/jetstream/machines.py"
DIRS = "node/jetstream/dirs.py"
WAL_FSYNC = ("raft/disk.py", "        os.fsync(fd)\n\n    def ftruncate",
             "        pass\n\n    def ftruncate")

# name -> [(file, original, mutated), ...]
MUTANTS: dict[str, list[tuple[str, str, str]]] = {
    # LMDB with MDB_NOSYNC: commits reach the disk only through env.sync() at snapshots.
    "lmdb-nosync": [(LMDB, "sync=sync,", "sync=False,")],
    # ... and compaction no longer syncs LMDB first: the WAL is truncated past what LMDB
    # holds durably (durability rules 4 and 5 together).
    "lmdb-nosync-early-truncate": [
        (LMDB, "sync=sync,", "sync=False,"),
        (MACH, "        self.env.sync()  # what `index` covers", "        # what `index` covers"),
        (MACH, "            index = _committed_applied(self.store)\n            self.env.sync()",
         "            index = _committed_applied(self.store)"),
    ],
    # The Raft WAL's fsync is skipped: commit (and so the PubAck) no longer waits for it.
    "wal-no-fsync": [WAL_FSYNC],
    # Nothing fsynced before the PubAck: WAL fsync skipped and LMDB NOSYNC.
    "ack-before-any-fsync": [
        WAL_FSYNC,
        (LMDB, "sync=sync,", "sync=False,"),
    ],
    # The store's directories are created without fsyncing their parents.
    "store-dirs-not-fsynced": [
        (DIRS, "        fsync_dir(os.path.dirname(d))\n", "        pass\n"),
        (DIRS, "    if not missing:\n        fsync_dir(os.path.dirname(path))\n", ""),
        (LMDB, "        fsync_dir(path)\n", ""),
    ],
}
MODELS = ("strict", "torn", "kill9")


def _apply(copy: Path, edits: list[tuple[str, str, str]]) -> None:
    for file, old, new in edits:
        path = copy / file
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"mutant no longer applies: {file}: {old!r}")
        path.write_text(text.replace(old, new))


def run(name: str, models: tuple[str, ...] = MODELS) -> list[tuple[str, str, str]]:
    out = []
    with tempfile.TemporaryDirectory(prefix="durab-mutant-") as tmp:
        copy = Path(tmp) / "tree"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(
            ".git", "__pycache__", ".pytest_cache", "node_modules", ".ruff_cache"))
        _apply(copy, MUTANTS[name])
        for model in models:
            env = {**os.environ, "PYTHONPATH": str(copy), "JETRAFT_POWER_KILL9": "1"}
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                 "tests/durability/test_power_loss.py", "-k", model],
                cwd=copy, env=env, capture_output=True, text=True)
            text = done.stdout + done.stderr
            why = next((m.group(0) for m in re.finditer(r"^E\s+.*$", text, re.M)), "")
            verdict = "passed" if done.returncode == 0 else "FAILED"
            out.append((model, verdict, why[:300]))
            print(f"{name:28} {model:7} {verdict:7} {why[:300]}", flush=True)
    return out


def main() -> int:
    names = sys.argv[1:] or list(MUTANTS)
    for name in names:
        run(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Mutants of the durability rules that the power-cut test must catch and kill -9 must not,
and of what the store-integrity test and the audit's JetStream hooks guard.

    python -m tests.durability.mutants [NAME...]     (from the worktree root)

For each mutant: copy the tree, apply the exact text replacements (each must match once),
then run in the copy: for a durability mutant the power-cut test (strict and torn disk
models) and the same cycles with kill -9 only; for the others their test file. Prints one
line per run: the mutant, the model, passed/FAILED, and the first failure line (the node's
[FTL] line when it refused to start). The outcomes are recorded in docs/notes/durab.md.
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
# The WAL syncs with fdatasync (raft/storage.py `_write`).
WAL_FSYNC = ("raft/disk.py", "        os.fdatasync(fd)\n\n    def ftruncate",
             "        pass\n\n    def ftruncate")

# name -> [(file, original, mutated), ...]
MUTANTS: dict[str, list[tuple[str, str, str]]] = {
    # LMDB with MDB_NOSYNC: commits reach the disk only through env.sync() at snapshots
    # (NodeEnv's `sync=False`: no pin, no meta restore, a plain env.sync() at snapshots.)
    "lmdb-nosync": [(LMDB, "def __init__(self, path: str, *, sync: bool = True,",
                     "def __init__(self, path: str, *, sync: bool = False,")],
    # Compaction no longer syncs LMDB first, and no periodic sync point covers for it: the
    # WAL is truncated past what LMDB holds durably (durability rule 4; one node and
    # clustered streams compact through the same marker path).
    "lmdb-nosync-early-truncate": [
        (LMDB, "            if sync_interval:\n                self._syncer",
         "            if False:\n                self._syncer"),
        (MACH, "        self.env.sync()  # what the image covers is durable before the WAL",
         "        # what the image covers is durable before the WAL"),
        (MACH, "            index = _committed_applied(self.store)\n            self.env.sync()",
         "            index = _committed_applied(self.store)"),
    ],
    # The Raft WAL's fsync is skipped: commit (and so the PubAck) no longer waits for it.
    "wal-no-fsync": [WAL_FSYNC],
    # The drain pass no longer waits for its WAL write+fsync: it runs in the WAL thread
    # while the pass commits, applies and sends the PubAck (ack before fsync).
    "ack-before-wal-fsync": [(
        "raft/multigroup.py",
        "            await self._sync_pass(len(work), runner,\n"
        "                                  None if installs else lambda: self._answer(work))",
        "            self._spawn(self._sync_pass(len(work), self.wal_executor.run))")],
    # Nothing fsynced, ever: WAL fsync skipped and LMDB's sync points dropped (its commits
    # are never fsynced by design; `sync=False` also drops the synced-state roll-back).
    "ack-before-any-fsync": [
        WAL_FSYNC,
        (LMDB, "def __init__(self, path: str, *, sync: bool = True,",
         "def __init__(self, path: str, *, sync: bool = False,"),
    ],
    # The store's directories are created without fsyncing their parents.
    "store-dirs-not-fsynced": [
        (DIRS, "        fsync_dir(os.path.dirname(d))\n", "        pass\n"),
        (DIRS, "    if not missing:\n        fsync_dir(os.path.dirname(path))\n", ""),
        (LMDB, "        fsync_dir(path)\n", ""),
    ],
}
SVC = "node/jetstream/service.py"
_EARLY_ACKS = '''def _early_acks(svc: Any, sm: Any) -> Any:
    """MUTANT: the PubAcks of merged publishes leave when the leader builds the entry."""
    merge = getattr(sm, "_early", None)
    if merge is None:
        def merge(entries: list[bytes]) -> bytes:
            sm._guess = max(getattr(sm, "_guess", 0), sm.stream.last_seq)
            for raw in entries:
                op = ops.decode(raw)
                sm._guess += 1
                if op.reply:
                    body = {"stream": sm.stream.cfg["name"], "seq": sm._guess}
                    svc._reply(sm.name, op.reply, json.dumps(body).encode())
            return ops.merge_msgs(entries)
        sm._early = merge
    return merge


def _snapshot_every() -> int:'''
MUTANTS["batch-acks-before-commit"] = [
    # A merged batch of publishes is answered when the leader merges it (predicted
    # sequences), before the entry is fsynced or committed; single publishes are not.
    (SVC, "merge=ops.merge_msgs)", "merge=_early_acks(self, sm))"),
    (SVC, "def _snapshot_every() -> int:", _EARLY_ACKS),
]
POWER = "tests/durability/test_power_loss.py"
MODELS = ("strict", "torn", "kill9")
AUDIT = "tests/audit/test_audit_jetstream.py"
HS, HM, JS = "audit/hook_jsstream.py", "audit/hook_jsmeta.py", "audit/jsstore.py"
# Mutants of what the other tests guard: (edits, test file) each; the test must fail.
OTHER: dict[str, tuple[list[tuple[str, str, str]], str]] = {
    "record crc not checked": ([(
        "node/jetstream/store/base.py",
        "if zlib.crc32(raw[4:], zlib.crc32(_SEQ.pack(seq))) != crc:", "if False:")],
        "tests/durability/test_store_integrity.py"),
    "audit: messages db not compared": ([(HS, "        for db in DB_NAMES:\n",
                                          "        for db in DB_NAMES[1:]:\n")], AUDIT),
    "audit: values not compared": ([(JS, "            if a[1] != b[1]:\n",
                                     "            if False:\n")], AUDIT),
    "audit: consumer states not compared": ([(HS, "        for db in DB_NAMES:\n",
                                              "        for db in DB_NAMES[:4]:\n")], AUDIT),
    "audit: meta delete not replayed": ([(HM, "            self.streams.pop(name, None)\n",
                                          "            pass\n")], AUDIT),
    "audit: meta compared to nothing": ([(HM, "        if mine == want:\n",
                                          "        if True:\n")], AUDIT),
    "audit: bootstrap snapshot not recognised": ([(HS, "            last = BOOTSTRAP  #",
                                                   "            last = 0  #")], AUDIT),
    "audit: stream config from the catalogue": ([(
        HS, "entry = self.created.get(group) or _stream_entry(nodes, group)",
        "entry = _stream_entry(nodes, group)")], AUDIT),
    # The held-fsync test: a real node whose WAL fsync waits must send no PubAck meanwhile.
    "held fsync: ack-before-wal-fsync": (
        MUTANTS["ack-before-wal-fsync"], "tests/integration/test_jetstream_ack_after_fsync.py"),
    "audit: jetstream hooks not registered": ([(
        "audit/hooks.py",
        "    return [JetStreamStreamHook(keyring), JetStreamConsumerHook(keyring),\n"
        "            JetStreamMetaHook(keyring), LmdbAppendLogHook()]",
        "    return [LmdbAppendLogHook()]")], AUDIT),
}


def _apply(copy: Path, edits: list[tuple[str, str, str]]) -> None:
    for file, old, new in edits:
        path = copy / file
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"mutant no longer applies: {file}: {old!r}")
        path.write_text(text.replace(old, new))


def _copy(tmp: str, edits: list[tuple[str, str, str]]) -> Path:
    copy = Path(tmp) / "tree"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(
        ".git", "__pycache__", ".pytest_cache", "node_modules", ".ruff_cache"))
    _apply(copy, edits)
    return copy


def _pytest(copy: Path, args: list[str]) -> tuple[str, str]:
    env = {"JETRAFT_POWER_CUTS": "5", **os.environ, "PYTHONPATH": str(copy),
           "JETRAFT_POWER_KILL9": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           *args], cwd=copy, env=env, capture_output=True, text=True)
    text = done.stdout + done.stderr
    # The node's fatal line says more than "jetraft exited 1".
    why = next((m.group(0) for m in re.finditer(r"\[FTL\].*$", text, re.M)), "") or \
        next((m.group(0) for m in re.finditer(r"^E\s+.*$", text, re.M)), "")
    return ("passed" if done.returncode == 0 else "FAILED"), " ".join(why.split())[:300]


def run(name: str) -> list[tuple[str, str, str]]:
    out = []
    with tempfile.TemporaryDirectory(prefix="durab-mutant-") as tmp:
        if name in MUTANTS:
            copy = _copy(tmp, MUTANTS[name])
            runs = [(m, [POWER, "-k", m]) for m in MODELS]
        else:
            edits, test = OTHER[name]
            copy = _copy(tmp, edits)
            runs = [("", [test])]
        for label, args in runs:
            verdict, why = _pytest(copy, args)
            out.append((label, verdict, why))
            print(f"{name:40} {label:7} {verdict:7} {why}", flush=True)
    return out


def main() -> int:
    names = sys.argv[1:] or [*MUTANTS, *OTHER]
    for name in names:
        run(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())

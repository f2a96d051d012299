"""Each storage fix of issue 6, undone on a copy of the code, must fail its tests.

    PYTHONPATH=$PWD python -m tests.raft.storage_mutants [NAME ...]

For every mutant: copy raft/ and tests/ to a temporary directory, replace
the fixed text by the old (or broken) one, run the tests that guard it there,
and report KILLED (they failed) or SURVIVED. Exit status 1 if any survived or
if the unmutated copy fails. The simulation (tests/sim/mutants.py) runs the
same lines against the whole cluster.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CRASH = "tests/raft/test_storage_crash.py"
MODEL = "tests/raft/test_storage_model.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = (
    Mutant("D2 segment deleted before its COMPACT is durable", "raft/storage.py",
           "doomed, self._doomed = self._doomed, []",
           "doomed, self._doomed = self._obsolete(), []", (CRASH, MODEL)),
    Mutant("D3a segments fsynced together after all writes", "raft/storage.py",
           "if i + 1 == len(batch) or batch[i + 1].seg != ch.seg:\n"
           "                    # fdatasync makes the bytes and a changed size durable: all a\n"
           "                    # reader of the records needs (mtime may lag).\n"
           "                    self.disk.fdatasync(self._fds[ch.seg])\n"
           "                    self.stats.fsyncs += 1",
           "pass\n"
           "            for seg in dict.fromkeys(c.seg for c in batch):\n"
           "                self.disk.fdatasync(self._fds[seg])\n"
           "                self.stats.fsyncs += 1", (CRASH, MODEL)),
    Mutant("D3b torn tail before empty segments called corruption", "raft/storage.py",
           "if later and not repair and not self._all_empty(later):",
           "if later and not repair:", (CRASH, MODEL)),
    Mutant("D4a a staged snapshot promoted though the log does not describe it",
           "raft/snapfile.py",
           "if index <= log_index and (current", "if (current", (CRASH,)),
    Mutant("D4b received snapshot committed before its WAL record", "raft/snapfile.py",
           "_write_durably(disk, _pending_path(dir, group), body",
           "_write_durably(disk, _meta_path(dir, group), body", (CRASH,)),
    Mutant("D5 repair unlinks without making it durable", "raft/storage.py",
           "            self._drop_segments(later)\n"
           "            if later:\n"
           "                # New records go after every dropped number: should the unlinks be\n"
           "                # undone anyway, the newer records still replay last and win.\n"
           "                self._cur_seg = later[-1]\n"
           "                dropped = True\n",
           "            for s in later:\n"
           "                self.disk.unlink(os.path.join(self.dir, segment_name(s)))\n", (CRASH,)),
    Mutant("D9 recovery writes on in a segment whose checkpoint the crash took",
           "raft/storage.py",
           "        if dropped or len(self._fds) > 1:\n", "        if dropped:\n", (CRASH,)),
    Mutant("FATAL the log takes writes after a failed fsync", "raft/storage.py",
           "            self._failed = e\n", "", (CRASH,)),
    Mutant("ARCH WAL directory fsynced before the archive's", "raft/storage.py",
           "            if self.archive_dir:\n"
           "                # The archive entry is durable before the log's entry goes away.\n"
           "                self._fsync_dir(self.archive_dir)\n"
           "            self._fsync_dir(self.dir)",
           "            self._fsync_dir(self.dir)\n"
           "            if self.archive_dir:\n"
           "                self._fsync_dir(self.archive_dir)",
           ("tests/raft/test_storage_archive.py",)),
    Mutant("SCALE deletion check scans the oldest segment's groups", "raft/storage.py",
           "if seq >= self._cur_seg or self._pins.get(seq):",
           "if seq >= self._cur_seg or self.pinning_groups():",
           ("tests/raft/test_storage_scale.py",)),
    Mutant("CKPT roll checkpoint re-encodes every group", "raft/storage.py",
           "            self.ckpt = (out, n)\n        return self.ckpt",
           "            self.ckpt = None\n            return (out, n)\n        return self.ckpt",
           ("tests/raft/test_storage_scale.py",)),
    Mutant("RELOC idle groups' short tails are not copied forward at a roll", "raft/storage.py",
           "            self._relocate_short_tails(self._segment_bytes // 8)\n", "",
           ("tests/raft/test_storage_scale.py",)),
    Mutant("COPY a copied-forward entry supersedes the entries after it", "raft/storage.py",
           "        if rec.type is RecordType.COPY and self._holds(g, rec.index, rec.term):\n"
           "            return  # the original is still here: the copy changes nothing\n", "",
           (CRASH,)),
    Mutant("STORM a checkpoint bigger than a segment rolls again at once", "raft/storage.py",
           "        self._seg_base = self._cur_size\n", "", ("tests/raft/test_storage_scale.py",)),
    Mutant("BUGA replayed install keeps a hole below its index", "raft/storage.py",
           "        self.hole = 0  # whatever its index: nothing before the snapshot is needed"
           " any more",
           "        if meta.index >= self.hole:\n            self.hole = 0", (MODEL,)),
    Mutant("ZERO zeros followed by record bytes taken for the end of the records",
           "raft/wal.py", "if view[pos:] == bytes(size - pos):",
           "if not any(view[pos:pos + 8]):", ("tests/raft/test_wal_corruption.py",)),
    Mutant("BUGB missing snapshot dir breaks load", "raft/snapfile.py",
           "    if not disk.exists(dir):\n        return  # nothing was ever written there\n", "",
           ("tests/raft/test_snapshot_files.py",)),
)


def copy_tree(dst: Path) -> None:
    shutil.copytree(ROOT / "raft", dst / "raft")
    shutil.copytree(ROOT / "chaos", dst / "chaos")  # tests/conftest.py imports it
    (dst / "tests").mkdir()
    for f in (ROOT / "tests").glob("*.py"):
        shutil.copy(f, dst / "tests" / f.name)
    shutil.copytree(ROOT / "tests" / "raft", dst / "tests" / "raft")
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")


def run_tests(dst: Path, tests: tuple[str, ...]) -> bool:
    """True if the tests pass in the copy (imports resolve to the copy only)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    env = {"PYTHONPATH": str(dst), "PATH": "/usr/bin:/bin"}
    return subprocess.run(cmd, cwd=dst, env=env, capture_output=True).returncode == 0


def check(m: Mutant | None, tests: tuple[str, ...]) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp)
        copy_tree(dst)
        if m is not None:
            src = (dst / m.path).read_text()
            if src.count(m.old) != 1:
                raise SystemExit(f"{m.name}: fixed text found {src.count(m.old)} times")
            (dst / m.path).write_text(src.replace(m.old, m.new))
        return run_tests(dst, tests)


def main(names: list[str]) -> int:
    chosen = [m for m in MUTANTS if not names or m.name.split()[0] in names]
    every_test = tuple(sorted({t for m in chosen for t in m.tests}))
    if not check(None, every_test):
        print("the unmutated code fails its tests: nothing to conclude")
        return 1
    survived = 0
    for m in chosen:
        killed = not check(m, m.tests)
        survived += not killed
        print(f"{'KILLED  ' if killed else 'SURVIVED'} {m.name}", flush=True)
    print(f"{len(chosen) - survived}/{len(chosen)} killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A power-loss disk for tests: mounts `powerfs` and cuts its power.

    disk = PowerDisk(tmp_path / "disk")
    disk.mount()                 # disk.path is the mount point
    ...                          # run a process whose files live under disk.path
    proc.kill(); disk.cut()      # the process dies, then everything not fsynced is gone
    disk.mount()                 # the surviving state, with cold kernel caches

`cut()` returns the daemon's per-file counters (tests/durability/powerfs.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MOUNT_TIMEOUT = 15.0


def fuse_available() -> str | None:
    """None when a FUSE mount can work here, else why not (for a skip message)."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "fusermount3 missing (Debian package fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy unusable: {exc}"
    return None


class PowerDisk:
    def __init__(self, root: Path, *, torn: float | None = None, seed: int = 0) -> None:
        self.root = root
        self.image = root / "image"
        self.path = root / "mnt"
        self.torn = torn
        self.seed = seed
        self.cuts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.image.mkdir(parents=True, exist_ok=True)
        self.path.mkdir(parents=True, exist_ok=True)

    def mount(self) -> Path:
        assert self.proc is None, "already mounted"
        stats = self.root / f"stats-{self.cuts:03d}.json"
        argv = [sys.executable, "-m", "tests.durability.powerfs", "--image", str(self.image),
                "--mount", str(self.path), "--seed", str(self.seed + self.cuts),
                "--stats", str(stats)]
        if self.torn is not None:
            argv += ["--torn", str(self.torn)]
        log = open(self.root / "powerfs.log", "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not os.path.ismount(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._kill()
                raise RuntimeError(f"powerfs did not mount:\n{self.log()}")
            time.sleep(0.02)
        return self.path

    def cut(self) -> dict[str, Any]:
        """Power off: the daemon unmounts and keeps only what was made durable. Kill every
        process writing under the mount first (the cut is of the disk, not of them)."""
        assert self.proc is not None, "not mounted"
        stats = self.root / f"stats-{self.cuts:03d}.json"
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while True:  # busy only for as long as the killed process's files are being closed
            done = subprocess.run(["fusermount3", "-u", str(self.path)], capture_output=True)
            if done.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self._kill()
            raise RuntimeError(f"powerfs did not stop:\n{self.log()}") from None
        self.proc = None
        self.cuts += 1
        if code != 0 or not stats.exists():
            raise RuntimeError(f"powerfs exited {code}:\n{self.log()}")
        return json.loads(stats.read_text())

    def log(self) -> str:
        path = self.root / "powerfs.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        if os.path.ismount(self.path):
            subprocess.run(["fusermount3", "-u", "-z", str(self.path)], check=False,
                           capture_output=True)

    def close(self) -> None:
        """End of test: unmount whatever state (no dump needed)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        self._kill()

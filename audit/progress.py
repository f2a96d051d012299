"""The progress line while Spark works: phase, stage, tasks done of total.

A daemon thread polls Spark's status tracker twice a second and rewrites one
line on stderr (a terminal) or prints a line every few seconds (a log file).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from pyspark import SparkContext


class Progress:
    def __init__(self, sc: SparkContext, out: TextIO | None = None, every_s: float = 0.5):
        self._sc, self._out = sc, out or sys.stderr
        self._tty = self._out.isatty()
        self._every = every_s
        self._phase = "starting"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="audit-progress", daemon=True)
        self._last_line = ""
        self._last_print = 0.0

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        if self._tty:
            self._out.write("\n")
        self._out.flush()

    def phase(self, name: str) -> None:
        self._phase = name
        self._show(f"[audit] {name}", force=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._show(self._line())
            except Exception:  # noqa: BLE001 - the tracker goes away at shutdown
                return

    def _line(self) -> str:
        tracker = self._sc.statusTracker()
        done = total = 0
        stages = tracker.getActiveStageIds()
        for sid in stages:
            info = tracker.getStageInfo(sid)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        work = f" stage {','.join(map(str, stages))}: {done}/{total} tasks" if stages else ""
        return f"[audit] {self._phase}{work}"

    def _show(self, line: str, force: bool = False) -> None:
        now = time.monotonic()
        if self._tty:
            self._out.write("\r" + line.ljust(len(self._last_line)))
        elif force or (line != self._last_line and now - self._last_print >= 5):
            self._out.write(line + "\n")
        else:
            return
        self._out.flush()
        self._last_line, self._last_print = line, now

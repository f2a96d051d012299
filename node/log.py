"""Logging in nats-server's line format.

    [PID] YYYY/MM/DD HH:MM:SS.uuuuuu [INF] message

Operators and scripts grep these lines ("Server is ready", "Listening for
client connections on ..."), so the prefix and the phrases must match the
Go server's exactly. Kept deliberately tiny: one writer, no handlers.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import datetime
from typing import TextIO


class Logger:
    """Writes nats-server style log lines to stderr or a file."""

    def __init__(
        self, debug: bool = False, trace: bool = False, log_file: str | None = None
    ) -> None:
        self.debug_enabled = debug
        self.trace_enabled = trace
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._stream: TextIO = sys.stderr
        self._owned = False
        if log_file:
            self._stream = open(log_file, "a", encoding="utf-8")  # noqa: SIM115
            self._owned = True

    def _write(self, level: str, msg: str) -> None:
        now = datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")
        line = f"[{self._pid}] {now} [{level}] {msg}\n"
        with self._lock:
            try:
                self._stream.write(line)
                self._stream.flush()
            except (OSError, ValueError):
                pass  # a closed stderr must never take the server down

    def info(self, msg: str) -> None:
        self._write("INF", msg)

    def warn(self, msg: str) -> None:
        self._write("WRN", msg)

    def error(self, msg: str) -> None:
        self._write("ERR", msg)

    def fatal(self, msg: str) -> None:
        self._write("FTL", msg)

    def debug(self, msg: str) -> None:
        if self.debug_enabled:
            self._write("DBG", msg)

    def trace(self, msg: str) -> None:
        if self.trace_enabled:
            self._write("TRC", msg)

    def set_file(self, log_file: str | None) -> None:
        """Config reload: log to another file (None: stderr) from now on."""
        stream: TextIO = open(log_file, "a", encoding="utf-8") if log_file else sys.stderr  # noqa: SIM115
        with self._lock:
            old, owned = self._stream, self._owned
            self._stream, self._owned = stream, bool(log_file)
        if owned:
            old.close()

    def close(self) -> None:
        if self._owned:
            self._stream.close()
            self._owned = False

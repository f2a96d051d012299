"""The history of a run: one JSON object per line, appended as things happen.

Every client operation is an `invoke` followed by exactly one completion:
`ok` (the server confirmed it), `fail` (it certainly did not happen) or `info`
(unknown: a timeout or a lost connection; it may or may not have happened).
Faults are `info` events of process `nemesis`. Fields:

    t        seconds since the run started
    proc     "pub<i>", "con<i>", "nemesis", "run"
    type     invoke | ok | fail | info
    f        publish | deliver | ack | a fault name | a run phase
    payload, stream, seq, dup, consumer, delivered, node, err: as the operation needs
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

Event = dict[str, Any]


class History:
    """Appends events to a file (line-buffered: a crashed run keeps what it saw)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = time.monotonic()
        self._lock = threading.Lock()
        self._file: TextIO = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def add(self, proc: str, type_: str, f: str, **fields: Any) -> Event:
        event: Event = {"t": round(time.monotonic() - self.start, 6), "proc": proc,
                        "type": type_, "f": f, **fields}
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
        return event

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read(path: Path) -> list[Event]:
    return list(iter_events(path))


def iter_events(path: Path) -> Iterator[Event]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                # The last line of a run that was killed may be cut short.
                raise ValueError(f"{path}:{n}: not a JSON event: {line[:80]!r}") from None

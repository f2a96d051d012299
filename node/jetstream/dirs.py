"""Durable directories for the JetStream store: a created directory is durable only once its
parent was fsynced (POSIX; a power loss may otherwise take the new entry, and everything
under it, away although the files inside were fsynced). The Raft WAL fsyncs its own
directory; the chain above it and the LMDB directory are made durable here.
"""

from __future__ import annotations

import os

SUBDIRS = ("raft", os.path.join("raft", "wal"), os.path.join("raft", "snap"), "lmdb")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_durable(path: str) -> None:
    """Create `path` and its missing parents, fsyncing the parent of each. An existing
    `path` gets its parent fsynced too: an earlier run may have crashed before doing it."""
    path = os.path.abspath(path)
    missing = []
    here = path
    while not os.path.isdir(here):
        missing.append(here)
        here = os.path.dirname(here)
    for d in reversed(missing):
        os.makedirs(d, exist_ok=True)
        fsync_dir(os.path.dirname(d))
    if not missing:
        fsync_dir(os.path.dirname(path))


def prepare_store_dir(store_dir: str) -> None:
    """The store directory and the ones the node writes in, all durable, before any write."""
    make_durable(store_dir)
    for sub in SUBDIRS:
        make_durable(os.path.join(store_dir, sub))

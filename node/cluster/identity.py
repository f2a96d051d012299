"""This node's peer id in the cluster: random, non-zero, 63 bits.

With JetStream the id is stored under the store directory, so a restart keeps
it and a wiped directory gets a NEW one: a node that lost its Raft state must
never come back under the identity (and the votes) of the old one. Without
JetStream there is no state to protect and each process gets a fresh id.
"""

from __future__ import annotations

import os
import secrets

ID_FILE = "identity"


def new_peer_id() -> int:
    while True:
        pid = secrets.randbits(63)
        if pid:
            return pid


def load_or_create(directory: str | None) -> int:
    """The persisted id in `directory` (created durably if missing); None: per process."""
    if directory is None:
        return new_peer_id()
    path = os.path.join(directory, ID_FILE)
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except FileNotFoundError:
        text = ""
    if text:
        try:
            pid = int(text, 16)
        except ValueError:
            raise ValueError(f"cluster identity file {path!r} is corrupt: {text[:40]!r}") from None
        if not 0 < pid < 1 << 63:
            raise ValueError(f"cluster identity file {path!r} holds an invalid id")
        return pid
    os.makedirs(directory, exist_ok=True)
    pid = new_peer_id()
    tmp = path + ".tmp"
    # Data, fsync, rename, then fsync the directory: a crash leaves either no
    # file (a new id next time, nothing was promised under this one) or the whole id.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, f"{pid:016x}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return pid

"""Plain data shared by the Raft core, its storage and its transports.

This module is the contract between `raft/core.py` (pure), `raft/storage.py`
(disk) and `raft/transport_*.py` (wire). It holds no logic beyond
construction, so every layer can import it without pulling in the others.

Node ids are positive integers (0 means "none"); the cluster layer maps
server names to ids. Group ids are short ASCII strings ("$meta",
"S-ORDERS"), kept readable because the audit job reads them from disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

NONE = 0  # no node: no vote cast, no leader known


class EntryType(IntEnum):
    # Append only: the value is written to disk and to the wire.
    NORMAL = 0  # application payload (may be empty: the leader's no-op)
    CONF_CHANGE = 1  # payload is an encoded ConfChange


class ConfChangeType(IntEnum):
    ADD_VOTER = 0
    REMOVE = 1
    ADD_LEARNER = 2


class MsgType(IntEnum):
    # Append only: the value is written to the wire.
    # Local messages: never leave the node, stepped in by the driver.
    HUP = 0  # start an election (pre-vote first when enabled)
    BEAT = 1  # leader: send heartbeats now
    PROP = 2  # propose entries
    # Wire messages.
    APP = 3
    APP_RESP = 4
    VOTE = 5
    VOTE_RESP = 6
    PRE_VOTE = 7
    PRE_VOTE_RESP = 8
    HEARTBEAT = 9
    HEARTBEAT_RESP = 10
    SNAP = 11
    TRANSFER_LEADER = 12
    TIMEOUT_NOW = 13
    READ_INDEX = 14
    READ_INDEX_RESP = 15
    # Local: the driver reports a peer it could not reach, or a snapshot outcome.
    UNREACHABLE = 16
    SNAP_STATUS = 17
    # Local: the driver reports that entries up to `index` (of `log_term`)
    # are fsynced on this node. Only then do they count toward commit here.
    STORAGE_APPEND_RESP = 18


# Generated and consumed inside one node: a transport drops them if they
# arrive from the network (a peer must not report our own fsyncs).
LOCAL_MSG_TYPES = frozenset({
    MsgType.HUP, MsgType.BEAT, MsgType.PROP, MsgType.UNREACHABLE,
    MsgType.SNAP_STATUS, MsgType.STORAGE_APPEND_RESP,
})


@dataclass(slots=True)
class Entry:
    term: int
    index: int
    type: EntryType = EntryType.NORMAL
    data: bytes = b""


@dataclass(slots=True)
class ConfChange:
    type: ConfChangeType
    node_id: int


@dataclass(slots=True, frozen=True)
class ConfState:
    voters: tuple[int, ...] = ()
    learners: tuple[int, ...] = ()


@dataclass(slots=True)
class SnapshotMeta:
    index: int = 0
    term: int = 0
    conf_state: ConfState = field(default_factory=ConfState)


@dataclass(slots=True)
class Snapshot:
    meta: SnapshotMeta = field(default_factory=SnapshotMeta)
    data: bytes = b""


@dataclass(slots=True)
class HardState:
    term: int = 0
    vote: int = NONE
    commit: int = 0


@dataclass(slots=True)
class Message:
    type: MsgType
    group: str = ""
    frm: int = NONE
    to: int = NONE
    term: int = 0
    log_term: int = 0
    index: int = 0
    entries: list[Entry] = field(default_factory=list)
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    snapshot: Snapshot | None = None
    context: bytes = b""


@dataclass(slots=True)
class ReadState:
    """A ReadIndex answer: reads tagged `context` are linearizable once
    the local state machine has applied `index`."""

    index: int
    context: bytes


@dataclass(slots=True)
class Ready:
    """What the driver must do, in order: persist `hard_state`, `snapshot`
    and `entries` (fsync, then step STORAGE_APPEND_RESP), send `messages`,
    apply `committed_entries`, then call `advance()` on the core."""

    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None
    committed_entries: list[Entry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    read_states: list[ReadState] = field(default_factory=list)
    must_sync: bool = False

    def empty(self) -> bool:
        return not (
            self.hard_state
            or self.entries
            or self.snapshot
            or self.committed_entries
            or self.messages
            or self.read_states
        )


class CompactedError(Exception):
    """The requested index is at or below the last snapshot: send a snapshot instead."""


class UnavailableError(Exception):
    """The requested index is past the stored log."""


class Storage(Protocol):
    """The stable (fsynced) log of one group, read by the core.

    `raft/memstorage.py` implements it in memory for tests and simulation;
    `raft/storage.py` implements it on disk. Writes come from the driver, not
    the core: `append`, `set_hard_state`, `apply_snapshot`, `compact`.
    """

    def initial_state(self) -> tuple[HardState, ConfState]: ...

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries in [lo, hi); at least one if any, at most max_bytes after the first."""
        ...

    def term(self, index: int) -> int:
        """Term of entry `index`; the snapshot's term for index == snapshot index."""
        ...

    def first_index(self) -> int:
        """Index of the first entry still stored (snapshot index + 1)."""
        ...

    def last_index(self) -> int: ...

    def snapshot(self) -> Snapshot: ...

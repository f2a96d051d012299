"""Store = replay for JetStream stream groups (`js.<stream>.<created_ns>`).

The committed entries of a stream group are replayed, in one Spark task per group, through
the node's own pure state machine (`node.jetstream.stream.Stream`) into a scratch LMDB store
in the executor's temp directory (the same store code and record format as the node, so
memory stays bounded whatever the stream's size). Each node's store is compared with the
replay at the Raft index that node's store says it applied (`applied`, written in the same
transaction as the data): every key and value of the group in every JetStream database
(messages with their CRC'd records, the per-subject index and counts, TTL and dedup
indexes, counters and progress, consumer configs and states) must be equal. A difference
is a `store_mismatch` violation naming the node, group, applied index and what differs
(a message's sequence, a consumer's ack floor, ...).

What cannot be checked is a note (`store_unchecked`): a log that does not start at index 1
(compacted without the archive), a gap in the committed entries, a store that applied
beyond the committed prefix the audit could read, or a group no catalogue names.
The stream's initial configuration is the one its `create` entry in the meta log carries
(handed over by the driver, `prepare`); only when the meta log is not readable is it taken
from a node's catalogue. UPDATE_CONFIG entries change it during the replay.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from collections.abc import Generator, Iterable, Iterator
from typing import Any

from audit.hooks import CommittedEntry
from audit.jsstore import (
    BOOTSTRAP,
    DB_NAMES,
    NodeStore,
    beyond_replay,
    diff_items,
    open_nodes,
)
from audit.model import (
    ACKED_DUPLICATED,
    ACKED_MISPLACED,
    ACKED_MISSING,
    ACKED_UNCHECKED,
    NOTE,
    STORE_MISMATCH,
    STORE_UNCHECKED,
    VIOLATION,
    Finding,
)

GROUP_PREFIX = "js."
RUN = 256  # entries applied per scratch transaction
MAX_DIFFS = 5  # differences reported per node and database (then a count)


def _stream_entry(nodes: dict[str, NodeStore], group: str) -> dict[str, Any] | None:
    for store in nodes.values():
        for entry in store.catalogue().values():
            if entry.get("group") == group:
                return entry
    return None


class JetStreamStreamHook:
    name = "JetStream stream store"
    prepare_from = "$js"  # the meta group: each stream's config as created

    def __init__(self, keyring: Any = None) -> None:
        self.created: dict[str, dict[str, Any]] = {}
        self.keyring = keyring  # audit/keyring.py: stores encrypted at rest
        self.named: dict[str, str] = {}  # stream name -> group of its last committed create
        self.acks: dict[str, list[Any]] = {}  # group -> its PubAcks (audit/acked.StreamAck)

    def prepare(self, entries: list[CommittedEntry]) -> None:
        """The config each stream group was created with, from the committed meta log (a
        node's catalogue may hold a later config, after a meta `update`)."""
        for e in entries:
            try:
                entry = json.loads(e.payload) if e.payload else None
            except ValueError:
                continue  # the meta hook reports it
            if isinstance(entry, dict) and entry.get("op") == "create" and \
                    isinstance(entry.get("group"), str):
                self.created.setdefault(entry["group"], entry)
                name = (entry.get("config") or {}).get("name")
                if isinstance(name, str):
                    self.named[name] = entry["group"]

    def take_acks(self, acks: list[Any]) -> list[Any]:
        """Hand each JetStream PubAck to its stream's group (checked during the replay);
        returns the ones whose stream no committed `create` names."""
        orphans = []
        for a in acks:
            group = self.named.get(a.stream)
            if group is None:
                orphans.append(a)
            else:
                self.acks.setdefault(group, []).append(a)
        return orphans

    def wants(self, group: str, data_dirs: dict[str, str]) -> bool:
        return group.startswith(GROUP_PREFIX)

    def replay(self, group: str, entries: Iterable[CommittedEntry],
               data_dirs: dict[str, str]) -> Iterator[Finding]:
        nodes = open_nodes(data_dirs, self.keyring)
        try:
            yield from self._replay(group, entries, nodes)
        finally:
            for store in nodes.values():
                store.close()

    def _replay(self, group: str, entries: Iterable[CommittedEntry],
                nodes: dict[str, NodeStore]) -> Iterator[Finding]:
        from node.jetstream import config as stream_config

        entry = self.created.get(group) or _stream_entry(nodes, group)
        if entry is None:
            yield Finding(STORE_UNCHECKED, NOTE, "no node's catalogue names this stream "
                          "group: its store was not compared", group=group)
            return
        if entry.get("config", {}).get("storage") == "memory":
            return  # a memory stream keeps nothing in LMDB: nothing to compare
        cfg = stream_config.from_wire(entry["config"])
        applied = {node: s.applied(group) for node, s in nodes.items()}
        # Encrypted stores key their subject and msg-id indexes by keyed tokens (the same
        # on every node): the replay builds them the same way; its values stay in the clear.
        tokens = self.keyring.tokens() if self.keyring is not None else None
        scratch = _Scratch(group, cfg, AckTracker(self.acks.get(group, [])), tokens)
        try:
            complete = yield from _walk(group, entries, nodes, applied, scratch)
            yield from scratch.tracker.findings(group, complete)
        finally:
            scratch.close()


class AckTracker:
    """Where the replay stored each acknowledged payload: (stream seq, Raft index) pairs."""

    def __init__(self, acks: list[Any]) -> None:
        self.acks = acks
        self.seen: dict[bytes, list[tuple[int, int]]] = {a.digest: [] for a in acks}

    def on_entry(self, store: Any, index: int, effects: list[Any]) -> None:
        if not self.acks:
            return
        from audit.acked import digest_of
        from node.jetstream.stream import Stored

        for eff in effects:
            if isinstance(eff, Stored):
                msg = store.load(eff.seq)
                at = self.seen.get(digest_of(msg.data)) if msg is not None else None
                if at is not None:
                    at.append((eff.seq, index))

    def findings(self, group: str, complete: bool) -> Iterator[Finding]:
        for a in self.acks:
            where = f"acked message of stream {a.stream!r} on line {a.line}" + (
                f" (told seq {a.seq})" if a.seq is not None else "")
            at = self.seen[a.digest]
            if not at:
                yield (Finding(ACKED_MISSING, VIOLATION, f"{where} is in no committed entry",
                               group=group) if complete else
                       Finding(ACKED_UNCHECKED, NOTE, f"{where} not found; the replay did "
                               "not cover the whole log", group=group))
            elif len(at) > 1 and not a.retried:
                yield Finding(ACKED_DUPLICATED, VIOLATION, f"{where} is stored "
                              f"{len(at)} times, at seqs {[s for s, _ in at][:5]}",
                              group=group, index=at[0][1])
            elif a.seq is not None and all(s != a.seq for s, _ in at):
                yield Finding(ACKED_MISPLACED, VIOLATION, f"{where} is stored at seq "
                              f"{at[0][0]} instead", group=group, index=at[0][1])


class _Scratch:
    """The replayed stream, in a throw-away LMDB environment."""

    def __init__(self, group: str, cfg: Any, tracker: AckTracker, tokens: Any = None) -> None:
        from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv
        from node.jetstream.stream import Stream

        self.dir = tempfile.mkdtemp(prefix="jetraft-audit-replay-")
        self.env = NodeEnv(self.dir, sync=False, tokens=tokens)
        self.group = group
        self.stream = Stream(cfg, LmdbStore(self.env, group))
        self.run: list[tuple[int, bytes]] = []
        self.tracker = tracker

    def add(self, index: int, payload: bytes) -> None:
        self.run.append((index, payload))
        if len(self.run) >= RUN:
            self.flush()

    def flush(self) -> None:
        if self.run:
            store = self.stream.store
            self.stream.apply_batch(
                self.run, lambda index, effects: self.tracker.on_entry(store, index, effects))
            self.run = []

    def items(self, db: str) -> Iterator[tuple[bytes, bytes]]:
        return scratch_items(self.env, self.group, db)

    def close(self) -> None:
        self.env.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def scratch_items(env: Any, group: str, db: str) -> Iterator[tuple[bytes, bytes]]:
    """(key without the group's prefix, value) of one group in a scratch environment."""
    from audit.jsstore import prefix

    head = prefix(group)
    with env.env.begin() as txn:
        cur = txn.cursor(db=env.dbs[db])
        if not cur.set_range(head):
            return
        for key, value in cur:
            if not key.startswith(head):
                return
            yield bytes(key[len(head):]), bytes(value)


def _walk(group: str, entries: Iterable[CommittedEntry], nodes: dict[str, NodeStore],
          applied: dict[str, int], scratch: _Scratch) -> Generator[Finding, None, bool]:
    """Yields the findings; returns whether the whole committed log was replayed."""
    checkpoints = sorted(set(applied.values()))
    last, term, complete = 0, None, True
    for e in entries:
        if last == 0 and e.index == BOOTSTRAP + 1:
            last = BOOTSTRAP  # the group's bootstrap snapshot: the empty state
        if e.index != last + 1:
            what = ("the log does not start at index 1 (compacted; no archive)" if last == 0
                    else f"committed entries {last + 1}..{e.index - 1} are not readable")
            yield Finding(STORE_UNCHECKED, NOTE, f"{what}: stores compared only up to "
                          f"{last}", group=group, index=last + 1, index_hi=e.index - 1)
            complete = False
            break
        while checkpoints and checkpoints[0] < e.index:
            scratch.flush()
            yield from _compare(group, nodes, applied, checkpoints.pop(0), term, scratch)
        if e.entry_type == 0 and e.payload:  # leader no-ops and conf changes: not applied
            scratch.add(e.index, e.payload)
        last, term = e.index, e.term
    else:
        scratch.flush()
        while checkpoints and checkpoints[0] <= last:
            yield from _compare(group, nodes, applied, checkpoints.pop(0), term, scratch)
    yield from beyond_replay("store", group, applied, checkpoints, last)
    return complete


def _compare(group: str, nodes: dict[str, NodeStore], applied: dict[str, int], index: int,
             term: int | None, scratch: _Scratch) -> Iterator[Finding]:
    for node in sorted(n for n, a in applied.items() if a == index):
        for db in DB_NAMES:
            diffs = diff_items(nodes[node].items(db, group), scratch.items(db))
            if db == "js_consumers":
                diffs = (d for d in diffs if not _same_consumer_state(d[1], d[2]))
            for count, (key, theirs, want) in enumerate(diffs):
                if count == MAX_DIFFS:
                    rest = 1 + sum(1 for _ in diffs)
                    yield Finding(STORE_MISMATCH, VIOLATION, f"{db}: {rest} more differences",
                                  node=node, group=group, index=index, term=term)
                    break
                yield Finding(STORE_MISMATCH, VIOLATION, describe(db, key, theirs, want),
                              node=node, group=group, index=index, term=term)


def describe(db: str, key: bytes, theirs: bytes | None, want: bytes | None) -> str:
    """One difference in words: which message, subject, counter or consumer."""
    if theirs is None:
        where = "missing from the store"
    elif want is None:
        where = "in the store but not in the replay"
    else:
        where = "differs from the replay"
    if db == "js_msgs":
        seq = int.from_bytes(key, "big")
        detail = _msg_diff(seq, theirs, want) if theirs and want else ""
        return f"message seq {seq} {where}{detail}"
    if db == "js_consumers":
        return f"consumer {key.decode(errors='replace')!r} state {where}" + \
            (_consumer_diff(theirs, want) if theirs and want else "")
    if db == "js_meta":
        return f"stream meta {key.decode(errors='replace')!r} {where}"
    return f"{db} key {key!r} {where}"


def _msg_diff(seq: int, theirs: bytes, want: bytes) -> str:
    from node.jetstream.store.base import CorruptRecordError, decode_record

    try:
        got = decode_record("store", seq, theirs)
    except CorruptRecordError as exc:
        return f" ({exc})"
    exp = decode_record("replay", seq, want)
    fields = [f for f in ("subject", "hdr", "data", "ts_ns") if getattr(got, f) != getattr(exp, f)]
    return f" ({', '.join(fields)})"


def _same_consumer_state(theirs: bytes | None, want: bytes | None) -> bool:
    """A consumer record a node wrote in the JSON format (before the binary one) equals
    the replay's binary record when both decode to the same state."""
    from node.jetstream.consumer import ConsumerState

    if theirs is None or want is None or theirs[:1] == want[:1]:
        return False
    try:
        return ConsumerState.decode(theirs) == ConsumerState.decode(want)
    except (ValueError, KeyError, TypeError, struct.error):
        return False


def _consumer_diff(theirs: bytes, want: bytes) -> str:
    from node.jetstream.consumer import ConsumerState

    try:
        got, exp = (json.loads(ConsumerState.decode(r).to_json()) for r in (theirs, want))
    except (ValueError, KeyError, TypeError, struct.error):
        return " (undecodable)"
    names = {"d": "delivered", "f": "ack floor", "l": "last-per-subject", "p": "pending"}
    fields = [names.get(k, k) for k in sorted(set(got) | set(exp)) if got.get(k) != exp.get(k)]
    return f" ({', '.join(fields)}: store {[got.get(k) for k in ('d', 'f')]}, " \
           f"replay {[exp.get(k) for k in ('d', 'f')]})"

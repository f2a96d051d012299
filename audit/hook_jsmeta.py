"""The JetStream meta group (`$js`): the catalogue replayed from the log = what each node
believes.

The meta log's entries are JSON objects with an `op` (docs/jetstream.md, "Meta group";
node/jetstream/cluster_meta.py). They are replayed here by the audit's own fold, not the
node's code (the audit must not share a bug with what it checks):

    {"op":"create","name","config","created_ns","group"[,"peers"]}  added unless the name
                                             is taken; the assignment's `rev` = its index
    {"op":"update","name","config","peers"}  config and peers replaced (`scaled` once the
                                             peer set changed), `rev` = its index
    {"op":"delete","name"}                   forgotten
    {"op":"remove_server","peer"}            the peer joins `removed`
    {"op":"seen","peer"}                     the peer joins `seen` (it had Raft state: the
                                             node refuses it later with an empty store)
    {"op":"consumer","name","consumer",...}  a consumer's own group, under the stream's
                                             `consumers` (every field but op/name/consumer/
                                             account, + `rev`); a retry or a stream that is
                                             gone changes nothing
    {"op":"consumer_update","name","consumer","peers","config"}  that group re-placed
                                             (`scaled` once its peers changed)
    {"op":"consumer_delete","name","consumer"}  that consumer's group forgotten

A single-node `create` has no `peers` (it means the node itself, whose id the log does not
say): its peers are not compared.

What a node believes is its catalogue in LMDB, written in the same transaction as the group's
`applied` index: `$js.meta` key `catalogue` = {"streams": {name: assignment}, "removed": [...],
"seen": [...]} (clustered layout), or key `streams` = {name: create entry} (the single-node layout,
without `rev`). At each node's applied index the replayed catalogue must equal the node's:
same streams, each assignment field for field (`meta_mismatch`, naming the node, the index and
the stream), same removed peers, same seen peers. A committed entry that is not a JSON object
with an `op` is a `meta_entry_bad` violation; an op the fold does not know is a note (the
node ignores it too).
Nodes at the same index must agree with each other, since all are compared with one replay.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from audit.hooks import CommittedEntry
from audit.jsstore import BOOTSTRAP, META_STORE, NodeStore, beyond_replay, open_nodes
from audit.model import (
    META_ENTRY_BAD,
    META_MISMATCH,
    NOTE,
    STORE_UNCHECKED,
    VIOLATION,
    Finding,
)

META_GROUP = "$js"


class BadEntry(ValueError):
    pass


class UnknownOp(ValueError):
    pass


class Catalogue:
    """The replayed belief: stream assignments by name, removed peers."""

    def __init__(self) -> None:
        self.streams: dict[str, dict[str, Any]] = {}
        self.removed: list[int] = []
        self.seen: list[int] = []

    def apply(self, index: int, payload: bytes) -> None:
        try:
            entry = json.loads(payload)
        except ValueError as exc:
            raise BadEntry(f"not JSON: {exc}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("op"), str):
            raise BadEntry("not an object with an op")
        op, name = entry["op"], entry.get("name")
        if op in ("create", "update", "delete") and not isinstance(name, str):
            raise BadEntry(f"{op} without a stream name")
        if op == "create":
            if name not in self.streams:
                self.streams[name] = {**entry, "rev": index}
        elif op == "update":
            if name in self.streams:
                a = dict(self.streams[name])
                a["config"] = entry.get("config")
                if "peers" in entry and list(entry["peers"]) != a.get("peers"):
                    a["scaled"] = True
                if "peers" in entry:
                    a["peers"] = list(entry["peers"])
                a["rev"] = index
                self.streams[name] = a
        elif op == "delete":
            self.streams.pop(name, None)
        elif op in ("consumer", "consumer_update", "consumer_delete"):
            self._consumer(index, op, name, entry)
        elif op in ("remove_server", "seen"):
            peer = entry.get("peer")
            if not isinstance(peer, int):
                raise BadEntry(f"{op} without a peer id")
            peers = self.removed if op == "remove_server" else self.seen
            if peer not in peers:
                peers.append(peer)
        else:
            raise UnknownOp(op)


    def _consumer(self, index: int, op: str, name: Any, entry: dict[str, Any]) -> None:
        consumer = entry.get("consumer")
        if not isinstance(name, str) or not isinstance(consumer, str):
            raise BadEntry(f"{op} without a stream or consumer name")
        if name not in self.streams:
            return
        a = dict(self.streams[name])
        groups = dict(a.pop("consumers", {}))
        if op == "consumer" and consumer not in groups:
            groups[consumer] = {k: v for k, v in entry.items()
                                if k not in ("op", "name", "consumer", "account")}
            groups[consumer]["rev"] = index
        elif op == "consumer_update" and consumer in groups:
            g = dict(groups[consumer], config=entry.get("config"), rev=index)
            if list(entry.get("peers") or []) != g.get("peers"):
                g["scaled"] = True
            g["peers"] = list(entry.get("peers") or [])
            groups[consumer] = g
        elif op == "consumer_delete":
            groups.pop(consumer, None)
        if groups:
            a["consumers"] = groups
        self.streams[name] = a


def belief(store: NodeStore) -> tuple[dict[str, Any], list[int] | None, list[int] | None]:
    """(streams, removed peers, seen peers; None where the layout keeps none) as the node
    keeps them, in either layout."""
    raw = store.meta(META_STORE, "catalogue")
    if raw is not None:
        image = json.loads(raw)
        seen = image.get("seen")
        return (dict(image.get("streams", {})), list(image.get("removed", [])),
                None if seen is None else list(seen))
    raw = store.meta(META_STORE, "streams")
    return (json.loads(raw) if raw else {}), None, None


def compare(believed: dict[str, Any], removed: list[int] | None, cat: Catalogue,
            seen: list[int] | None = None) -> list[str]:
    """What differs, in words (empty when the node believes what the log says)."""
    out = []
    for name in sorted(set(believed) | set(cat.streams)):
        mine, want = believed.get(name), cat.streams.get(name)
        if mine is not None and want is not None:
            mine, want = dict(mine), dict(want)
            if "rev" not in mine:  # the single-node layout keeps the create entry as is
                want.pop("rev", None)
            if "peers" not in want:  # a single-node create: the node filled in itself
                mine.pop("peers", None)
        if mine == want:
            continue
        if mine is None:
            what = "missing from the node's catalogue"
        elif want is None:
            what = "in the node's catalogue but not in the replayed meta log"
        else:
            fields = sorted(k for k in set(mine) | set(want) if mine.get(k) != want.get(k))
            what = f"differs from the replayed meta log in {', '.join(fields)}"
        out.append(f"stream {name!r} {what}")
    if removed is not None and sorted(removed) != sorted(cat.removed):
        out.append(f"removed peers {sorted(removed)} differ from the replayed meta log "
                   f"{sorted(cat.removed)}")
    if seen is not None and sorted(seen) != sorted(cat.seen):
        out.append(f"seen peers {sorted(seen)} differ from the replayed meta log "
                   f"{sorted(cat.seen)}")
    return out


class JetStreamMetaHook:
    name = "JetStream meta group"

    def __init__(self, keyring: Any = None) -> None:
        self.keyring = keyring  # audit/keyring.py: stores encrypted at rest

    def wants(self, group: str, data_dirs: dict[str, str]) -> bool:
        return group == META_GROUP

    def replay(self, group: str, entries: Iterable[CommittedEntry],
               data_dirs: dict[str, str]) -> Iterator[Finding]:
        nodes = open_nodes(data_dirs, self.keyring)
        try:
            yield from _walk(group, entries, nodes)
        finally:
            for store in nodes.values():
                store.close()


def _walk(group: str, entries: Iterable[CommittedEntry],
          nodes: dict[str, NodeStore]) -> Iterator[Finding]:
    applied = {node: s.applied(META_STORE) for node, s in nodes.items()}
    checkpoints = sorted(set(applied.values()))
    cat = Catalogue()
    last, term = 0, None
    usable = True
    for e in entries:
        if last == 0 and e.index == BOOTSTRAP + 1:
            last = BOOTSTRAP  # the group's bootstrap snapshot: the empty state
        if e.index != last + 1:
            what = ("the log does not start at index 1 (compacted; no archive)" if last == 0
                    else f"committed entries {last + 1}..{e.index - 1} are not readable")
            yield Finding(STORE_UNCHECKED, NOTE, f"{what}: catalogues compared only up to "
                          f"{last}", group=group, index=last + 1, index_hi=e.index - 1)
            usable = False
            break
        while checkpoints and checkpoints[0] < e.index:
            yield from _compare(group, nodes, applied, checkpoints.pop(0), term, cat)
        if e.entry_type == 0 and e.payload:
            try:
                cat.apply(e.index, e.payload)
            except BadEntry as exc:
                yield Finding(META_ENTRY_BAD, VIOLATION, f"committed meta entry: {exc}",
                              group=group, index=e.index, term=e.term)
            except UnknownOp as exc:
                yield Finding(META_ENTRY_BAD, NOTE, f"committed meta entry with an op the "
                              f"audit does not know: {exc}", group=group, index=e.index,
                              term=e.term)
        last, term = e.index, e.term
    if usable:
        while checkpoints and checkpoints[0] <= last:
            yield from _compare(group, nodes, applied, checkpoints.pop(0), term, cat)
    yield from beyond_replay("catalogue", group, applied, checkpoints, last)


def _compare(group: str, nodes: dict[str, NodeStore], applied: dict[str, int], index: int,
             term: int | None, cat: Catalogue) -> Iterator[Finding]:
    for node in sorted(n for n, a in applied.items() if a == index):
        streams, removed, seen = belief(nodes[node])
        for what in compare(streams, removed, cat, seen):
            yield Finding(META_MISMATCH, VIOLATION, what, node=node, group=group, index=index,
                          term=term)

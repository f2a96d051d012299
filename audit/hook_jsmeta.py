"""The JetStream meta group (`$js`): the catalogue replayed from the log = what each node
believes.

The meta log's entries are JSON objects with an `op`. Replayed here without the node's code
(the audit must not share a bug with what it checks), in two accepted formats:

* today's single-node entries (docs/jetstream.md): `{"op": "create", "name", "config",
  "created_ns", "group"}` (a create of an existing name changes nothing) and
  `{"op": "delete", "name"}`;
* assignment entries, as a clustered meta group writes them: a stream assignment
  (`op` one of `assign`, `assign_stream`, `stream_assign`, `update_stream`) replaces the
  stream's record (name, config, group, peers, ...); an unassignment (`unassign`,
  `unassign_stream`, `stream_unassign`, `remove_stream`) removes it; consumer assignments
  (`assign_consumer`, `consumer_assign` / `unassign_consumer`, `consumer_unassign`, with
  `stream` and `name`) go to a per-stream consumer map.

What a node believes is its catalogue in LMDB (`$js.meta`: `streams`, and `consumers` when
the node keeps them), written in the same transaction as the group's `applied` index. At
each node's applied index the replayed catalogue must equal the node's: same streams, and
each stream's record field for field. Different records are `meta_mismatch` violations
naming the node, the index and the stream; a committed entry the replay cannot read
(not JSON, no `op`, an unknown `op`) is a `meta_entry_bad` violation (the node's state
machine could not have applied it either). Nodes at the same index must agree with each
other, since they are all compared with one replay.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from audit.hooks import CommittedEntry
from audit.jsstore import BOOTSTRAP, META_STORE, NodeStore, open_nodes
from audit.model import (
    META_ENTRY_BAD,
    META_MISMATCH,
    NOTE,
    STORE_UNCHECKED,
    VIOLATION,
    Finding,
)

META_GROUP = "$js"
STREAM_ADD = {"assign", "assign_stream", "stream_assign", "update_stream"}
STREAM_REMOVE = {"unassign", "unassign_stream", "stream_unassign", "remove_stream"}
CONSUMER_ADD = {"assign_consumer", "consumer_assign", "update_consumer"}
CONSUMER_REMOVE = {"unassign_consumer", "consumer_unassign", "remove_consumer"}


class BadEntry(ValueError):
    pass


class Catalogue:
    """The replayed belief: streams by name, consumers by (stream, name)."""

    def __init__(self) -> None:
        self.streams: dict[str, dict[str, Any]] = {}
        self.consumers: dict[str, dict[str, dict[str, Any]]] = {}

    def apply(self, payload: bytes) -> None:
        try:
            entry = json.loads(payload)
        except ValueError as exc:
            raise BadEntry(f"not JSON: {exc}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("op"), str):
            raise BadEntry("no op")
        op, name = entry["op"], entry.get("name")
        if op in {"create", "delete"} | STREAM_ADD | STREAM_REMOVE and not isinstance(name, str):
            raise BadEntry(f"{op} without a stream name")
        if op == "create":
            self.streams.setdefault(name, entry)
        elif op == "delete" or op in STREAM_REMOVE:
            self.streams.pop(name, None)
            self.consumers.pop(name, None)
        elif op in STREAM_ADD:
            self.streams[name] = entry
        elif op in CONSUMER_ADD | CONSUMER_REMOVE:
            stream = entry.get("stream")
            if not isinstance(stream, str) or not isinstance(name, str):
                raise BadEntry(f"{op} without stream and consumer names")
            if op in CONSUMER_ADD:
                self.consumers.setdefault(stream, {})[name] = entry
            else:
                self.consumers.get(stream, {}).pop(name, None)
        else:
            raise BadEntry(f"unknown op {op!r}")


class JetStreamMetaHook:
    name = "JetStream meta group"

    def wants(self, group: str, data_dirs: dict[str, str]) -> bool:
        return group == META_GROUP

    def replay(self, group: str, entries: Iterable[CommittedEntry],
               data_dirs: dict[str, str]) -> Iterator[Finding]:
        nodes = open_nodes(data_dirs)
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
                cat.apply(e.payload)
            except BadEntry as exc:
                yield Finding(META_ENTRY_BAD, VIOLATION, f"committed meta entry: {exc}",
                              group=group, index=e.index, term=e.term)
        last, term = e.index, e.term
    if usable:
        while checkpoints and checkpoints[0] <= last:
            yield from _compare(group, nodes, applied, checkpoints.pop(0), term, cat)
    for index in checkpoints:
        for node in sorted(n for n, a in applied.items() if a == index):
            yield Finding(STORE_UNCHECKED, NOTE, f"the catalogue applied up to {index}, "
                          f"beyond the committed entries the audit could replay (to {last})",
                          node=node, group=group, index=last + 1, index_hi=index)


def _compare(group: str, nodes: dict[str, NodeStore], applied: dict[str, int], index: int,
             term: int | None, cat: Catalogue) -> Iterator[Finding]:
    for node in sorted(n for n, a in applied.items() if a == index):
        believed = nodes[node].catalogue()
        for name in sorted(set(believed) | set(cat.streams)):
            mine, want = believed.get(name), cat.streams.get(name)
            if mine == want:
                continue
            if mine is None:
                what = "missing from the node's catalogue"
            elif want is None:
                what = "in the node's catalogue but not in the replayed meta log"
            else:
                fields = sorted(k for k in set(mine) | set(want) if mine.get(k) != want.get(k))
                what = f"differs from the replayed meta log in {', '.join(fields)}"
            yield Finding(META_MISMATCH, VIOLATION, f"stream {name!r} {what}", node=node,
                          group=group, index=index, term=term)
        raw = nodes[node].meta(META_STORE, "consumers")
        if raw is not None or cat.consumers:
            kept = json.loads(raw) if raw else {}
            if kept != {s: c for s, c in cat.consumers.items() if c}:
                yield Finding(META_MISMATCH, VIOLATION, "consumer assignments differ from the "
                              "replayed meta log", node=node, group=group, index=index,
                              term=term)

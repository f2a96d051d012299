"""Store = replay for consumer groups (`jc.<stream>.<consumer>.<created_ns>`,
node/jetstream/cgroup.py): a consumer whose replicas or storage differ from its stream's.

The committed entries of such a group are replayed, in one Spark task per group, through
the node's own state machine (`node.jetstream.machines.ConsumerMachine`: the same
`ConsumerCore` apply, the same binary state record, the same applied index in the same
transaction) into a scratch LMDB store, starting from the state the meta `consumer` entry
gives it (empty for a new consumer; the state it brought when it moved out of its stream's
group). Each node's consumer record and applied index for the group are compared with the
replay at the index that node applied, as for streams (audit/hook_jsstream.py): a
difference (ack floor, delivered, pending and redelivery counts) is a `store_mismatch`
naming the node, group and index.

A `mem_storage` consumer (or one of a memory stream) keeps nothing in LMDB: nothing to
compare. A group no committed meta `consumer` entry names is a `store_unchecked` note.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from audit.hook_jsstream import _walk, scratch_items
from audit.hooks import CommittedEntry
from audit.jsstore import open_nodes
from audit.model import NOTE, STORE_UNCHECKED, Finding

GROUP_PREFIX = "jc."


class JetStreamConsumerHook:
    name = "JetStream consumer group store"
    prepare_from = "$js"  # the meta group: each consumer group's assignment

    def __init__(self, keyring: Any = None) -> None:
        self.keyring = keyring
        self.assigned: dict[str, dict[str, Any]] = {}  # group -> its `consumer` entry
        self.streams: dict[str, dict[str, Any]] = {}  # stream key -> its config as created

    def prepare(self, entries: list[CommittedEntry]) -> None:
        for e in entries:
            try:
                entry = json.loads(e.payload) if e.payload else None
            except ValueError:
                continue  # the meta hook reports it
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                continue
            if entry.get("op") == "create":
                self.streams.setdefault(entry["name"], entry.get("config") or {})
            elif entry.get("op") == "consumer" and isinstance(entry.get("group"), str):
                self.assigned.setdefault(entry["group"], entry)

    def wants(self, group: str, data_dirs: dict[str, str]) -> bool:
        return group.startswith(GROUP_PREFIX)

    def replay(self, group: str, entries: Iterable[CommittedEntry],
               data_dirs: dict[str, str]) -> Iterator[Finding]:
        from node.jetstream import cgroup, consumer_config

        entry = self.assigned.get(group)
        if entry is None:
            yield Finding(STORE_UNCHECKED, NOTE, "no committed meta entry assigns this "
                          "consumer group: its store was not compared", group=group)
            return
        stream_cfg = self.streams.get(entry["name"], {})
        cfg = consumer_config.from_wire(entry.get("config") or {})
        if cgroup.memory(cfg, stream_cfg):
            return  # kept in memory: nothing in LMDB to compare
        nodes = open_nodes(data_dirs, self.keyring)
        tokens = self.keyring.tokens() if self.keyring is not None else None
        scratch = _Scratch(group, entry, cfg, tokens)
        try:
            # a node that applied nothing of the group (never hosted it, or let it go and
            # dropped its store, or holds only the bootstrap image) has nothing to compare
            applied = {node: a for node, s in nodes.items() if (a := s.applied(group)) > 0}
            yield from _walk(group, entries, nodes, applied, scratch)
        finally:
            scratch.close()
            for store in nodes.values():
                store.close()


class _StreamStub:
    """What a ConsumerMachine reads of its stream: the env, a lock, a name (its messages
    are not needed to apply its entries), and `readers`, where it registers (on a node,
    a stream replica read by a consumer group applies without the follower hold)."""

    def __init__(self, name: str, env: Any) -> None:
        self.name = name
        self.env = env
        self.lock = threading.RLock()
        self.readers: set[Any] = set()


class _Scratch:
    """The replayed consumer group, in a throw-away LMDB environment (the interface
    `_walk` drives: add, flush, items)."""

    def __init__(self, group: str, entry: dict[str, Any], cfg: dict[str, Any],
                 tokens: Any = None) -> None:
        from node.jetstream.machines import ConsumerMachine
        from node.jetstream.store.lmdbstore import NodeEnv

        self.dir = tempfile.mkdtemp(prefix="jetraft-audit-creplay-")
        self.env = NodeEnv(self.dir, sync=False, tokens=tokens)
        self.group = group
        stub = _StreamStub(entry["name"], self.env)
        self.machine = ConsumerMachine(
            stub, entry["consumer"], group, cfg, int(entry.get("start", 0)),  # type: ignore[arg-type]
            int(entry.get("lps", 0)), int(entry.get("created_ns", 0)), False,
            lambda _cm, _effects: None, base64.b64decode(entry.get("state") or ""))
        self.run: list[tuple[int, bytes]] = []

    def add(self, index: int, payload: bytes) -> None:
        self.run.append((index, payload))

    def flush(self) -> None:
        if self.run:
            self.machine.apply_batch(self.run)
            self.run = []

    def items(self, db: str) -> Iterator[tuple[bytes, bytes]]:
        return scratch_items(self.env, self.group, db)

    def close(self) -> None:
        self.env.close()
        shutil.rmtree(self.dir, ignore_errors=True)

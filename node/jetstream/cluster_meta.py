"""The meta group's entries and the catalogue they build (pure; docs/jetstream.md "Meta group").

Every entry of the `$js` Raft group is one compact JSON object with an `op`:

    {"op":"create","name":S,"config":{...},"created_ns":N,"group":G,"peers":[P,...][,"account":A]}
    {"op":"update","name":S,"config":{...},"peers":[P,...][,"account":A]}
    {"op":"delete","name":S[,"account":A]}
    {"op":"remove_server","peer":P}
    {"op":"seen","peer":P}
    {"op":"consumer","name":S,"consumer":C,"group":G,"peers":[P,...],"config":{...},
     "start":N,"lps":N,"created_ns":N[,"state":B64][,"account":A]}
    {"op":"consumer_update","name":S,"consumer":C,"peers":[P,...],"config":{...}[,"account":A]}
    {"op":"consumer_delete","name":S,"consumer":C[,"account":A]}

`name` is the stream's registry key (node/jetstream/jsaccount.py): the stream name in the
global account `$G`, `<account>/<stream name>` in any other; `account` names that account and
is left out for `$G`, so entries written before accounts existed read as `$G`'s. Two accounts'
streams of the same name are two keys, two assignments, two groups.

`config` is the stream config in its wire form as the meta leader checked it, `group` the name
of the stream's Raft group (`js.<name>.<created_ns>`: a re-created stream never reuses a log),
`peers` the peer ids (random 63-bit integers, `node/cluster`) of its replicas, the preferred
first. A `create` written by a single node (before clustering existed) has no `peers`: it means
the node itself. The catalogue is the fold of the entries in log order:

* `create` adds the assignment unless the name is taken (an idempotent retry keeps the first);
* `update` replaces the config and the peer set of an existing stream (scaling, peer removal);
  once the peer set changed the assignment carries `"scaled": true`: a peer that opens the
  group from then on joins it empty (the leader adds it) instead of bootstrapping it;
* every assignment carries `rev`, the index of the entry that last set it: a stream leader
  never replaces its group's config by an older revision than one it already wrote;
* `seen` records that peer P acknowledged meta entries, i.e. had Raft state (proposed once
  per peer by the meta leader): a node whose id is `seen` but whose store is empty lost its
  state (a wiped store with its identity file put back) and is refused;
* `delete` forgets it; `remove_server` records a peer that left the cluster for good (placement
  never picks it again, and the meta leader removes it from the groups that name it).

* `consumer` assigns a consumer whose replicas or storage differ from its stream's a Raft
  group of its own (node/jetstream/cgroup.py): `group`, `peers` (a subset of the stream's),
  the consumer `config` (wire form) and its start position (`start`, `lps`, as the stream's
  CONSUMER_UPSERT carries them); kept under the stream's assignment, `consumers` -> C. A retry
  (C already assigned) keeps the first; a stream that is gone ignores it. `state` (base64 of
  the binary consumer state record) is the state the group starts from when the consumer
  moved out of its stream's group (a replicas change): its acks and redelivery counts so far.
  `consumer_update` re-places an assigned group (its replicas changed, its stream was scaled
  or lost the peer): new `peers` and `config`; once the peers changed it carries
  `"scaled": true` (a peer that opens the group from then on joins it empty, as for streams).
  `consumer_delete` forgets it; deleting the stream forgets its consumers.

Every other consumer is not here: it is entries of its stream's own group (docs/jetstream.md).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from node.jetstream import jsaccount

_JSON: dict[str, Any] = {"separators": (",", ":"), "sort_keys": False}


def encode(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, **_JSON).encode()


def group_for(name: str, created_ns: int) -> str:
    """The stream's Raft group name. Snapshot files are named by the group's ASCII in hex,
    so a long (nats-server allows 255 bytes) or non-ASCII stream name would make a file name
    the filesystem refuses: such names are replaced by a digest. The group is stored in the
    catalogue entry and never parsed back into the stream name."""
    group = f"js.{name}.{created_ns}"
    if group.isascii() and len(group) <= _MAX_PLAIN_GROUP:
        return group
    return f"js.~{hashlib.sha256(name.encode()).hexdigest()[:32]}.{created_ns}"


# hex doubles it; ".<12 hex>.part" (18) must still fit a 255-byte file name, with room.
_MAX_PLAIN_GROUP = 100


def _account(entry: dict[str, Any]) -> dict[str, Any]:
    account, _name = jsaccount.split(entry["name"])
    if account != jsaccount.GLOBAL:
        entry["account"] = account
    return entry


def create(name: str, config: dict[str, Any], created_ns: int, peers: list[int]
           ) -> dict[str, Any]:
    return _account({"op": "create", "name": name, "config": config,
                     "created_ns": created_ns, "group": group_for(name, created_ns),
                     "peers": list(peers)})


def update(name: str, config: dict[str, Any], peers: list[int]) -> dict[str, Any]:
    return _account({"op": "update", "name": name, "config": config, "peers": list(peers)})


def delete(name: str) -> dict[str, Any]:
    return _account({"op": "delete", "name": name})


def remove_server(peer: int) -> dict[str, Any]:
    return {"op": "remove_server", "peer": peer}


def seen(peer: int) -> dict[str, Any]:
    return {"op": "seen", "peer": peer}


def consumer(name: str, consumer_name: str, group: str, peers: list[int],
             config: dict[str, Any], start: int, lps: int, created_ns: int,
             state: str = "") -> dict[str, Any]:
    entry = {"op": "consumer", "name": name, "consumer": consumer_name, "group": group,
             "peers": list(peers), "config": config, "start": start, "lps": lps,
             "created_ns": created_ns}
    if state:
        entry["state"] = state
    return _account(entry)


def consumer_update(name: str, consumer_name: str, peers: list[int], config: dict[str, Any]
                    ) -> dict[str, Any]:
    return _account({"op": "consumer_update", "name": name, "consumer": consumer_name,
                     "peers": list(peers), "config": config})


def consumer_delete(name: str, consumer_name: str) -> dict[str, Any]:
    return _account({"op": "consumer_delete", "name": name, "consumer": consumer_name})


@dataclass
class Catalogue:
    """Stream name -> its assignment (the `create` entry, kept current by `update`s)."""

    streams: dict[str, dict[str, Any]] = field(default_factory=dict)
    removed: list[int] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)

    def apply(self, entry: dict[str, Any], self_peer: int, index: int = 0) -> str | None:
        """Fold one entry in (`index`: its Raft index, kept as the assignment's `rev`);
        returns the name of the stream it touched (None: none)."""
        op = entry.get("op")
        name = entry.get("name")
        if op == "create" and isinstance(name, str):
            if name in self.streams:
                return None
            a = dict(entry)
            a.setdefault("peers", [self_peer])
            a["rev"] = index
            self.streams[name] = a
            return name
        if op == "update" and isinstance(name, str) and name in self.streams:
            a = dict(self.streams[name])
            a["config"] = entry["config"]
            if list(entry["peers"]) != a.get("peers"):
                a["scaled"] = True  # peers added from now on join the group empty
            a["peers"] = list(entry["peers"])
            a["rev"] = index
            self.streams[name] = a
            return name
        if op == "delete" and isinstance(name, str):
            return name if self.streams.pop(name, None) is not None else None
        if op in ("consumer", "consumer_update", "consumer_delete") and isinstance(name, str):
            return self._apply_consumer(op, name, entry, index)
        if op == "remove_server":
            peer = int(entry["peer"])
            if peer not in self.removed:
                self.removed.append(peer)
        if op == "seen":
            peer = int(entry["peer"])
            if peer not in self.seen:
                self.seen.append(peer)
        return None

    def _apply_consumer(self, op: str, name: str, entry: dict[str, Any], index: int
                        ) -> str | None:
        a = self.streams.get(name)
        cname = entry.get("consumer")
        if a is None or not isinstance(cname, str):
            return None  # the stream went first
        groups = dict(a.get("consumers") or {})
        if op == "consumer":
            if cname in groups:
                return None  # a retried placement keeps the first
            groups[cname] = {k: v for k, v in entry.items()
                             if k not in ("op", "name", "consumer", "account")} | {"rev": index}
        elif op == "consumer_update":
            g = groups.get(cname)
            if g is None:
                return None
            g = dict(g, config=entry["config"], rev=index)
            if list(entry["peers"]) != g["peers"]:
                g["scaled"] = True  # peers added from now on join the group empty
            g["peers"] = list(entry["peers"])
            groups[cname] = g
        elif groups.pop(cname, None) is None:
            return None
        a = dict(a)
        if groups:
            a["consumers"] = groups
        else:
            a.pop("consumers", None)
        self.streams[name] = a
        return name

    def consumer_groups(self) -> dict[tuple[str, str], dict[str, Any]]:
        """(stream, consumer) -> the consumer's own group assignment."""
        return {(n, c): g for n, a in self.streams.items()
                for c, g in (a.get("consumers") or {}).items()}

    def consumer_group(self, stream: str, consumer: str) -> dict[str, Any] | None:
        a = self.streams.get(stream)
        return (a.get("consumers") or {}).get(consumer) if a is not None else None

    def consumer_load(self) -> dict[int, int]:
        """Consumer groups assigned per peer: the load consumer placement spreads."""
        out: dict[int, int] = {}
        for g in self.consumer_groups().values():
            for p in g["peers"]:
                out[p] = out.get(p, 0) + 1
        return out

    def peers(self, name: str, self_peer: int) -> list[int]:
        a = self.streams.get(name)
        if a is None:
            return []
        return list(a.get("peers") or [self_peer])

    def assigned_to(self, peer: int) -> list[str]:
        return sorted(n for n, a in self.streams.items() if peer in a.get("peers", [peer]))

    def load(self) -> dict[int, int]:
        """Replicas assigned per peer: the load placement spreads."""
        out: dict[int, int] = {}
        for a in self.streams.values():
            for p in a.get("peers", []):
                out[p] = out.get(p, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {"streams": self.streams, "removed": self.removed, "seen": self.seen}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Catalogue:
        if "streams" in raw and isinstance(raw.get("removed"), list):
            return cls(dict(raw["streams"]), list(raw["removed"]), list(raw.get("seen", [])))
        return cls(dict(raw))  # the single-node layout: name -> create entry

"""The membership table: who is in the cluster, as gossip tells it. Pure.

Each node owns its own record and bumps `version` whenever something in it
changes; a merge keeps the higher version of every record. `up` is never
gossiped: it is this node's own view (whether its link to the member works),
so one node's partition never marks a member down elsewhere.

A member that comes back with a new id at the address of an old one (its
data directory was wiped) replaces the old record: the old id is gone for
good, and the cluster layer reports it down.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

GOSSIPED = ("peer_id", "name", "cluster_addr", "client_urls", "ws_urls", "tags", "jetstream",
            "version", "server_id", "healthy", "lame_duck", "store_max", "store_used",
            "start_ms", "shutdown", "account_conns", "raft_addr")


@dataclass
class Member:
    peer_id: int
    name: str
    cluster_addr: str  # host:port of its gRPC cluster port
    client_url: str = ""  # host:port for clients ("" with no_advertise)
    client_urls: list[str] = field(default_factory=list)
    ws_urls: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    jetstream: bool = False
    version: int = 0
    server_id: str = ""
    healthy: bool = True
    lame_duck: bool = False
    store_max: int = 0
    store_used: int = 0
    start_ms: int = 0
    shutdown: bool = False
    account_conns: dict[str, int] = field(default_factory=dict)  # limited accounts only
    raft_addr: str = ""  # host:port of its direct Raft lane ("" = Raft over gRPC only)
    up: bool = False  # local view only
    is_self: bool = False

    def __post_init__(self) -> None:
        if not self.client_url and self.client_urls:
            self.client_url = self.client_urls[0]

    def wire(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in GOSSIPED}


def from_wire(d: dict[str, Any]) -> Member:
    return Member(**{k: d[k] for k in GOSSIPED if k in d})


class MemberTable:
    def __init__(self, me: Member) -> None:
        me.is_self = True
        me.up = True
        self.self_id = me.peer_id
        self.members: dict[int, Member] = {me.peer_id: me}
        self.gone: set[int] = set()  # ids replaced by a newer member at the same address

    @property
    def me(self) -> Member:
        return self.members[self.self_id]

    def update_self(self, **changes: Any) -> bool:
        """Change this node's own record; True if anything changed (version bumped)."""
        me = self.me
        if all(getattr(me, k) == v for k, v in changes.items()):
            return False
        for k, v in changes.items():
            setattr(me, k, v)
        me.version += 1
        if "client_urls" in changes:
            me.client_url = me.client_urls[0] if me.client_urls else ""
        return True

    def merge(self, incoming: Member) -> tuple[Member | None, list[Member]]:
        """Fold one gossiped record in. Returns (the new or changed member or None,
        the members it replaced)."""
        pid = incoming.peer_id
        if pid == 0 or pid == self.self_id or pid in self.gone:
            return None, []
        cur = self.members.get(pid)
        if cur is not None and cur.version >= incoming.version:
            return None, []
        replaced: list[Member] = []
        if cur is None:
            for other in list(self.members.values()):
                if (other.cluster_addr == incoming.cluster_addr and not other.is_self
                        and other.peer_id != pid and other.start_ms <= incoming.start_ms):
                    replaced.append(self.members.pop(other.peer_id))
                    self.gone.add(other.peer_id)
                    other.up = False
        up = cur.up if cur is not None else False
        merged = replace(incoming, up=up, is_self=False)
        self.members[pid] = merged
        return merged, replaced

    def set_up(self, pid: int, up: bool) -> Member | None:
        """Record this node's view of a member; the member if it changed."""
        m = self.members.get(pid)
        if m is None or m.is_self or m.up == up:
            return None
        m.up = up
        return m

    def snapshot(self) -> list[Member]:
        return list(self.members.values())

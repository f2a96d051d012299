"""Subscription interest between nodes. Pure: no I/O, no asyncio.

`LocalInterest` folds this node's subscriptions into what peers need to know,
as nats-server's route protocol does: for a plain subject, only whether any
local subscription exists (weight 1 or 0); for a queue group, how many local
members it has (the weight a peer uses to spread the group's messages).
It returns the changes to send, and a snapshot for a peer that (re)connects.

`RemoteInterest` is the other side: what each peer said, as subscriptions in
one sublist per account, matched when a local publish may need forwarding.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from node.sublist import SubList

# (account, subject, queue or "") -> local subscription count
Key = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Change:
    account: str
    subject: str
    queue: str  # "" for a plain subscription
    weight: int  # plain: 1 or 0; queue: member count (0 = gone)


class LocalInterest:
    def __init__(self) -> None:
        self.counts: dict[Key, int] = {}

    def add(self, account: str, subject: str, queue: str | None) -> Change | None:
        key = (account, subject, queue or "")
        n = self.counts.get(key, 0) + 1
        self.counts[key] = n
        if queue or n == 1:
            return Change(account, subject, queue or "", n if queue else 1)
        return None

    def remove(self, account: str, subject: str, queue: str | None) -> Change | None:
        key = (account, subject, queue or "")
        n = self.counts.get(key, 0)
        if n == 0:
            return None  # never announced: nothing to take back
        n -= 1
        if n == 0:
            del self.counts[key]
        else:
            self.counts[key] = n
        if queue or n == 0:
            return Change(account, subject, queue or "", n if queue else 0)
        return None

    def snapshot(self) -> list[Change]:
        return [Change(a, s, q, n if q else 1) for (a, s, q), n in self.counts.items()]


class RemoteSub:
    """A peer's interest, stored in a sublist like a subscription."""

    __slots__ = ("subject", "queue", "sid", "client", "weight", "dead")

    def __init__(self, subject: str, queue: str | None, peer: int, weight: int) -> None:
        self.subject = subject
        self.queue = queue
        self.sid = f"r{peer}"
        self.client = peer  # the peer id: forwarding sends to that node
        self.weight = weight
        self.dead = False


class RemoteInterest:
    """Every peer's interest, per account."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.sublists: dict[str, SubList] = {}
        self.by_peer: dict[int, dict[Key, RemoteSub]] = {}
        self.rng = rng or random.Random()

    def sublist(self, account: str) -> SubList:
        sl = self.sublists.get(account)
        if sl is None:
            sl = self.sublists[account] = SubList()
        return sl

    def apply(self, peer: int, change: Change) -> bool:
        """Fold one change a peer sent; False if it was invalid and ignored."""
        if not change.subject or not change.account:
            return False
        key = (change.account, change.subject, change.queue)
        subs = self.by_peer.setdefault(peer, {})
        cur = subs.get(key)
        if change.weight <= 0:
            if cur is not None:
                del subs[key]
                cur.dead = True
                self.sublist(change.account).remove(cur)
            return True
        if cur is not None:
            cur.weight = change.weight  # the sublist holds the same object
            return True
        sub = RemoteSub(change.subject, change.queue or None, peer, change.weight)
        try:
            self.sublist(change.account).insert(sub)
        except ValueError:
            return False  # a subject the sublist refuses (malformed)
        subs[key] = sub
        return True

    def forget(self, peer: int) -> int:
        """Drop everything `peer` said (its stream ended, or it reset)."""
        subs = self.by_peer.pop(peer, {})
        for (account, _, _), sub in subs.items():
            sub.dead = True
            self.sublist(account).remove(sub)
        return len(subs)

    def count(self, peer: int) -> int:
        return len(self.by_peer.get(peer, {}))

    def subjects(self, peer: int) -> list[str]:
        return [s for (_, s, _) in self.by_peer.get(peer, {})]

    def targets(self, account: str, subject: str,
                done_queues: set[str] | frozenset[str]) -> dict[int, list[str]]:
        """Peers a message in `account` on `subject` goes to, each with the queue
        groups it must serve: every peer with plain interest, and for each queue
        group not served here, ONE peer chosen by weight (its member count)."""
        sl = self.sublists.get(account)
        if sl is None:
            return {}
        result = sl.match(subject)
        if not result.psubs and not result.qsubs:  # (not through MatchResult.__bool__)
            return {}
        out: dict[int, list[str]] = {}
        for sub in result.psubs:
            if sub.client not in out:
                out[sub.client] = []
        for queue, members in result.qsubs.items():
            if queue in done_queues:
                continue
            peer = self._pick(members)
            if peer is not None:
                out.setdefault(peer, []).append(queue)
        return out

    def queue_weights(self, account: str, subject: str) -> dict[str, int]:
        """Queue group -> the peers' member count for `subject` (empty: none)."""
        sl = self.sublists.get(account)
        if sl is None:
            return {}
        qsubs = sl.match(subject).qsubs
        if not qsubs:
            return {}
        return {q: sum(m.weight for m in members if not m.dead) for q, members in qsubs.items()}

    def _pick(self, members: list) -> int | None:
        total = sum(m.weight for m in members if not m.dead)
        if total <= 0:
            return None
        x = self.rng.randrange(total)
        for m in members:
            if m.dead:
                continue
            x -= m.weight
            if x < 0:
                return m.client
        return None

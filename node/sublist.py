"""The subscription index: a trie of subject tokens with a bounded match cache.

Pure data structure, no I/O.  Each trie node stands for one token position;
it has literal children by token, plus at most one ``*`` child and one ``>``
child, and holds the subscriptions whose subject ends there.  Matching walks
the literal and ``*`` branches token by token and collects every ``>`` child
passed on the way, so cost grows with the number of wildcard branches
actually hit, never with the number of subscriptions.

Subscriptions are the caller's own objects (anything with ``.subject``,
``.queue``, ``.sid`` and ``.client``); they are stored and removed by
identity, so two equal-looking subscriptions stay distinct.  A
subscription's ``subject`` and ``queue`` must not change while it is
inserted.  A ``queue`` of ``None`` or ``""`` means a plain subscription.

Results of `match` are cached per published subject.  The cache holds at most
`cache_max` entries; when full, the oldest entries are swept down to
`cache_sweep` (nats-server does the same with 1024/256).  An insert or
removal drops only the cached subjects the changed subscription matches, so
the cache is never stale.  Returned `MatchResult` objects are shared with
the cache: callers must treat them as read-only.

A second cache is keyed by a subject's PREFIX (everything before its last
token), for the subjects that are new on every message: request replies
(`_INBOX.<id>.<n>`, a PubAck's `_AB.<id>.<n>`), which would each miss the cache,
walk the trie and push out subjects that do repeat.  Where the prefix's walk
ends, the last token can only meet `>` and `*` children (the same for every
token) or literal children; the entry keeps the match without the literal ones
and the literal children's tables, so any last token that none of them holds
has that match, without a walk and without a cache slot of its own.  Any
insert or removal clears this cache (it holds few prefixes).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Protocol

from node.subject import (
    FWC,
    PWC,
    SEP,
    compile_matcher,
    is_literal,
    valid_queue_name,
    valid_subject,
)

CACHE_MAX = 1024
CACHE_SWEEP = 256
# Subjects under this head are unique per message (JetStream ack replies, `$JS.ACK.<stream>.
# <consumer>.<delivered>.<sseq>...`): caching each would only evict the subjects that repeat,
# and walking the trie for each costs an ack more than its own work. While no subscription
# looks past the head's two tokens (only `>` there, the usual case: JetStream's own
# `$JS.ACK.>`), every subject under it has the same match: computed once per change.
UNIQUE_HEAD = "$JS.ACK."
_HEAD_TOKENS = ("$JS", "ACK")


class Subscription(Protocol):
    subject: str
    queue: str | None
    sid: str
    client: Any


@dataclass(slots=True)
class MatchResult:
    psubs: list = field(default_factory=list)  # plain subscriptions: each gets the message
    qsubs: dict[str, list] = field(default_factory=dict)  # queue -> members; pick one per group

    def fanout(self) -> int:
        """Deliveries one message causes: one per plain sub, one per queue group."""
        return len(self.psubs) + len(self.qsubs)

    def __bool__(self) -> bool:
        return bool(self.psubs or self.qsubs)


class _Node:
    """One token position.  Containers are created lazily to keep the
    million-subscription case small: most nodes are only on the way."""

    __slots__ = ("children", "pwc", "fwc", "psubs", "qsubs")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.pwc: _Node | None = None
        self.fwc: _Node | None = None
        self.psubs: dict[int, Any] | None = None  # id(sub) -> sub
        self.qsubs: dict[str, dict[int, Any]] | None = None  # queue -> id(sub) -> sub

    def child(self, token: str) -> _Node | None:
        if token == PWC:
            return self.pwc
        if token == FWC:
            return self.fwc
        return self.children.get(token) if self.children else None

    def add_child(self, token: str) -> _Node:
        node = _Node()
        if token == PWC:
            self.pwc = node
        elif token == FWC:
            self.fwc = node
        else:
            if self.children is None:
                self.children = {}
            self.children[token] = node
        return node

    def drop_child(self, token: str) -> None:
        if token == PWC:
            self.pwc = None
        elif token == FWC:
            self.fwc = None
        elif self.children is not None:
            del self.children[token]
            if not self.children:
                self.children = None

    def is_empty(self) -> bool:
        return (
            self.children is None
            and self.pwc is None
            and self.fwc is None
            and self.psubs is None
            and self.qsubs is None
        )

    def has_subs(self) -> bool:
        return self.psubs is not None or self.qsubs is not None

    def add_to(self, result: MatchResult) -> None:
        if self.psubs is not None:
            result.psubs.extend(self.psubs.values())
        if self.qsubs is not None:
            groups = result.qsubs
            for queue, members in self.qsubs.items():
                if queue in groups:
                    groups[queue].extend(members.values())
                else:
                    groups[queue] = list(members.values())


class SubList:
    # Every insert or remove in any SubList of the process: a validity stamp for caches
    # that span several sublists (node/crossaccount.py's subjects nobody listens to).
    changes = 0

    def __init__(self, cache_max: int = CACHE_MAX, cache_sweep: int = CACHE_SWEEP) -> None:
        if not 0 <= cache_sweep < cache_max:
            raise ValueError("need 0 <= cache_sweep < cache_max")
        self._root = _Node()
        self._nodes = 0  # trie nodes below the root, to prove pruning works
        self._count = 0
        # Never rebound (only cleared): the account's fast path holds `cached`, its `get`.
        self._cache: dict[str, MatchResult] = {}
        self.cached = self._cache.get
        self._cache_max = cache_max
        self._cache_sweep = cache_sweep
        self._inserts = 0
        self._removes = 0
        self._misses = 0
        self.hits = 0  # public: a caller that used `cached` itself counts its hit here
        self._head: MatchResult | bool | None = None  # UNIQUE_HEAD's match; None: unknown
        # prefix (the subject before its last `.`) -> (the match of any last token that is
        # in none of the literal-children tables, those tables): see the module doc.
        self._tails: dict[str, tuple[MatchResult, tuple[dict[str, _Node], ...]]] = {}

    # -- mutation -----------------------------------------------------------

    def insert(self, sub: Subscription) -> None:
        """Index `sub`.  Inserting the same object twice is a no-op."""
        subject = sub.subject
        queue = sub.queue or None
        if not valid_subject(subject):
            raise ValueError(f"invalid subject {subject!r}")
        if queue is not None and not valid_queue_name(queue):
            raise ValueError(f"invalid queue name {queue!r}")
        node = self._root
        for token in subject.split(SEP):
            nxt = node.child(token)
            if nxt is None:
                nxt = node.add_child(token)
                self._nodes += 1
            node = nxt
        if not self._attach(node, sub, queue):
            return
        self._count += 1
        self._inserts += 1
        SubList.changes += 1
        self._head = None
        self._tails.clear()
        self._invalidate(subject)

    @staticmethod
    def _attach(node: _Node, sub: Any, queue: str | None) -> bool:
        key = id(sub)
        if queue is None:
            if node.psubs is None:
                node.psubs = {}
            bucket = node.psubs
        else:
            if node.qsubs is None:
                node.qsubs = {}
            bucket = node.qsubs.setdefault(queue, {})
        if key in bucket:
            return False
        bucket[key] = sub
        return True

    def remove(self, sub: Subscription) -> bool:
        """Un-index `sub`; False if this very object was not inserted."""
        if not self._detach(sub):
            return False
        SubList.changes += 1
        self._head = None
        self._tails.clear()
        self._invalidate(sub.subject)
        return True

    def remove_batch(self, subs: list[Subscription]) -> int:
        """Remove many (a client going away) with one cache flush, not one
        cache scan per subscription.  Returns how many were removed."""
        removed = sum(1 for sub in subs if self._detach(sub))
        if removed:
            SubList.changes += 1
            self._head = None
            self._tails.clear()
            self._cache.clear()
        return removed

    def _detach(self, sub: Any) -> bool:
        path: list[tuple[_Node, str]] = []
        node = self._root
        for token in sub.subject.split(SEP):
            nxt = node.child(token)
            if nxt is None:
                return False
            path.append((node, token))
            node = nxt
        if not self._unlink(node, sub, sub.queue or None):
            return False
        self._count -= 1
        self._removes += 1
        self._prune(path, node)
        return True

    @staticmethod
    def _unlink(node: _Node, sub: Any, queue: str | None) -> bool:
        key = id(sub)
        if queue is None:
            bucket = node.psubs
        else:
            bucket = node.qsubs.get(queue) if node.qsubs is not None else None
        if bucket is None or bucket.get(key) is not sub:
            return False
        del bucket[key]
        if bucket:
            return True
        if queue is None:
            node.psubs = None
        else:
            del node.qsubs[queue]
            if not node.qsubs:
                node.qsubs = None
        return True

    def _prune(self, path: list[tuple[_Node, str]], leaf: _Node) -> None:
        """Drop the now-empty tail of `path`, deepest first."""
        node = leaf
        for parent, token in reversed(path):
            if not node.is_empty():
                return
            parent.drop_child(token)
            self._nodes -= 1
            node = parent

    # -- cache ----------------------------------------------------------------

    def _invalidate(self, pattern: str) -> None:
        cache = self._cache
        if not cache:
            return
        if is_literal(pattern):
            cache.pop(pattern, None)  # a literal only ever matches itself
            return
        matches = compile_matcher(pattern)
        stale = [subject for subject in cache if matches(subject)]
        for subject in stale:
            del cache[subject]

    def _remember(self, subject: str, result: MatchResult) -> None:
        self._bounded_put(self._cache, subject, result)

    def _bounded_put(self, cache: dict, key: str, value: Any) -> None:
        if len(cache) >= self._cache_max:
            # Dicts keep insertion order, so this drops the oldest entries.
            excess = len(cache) - self._cache_sweep
            for old in list(islice(cache, excess)):
                del cache[old]
        cache[key] = value

    # -- queries --------------------------------------------------------------

    def match(self, subject: str) -> MatchResult:
        """Every subscription interested in a message published to `subject`."""
        cached = self._cache.get(subject)
        if cached is not None:
            self.hits += 1
            return cached
        if subject.startswith(UNIQUE_HEAD):
            self._misses += 1
            head = self._head_match(subject)
            if head is not None:
                return head  # not cached: the subject never comes again
            return self._match_walk(subject)
        cut = subject.rfind(SEP)
        if cut > 0:
            entry = self._tails.get(subject[:cut])
            if entry is not None:
                token = subject[cut + 1:]
                if token:
                    for literals in entry[1]:
                        if token in literals:
                            break
                    else:
                        self.hits += 1
                        return entry[0]  # not cached: a new last token each time, mostly
            else:
                self._misses += 1
                return self._match_by_prefix(subject, cut)
        self._misses += 1
        return self._match_walk(subject)

    def _match_walk(self, subject: str) -> MatchResult:
        result = MatchResult()
        for node in self._walk(subject, result):
            node.add_to(result)
        self._remember(subject, result)
        return result

    def _match_by_prefix(self, subject: str, cut: int) -> MatchResult:
        """A miss whose prefix has no entry yet: walk the prefix, make its entry, and
        finish the match from it (the same subscriptions `_walk` finds)."""
        prefix = subject[:cut]
        token = subject[cut + 1:]
        if not token:
            return self._match_walk(subject)  # an empty last token: `_walk` decides
        tokens = prefix.split(SEP)
        if "" in tokens:
            return self._match_walk(subject)
        result = MatchResult()
        level = [self._root]
        for tok in tokens:
            level = self._step(level, tok, result)
            if not level:
                break
        ends: list[_Node] = []
        literals: list[dict[str, _Node]] = []
        for node in level:
            if node.fwc is not None:
                node.fwc.add_to(result)  # `>` takes the last token, whatever it is
            if node.pwc is not None:
                ends.append(node.pwc)
            if node.children is not None:
                literals.append(node.children)
        for node in ends:
            node.add_to(result)
        self._bounded_put(self._tails, prefix, (result, tuple(literals)))
        hit = [table[token] for table in literals if token in table]
        if hit:
            # This token has literal subscriptions of its own: its match is the prefix's
            # plus theirs, on a copy (the entry's result is shared).
            full = MatchResult(list(result.psubs),
                               {q: list(m) for q, m in result.qsubs.items()})
            for node in hit:
                node.add_to(full)
            result = full
        # The first subject under a prefix is cached too: a subject that repeats then hits
        # the subject cache (the account's fast path reads only that one).
        self._remember(subject, result)
        return result

    @staticmethod
    def _step(level: list[_Node], token: str, result: MatchResult) -> list[_Node]:
        """One token down from every node of `level`: adds each `>` passed into `result`."""
        nxt: list[_Node] = []
        for node in level:
            if node.fwc is not None:
                node.fwc.add_to(result)
            if node.pwc is not None:
                nxt.append(node.pwc)
            if node.children is not None:
                child = node.children.get(token)
                if child is not None:
                    nxt.append(child)
        return nxt

    def _head_match(self, subject: str) -> MatchResult | None:
        """The match of a subject under UNIQUE_HEAD without walking it (None: walk it)."""
        if subject.endswith(SEP) or ".." in subject:
            return None  # empty tokens: `_walk` decides (nothing)
        head = self._head
        if head is None:
            head = self._head = self._compute_head()
        return head if head is not False else None  # type: ignore[return-value]

    def _compute_head(self) -> MatchResult | bool:
        """The `>` subscriptions every subject under UNIQUE_HEAD reaches, or False when some
        subscription has a literal or `*` token past the head (the match then depends on
        the rest of the subject)."""
        result = MatchResult()
        level = [self._root]
        for token in _HEAD_TOKENS:
            level = self._step(level, token, result)
        for node in level:
            if node.children is not None or node.pwc is not None:
                return False
            if node.fwc is not None:
                node.fwc.add_to(result)
        return result

    def _walk(self, subject: str, result: MatchResult) -> list[_Node]:
        """Follow `subject` down the trie.  Adds every ``>`` node passed into
        `result` and returns the nodes where the subject ends exactly."""
        tokens = subject.split(SEP)
        if "" in tokens:
            return []  # nats-server delivers nothing for empty tokens
        level = [self._root]
        for token in tokens:
            nxt: list[_Node] = []
            for node in level:
                if node.fwc is not None:
                    node.fwc.add_to(result)
                if node.pwc is not None:
                    nxt.append(node.pwc)
                if node.children is not None:
                    child = node.children.get(token)
                    if child is not None:
                        nxt.append(child)
            if not nxt:
                return nxt
            level = nxt
        return level

    def has_interest(self, subject: str) -> bool:
        """Would a message on `subject` reach anyone?  Does not fill the cache."""
        cached = self._cache.get(subject)
        if cached is not None:
            return bool(cached)
        probe = MatchResult()
        ends = self._walk(subject, probe)
        return bool(probe) or any(node.has_subs() for node in ends)

    def count(self) -> int:
        return self._count

    def node_count(self) -> int:
        """Trie nodes below the root; zero whenever the list is empty."""
        return self._nodes

    def all_subscriptions(self) -> list:
        return list(self.iter_subscriptions())

    def iter_subscriptions(self) -> Iterator[Any]:
        """Every subscription, lazily: a caller wanting a page stops early."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.psubs is not None:
                yield from list(node.psubs.values())
            if node.qsubs is not None:
                for members in list(node.qsubs.values()):
                    yield from list(members.values())
            if node.children is not None:
                stack.extend(node.children.values())
            if node.pwc is not None:
                stack.append(node.pwc)
            if node.fwc is not None:
                stack.append(node.fwc)

    def stats(self) -> dict[str, Any]:
        """The counters nats-server shows on /subsz; fanout is over cached results."""
        fanouts = [result.fanout() for result in self._cache.values()]
        matches = self.hits + self._misses
        return {
            "num_subscriptions": self._count,
            "num_cache": len(self._cache),
            "num_inserts": self._inserts,
            "num_removes": self._removes,
            "num_matches": matches,
            "cache_hit_rate": self.hits / matches if matches else 0.0,
            "max_fanout": max(fanouts, default=0),
            "avg_fanout": sum(fanouts) / len(fanouts) if fanouts else 0.0,
        }

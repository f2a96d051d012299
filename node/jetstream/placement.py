"""Which servers hold a stream's replicas (pure: no I/O, no clock).

The rules are the reference docs' Placement section (nats-docs, "Placement"), checked against a
3-node nats-server 2.15.1 cluster for the reply texts:

* `placement.cluster`: every replica in the named cluster. Jetraft runs one cluster, so a name
  other than ours leaves no candidate.
* `placement.tags`: a server qualifies only if its `server_tags` hold every requested tag
  (compared without case, as nats-server lowercases tags when it reads them).
* `jetstream.unique_tag` (a tag prefix such as `az`): no two replicas on servers whose tag with
  that prefix has the same value; a server without such a tag cannot hold a replica at all.
* `placement.preferred` names a server for `$JS.API.META.LEADER.STEPDOWN` only; a stream
  config carrying it is refused (`preferred server not permitted in placement`).

Among the qualifying servers the least loaded are chosen (fewest replicas already assigned),
then the one with the most free storage, then by peer id for a stable answer, so successive
streams spread evenly. A request that cannot be met is refused with nats-server's errors:
10005 `no suitable peers for placement[, <reasons>]`, or 10023 `insufficient resources` when
only free storage was short.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from node.jetstream.errors import ApiError


@dataclass(frozen=True)
class Candidate:
    """One JetStream server as the meta leader sees it."""

    peer: int
    name: str
    cluster: str = ""
    tags: tuple[str, ...] = ()
    up: bool = True
    free_storage: int | None = None  # bytes; None = unknown (never the reason for a refusal)
    load: int = 0  # replicas already assigned to it
    ha_assets: int = 0  # replicated streams and consumers it holds (the meta group aside)


@dataclass(frozen=True)
class Placement:
    cluster: str = ""
    tags: tuple[str, ...] = ()
    preferred: str = ""

    @classmethod
    def from_config(cls, raw: Any) -> Placement:
        """The `placement` object of a stream config (absent or null: no constraint)."""
        if not isinstance(raw, dict):
            return cls()
        tags = raw.get("tags") or ()
        if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags):
            raise ApiError.of("JSStreamInvalidConfigF", err="placement tags must be strings")
        return cls(str(raw.get("cluster") or ""), tuple(tags), str(raw.get("preferred") or ""))


@dataclass
class _Why:
    """Why candidates were left out, in the order nats-server lists its reasons."""

    offline: int = 0
    excluded: int = 0
    tags: int = 0
    storage: int = 0
    unique: int = 0
    misc: int = 0  # over `max_ha_assets`
    reasons: list[str] = field(default_factory=list)


def normalize_tags(tags: Iterable[str]) -> tuple[str, ...]:
    return tuple(t.strip().lower() for t in tags if t.strip())


def unique_value(tags: Iterable[str], unique_tag: str) -> str | None:
    """The value of the server's tag with prefix `unique_tag` (`az` matches `az:b` -> `b`);
    None when the server has no such tag."""
    prefix = unique_tag.strip().lower()
    if not prefix.endswith(":"):
        prefix += ":"
    for tag in normalize_tags(tags):
        if tag.startswith(prefix):
            return tag[len(prefix):]
    return None


def select_peers(candidates: Sequence[Candidate], replicas: int, placement: Placement, *,
                 our_cluster: str = "", unique_tag: str = "", keep: Sequence[int] = (),
                 exclude: Iterable[int] = (), max_bytes: int = 0, max_ha_assets: int = 0
                 ) -> list[int]:
    """`replicas` peer ids for a stream (the peers in `keep` that still qualify come first:
    scaling up keeps the replicas that hold the data). Raises ApiError when it cannot.
    `max_ha_assets` (`jetstream { limits {} }`): a replicated stream is not placed on a
    server whose replicated assets, its meta group included, are past it already."""
    if placement.preferred:
        raise ApiError.of("JSStreamInvalidConfigF",
                          err="preferred server not permitted in placement")
    if replicas < 1:
        replicas = 1
    if placement.cluster and our_cluster and placement.cluster != our_cluster:
        raise ApiError.of("JSClusterNoPeersErrF", err="no suitable peers for placement")
    want_tags = normalize_tags(placement.tags)
    excluded = set(exclude)
    why = _Why()
    eligible: list[Candidate] = []
    for c in candidates:
        if c.peer in excluded:
            why.excluded += 1
            continue
        if not c.up:
            why.offline += 1
            continue
        have = set(normalize_tags(c.tags))
        if any(t not in have for t in want_tags):
            why.tags += 1
            continue
        if max_bytes > 0 and c.free_storage is not None and c.free_storage < max_bytes:
            why.storage += 1
            continue
        if unique_tag and unique_value(c.tags, unique_tag) is None:
            why.unique += 1
            continue
        if replicas > 1 and ha_over(c.ha_assets, max_ha_assets):
            why.misc += 1
            continue
        eligible.append(c)
    kept = [c for p in keep for c in eligible if c.peer == p]
    rest = sorted((c for c in eligible if c.peer not in set(keep)),
                  key=lambda c: (c.load, -(c.free_storage or 0), c.peer))
    chosen: list[Candidate] = []
    used: set[str] = set()
    for c in [*kept, *rest]:
        if len(chosen) == replicas:
            break
        if unique_tag:
            value = unique_value(c.tags, unique_tag)
            if value in used:
                why.unique += 1
                continue
            used.add(value or "")
        chosen.append(c)
    if len(chosen) < replicas:
        raise _refusal(why, want_tags)
    return [c.peer for c in chosen]


def ha_over(assets: int, max_ha_assets: int) -> bool:
    """Whether a server holding `assets` replicated streams and consumers takes no more:
    nats-server counts its Raft groups (the meta group too) and refuses once they are past
    the limit (checked against 2.15.1: `max_ha_assets: 2` takes two R3 streams, or one and
    an R3 consumer, then 10005 / 10023). 0 = no limit."""
    return max_ha_assets > 0 and 1 + assets > max_ha_assets


def _refusal(why: _Why, want_tags: tuple[str, ...]) -> ApiError:
    if why.storage and not (why.tags or why.unique or why.offline or why.misc):
        return ApiError.of("JSInsufficientResourcesErr")
    reasons = []
    if why.tags:
        reasons.append("tags not matched [" + ", ".join(f"'{t}'" for t in want_tags) + "]")
    if why.storage:
        reasons.append("insufficient storage")
    if why.unique:
        reasons.append("server tag not unique")
    if why.offline:
        reasons.append("peer offline")
    if why.misc:
        reasons.append("miscellaneous issue")
    text = ", ".join(["no suitable peers for placement", *reasons])
    return ApiError.of("JSClusterNoPeersErrF", err=text)


def pick_leader(candidates: Sequence[Candidate], voters: Iterable[int], current: int,
                placement: Placement, unique_tag: str = "") -> int:
    """The peer a META.LEADER.STEPDOWN hands leadership to: a voter other than the current
    leader that is up and matches `preferred` (a server name), `cluster` and `tags`.
    0 = any (no preference given); raises when the preference matches nobody."""
    del unique_tag  # a single leader has no uniqueness to keep
    voting = set(voters)
    want_tags = normalize_tags(placement.tags)
    pool = [c for c in candidates if c.peer in voting and c.peer != current and c.up]
    if placement.preferred:
        pool = [c for c in pool if c.name == placement.preferred]
    if placement.cluster:
        pool = [c for c in pool if not c.cluster or c.cluster == placement.cluster]
    if want_tags:
        pool = [c for c in pool if all(t in set(normalize_tags(c.tags)) for t in want_tags)]
    if not pool:
        if placement.preferred or placement.cluster or want_tags:
            raise ApiError.of("JSClusterNoPeersErrF",
                              err="no replacement peer connected")
        return 0
    return min(pool, key=lambda c: (c.load, c.peer)).peer

"""A consumer's own Raft group (issue 8: consumer `replicas` and `mem_storage` honoured).

Pure: which consumers get a group of their own, where the meta leader places it, and the
group's state machine core. A consumer keeps its deliveries and acks in its stream's group
unless its replica count or its storage differs from the stream's; then (as nats-server
does) they are entries of a group of its own, hosted on a subset of the stream's peers.

The entries of a consumer group are the stream group's consumer entries (CONSUMER_DELIVERED,
CONSUMER_ACK), for one consumer; the core applies them to a `Consumer` exactly as a stream
applies them to its consumers, so a delivery or an ack means the same in either place. The
stream still holds the consumer's config (CONSUMER_UPSERT, CONSUMER_DELETE stay stream
entries: creation order against publishes decides its start). Under interest / workqueue
retention the stream learns what such a consumer acked from CONSUMER_GROUP_STATE entries
that the consumer group's leader proposes to the stream's group (`report`): docs/jetstream.md,
"Consumer groups".
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from node.jetstream import ops
from node.jetstream.consumer import AckKind, Consumer
from node.jetstream.stream import ConsumerEvent, Delivered, Effect

GROUP_PREFIX = "jc."


def stream_replicas(stream_cfg: Mapping[str, Any]) -> int:
    return int(stream_cfg.get("num_replicas") or 1)


def replicas(consumer_cfg: Mapping[str, Any], stream_cfg: Mapping[str, Any]) -> int:
    """The consumer's replica count: its own, 0 meaning its stream's (as nats-server)."""
    return int(consumer_cfg.get("num_replicas") or 0) or stream_replicas(stream_cfg)


def memory(consumer_cfg: Mapping[str, Any], stream_cfg: Mapping[str, Any]) -> bool:
    """Memory storage: asked for, or the stream's own (a memory stream's consumers are)."""
    return bool(consumer_cfg.get("mem_storage")) or stream_cfg.get("storage") == "memory"


def own_group(consumer_cfg: Mapping[str, Any], stream_cfg: Mapping[str, Any]) -> bool:
    """Whether the consumer's state lives in a group of its own (clustered JetStream)."""
    return (replicas(consumer_cfg, stream_cfg) != stream_replicas(stream_cfg)
            or memory(consumer_cfg, stream_cfg) != (stream_cfg.get("storage") == "memory"))


def group_name(stream_key: str, consumer: str, created_ns: int) -> str:
    """Never reused: a consumer deleted and created again gets a fresh group (and log).
    Snapshot files are named by the group's hex: long or non-ASCII names become a digest."""
    group = f"{GROUP_PREFIX}{stream_key}.{consumer}.{created_ns}"
    if group.isascii() and len(group) <= 100:
        return group
    digest = hashlib.sha256(f"{stream_key}/{consumer}".encode()).hexdigest()[:32]
    return f"{GROUP_PREFIX}~{digest}.{created_ns}"


def place(stream_peers: Sequence[int], want: int, up: Callable[[int], bool],
          load: Mapping[int, int], pick: Callable[[int], int] = secrets.randbelow
          ) -> list[int]:
    """`want` of the stream's peers for the consumer's group: up ones first, then the least
    loaded (consumer groups each already hosts); ties broken at random as nats-server
    shuffles its active peers. Fewer than `want` peers up: [] (the create is refused)."""
    active = [p for p in stream_peers if up(p)]
    if len(active) < want:
        return []
    ties = {p: pick(1 << 30) for p in active}
    return sorted(active, key=lambda p: (load.get(p, 0), ties[p]))[:want]


def replace(current: Sequence[int], stream_peers: Sequence[int], want: int,
            up: Callable[[int], bool], load: Mapping[int, int], leader: int = 0,
            pick: Callable[[int], int] = secrets.randbelow) -> list[int]:
    """The peers of an assigned consumer group after its replicas or its stream's peers
    changed: its peers that still hold a stream replica stay (the group's leader first,
    so a shrink keeps it), new ones come from the stream's other peers as `place` picks
    them. [] when too few are up to grow it."""
    keep = [p for p in current if p in stream_peers]
    keep.sort(key=lambda p: p != leader)  # stable: the leader first, else as assigned
    if len(keep) >= want:
        return keep[:want]
    extra = place([p for p in stream_peers if p not in keep], want - len(keep), up, load, pick)
    return keep + extra if extra else []


def capped(cfg: Mapping[str, Any], stream_cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """A consumer config whose explicit replicas exceed its stream's after the stream
    shrank: nats-server lowers them to the stream's (probed on 2.15: R3 consumer, stream
    R3 -> R1, INFO then says `num_replicas: 1`). None: the config stands."""
    want = int(cfg.get("num_replicas") or 0)
    if want > stream_replicas(stream_cfg):
        return dict(cfg, num_replicas=stream_replicas(stream_cfg))
    return None


class ConsumerCore:
    """The state machine of one consumer group: the consumer's entries, in log order."""

    def __init__(self, name: str, consumer: Consumer) -> None:
        self.name = name
        self.consumer = consumer
        self.changed = False  # acked state moved since the last `report`

    def apply(self, op: ops.Op) -> list[Effect]:
        c = self.consumer
        if isinstance(op, ops.ConsumerDelivered) and op.consumer == self.name:
            cseq = c.apply_delivered(op.now_ns, op.sseq)
            self.changed = True
            return [Delivered(self.name, op.sseq, cseq, c.state.deliveries.get(op.sseq, 1),
                              op.now_ns)]
        if isinstance(op, ops.ConsumerAck) and op.consumer == self.name:
            advisories = c.apply_ack(op.now_ns, AckKind(op.kind), op.sseq, op.delay_ns)
            self.changed = True
            return [ConsumerEvent(self.name, a) for a in advisories]
        if isinstance(op, ops.ConsumerDeliveredMany) and op.consumer == self.name:
            return [e for sseq in op.sseqs
                    for e in self.apply(ops.ConsumerDelivered(op.now_ns, op.consumer, sseq))]
        if isinstance(op, ops.ConsumerAcks) and op.consumer == self.name:
            return [e for kind, sseq, delay in op.acks
                    for e in self.apply(ops.ConsumerAck(op.now_ns, op.consumer, kind, sseq,
                                                        delay))]
        return []  # another consumer's entry, or an op a consumer group never holds

    def report(self, now_ns: int) -> ops.ConsumerGroupState:
        """The stream-group entry telling the stream this consumer's acks (its leader
        proposes it after applies that moved the state)."""
        st = self.consumer.state
        self.changed = False
        return ops.ConsumerGroupState(now_ns, self.name, st.delivered_sseq, st.floor_sseq,
                                      tuple(sorted(st.pending)))

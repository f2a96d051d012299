"""The checker: a run's history against the final state of every node. Pure.

The bar (issue #9): zero acknowledged messages lost, no duplicates beyond dedup, the same
order on every replica, consumers resume without skipping, no stream forgotten.

`View`s are final states: the client view (what a stream serves through nats-py,
`authoritative`) and one replica view per node (read offline from its LMDB, or online).
Every anomaly below is a failure:

- lost             an acked payload is missing from a client view, or from most replicas
- replica-missing  an acked payload is missing from one replica while most hold it (that
                   replica did not catch up: still a failure, but not a lost write)
- misplaced        an acked payload is stored, but not at the seq its PubAck gave
- duplicate        one payload at two seqs (every retry carries the same Nats-Msg-Id,
                   so dedup must have caught it)
- phantom          a stored payload no publisher ever sent
- divergent        two views hold different payloads at the same seq
- views-differ     two client views (through different nodes) are not identical
- stream-forgotten a stream with acked messages, or whose create was acknowledged, is
                   missing from a view that must hold it
- publisher-order  a publisher's later message got a lower seq than its earlier one
- delivery-mismatch a consumer got a payload that is not the one stored at that seq
- acked-redelivered a delivery fetched after its ack was confirmed (the ack was lost)
- skipped          a stored message never delivered, though the consumer drained past it
- unknown-ack-seq  two PubAcks for the same payload gave different seqs
- consumer-state   after the drain, CONSUMER.INFO still has pending / unacked messages,
                   or an ack floor below the last stored seq
- kv-*             the KV workload's per-key CAS chains and reads (chaos/kv_checker.py)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from chaos.history import Event

Streams = dict[str, dict[int, str]]  # stream -> seq -> payload


@dataclass
class View:
    source: str  # "client@n0", "lmdb@n2"
    streams: Streams
    authoritative: bool = False  # the client's view (served by the stream's leader)


@dataclass(frozen=True)
class Anomaly:
    kind: str
    detail: dict[str, Any]

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass
class Verdict:
    anomalies: list[Anomaly] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for a in self.anomalies:
            out[a.kind] += 1
        return dict(out)


# An anomaly list can run to millions on a bad run; keep this many of each kind.
MAX_PER_KIND = 50


# Seconds after a confirmed ack during which a redelivery may still be one sent before
# the ack was applied: the fetch timeout (1 s) plus a margin.
REDELIVERY_GRACE = 2.0


def check(events: list[Event], views: list[View],
          replicas: dict[str, set[str]] | None = None,
          redelivery_grace: float = REDELIVERY_GRACE) -> Verdict:
    """`replicas`: stream -> the sources that must hold it (default: every view that has
    the stream, plus every authoritative view)."""
    v = Verdict()
    seen: dict[str, int] = defaultdict(int)

    def flag(kind: str, **detail: Any) -> None:
        seen[kind] += 1
        if seen[kind] <= MAX_PER_KIND:
            v.anomalies.append(Anomaly(kind, detail))

    acks = _pub_acks(events, flag)
    invoked = {e["payload"] for e in events if e["f"] == "publish" and e["type"] == "invoke"}
    # The KV bucket's stream holds the KV workload's values: written, not published.
    invoked |= {e["value"] for e in events if e["f"] == "kv-cas" and e["type"] == "invoke"}
    auth = [w for w in views if w.authoritative]
    _check_client_views(auth, flag)

    for stream in sorted({s for s, _ in acks} | {s for w in views for s in w.streams}):
        acked = {p: seq for (s, p), seq in acks.items() if s == stream}
        must = replicas.get(stream) if replicas is not None else None
        held = [w for w in views if not w.authoritative and stream in w.streams]
        for w in views:
            msgs = w.streams.get(stream)
            required = w.authoritative or (must is not None and w.source in must)
            if msgs is None:
                if required and acked:
                    flag("stream-forgotten", stream=stream, source=w.source)
                continue
            _check_view(stream, w, msgs, acked, invoked, held, flag)
        _check_agreement(stream, [w for w in views if stream in w.streams], flag)

    created = sorted({e["stream"] for e in events if e["f"] == "create" and e["type"] == "ok"})
    for w in auth:
        for stream in created:
            if stream not in w.streams:
                flag("stream-forgotten", stream=stream, source=w.source, created=True)
    _check_publisher_order(events, flag)
    ref = auth[0].streams if auth else (views[0].streams if views else {})
    late = [0]
    _check_consumers(events, ref, flag, redelivery_grace, late)
    _check_consumer_final(events, ref, flag)
    from chaos import kv_checker  # imports this module

    kv_stats = kv_checker.check_kv(events, views, flag) if kv_checker.has_kv(events) else {}

    v.stats = {
        "publishes": sum(1 for e in events if e["f"] == "publish" and e["type"] == "invoke"),
        "acked": len(acks),
        "publish_unknown": sum(1 for e in events if e["f"] == "publish" and e["type"] == "info"),
        "publish_failed": sum(1 for e in events if e["f"] == "publish" and e["type"] == "fail"),
        "deliveries": sum(1 for e in events if e["f"] == "deliver"),
        "acks_confirmed": sum(1 for e in events if e["f"] == "ack" and e["type"] == "ok"),
        "redelivered_within_grace": late[0],
        # Pull answers that were not stream messages (e.g. a JSON error body): no data is
        # lost by them, but nats-server never sends them; reported, not failed.
        "bad_deliveries": sum(1 for e in events if e["f"] == "bad-delivery"),
        "streams_created": len(created),
        "faults": sum(1 for e in events if e["proc"] == "nemesis"),
        "views": len(views),
        **{f"stored@{w.source}": sum(len(m) for m in w.streams.values()) for w in views},
        **kv_stats,
        **{f"anomaly:{k}": n for k, n in seen.items()},
    }
    return v


def _pub_acks(events: list[Event], flag: Any) -> dict[tuple[str, str], int]:
    """(stream, payload) -> the seq its PubAck(s) gave."""
    out: dict[tuple[str, str], int] = {}
    for e in events:
        if e["f"] != "publish" or e["type"] != "ok":
            continue
        key = (e["stream"], e["payload"])
        if key in out and out[key] != e["seq"]:
            flag("unknown-ack-seq", stream=e["stream"], payload=e["payload"],
                 seqs=[out[key], e["seq"]])
        out.setdefault(key, e["seq"])
    return out


def _check_client_views(auth: list[View], flag: Any) -> None:
    for w in auth[1:]:
        if w.streams != auth[0].streams:
            diff = sorted(s for s in set(w.streams) | set(auth[0].streams)
                          if w.streams.get(s) != auth[0].streams.get(s))
            flag("views-differ", a=auth[0].source, b=w.source, streams=diff)


def _check_view(stream: str, view: View, msgs: dict[int, str], acked: dict[str, int],
                invoked: set[str], replicas: list[View], flag: Any) -> None:
    source = view.source
    where: dict[str, list[int]] = defaultdict(list)
    for seq, payload in msgs.items():
        where[payload].append(seq)
    for payload, seqs in where.items():
        if len(seqs) > 1:
            flag("duplicate", stream=stream, source=source, payload=payload, seqs=sorted(seqs))
        if payload not in invoked:
            flag("phantom", stream=stream, source=source, payload=payload, seqs=sorted(seqs))
    stored_sets = [set(r.streams[stream].values()) for r in replicas]
    for payload, seq in acked.items():
        if payload not in where:
            # A client view, or most replicas, without it: the cluster lost it. One
            # replica short while the majority holds it: that replica failed to catch up.
            missing = sum(1 for st in stored_sets if payload not in st)
            lost = view.authoritative or missing * 2 > len(stored_sets)
            flag("lost" if lost else "replica-missing", stream=stream, source=source,
                 payload=payload, acked_seq=seq)
        elif seq not in where[payload]:
            flag("misplaced", stream=stream, source=source, payload=payload, acked_seq=seq,
                 stored_at=sorted(where[payload]))


def _check_agreement(stream: str, views: list[View], flag: Any) -> None:
    """Same payload at every seq that two views both hold: one order on every replica."""
    for i, a in enumerate(views):
        for b in views[i + 1:]:
            ma, mb = a.streams[stream], b.streams[stream]
            bad = [s for s in sorted(set(ma) & set(mb)) if ma[s] != mb[s]]
            if bad:
                flag("divergent", stream=stream, a=a.source, b=b.source, first_seq=bad[0],
                     count=len(bad), values=[ma[bad[0]], mb[bad[0]]])


def _check_publisher_order(events: list[Event], flag: Any) -> None:
    """A publisher sends one message at a time: each acked one lands after the previous."""
    last: dict[tuple[str, str], tuple[int, str]] = {}
    for e in events:
        if e["f"] != "publish" or e["type"] != "ok" or e.get("dup"):
            continue
        key = (e["proc"], e["stream"])
        prev = last.get(key)
        if prev is not None and e["seq"] <= prev[0] and e["payload"] != prev[1]:
            flag("publisher-order", proc=e["proc"], stream=e["stream"],
                 earlier=list(prev), later=[e["seq"], e["payload"]])
        last[key] = (e["seq"], e["payload"])


def _check_consumers(events: list[Event], ref: Streams, flag: Any, grace: float,
                     late: list[int]) -> None:
    acked_at: dict[tuple[str, str, int], float] = {}  # (stream, consumer, seq) -> ack ok time
    delivered: dict[tuple[str, str], set[int]] = defaultdict(set)
    drained: set[tuple[str, str]] = set()
    for e in events:
        if e["f"] == "ack" and e["type"] == "ok":
            acked_at.setdefault((e["stream"], e["consumer"], e["seq"]), e["t"])
        elif e["f"] == "drained" and e["type"] == "ok":
            drained.add((e["stream"], e["consumer"]))
    for e in events:
        if e["f"] != "deliver":
            continue
        stream, consumer, seq = e["stream"], e["consumer"], e["seq"]
        delivered[(stream, consumer)].add(seq)
        stored = ref.get(stream, {}).get(seq)
        if stored is not None and stored != e["payload"]:
            flag("delivery-mismatch", stream=stream, consumer=consumer, seq=seq,
                 delivered=e["payload"], stored=stored)
        t_ack = acked_at.get((stream, consumer, seq))
        if t_ack is not None and e.get("fetch_t", e["t"]) > t_ack:
            # A redelivery sent before the ack was applied may still reach a fetch issued
            # just after the confirmation (nats-py's fetches share one inbox, and a delivery
            # and an ack reply can travel different routes); past the grace it cannot.
            if e.get("fetch_t", e["t"]) > t_ack + grace:
                flag("acked-redelivered", stream=stream, consumer=consumer, seq=seq,
                     ack_confirmed_t=t_ack, fetched_t=e.get("fetch_t", e["t"]))
            else:
                late[0] += 1
    for key in set(delivered) | drained:
        stream, consumer = key
        seqs = delivered.get(key, set())
        stored = sorted(ref.get(stream, {}))
        if key in drained:
            horizon = stored[-1] if stored else 0
        else:
            horizon = max(seqs, default=0)
        missing = [s for s in stored if s <= horizon and s not in seqs]
        if missing:
            flag("skipped", stream=stream, consumer=consumer, count=len(missing),
                 first=missing[:10], drained=key in drained)


def _check_consumer_final(events: list[Event], ref: Streams, flag: Any) -> None:
    """After the drain every stored message is acked: the consumer's own state must say so
    (CONSUMER.INFO read by the run, event f="consumer-final")."""
    for e in events:
        if e["f"] != "consumer-final" or e["type"] != "ok":
            continue
        stored = ref.get(e["stream"], {})
        last = max(stored, default=0)
        info = e["info"]
        floor = info.get("ack_floor", {}).get("stream_seq", 0)
        problems = {k: info.get(k) for k in ("num_ack_pending", "num_pending",
                                             "num_redelivered") if info.get(k)}
        problems.pop("num_redelivered", None)  # redeliveries are allowed, not left-overs
        if floor < last or problems:
            flag("consumer-state", stream=e["stream"], consumer=e["consumer"],
                 ack_floor=floor, last_seq=last, **problems)

"""The KV checker: the history of per-key CAS writes and reads (chaos/kv_workload.py)
against the bucket stream's final state on every view. Pure.

Every stored value names its key and the revision its CAS was conditioned on, so each
key's stored writes must form one chain: the first follows 0, every later one follows the
revision (stream seq) of the one before it. Anomalies (all failures):

- kv-chain-broken  a stored write whose condition is not the key's previous revision (two
                   writes accepted from the same revision, or a gap: a write lost between)
- kv-fork          two acknowledged CASes on one key from the same revision
- kv-lost          an acknowledged CAS missing from the final state
- kv-misplaced     an acknowledged CAS stored, but not at the revision its ack gave
- kv-failed-stored a CAS the leader refused (wrong last sequence) is stored
- kv-duplicate     one written value stored twice (a CAS with an unknown outcome is either
                   absent or in the chain exactly once)
- kv-phantom       a stored value no client wrote
- kv-dirty-read    a read returned a revision whose final value is not the one read (it
                   saw a write that was later lost, or never committed)
- kv-unchecked     no client view of the bucket at the end: nothing could be checked
- kv-stale-read    a read returned an older revision than one already known committed
                   when the read began (an acknowledged CAS, or a read that completed
                   before): reads go through the leader and must be linearizable; this also
                   covers one client's reads going back
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

from chaos.checker import View
from chaos.history import Event
from chaos.kv_workload import STREAM, parse_value


def has_kv(events: list[Event]) -> bool:
    return any(e["f"] == "kv-cas" for e in events)


def check_kv(events: list[Event], views: list[View], flag: Any, stream: str = STREAM
             ) -> dict[str, int]:
    """Flags every anomaly through `flag(kind, **detail)`; returns the stats."""
    auth = [w for w in views if w.authoritative and stream in w.streams]
    held = [w for w in views if stream in w.streams]
    for w in held:
        _check_chain(stream, w, flag)
    invoked = {e["value"] for e in events if e["f"] == "kv-cas" and e["type"] == "invoke"}
    for w in held:
        _check_stored(stream, w, events, invoked, flag)
    acked = [e for e in events if e["f"] == "kv-cas" and e["type"] == "ok"]
    _check_forks(acked, flag)
    final = auth[0].streams[stream] if auth else {}
    if auth:
        _check_acked(stream, auth[0], acked, flag)
        _check_dirty_reads(events, final, flag)
    elif acked:
        # No client could read the bucket at the end (the run's errors say why): the acked
        # writes cannot be checked, which fails the run without calling them lost.
        flag("kv-unchecked", stream=stream, acked=len(acked))
    stale = _check_stale_reads(events, flag)
    return {
        "kv_cas": sum(1 for e in events if e["f"] == "kv-cas" and e["type"] == "invoke"),
        "kv_cas_ok": len(acked),
        "kv_cas_failed": sum(1 for e in events if e["f"] == "kv-cas" and e["type"] == "fail"),
        "kv_cas_unknown": sum(1 for e in events if e["f"] == "kv-cas" and e["type"] == "info"),
        "kv_reads_ok": sum(1 for e in events if e["f"] == "kv-get" and e["type"] == "ok"),
        "kv_reads_checked_realtime": stale,
        "kv_revisions_stored": len(final),
    }


def _chains(msgs: dict[int, str]) -> dict[str, list[tuple[int, int, str]]]:
    """key -> [(seq, conditioned-on revision, value)] in seq order."""
    out: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for seq in sorted(msgs):
        parsed = parse_value(msgs[seq])
        if parsed is not None:
            out[parsed[0]].append((seq, parsed[1], msgs[seq]))
    return out


def _check_chain(stream: str, w: View, flag: Any) -> None:
    for key, chain in _chains(w.streams[stream]).items():
        prev = 0
        for seq, last, value in chain:
            if last != prev:
                flag("kv-chain-broken", stream=stream, source=w.source, key=key, seq=seq,
                     value=value, conditioned_on=last, previous_revision=prev)
            prev = seq


def _check_stored(stream: str, w: View, events: list[Event], invoked: set[str],
                  flag: Any) -> None:
    failed = {e["value"] for e in events if e["f"] == "kv-cas" and e["type"] == "fail"}
    where: dict[str, list[int]] = defaultdict(list)
    for seq, value in w.streams[stream].items():
        where[value].append(seq)
    for value, seqs in sorted(where.items()):
        if len(seqs) > 1:
            flag("kv-duplicate", stream=stream, source=w.source, value=value, seqs=sorted(seqs))
        if value not in invoked:
            flag("kv-phantom", stream=stream, source=w.source, value=value, seqs=sorted(seqs))
        if value in failed:
            flag("kv-failed-stored", stream=stream, source=w.source, value=value,
                 seqs=sorted(seqs))


def _check_forks(acked: list[Event], flag: Any) -> None:
    by_cond: dict[tuple[str, int], list[Event]] = defaultdict(list)
    for e in acked:
        by_cond[(e["key"], e["last"])].append(e)
    for (key, last), es in sorted(by_cond.items()):
        if len(es) > 1:
            flag("kv-fork", key=key, conditioned_on=last,
                 acked=[[e["value"], e["rev"]] for e in es])


def _check_acked(stream: str, w: View, acked: list[Event], flag: Any) -> None:
    msgs = w.streams[stream]
    at = {v: s for s, v in msgs.items()}
    for e in acked:
        if msgs.get(e["rev"]) == e["value"]:
            continue
        if e["value"] in at:
            flag("kv-misplaced", stream=stream, source=w.source, value=e["value"],
                 acked_rev=e["rev"], stored_at=at[e["value"]])
        else:
            flag("kv-lost", stream=stream, source=w.source, value=e["value"],
                 acked_rev=e["rev"], key=e["key"])


def _check_dirty_reads(events: list[Event], final: dict[int, str], flag: Any) -> None:
    for e in events:
        if e["f"] != "kv-get" or e["type"] != "ok" or not e["rev"]:
            continue
        if final.get(e["rev"]) != e["value"]:
            flag("kv-dirty-read", proc=e["proc"], key=e["key"], rev=e["rev"], read=e["value"],
                 final=final.get(e["rev"]), t=e["t"])


def _check_stale_reads(events: list[Event], flag: Any) -> int:
    """A read invoked after revision r of its key was known committed (an acked CAS or a
    completed read returned it) must return >= r. Returns how many reads were checked."""
    known: dict[str, list[tuple[float, int]]] = defaultdict(list)  # key -> (t, rev)
    invoked_at: dict[str, float] = {}
    reads: list[tuple[float, Event]] = []
    for e in events:
        if e["f"] not in ("kv-get", "kv-cas"):
            continue
        if e["type"] == "invoke":
            invoked_at[e["proc"]] = e["t"]
        elif e["type"] == "ok":
            known[e["key"]].append((e["t"], e["rev"]))
            if e["f"] == "kv-get":
                reads.append((invoked_at.get(e["proc"], e["t"]), e))
    prefix: dict[str, tuple[list[float], list[int]]] = {}
    for key, ks in known.items():
        ks.sort()
        best, maxes = 0, []
        for _, rev in ks:
            best = max(best, rev)
            maxes.append(best)
        prefix[key] = ([t for t, _ in ks], maxes)
    for t_inv, e in reads:
        times, maxes = prefix[e["key"]]
        i = bisect.bisect_left(times, t_inv)  # completed strictly before the invoke
        if i and maxes[i - 1] > e["rev"]:
            flag("kv-stale-read", proc=e["proc"], key=e["key"], read_rev=e["rev"],
                 known_rev=maxes[i - 1], invoked_t=t_inv, t=e["t"])
    return len(reads)

"""The chaos checker (chaos/checker.py) on small hand-made histories: each anomaly it
exists to catch is planted once, and a clean history passes."""

from __future__ import annotations

from typing import Any

from chaos.checker import View, check

S = "CHAOS"


def pub(proc: str, payload: str, seq: int | None, t: float, dup: bool = False) -> list[dict]:
    out: list[dict[str, Any]] = [{"t": t, "proc": proc, "type": "invoke", "f": "publish",
                                  "stream": S, "payload": payload}]
    if seq is None:
        out.append({"t": t + 0.1, "proc": proc, "type": "info", "f": "publish", "stream": S,
                    "payload": payload, "err": "TimeoutError"})
    else:
        out.append({"t": t + 0.1, "proc": proc, "type": "ok", "f": "publish", "stream": S,
                    "payload": payload, "seq": seq, "dup": dup})
    return out


def deliver(seq: int, payload: str, t: float, acked: bool = True) -> list[dict]:
    base = {"proc": "con0", "stream": S, "consumer": "c", "seq": seq}
    out = [{**base, "t": t, "type": "ok", "f": "deliver", "payload": payload, "fetch_t": t}]
    if acked:
        out.append({**base, "t": t + 0.05, "type": "ok", "f": "ack"})
    return out


def clean() -> tuple[list[dict], dict[int, str]]:
    ev = pub("pub0", "p0-0", 1, 0) + pub("pub1", "p1-0", 2, 0.05) + pub("pub0", "p0-1", 3, 1)
    # An unknown outcome that was in fact stored, then retried (dedup answers dup=True).
    ev += pub("pub1", "p1-1", None, 1.1) + pub("pub1", "p1-1", 4, 1.5, dup=True)
    ev += deliver(1, "p0-0", 2) + deliver(2, "p1-0", 2) + deliver(3, "p0-1", 2.2)
    ev += deliver(4, "p1-1", 2.3)
    ev.append({"t": 9, "proc": "con0", "type": "ok", "f": "drained", "stream": S,
               "consumer": "c"})
    return ev, {1: "p0-0", 2: "p1-0", 3: "p0-1", 4: "p1-1"}


def views(msgs: dict[int, str], replica: dict[int, str] | None = None) -> list[View]:
    return [View("client@n0", {S: dict(msgs)}, authoritative=True),
            View("lmdb@n0", {S: dict(msgs if replica is None else replica)})]


def kinds(events: list[dict], vs: list[View]) -> dict[str, int]:
    return check(events, vs).kinds()


def test_clean_history_passes() -> None:
    ev, msgs = clean()
    v = check(ev, views(msgs))
    assert v.ok, v.anomalies
    assert v.stats["acked"] == 4 and v.stats["publish_unknown"] == 1


def test_lost_acked_message() -> None:
    ev, msgs = clean()
    del msgs[3]
    got = kinds(ev, views(msgs))
    assert got["lost"] == 2  # both the client view and the replica
    assert "skipped" not in got  # a message that is not stored cannot be skipped


def test_lost_on_one_replica_only() -> None:
    ev, msgs = clean()
    replica = {k: p for k, p in msgs.items() if k != 2}
    assert kinds(ev, views(msgs, replica)) == {"lost": 1}  # the only replica


def test_duplicate_beyond_dedup() -> None:
    ev, msgs = clean()
    msgs[5] = "p1-1"
    ev += deliver(5, "p1-1", 3)
    assert kinds(ev, views(msgs))["duplicate"] == 2


def test_misplaced_and_divergent_replica() -> None:
    ev, msgs = clean()
    replica = dict(msgs)
    replica[1], replica[2] = msgs[2], msgs[1]  # same messages, another order
    got = kinds(ev, views(msgs, replica))
    assert got == {"misplaced": 2, "divergent": 1}


def test_phantom_message() -> None:
    ev, msgs = clean()
    msgs[5] = "nobody-sent-this"
    ev += deliver(5, "nobody-sent-this", 3)
    assert kinds(ev, views(msgs)) == {"phantom": 2}


def test_forgotten_stream() -> None:
    ev, msgs = clean()
    vs = [View("client@n0", {}, authoritative=True), View("lmdb@n0", {S: msgs})]
    assert kinds(ev, vs)["stream-forgotten"] == 1


def test_client_views_differ() -> None:
    ev, msgs = clean()
    other = {k: p for k, p in msgs.items() if k != 4}
    vs = views(msgs) + [View("client@n1", {S: other}, authoritative=True)]
    got = kinds(ev, vs)
    assert got["views-differ"] == 1 and got["lost"] == 1


def test_consumer_skip() -> None:
    ev, msgs = clean()
    ev = [e for e in ev if not (e["f"] in ("deliver", "ack") and e["seq"] == 2)]
    assert kinds(ev, views(msgs)) == {"skipped": 1}


def test_undrained_consumer_is_only_checked_up_to_what_it_saw() -> None:
    ev, msgs = clean()
    ev = [e for e in ev if e["f"] != "drained"
          and not (e["f"] in ("deliver", "ack") and e["seq"] == 4)]
    assert check(ev, views(msgs)).ok


def test_acked_then_redelivered() -> None:
    ev, msgs = clean()
    ev += deliver(2, "p1-0", 5)  # fetched at t=5, long after its ack was confirmed
    assert kinds(ev, views(msgs)) == {"acked-redelivered": 1}


def test_redelivery_after_an_unconfirmed_ack_is_fine() -> None:
    ev, msgs = clean()
    ev = [e for e in ev if not (e["f"] == "ack" and e["seq"] == 2)]
    ev += deliver(2, "p1-0", 5)
    assert check(ev, views(msgs)).ok


def test_delivery_mismatch() -> None:
    ev, msgs = clean()
    ev += deliver(3, "p1-0", 2.1, acked=False)  # fetched before seq 3 was acked
    got = kinds(ev, views(msgs))
    assert got == {"delivery-mismatch": 1}


def test_publisher_order() -> None:
    ev, msgs = clean()
    # pub0's second message acked below its first.
    ev = [dict(e, seq=0) if e.get("payload") == "p0-1" and e["type"] == "ok"
          and e["f"] == "publish" else e for e in ev]
    msgs2 = {0: "p0-1", 1: "p0-0", 2: "p1-0", 4: "p1-1"}
    ev = [e for e in ev if e["f"] not in ("deliver", "ack", "drained")]
    assert kinds(ev, views(msgs2)) == {"publisher-order": 1}


def test_two_acks_disagree() -> None:
    ev, msgs = clean()
    ev += pub("pub1", "p1-1", 5, 3, dup=True)
    assert kinds(ev, views(msgs))["unknown-ack-seq"] == 1


def test_redelivery_right_after_the_ack_is_within_grace() -> None:
    ev, msgs = clean()
    ev += deliver(2, "p1-0", 2.2)  # 0.15 s after the ack was confirmed
    v = check(ev, views(msgs))
    assert v.ok and v.stats["redelivered_within_grace"] == 1


def _final(info: dict) -> dict:
    return {"t": 10, "proc": "run", "type": "ok", "f": "consumer-final", "stream": S,
            "consumer": "c", "info": info}


def test_consumer_state_after_drain() -> None:
    ev, msgs = clean()
    good = {"ack_floor": {"stream_seq": 4}, "num_ack_pending": 0, "num_pending": 0}
    assert check(ev + [_final(good)], views(msgs)).ok
    behind = dict(good, ack_floor={"stream_seq": 3}, num_ack_pending=1)
    assert kinds(ev + [_final(behind)], views(msgs)) == {"consumer-state": 1}


def test_missing_from_most_replicas_is_lost() -> None:
    ev, msgs = clean()
    short = {k: p for k, p in msgs.items() if k != 2}
    vs = [View("lmdb@n0", {S: dict(msgs)}), View("lmdb@n1", {S: dict(short)}),
          View("lmdb@n2", {S: dict(short)})]
    got = kinds(ev, vs)
    assert got == {"lost": 2}, got


def test_one_replica_behind_is_replica_missing() -> None:
    ev, msgs = clean()
    short = {k: p for k, p in msgs.items() if k != 4}
    vs = [View("client@n0", {S: dict(msgs)}, authoritative=True),
          View("lmdb@n0", {S: dict(msgs)}), View("lmdb@n1", {S: dict(msgs)}),
          View("lmdb@n2", {S: short})]
    assert kinds(ev, vs) == {"replica-missing": 1}


def test_created_stream_forgotten() -> None:
    ev, msgs = clean()
    ev += [{"t": 1, "proc": "cre0", "type": "invoke", "f": "create", "stream": "CR0_0"},
           {"t": 1.2, "proc": "cre0", "type": "ok", "f": "create", "stream": "CR0_0"},
           {"t": 2, "proc": "cre0", "type": "invoke", "f": "create", "stream": "CR0_1"},
           {"t": 4, "proc": "cre0", "type": "info", "f": "create", "stream": "CR0_1"}]
    vs = views(msgs)
    assert kinds(ev, vs) == {"stream-forgotten": 1}  # CR0_1's outcome was unknown
    vs[0].streams["CR0_0"] = {}
    assert check(ev, vs).ok

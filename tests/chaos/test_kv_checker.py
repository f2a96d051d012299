"""The KV checker (chaos/kv_checker.py) on hand-made histories: a good one passes, and each
planted anomaly is reported by its kind."""

from __future__ import annotations

from typing import Any

from chaos.checker import View, check
from chaos.kv_workload import STREAM, kv_value

Ev = dict[str, Any]


class H:
    """Builds a history: one client operation = invoke + completion, time moving on."""

    def __init__(self) -> None:
        self.events: list[Ev] = []
        self.t = 0.0

    def _add(self, proc: str, type_: str, f: str, **kw: Any) -> None:
        self.t += 1.0
        self.events.append({"t": self.t, "proc": proc, "type": type_, "f": f, **kw})

    def cas(self, proc: str, key: str, n: int, last: int, outcome: str = "ok",
            rev: int | None = None) -> str:
        value = kv_value(key, proc, n, last)
        self._add(proc, "invoke", "kv-cas", key=key, value=value, last=last)
        extra = {"rev": rev} if outcome == "ok" else {"err": "x"}
        self._add(proc, outcome, "kv-cas", key=key, value=value, last=last, **extra)
        return value

    def get(self, proc: str, key: str, rev: int, value: str | None) -> None:
        self._add(proc, "invoke", "kv-get", key=key)
        self._add(proc, "ok", "kv-get", key=key, rev=rev, value=value)


def _good() -> tuple[H, dict[int, str]]:
    h = H()
    a1 = h.cas("kv0", "k0", 1, 0, rev=1)
    b1 = h.cas("kv1", "k1", 1, 0, rev=2)
    h.cas("kv1", "k0", 2, 0, "fail")  # lost the race for k0's first write
    h.get("kv1", "k0", 1, a1)
    a2 = h.cas("kv1", "k0", 3, 1, rev=3)
    u = h.cas("kv0", "k1", 2, 2, "info")  # unknown outcome; it did land
    h.get("kv0", "k1", 4, u)
    h.get("kv0", "k0", 3, a2)
    return h, {1: a1, 2: b1, 3: a2, 4: u}


def _kinds(events: list[Ev], msgs: dict[int, str], replica: dict[int, str] | None = None
           ) -> dict[str, int]:
    views = [View("client@n0", {STREAM: msgs}, authoritative=True),
             View("lmdb@n0", {STREAM: dict(msgs if replica is None else replica)})]
    return check(events, views).kinds()


def test_good_history_passes() -> None:
    h, msgs = _good()
    v = check(h.events, [View("client@n0", {STREAM: msgs}, authoritative=True)])
    assert v.ok, v.anomalies
    assert v.stats["kv_cas_ok"] == 3 and v.stats["kv_cas_failed"] == 1
    assert v.stats["kv_cas_unknown"] == 1 and v.stats["kv_reads_checked_realtime"] == 3


def test_unknown_cas_absent_passes() -> None:
    h = H()
    a1 = h.cas("kv0", "k0", 1, 0, rev=1)
    h.cas("kv1", "k0", 1, 1, "info")  # timed out, never stored
    a2 = h.cas("kv0", "k0", 2, 1, rev=2)
    assert _kinds(h.events, {1: a1, 2: a2}) == {}


def test_lost_acked_cas() -> None:
    h, msgs = _good()
    del msgs[3]  # k0's second acked write is gone (and nothing follows it)
    kinds = _kinds(h.events, msgs)
    assert kinds.get("kv-lost") == 1
    assert kinds.get("kv-dirty-read") == 1  # the read of it saw a write that was lost


def test_two_acked_cas_from_one_revision_fork() -> None:
    h = H()
    a1 = h.cas("kv0", "k0", 1, 0, rev=1)
    b = h.cas("kv0", "k0", 2, 1, rev=2)
    c = h.cas("kv1", "k0", 1, 1, rev=3)  # from revision 1 again, accepted
    kinds = _kinds(h.events, {1: a1, 2: b, 3: c})
    assert kinds.get("kv-fork") == 1
    assert kinds.get("kv-chain-broken") == 2  # both views


def test_gap_in_chain_is_broken() -> None:
    # A write stored with no acked trace follows a revision that is not stored.
    h = H()
    a1 = h.cas("kv0", "k0", 1, 0, rev=1)
    x = h.cas("kv1", "k0", 1, 5, "info")
    kinds = _kinds(h.events, {1: a1, 6: x})
    assert kinds.get("kv-chain-broken") == 2


def test_failed_cas_stored() -> None:
    h = H()
    a1 = h.cas("kv0", "k0", 1, 0, rev=1)
    f = h.cas("kv1", "k0", 1, 1, "fail")
    kinds = _kinds(h.events, {1: a1, 2: f})
    assert kinds.get("kv-failed-stored") == 2


def test_unknown_cas_stored_twice() -> None:
    h = H()
    u = h.cas("kv0", "k0", 1, 0, "info")
    kinds = _kinds(h.events, {1: u, 2: u})
    assert kinds.get("kv-duplicate") == 2
    assert kinds.get("kv-chain-broken") == 2  # the second copy follows 0, not 1


def test_misplaced_and_phantom() -> None:
    h = H()
    a1 = h.cas("kv0", "k0", 1, 0, rev=2)  # acked at 2, stored at 1
    kinds = _kinds(h.events, {1: a1, 3: kv_value("k1", "ghost", 1, 0)})
    assert kinds.get("kv-misplaced") == 1
    assert kinds.get("kv-phantom") == 2


def test_stale_read_after_acked_cas() -> None:
    h = H()
    a1 = h.cas("kv0", "k0", 1, 0, rev=1)
    a2 = h.cas("kv0", "k0", 2, 1, rev=2)
    h.get("kv1", "k0", 1, a1)  # began after revision 2 was acked: went back
    kinds = _kinds(h.events, {1: a1, 2: a2})
    assert kinds == {"kv-stale-read": 1}


def test_read_going_back_after_a_read() -> None:
    h = H()
    a1 = h.cas("kv0", "k0", 1, 0, rev=1)
    a2 = h.cas("kv0", "k0", 2, 1, "info")
    h.get("kv1", "k0", 2, a2)
    h.get("kv1", "k0", 1, a1)
    assert _kinds(h.events, {1: a1, 2: a2}) == {"kv-stale-read": 1}
    h2 = H()
    h2.cas("kv0", "k0", 1, 0, rev=1)
    h2.get("kv1", "k0", 0, None)  # "not found" after the create was acked
    assert _kinds(h2.events, {1: kv_value("k0", "kv0", 1, 0)}) == {"kv-stale-read": 1}


def test_concurrent_read_may_see_old_value() -> None:
    # A read that began before the CAS was acked may return either revision.
    h = H()
    a1 = h.cas("kv0", "k0", 1, 0, rev=1)
    value = kv_value("k0", "kv0", 2, 1)
    h._add("kv1", "invoke", "kv-get", key="k0")
    h._add("kv0", "invoke", "kv-cas", key="k0", value=value, last=1)
    h._add("kv0", "ok", "kv-cas", key="k0", value=value, last=1, rev=2)
    h._add("kv1", "ok", "kv-get", key="k0", rev=1, value=a1)
    assert _kinds(h.events, {1: a1, 2: value}) == {}


def test_replica_divergent_chain() -> None:
    h, msgs = _good()
    replica = dict(msgs)
    replica[3] = kv_value("k0", "kv9", 9, 0)  # a replica holds another write at 3
    kinds = _kinds(h.events, msgs, replica)
    assert kinds.get("kv-chain-broken") == 1 and kinds.get("divergent") == 1


def test_no_final_client_view_is_unchecked_not_lost() -> None:
    h, msgs = _good()
    kinds = check(h.events, [View("lmdb@n0", {STREAM: msgs})]).kinds()
    assert kinds == {"kv-unchecked": 1}

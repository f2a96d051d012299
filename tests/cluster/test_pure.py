"""The pure parts of the cluster layer: interest folding, remote interest
matching, membership merge, route URLs and the cluster secret checks."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from node.cluster.interest import Change, LocalInterest, RemoteInterest
from node.cluster.members import Member, MemberTable
from node.cluster.security import Authorizer, credentials_text
from node.cluster.wire import parse_route_url
from node.options import ClusterOptions


def test_local_interest_announces_plain_once_and_queue_weights() -> None:
    li = LocalInterest()
    assert li.add("A", "foo", None) == Change("A", "foo", "", 1)
    assert li.add("A", "foo", None) is None  # a second sub: peers already know
    assert li.add("B", "foo", None) == Change("B", "foo", "", 1)  # other account
    assert li.add("A", "foo", "q") == Change("A", "foo", "q", 1)
    assert li.add("A", "foo", "q") == Change("A", "foo", "q", 2)  # weight = members
    assert sorted(li.snapshot(), key=str) == sorted(
        [Change("A", "foo", "", 1), Change("B", "foo", "", 1), Change("A", "foo", "q", 2)],
        key=str)
    assert li.remove("A", "foo", None) is None
    assert li.remove("A", "foo", None) == Change("A", "foo", "", 0)
    assert li.remove("A", "foo", None) is None  # never underflows
    assert li.remove("A", "foo", "q") == Change("A", "foo", "q", 1)
    assert li.remove("A", "foo", "q") == Change("A", "foo", "q", 0)
    assert li.snapshot() == [Change("B", "foo", "", 1)]


def test_remote_interest_targets_plain_peers_and_one_peer_per_group() -> None:
    ri = RemoteInterest(random.Random(7))
    assert ri.apply(1, Change("A", "foo.*", "", 1))
    assert ri.apply(2, Change("A", "foo.>", "", 1))
    assert ri.apply(2, Change("A", "foo.bar", "", 1))  # a second match on peer 2: one send
    assert ri.apply(3, Change("B", "foo.bar", "", 1))  # other account
    assert ri.targets("A", "foo.bar", frozenset()) == {1: [], 2: []}
    assert ri.targets("A", "nope", frozenset()) == {}
    assert ri.targets("C", "foo.bar", frozenset()) == {}
    ri.apply(4, Change("A", "work", "q", 3))
    ri.apply(5, Change("A", "work", "q", 1))
    picks = Counter()
    for _ in range(4000):
        t = ri.targets("A", "work", frozenset())
        assert len(t) == 1 and list(t.values()) == [["q"]]
        picks.update(t.keys())
    assert 2700 < picks[4] < 3300 and picks[4] + picks[5] == 4000  # by weight 3:1
    assert ri.targets("A", "work", frozenset({"q"})) == {}  # served locally: not offered
    ri.apply(4, Change("A", "work", "q", 0))
    assert ri.targets("A", "work", frozenset()) == {5: ["q"]}
    assert ri.count(2) == 2
    assert ri.forget(2) == 2
    assert ri.targets("A", "foo.bar", frozenset()) == {1: []}
    assert not ri.apply(1, Change("A", "bad..subject", "", 1))
    assert not ri.apply(1, Change("A", "x", "bad queue", 1))
    assert not ri.apply(1, Change("", "x", "", 1))


def _m(pid: int, addr: str, version: int = 1, start: int = 0, **kw) -> Member:
    return Member(peer_id=pid, name=f"n{pid}", cluster_addr=addr, version=version,
                  start_ms=start, **kw)


def test_membership_merge_versions_self_and_replacement() -> None:
    t = MemberTable(_m(1, "h:1"))
    m, replaced = t.merge(_m(2, "h:2", version=5))
    assert m is not None and m.version == 5 and not m.up and replaced == []
    assert t.merge(_m(2, "h:2", version=4)) == (None, [])  # older news
    m, _ = t.merge(_m(2, "h:2", version=6, tags=["az:1"]))
    assert m is not None and m.tags == ["az:1"]
    assert t.merge(_m(1, "evil:1", version=99)) == (None, [])  # nobody speaks for us
    assert t.merge(_m(0, "h:0")) == (None, [])
    assert t.set_up(2, True) is not None and t.members[2].up
    m, _ = t.merge(_m(2, "h:2", version=7))
    assert m is not None and m.up  # up is ours, not gossiped
    # A wiped node comes back at the same address with a new id: the old id is gone.
    new, replaced = t.merge(_m(3, "h:2", version=1, start=10))
    assert new is not None and [r.peer_id for r in replaced] == [2]
    assert 2 not in t.members and not replaced[0].up
    assert t.merge(_m(2, "h:2", version=100)) == (None, [])  # and never comes back
    assert t.update_self(tags=["x"]) and t.me.version == 2
    assert not t.update_self(tags=["x"])


def test_route_urls() -> None:
    u = parse_route_url("nats-route://user:p%40ss@127.0.0.1:4248")
    assert (u.addr, u.credentials) == ("127.0.0.1:4248", "user user:p@ss")
    assert parse_route_url("nats://h:1").addr == "h:1"
    assert parse_route_url("h:2").addr == "h:2"
    assert parse_route_url("nats-route://[::1]:5").addr == "[::1]:5"
    for bad in ("http://h:1", "nats-route://h", "nats-route://h:0", "nats-route://:4"):
        with pytest.raises(ValueError):
            parse_route_url(bad)


def test_cluster_secret_checks() -> None:
    a = Authorizer(ClusterOptions(user="r", password="s"))
    assert a.allows(credentials_text("r", "s", None))
    assert not a.allows(credentials_text("r", "x", None))
    assert not a.allows(credentials_text("x", "s", None))
    assert not a.allows(None) and not a.allows("token s")
    t = Authorizer(ClusterOptions(token="tok"))
    assert t.allows("token tok") and not t.allows("token tik") and not t.allows("user :tok")
    assert Authorizer(ClusterOptions()).allows(None)  # no authorization configured
    proof = a.prove(b"n" * 16, "h:1")
    assert a.check_proof(b"n" * 16, "h:1", proof)
    assert not a.check_proof(b"n" * 16, "h:2", proof)  # bound to the dialed address
    assert not Authorizer(ClusterOptions(user="r", password="other")).check_proof(
        b"n" * 16, "h:1", proof)

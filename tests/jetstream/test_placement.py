"""Pure placement rules (node/jetstream/placement.py): tags, unique_tag, spreading, refusals.

The refusal texts are those a 3-node nats-server 2.15.1 cluster answered (probe of 2026-11-26,
servers tagged az:a / az:b / az:b, see docs/notes/jscluster.md)."""

from __future__ import annotations

import pytest

from node.jetstream.errors import ApiError
from node.jetstream.placement import Candidate, Placement, pick_leader, select_peers


def zones(n_zones: int = 3, per_zone: int = 2, region: str = "region:x") -> list[Candidate]:
    return [Candidate(peer=z * 10 + i + 1, name=f"n{z}{i}", cluster="C1",
                      tags=(f"az:{'abcdefg'[z]}", region))
            for z in range(n_zones) for i in range(per_zone)]


def place_many(cands: list[Candidate], count: int, replicas: int, placement: Placement,
               unique_tag: str = "") -> list[list[int]]:
    """Place `count` streams one after another, each one adding load to its peers."""
    load = {c.peer: 0 for c in cands}
    out = []
    for _ in range(count):
        now = [Candidate(c.peer, c.name, c.cluster, c.tags, c.up, c.free_storage, load[c.peer])
               for c in cands]
        peers = select_peers(now, replicas, placement, our_cluster="C1", unique_tag=unique_tag)
        for p in peers:
            load[p] += 1
        out.append(peers)
    return out


def zone_of(cands: list[Candidate], peer: int) -> str:
    return next(t for c in cands if c.peer == peer for t in c.tags if t.startswith("az:"))


def test_twenty_r3_streams_land_in_three_distinct_zones() -> None:
    cands = zones()
    placed = place_many(cands, 20, 3, Placement(), unique_tag="az")
    for peers in placed:
        assert len(set(peers)) == 3
        assert len({zone_of(cands, p) for p in peers}) == 3
    # Spread: 60 replicas over 6 servers, 10 each.
    counts = {c.peer: sum(c.peer in p for p in placed) for c in cands}
    assert set(counts.values()) == {10}


def test_tags_alone_allow_two_in_one_zone_but_unique_tag_spreads() -> None:
    # Zone a has the lightest servers: by load alone, two replicas would go to zone a.
    cands = [Candidate(1, "a1", "C1", ("az:a", "ssd"), load=0),
             Candidate(2, "a2", "C1", ("az:a", "ssd"), load=0),
             Candidate(3, "b1", "C1", ("az:b", "ssd"), load=5),
             Candidate(4, "c1", "C1", ("az:c", "ssd"), load=9)]
    loose = select_peers(cands, 3, Placement(tags=("ssd",)), our_cluster="C1")
    assert sorted(zone_of(cands, p) for p in loose) == ["az:a", "az:a", "az:b"]
    strict = select_peers(cands, 3, Placement(tags=("ssd",)), our_cluster="C1",
                          unique_tag="az")
    assert sorted(zone_of(cands, p) for p in strict) == ["az:a", "az:b", "az:c"]


def test_tags_filter_and_case() -> None:
    cands = zones()
    peers = select_peers(cands, 2, Placement(tags=("AZ:B",)), our_cluster="C1")
    assert sorted(peers) == [11, 12]


def err(exc: pytest.ExceptionInfo[ApiError]) -> tuple[int, str]:
    return exc.value.err_code, exc.value.description


def test_impossible_requests_are_refused_as_nats_server_does() -> None:
    three = [Candidate(1, "n0", "C1", ("az:a", "r:x")), Candidate(2, "n1", "C1", ("az:b", "r:x")),
             Candidate(3, "n2", "C1", ("az:b", "r:y"))]
    with pytest.raises(ApiError) as e:
        select_peers(three, 3, Placement(), our_cluster="C1", unique_tag="az")
    assert err(e) == (10005, "no suitable peers for placement, server tag not unique")
    with pytest.raises(ApiError) as e:
        select_peers(three, 5, Placement(), our_cluster="C1")
    assert err(e) == (10005, "no suitable peers for placement")
    with pytest.raises(ApiError) as e:
        select_peers(three, 1, Placement(tags=("zz:q",)), our_cluster="C1")
    assert err(e) == (10005, "no suitable peers for placement, tags not matched ['zz:q']")
    with pytest.raises(ApiError) as e:
        select_peers(three, 2, Placement(tags=("r:y",)), our_cluster="C1")
    assert err(e) == (10005, "no suitable peers for placement, tags not matched ['r:y']")
    with pytest.raises(ApiError) as e:
        select_peers(three, 1, Placement(cluster="C9"), our_cluster="C1")
    assert err(e) == (10005, "no suitable peers for placement")
    with pytest.raises(ApiError) as e:
        select_peers(three, 1, Placement(preferred="n1"), our_cluster="C1")
    assert err(e) == (10052, "preferred server not permitted in placement")


def test_storage_short_everywhere_is_insufficient_resources() -> None:
    cands = [Candidate(i, f"n{i}", free_storage=1000) for i in (1, 2, 3)]
    with pytest.raises(ApiError) as e:
        select_peers(cands, 3, Placement(), max_bytes=10_000)
    assert err(e) == (10023, "insufficient resources")
    assert len(select_peers(cands, 3, Placement(), max_bytes=500)) == 3


def test_offline_and_excluded_peers_are_not_chosen() -> None:
    cands = [Candidate(1, "n1"), Candidate(2, "n2", up=False), Candidate(3, "n3"),
             Candidate(4, "n4")]
    assert sorted(select_peers(cands, 2, Placement(), exclude=[1])) == [3, 4]
    with pytest.raises(ApiError) as e:
        select_peers(cands, 4, Placement())
    assert err(e) == (10005, "no suitable peers for placement, peer offline")


def test_scale_up_keeps_existing_replicas() -> None:
    cands = [Candidate(i, f"n{i}", load=10 - i) for i in range(1, 6)]
    peers = select_peers(cands, 3, Placement(), keep=[1])
    assert peers[0] == 1 and len(set(peers)) == 3


def test_free_storage_breaks_load_ties() -> None:
    cands = [Candidate(1, "n1", free_storage=10), Candidate(2, "n2", free_storage=30),
             Candidate(3, "n3", free_storage=20)]
    assert select_peers(cands, 2, Placement()) == [2, 3]


def test_meta_stepdown_preference() -> None:
    cands = zones()
    voters = [c.peer for c in cands]
    assert pick_leader(cands, voters, 1, Placement(preferred="n21")) == 22
    assert pick_leader(cands, voters, 1, Placement()) != 1
    assert pick_leader(cands, voters, 1, Placement(tags=("az:c",))) in (21, 22)
    with pytest.raises(ApiError):
        pick_leader(cands, voters, 1, Placement(preferred="nobody"))


def test_max_ha_assets_leaves_out_full_servers_for_replicated_streams_only() -> None:
    # nats-server counts its meta group too: with a cap of 2 a server takes 2 assets
    cands = [Candidate(peer=p, name=f"n{p}", cluster="C1", ha_assets=a)
             for p, a in ((1, 2), (2, 1), (3, 0), (4, 1))]
    assert sorted(select_peers(cands, 3, Placement(), max_ha_assets=2)) == [2, 3, 4]
    assert select_peers(cands, 1, Placement(), max_ha_assets=2)  # R1: not an HA asset
    assert sorted(select_peers(cands, 3, Placement(), max_ha_assets=0)) != []  # no cap
    with pytest.raises(ApiError) as err:
        select_peers(cands, 4, Placement(), max_ha_assets=2)
    assert err.value.to_dict()["error"] == {
        "code": 400, "err_code": 10005,
        "description": "no suitable peers for placement, miscellaneous issue"}
